from __future__ import annotations

import pytest

from autotune.app.durations import format_duration, parse_duration_s
from autotune.errors import UsageError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("30m", 1800),
        ("1h30m", 5400),
        ("2.5h", 9000),
        ("1h 2m 3s", 3723),
        ("500ms", 0.5),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "10x", "m", "-5m", "0", "30m abc", "1.2.3h"])
def test_nonsense_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="is not a duration"):
        parse_duration_s(text)


def test_format() -> None:
    assert format_duration(5.25) == "5.2s"
    assert format_duration(3725) == "1h 2m 5s"
    assert format_duration(125) == "2m 5s"
