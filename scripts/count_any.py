"""How loosely typed the package is: the ``Any`` and ``dict[str, Any]`` in its annotations, per folder.

    python scripts/count_any.py            # a table: folder, Any, dict[str, Any]
    python scripts/count_any.py --json     # the same as one JSON object

Counted from the parsed source (``ast``), not by grepping text, so a comment or a docstring that says
``Any`` is not counted: each ``Any`` name (``Any`` or ``typing.Any``) in an annotation, a type alias or a
``cast`` (an ``import`` of it is not a use), each ``dict[str, Any]`` / ``Dict[str, Any]``, and each
``Mapping[str, Any]`` / ``MutableMapping[str, Any]`` subscript. The folders are
the three the project tracks (autotune/, probes/, reports/).
"""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("autotune", "probes", "reports")
DICTS = {"dict", "Dict"}
MAPPINGS = {"Mapping", "MutableMapping"}


@dataclass(frozen=True)
class Counts:
    any_names: int
    str_any_dicts: int
    str_any_mappings: int


def _is_any(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "Any"
    return isinstance(node, ast.Attribute) and node.attr == "Any"


def _is_str_any(node: ast.AST, names: set[str]) -> bool:
    if not isinstance(node, ast.Subscript):
        return False
    base = node.value
    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    args = node.slice
    return (
        name in names
        and isinstance(args, ast.Tuple)
        and len(args.elts) == 2
        and isinstance(args.elts[0], ast.Name)
        and args.elts[0].id == "str"
        and _is_any(args.elts[1])
    )


def _annotation_strings(tree: ast.AST) -> list[ast.AST]:
    """String annotations (``"dict[str, Any]"``) parsed, so quoted types count like bare ones."""
    parsed: list[ast.AST] = []
    for node in ast.walk(tree):
        for ann in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
                try:
                    parsed.append(ast.parse(ann.value, mode="eval"))
                except SyntaxError:
                    continue
    return parsed


def count_file(path: Path) -> Counts:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = [node for root in (tree, *_annotation_strings(tree)) for node in ast.walk(root)]
    return Counts(
        any_names=sum(1 for n in nodes if _is_any(n)),
        str_any_dicts=sum(1 for n in nodes if _is_str_any(n, DICTS)),
        str_any_mappings=sum(1 for n in nodes if _is_str_any(n, MAPPINGS)),
    )


def _sum(counts: list[Counts]) -> Counts:
    return Counts(
        *(sum(getattr(c, f) for c in counts) for f in ("any_names", "str_any_dicts", "str_any_mappings"))
    )


def count_folder(folder: Path) -> Counts:
    return _sum([count_file(p) for p in sorted(folder.rglob("*.py"))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    counts = {name: count_folder(ROOT / name) for name in FOLDERS}
    total = _sum(list(counts.values()))
    if args.json:
        rows = {k: vars(v) for k, v in {**counts, "total": total}.items()}
        print(json.dumps(rows, indent=2))
        return
    print(f"{'folder':<10} {'Any':>6} {'dict[str, Any]':>15} {'Mapping[str, Any]':>18}")
    for name, c in {**counts, "total": total}.items():
        print(f"{name:<10} {c.any_names:>6} {c.str_any_dicts:>15} {c.str_any_mappings:>18}")


if __name__ == "__main__":
    main()
