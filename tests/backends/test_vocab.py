"""The shared vocabulary between ms-swift and TRL holds in the installed frameworks.

Run the trl test in the main environment and the swift one in the ms-swift environment.
"""

from __future__ import annotations

import dataclasses

import pytest

from autotune.backends._vocab import SHARED_ARGS
from autotune.backends._vocab import TRL_NAMES as SWIFT_TO_TRL


@pytest.mark.trl
def test_shared_and_renamed_arguments_are_trl_fields() -> None:
    trl = pytest.importorskip("trl")
    if int(trl.__version__.split(".")[0]) < 1:
        pytest.skip("the trl export is written for trl >= 1.0")
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)} | {
        f.name for f in dataclasses.fields(trl.ModelConfig)
    }
    assert sorted(SHARED_ARGS - fields) == []
    assert sorted(set(SWIFT_TO_TRL.values()) - fields) == []


@pytest.mark.swift
def test_shared_and_renamed_arguments_are_ms_swift_flags() -> None:
    pytest.importorskip("swift")
    try:
        from swift.arguments import RLHFArguments
    except ImportError:  # ms-swift 3.x
        from swift.llm import RLHFArguments
    fields = {f.name for f in dataclasses.fields(RLHFArguments)}
    assert sorted(SHARED_ARGS - fields) == []
    assert sorted(set(SWIFT_TO_TRL) - fields) == []
