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


def _bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nknobs: *a{levels - 1}\n"


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    """A billion laughs: 10 levels of ten aliases each are 10**10 values once expanded."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(10))
    with pytest.raises(SpaceError, match=r"expands to more than 100000 values through its aliases"):
        read_yaml(path, what="search-space", flag="--space", error=SpaceError)
    # a few aliases, as people write them, are fine
    path.write_text("base: &b {type: int, choices: [1, 2], default: 1}\nknobs:\n  x: *b\n  y: *b\n")
    assert read_yaml(path, what="x", flag="--x")["knobs"]["y"]["choices"] == [1, 2]


def test_an_alias_inside_itself_a_deep_nesting_and_a_huge_file_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "self.yaml").write_text("a: &a [1, *a]\n")
    with pytest.raises(UsageError, match="nests too deeply"):
        read_yaml(tmp_path / "self.yaml", what="--fixed", flag="--fixed")
    (tmp_path / "deep.yaml").write_text("[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(UsageError, match="nests too deeply"):
        read_yaml(tmp_path / "deep.yaml", what="--fixed", flag="--fixed")
    (tmp_path / "big.yaml").write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(UsageError, match="larger than 1 MiB") as big:
        read_yaml(tmp_path / "big.yaml", what="--fixed", flag="--fixed")
    assert "\n" not in str(big.value)
