"""Fixtures the backends' export tests share with tests/export: a study directory to export from."""

from tests.export.conftest import fixture_study  # noqa: F401 - a pytest fixture, used by name
