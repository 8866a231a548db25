"""The columns the plan evaluates every candidate with (``autotune/estimate/columns.py``), value by
value: a JobConfig field of many configurations as one column, and the candidates at some rows."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.estimate import find_model
from autotune.estimate.columns import CONFIG_COLUMNS, ShapeColumns, column


def test_column_turns_none_into_zero_or_empty_text() -> None:
    ints = column([4, None, 2], np.int64)
    assert ints.dtype == np.int64 and ints.tolist() == [4, 0, 2]
    floats = column([0.5, None], np.float64)
    assert floats.dtype == np.float64 and floats.tolist() == [0.5, 0.0]
    flags = column([True, None, False], np.bool_)
    assert flags.dtype == np.bool_ and flags.tolist() == [True, False, False]
    text = column(["server", None, "colocate"], np.str_)
    assert text.dtype.kind == "U" and text.tolist() == ["server", "", "colocate"]
    # text of a non-text value: its str()
    assert column([3], np.str_).tolist() == ["3"]


def _columns(n_gpus: int = 4) -> ShapeColumns:
    model = find_model("Qwen2-7B")
    assert model is not None
    config = {
        name: np.zeros(3, dtype=dtype if dtype is not np.str_ else "U8")
        for name, dtype in CONFIG_COLUMNS.items()
    }
    config["per_device_batch"] = np.array([1, 2, 4])
    config["vllm_mode"] = np.array(["", "server", "colocate"])
    return ShapeColumns(config, model, n_gpus)


def test_columns_read_by_field_name_and_unknown_names_fail() -> None:
    cols = _columns()
    assert len(cols) == 3
    assert cols.per_device_batch.tolist() == [1, 2, 4]  # a config column, read as an attribute
    assert cols.vllm_mode.tolist() == ["colocate", "server", "colocate"]  # a property: "" means colocate
    with pytest.raises(AttributeError, match="no_such_field"):
        _ = cols.no_such_field


def test_take_keeps_the_rows_the_model_and_the_gpus() -> None:
    cols = _columns(n_gpus=2)
    picked = cols.take(np.array([2, 0]))
    assert len(picked) == 2
    assert picked.per_device_batch.tolist() == [4, 1]
    assert picked.config["vllm_mode"].tolist() == ["colocate", ""]
    assert set(picked.config) == set(CONFIG_COLUMNS)
    assert picked.model is cols.model and picked.n_gpus == 2
    masked = cols.take(np.array([False, True, False]))
    assert masked.per_device_batch.tolist() == [2] and masked.n_gpus == 2
