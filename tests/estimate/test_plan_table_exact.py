"""How the plan enumerates a space (``autotune/estimate/plan.py``): the grid walk, the values a knob
takes, and the decoder run once per group of candidates that differ only in pass-through knobs, with
the number of decoder calls worked out by hand. Pure and cheap: a fake decoder, no estimate."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from autotune.estimate.columns import CONFIG_COLUMNS
from autotune.estimate.plan import _config_fields, _same_value, _unique_values, _walk
from autotune.jobconfig import JobConfig
from autotune.space import Knob, SearchSpace


def _config(**kw: Any) -> JobConfig:
    base: dict[str, Any] = {
        "world_size": 4,
        "global_batch": 64,
        "num_generations": 8,
        "per_device_batch": 4,
        "grad_accum": 4,
    }
    return JobConfig(**{**base, **kw})


def _space(*knobs: Knob, dropped_defaults: dict[str, Any] | None = None) -> SearchSpace:
    return SearchSpace("trl", tuple(knobs), dropped_defaults=dropped_defaults or {})


# ------------------------------------------------------------------------------ values and the walk


def test_unique_values_keep_first_of_each_value_and_type() -> None:
    knob = Knob("k", "int", default=1, choices=(1, True, 1, 2.0, 2, None, None, False, 0))
    # True == 1 and 2.0 == 2 but of other types: kept apart; repeats dropped, first order kept
    assert _unique_values(knob) == [1, True, 2.0, 2, None, False, 0]


def test_same_value_numbers_agree_across_int_and_float_but_never_with_bool() -> None:
    assert _same_value(2, 2.0) and _same_value(2.0, 2) and _same_value(3, 3)
    assert _same_value("a", "a") and _same_value(None, None) and _same_value(True, True)
    assert not _same_value(1, True) and not _same_value(True, 1)
    assert not _same_value(1.0, True) and not _same_value(False, 0.0)
    assert not _same_value(2, 3.0) and not _same_value("1", 1) and not _same_value(1, "1")
    assert not _same_value(None, 0) and not _same_value(0, None)


def test_config_fields_are_the_compared_fields() -> None:
    config = _config(origin={"per_device_batch": ("knob", 4)})
    fields = _config_fields(config)
    assert "origin" not in fields  # compare=False: where a value came from is not the configuration
    assert fields["per_device_batch"] == 4 and fields["global_batch"] == 64
    assert len(fields) == len(dataclasses.fields(JobConfig)) - 1


def test_walk_follows_conditions_and_dropped_defaults() -> None:
    a = Knob("a", "int", default=0, choices=(1, 0))
    b = Knob("b", "int", default=5, choices=(5, 6, 7), when={"a": (1,)})
    c = Knob("c", "bool", default=False, choices=(False, True), when={"gpu": (True,)})
    d = Knob("d", "int", default=9, choices=(9,), when={"b": (7,)})
    space = _space(a, b, d, c, dropped_defaults={"gpu": True})
    values = [list(k.values()) for k in space.knobs]
    # a=1: b in 5, 6, 7 and d only under b=7; a=0: b and d inactive (b=7 of the branch before is
    # forgotten); c always (gpu is True by default)
    assert _walk(space, values) == [
        (0, 0, -1, 0),
        (0, 0, -1, 1),
        (0, 1, -1, 0),
        (0, 1, -1, 1),
        (0, 2, 0, 0),
        (0, 2, 0, 1),
        (1, -1, -1, 0),
        (1, -1, -1, 1),
    ]
    # a knob that exists only while an earlier one is *unset* (a null choice): after a=1's branch, b's
    # last value is forgotten, not left as None, so under a=0 b is absent and n does not exist
    n = Knob("n", "int", default=0, choices=(0,), when={"b": (None,)})
    assert _walk(_space(a, b, n), [[1, 0], [5, 6], [0]]) == [(0, 0, -1), (0, 1, -1), (1, -1, -1)]
    # without the dropped default, c never exists
    assert _walk(_space(a, c), [[1, 0], [False, True]]) == [(0, -1), (1, -1)]
    # a knob that overrides a dropped default (gpu, only under a=1) gives the default back after its
    # branch: under a=0 gpu is True again and c exists
    g = Knob("gpu", "bool", default=True, choices=(False,), when={"a": (1,)})
    space = _space(a, g, c, dropped_defaults={"gpu": True})
    assert _walk(space, [[1, 0], [False], [False, True]]) == [(0, 0, -1), (1, -1, 0), (1, -1, 1)]


# ------------------------------------------------------------------------------ decoded once per group


def _decode_counted(space: SearchSpace, describe: Any) -> tuple[Any, list[dict[str, Any]]]:
    """The plan's table of ``space`` and every call of the decoder it made."""
    from autotune.estimate.plan import _table

    calls: list[dict[str, Any]] = []

    def counted(params: dict[str, Any]) -> JobConfig:
        calls.append(dict(params))
        return describe(params)

    return _table(space, counted), calls


def _fields(params: dict[str, Any]) -> JobConfig:
    """pdbs sets the batch and the accumulation (two fields); util, sleep and file one field each."""
    pdbs = params.get("pdbs", 1)
    return _config(
        per_device_batch=pdbs,
        grad_accum=64 // (pdbs * 4),
        use_vllm=params.get("vllm", True),
        vllm_util=params.get("util", 0.9),
        sleep_level=params.get("sleep", 0),
        ds_config_path=params.get("file"),
        vllm_mode=params.get("mode", "colocate"),
    )


