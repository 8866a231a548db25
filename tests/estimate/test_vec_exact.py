"""The one-or-many arithmetic helpers: each does on a number what the Python builtin named after it does,
and on numpy columns the same thing row by row (with a numpy result, whichever argument is the array)."""

from __future__ import annotations

import numpy as np

from autotune.estimate import _vec as v


def _same(got: object, expected: list[object], dtype: object) -> None:
    """``got`` is a numpy array of ``dtype`` holding ``expected``."""
    assert isinstance(got, np.ndarray)
    assert got.dtype == dtype
    assert got.tolist() == expected


def test_is_array_finds_an_array_in_any_position() -> None:
    col = np.array([1, 2])
    assert v.is_array(col) and v.is_array(col, 3) and v.is_array(3, col) and v.is_array(1, 2, col)
    assert not v.is_array() and not v.is_array(1) and not v.is_array(1, 2.5, None, [1, 2])


def test_where_on_numbers_is_a_conditional_expression() -> None:
    assert v.where(True, "a", "b") == "a"
    assert v.where(False, "a", "b") == "b"
    assert v.where(0, 1, 2) == 2 and v.where(5, 1, 2) == 1  # truthiness, as `a if cond else b`


def test_where_goes_row_by_row_when_any_argument_is_a_column() -> None:
    _same(v.where(np.array([True, False, True]), 1, 2), [1, 2, 1], np.int64)
    _same(v.where(True, np.array([7, 8]), 0), [7, 8], np.int64)  # only the taken side is a column
    _same(v.where(False, 0, np.array([5, 6])), [5, 6], np.int64)  # only the other side is a column
    _same(v.where(True, 3, np.array([5, 6])), [3, 3], np.int64)  # a column on the side not taken


def test_either_is_or_as_a_bool() -> None:
    assert v.either(0, 0) is False
    assert v.either(0, 3) is True  # `bool(0 or 3)`, not 3
    assert v.either(2, 0) is True
    assert v.either(True, True) is True


def test_either_on_columns_is_a_row_by_row_or() -> None:
    a, b = np.array([True, True, False, False]), np.array([True, False, True, False])
    _same(v.either(a, b), [True, True, True, False], np.bool_)
    _same(v.either(False, np.array([False, True])), [False, True], np.bool_)
    _same(v.either(np.array([False, True]), False), [False, True], np.bool_)


def test_lmax_and_lmin_on_numbers_are_max_and_min() -> None:
    assert v.lmax(3, 7, 5) == 7 and v.lmin(3, 7, 5) == 3
    assert v.lmax(4) == 4 and v.lmin(4) == 4
    # the first of equals, as max and min return it
    assert type(v.lmax(2, 2.0)) is int and type(v.lmin(2.0, 2)) is float


def test_lmax_on_columns_takes_every_argument_row_by_row() -> None:
    # rows: max(1, 4, 3) = 4, max(5, 2, 3) = 5
    _same(v.lmax(np.array([1, 5]), np.array([4, 2]), 3), [4, 5], np.int64)
    # two arguments, the second the larger in row 0; the first the larger in row 1
    _same(v.lmax(np.array([1, 5]), np.array([4, 2])), [4, 5], np.int64)
    # the first argument the largest everywhere: it must not be dropped
    _same(v.lmax(np.array([9, 9]), np.array([1, 2]), 0), [9, 9], np.int64)
    # a number first, the column later
    _same(v.lmax(2, np.array([1, 3])), [2, 3], np.int64)
    _same(v.lmax(np.array([1, 3])), [1, 3], np.int64)


def test_lmin_on_columns_takes_every_argument_row_by_row() -> None:
    # rows: min(1, 4, 3) = 1, min(5, 2, 3) = 2
    _same(v.lmin(np.array([1, 5]), np.array([4, 2]), 3), [1, 2], np.int64)
    _same(v.lmin(np.array([1, 5]), np.array([4, 2])), [1, 2], np.int64)
    _same(v.lmin(np.array([0, 0]), np.array([1, 2]), 5), [0, 0], np.int64)
    _same(v.lmin(2, np.array([1, 3])), [1, 2], np.int64)
    _same(v.lmin(np.array([1, 3])), [1, 3], np.int64)


def test_ceil_rounds_up_to_an_int() -> None:
    assert v.ceil(2.1) == 3 and type(v.ceil(2.1)) is int
    assert v.ceil(2.0) == 2 and v.ceil(-1.5) == -1
    _same(v.ceil(np.array([0.5, 2.0, -1.5])), [1, 2, -1], np.int64)


def test_to_int_truncates_toward_zero() -> None:
    assert v.to_int(2.9) == 2 and v.to_int(-2.9) == -2 and type(v.to_int(2.9)) is int
    _same(v.to_int(np.array([2.9, -2.9, 4.0])), [2, -2, 4], np.int64)


def test_neg_is_not() -> None:
    assert v.neg(0) is True and v.neg(3) is False and v.neg(False) is True
    _same(v.neg(np.array([True, False])), [False, True], np.bool_)


def test_num_reads_an_absent_count_as_zero() -> None:
    assert v.num(None) == 0 and v.num(0) == 0 and v.num(5) == 5
    col = np.array([0, 3])
    assert v.num(col) is col  # a column already holds 0 for "none"


def test_per_value_calls_f_once_per_distinct_value_and_puts_it_back_in_every_row() -> None:
    calls: list[int] = []

    def f(x: int) -> int:
        calls.append(x)
        return 10 * x + 1

    assert v.per_value(f, 3) == 31 and calls == [3]
    calls.clear()
    out = v.per_value(f, np.array([4, 2, 4, 0]))
    # distinct values 0, 2, 4 (sorted, each once as a Python int): 1, 21, 41, back in row order
    assert calls == [0, 2, 4] and all(type(c) is int for c in calls)
    assert out.tolist() == [41, 21, 41, 1]
