"""The strategy registry: what ``--search`` offers and says is derived from it, and reading it loads
neither numpy nor Optuna (``autotune search --help`` stays instant)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autotune.errors import UsageError
from autotune.space import SearchSpace
from autotune.strategy import (
    COMPARISON_KINDS,
    SEARCH_KINDS,
    STRATEGIES,
    AutoStrategy,
    BaseStrategy,
    GridStrategy,
    build_strategy,
    search_help,
)


def test_search_offers_the_registered_cli_strategies_and_says_what_each_does() -> None:
    assert SEARCH_KINDS == tuple(n for n, e in STRATEGIES.items() if e.on_cli)
    assert SEARCH_KINDS[0] == "auto" and "grid" in SEARCH_KINDS and "tpe" not in SEARCH_KINDS
    assert COMPARISON_KINDS == (
        "auto-v4",
        "tpe",
        "gp",
    )  # built by name for the benches; ds-sweep needs its settings
    text = search_help()
    for name in SEARCH_KINDS:
        assert f"{name}: {STRATEGIES[name].summary}" in text
    assert "tpe" not in text and "ds-sweep" not in text


def test_every_entry_names_a_strategy_class() -> None:
    for entry in STRATEGIES.values():
        assert issubclass(entry.load(), BaseStrategy)
    assert STRATEGIES["auto"].load() is AutoStrategy


def test_build_by_name() -> None:
    space = SearchSpace(backend="", knobs=())
    assert isinstance(build_strategy("grid", space), GridStrategy)
    with pytest.raises(UsageError, match="unknown search 'bayes'"):
        build_strategy("bayes", space)
    with pytest.raises(UsageError, match="unknown search 'ds-sweep'"):
        build_strategy("ds-sweep", space)  # needs its settings


def test_reading_the_registry_loads_no_numpy_or_optuna() -> None:
    probe = (
        "import sys\nfrom autotune.strategy import search_help, SEARCH_KINDS\nsearch_help()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'optuna')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
