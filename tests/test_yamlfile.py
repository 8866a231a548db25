"""read_yaml: one reader, one-line errors naming the file and the flag that fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import SpaceError, UsageError
from autotune.yamlfile import read_yaml


def test_reads_a_mapping_and_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("beta: 0.04\nname: x\n")
    (tmp_path / "empty.yaml").write_text("")
    assert read_yaml(tmp_path / "a.yaml", what="x", flag="--x") == {"beta": 0.04, "name": "x"}
    assert read_yaml(str(tmp_path / "empty.yaml"), what="x", flag="--x") is None


def test_each_problem_is_one_line_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"search-space file .*nope.yaml does not exist") as missing:
        read_yaml(tmp_path / "nope.yaml", what="search-space", flag="--space")
    assert missing.value.hint == "Check the --space path"
    with pytest.raises(UsageError, match="cannot read --baseline file"):
        read_yaml(tmp_path, what="--baseline", flag="--baseline")  # a directory
    (tmp_path / "bad.yaml").write_text("a: 1\nb: [1, 2\n")
    with pytest.raises(SpaceError, match="is not valid YAML at line 3") as bad:
        read_yaml(tmp_path / "bad.yaml", what="search-space", flag="--space", error=SpaceError)
    assert "\n" not in str(bad.value)