def _check_table(space: SearchSpace, table: Any, describe: Any) -> None:
    """The table holds the space's grid, in order, and each row's configuration as decoded alone."""
    grid = list(space.grid())
    assert [table.params(r) for r in range(len(table.index))] == grid
    # every column: the decoded field, None as 0 (as "" for text)
    for name, dtype in CONFIG_COLUMNS.items():
        decoded = [getattr(describe(p), name) for p in grid]
        blank = "" if dtype is np.str_ else 0
        assert table.config[name].tolist() == [blank if x is None else x for x in decoded], name


def test_pass_through_knobs_are_decoded_once_per_value_not_per_candidate() -> None:
    space = _space(
        Knob("pdbs", "int", default=1, choices=(1, 2)),
        Knob("util", "float", default=0.3, choices=(0.3, 0.5, 0.7)),
        Knob("one", "int", default=0, choices=(0,)),
        Knob("sleep", "int", default=0, choices=(0, 1)),
    )
    table, calls = _decode_counted(space, _fields)
    _check_table(space, table, _fields)
    # a knob of one value is no branch: it is never tried as a pass-through knob.
    # try 1: the others pass through: one group (2, 0.7, 0, 1); pdbs decoded at 1 and 2 moves two fields
    #   → 2 calls, pdbs is decoded per group;
    # try 2: groups (1, ·, 0, ·) and (2, ·, 0, ·); util's 3 values at its first group, sleep's 2, then
    #   the two groups → 3 + 2 + 2 calls. 12 candidates, 9 decodes.
    assert len(table.index) == 12
    assert len(calls) == 2 + 3 + 2 + 2
    first = {"pdbs": 1, "util": 0.7, "one": 0, "sleep": 1}
    assert calls[:2] == [first, {**first, "pdbs": 2}]
    assert calls[-2:] == [first, {**first, "pdbs": 2}]


def test_a_knob_that_passes_through_in_one_group_only_is_decoded_per_group() -> None:
    def fields(params: dict[str, Any]) -> JobConfig:
        c = _fields(params)  # batch 2 holds vLLM at 0.9 whatever util says
        return dataclasses.replace(c, vllm_util=0.9) if params["pdbs"] == 2 else c

    space = _space(
        Knob("pdbs", "int", default=1, choices=(1, 2)),
        Knob("util", "float", default=0.3, choices=(0.3, 0.5)),
    )
    table, calls = _decode_counted(space, fields)
    _check_table(space, table, fields)
    assert table.config["vllm_util"].tolist() == [0.3, 0.5, 0.9, 0.9]
    # try 1: pdbs moves two fields (2 calls); try 2: util passes at pdbs 1 (2 calls) but the group of
    # pdbs 2 decodes util 0.5 as 0.9 (2 group calls, the second fails); try 3: 4 groups, 4 calls
    assert len(calls) == 2 + 2 + 2 + 4


def test_knobs_inactive_somewhere_or_everywhere_and_fields_without_a_column() -> None:
    space = _space(
        Knob("vllm", "bool", default=False, choices=(False, True)),
        Knob("util", "float", default=0.3, choices=(0.3, 0.5), when={"vllm": (True,)}),
        Knob("never", "int", default=1, choices=(1, 2), when={"vllm": (None,)}),
        Knob("sleep", "int", default=0, choices=(0, 1)),
    )
    table, calls = _decode_counted(space, _fields)
    _check_table(space, table, _fields)
    # vllm is a condition: it never passes through. Groups (False, -, -, 1) and (True, 0.5, -, 1);
    # util is first active in the second group (2 calls), never is active nowhere (no call), sleep at
    # the first group (2 calls); then the 2 groups. 2 + 2 × 2 = 6 candidates.
    assert len(table.index) == 6 and len(calls) == 2 + 2 + 2
    # a knob that moves a field the columns do not hold (a DeepSpeed file) is decoded per group
    space = _space(
        Knob("file", "str", default="a.json", choices=("a.json", "b.json")),
        Knob("sleep", "int", default=0, choices=(0, 1)),
    )
    table, calls = _decode_counted(space, _fields)
    _check_table(space, table, _fields)
    # try 1: file (2 calls) is rejected; try 2: groups a and b, sleep at a (2 calls), 2 groups
    assert len(table.index) == 4 and len(calls) == 2 + 2 + 2
    assert [table.first_config(r).ds_config_path for r in range(4)] == [
        "a.json",
        "a.json",
        "b.json",
        "b.json",
    ]


def test_the_decoders_own_error_reaches_the_caller() -> None:
    """A value the decoder refuses is refused once the knob is decoded per group: its UsageError, not
    the plan's bookkeeping, is what the user reads."""
    from autotune.errors import UsageError

    def fields(params: dict[str, Any]) -> JobConfig:
        if params["util"] == 0.3:
            raise UsageError("vllm_gpu_memory_utilization=0.3 is refused here", hint="use 0.5")
        return _fields(params)

    space = _space(
        Knob("pdbs", "int", default=1, choices=(1, 2)), Knob("util", "float", default=0.5, choices=(0.3, 0.5))
    )
    with pytest.raises(UsageError, match="0.3 is refused"):
        _decode_counted(space, fields)


def test_a_field_decided_per_group_keeps_none_as_blank() -> None:
    # mode is a condition of sync, so it is decoded per group: its None (no mode) is "" in the column
    space = _space(
        Knob("mode", "str", default="server", choices=(None, "server")),
        Knob("sleep", "int", default=0, choices=(0, 1), when={"mode": ("server",)}),
    )
    table, calls = _decode_counted(space, _fields)
    _check_table(space, table, _fields)
    assert table.config["vllm_mode"].tolist() == ["", "server", "server"]
    # groups (None, -) and ("server", 1): sleep's 2 values at the second, then 2 group decodes
    assert len(calls) == 2 + 2
