"""The house rules the code keeps, checked on its source: a framework's facts live in its backend,
imports point one way (probes → core → application/CLI, and floor by floor inside the core: FLOORS) and
never in a circle.

Read from the source as text (``ast``): nothing here imports the modules it checks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
#: installed package name → folder in the repository (pyproject's package-dir mapping)
FOLDERS = {
    "autotune.probes": ROOT / "probes",
    "autotune.reports": ROOT / "reports",
    "autotune.search_spaces": ROOT / "search_spaces",
    "autotune": ROOT / "autotune",
}
APPLICATION = ("autotune.app", "autotune.cli", "autotune.__main__")  # __main__: `python -m autotune`


def _modules() -> dict[str, Path]:
    """Every module of the installed package: dotted name → source file."""
    out: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            if package == "autotune" and parts and parts[0] in ("probes", "reports", "search_spaces"):
                continue
            out.setdefault(name, path)
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path) -> Iterator[str]:
    """The modules of ours that ``module`` imports, anywhere in its source (lazy imports included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:
                    yield sub
                elif target in MODULES:
                    yield target


# The top-level package is the Python API's façade: ``autotune.load_study`` / ``search`` / ``plan`` are
# the application layer's (autotune.app.api), re-exported lazily by a module ``__getattr__`` so that
# ``import autotune`` loads nothing. That one lazy edge is allowed and left out of the graph; what keeps
# it lazy is checked below (test_the_facade_imports_its_api_lazily_and_nothing_else).
FACADE, FACADE_API = "autotune", "autotune.app.api"

GRAPH = {
    name: sorted(set(_imports(name, path)) - {name} - ({FACADE_API} if name == FACADE else set()))
    for name, path in MODULES.items()
}


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_package() -> None:
    assert "autotune.trial.runner" in GRAPH and "autotune.probes.nvml" in GRAPH
    assert "autotune.trial.evidence" in GRAPH["autotune.trial.runner"]  # a known edge is found


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_core_never_imports_the_application_layer() -> None:
    up = [
        (module, target)
        for module, targets in GRAPH.items()
        if not module.startswith(APPLICATION)
        for target in targets
        if target.startswith(APPLICATION)
    ]
    assert up == []


def test_the_facade_imports_its_api_lazily_and_nothing_else() -> None:
    """``autotune/__init__.py`` imports of ours only the API module and the version, and only inside a
    function or an ``if TYPE_CHECKING:`` block: importing the package runs none of it."""
    path = MODULES[FACADE]
    assert set(_imports(FACADE, path)) <= {FACADE_API, "autotune.app", "autotune.version"}
    tree = ast.parse(path.read_text())
    eager = [
        node.lineno
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(n.startswith("autotune") for n in _imported_names(node))
    ]
    assert eager == []


def _imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [node.module or ""]


def test_importing_autotune_loads_none_of_its_layers_or_heavy_dependencies() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, autotune; print(sorted(m for m in sys.modules"
        " if m.startswith(('autotune.', 'pandas', 'optuna', 'torch', 'rich', 'pydantic'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_probes_import_nothing_of_autotune_but_the_probes() -> None:
    out = [
        (module, target)
        for module, targets in GRAPH.items()
        if module.startswith("autotune.probes")
        for target in targets
        if not target.startswith("autotune.probes") and target != "autotune"
    ]
    assert out == []


def _outside_backends() -> Iterator[tuple[str, Path]]:
    for name, path in MODULES.items():
        if not name.startswith("autotune.backends"):
            yield name, path


def _backend_names() -> set[str]:
    from autotune.backends import BACKENDS

    return set(BACKENDS) | {"verl"}


def _string_constants(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for elt in node.elts for s in _string_constants(elt)]
    return []


def _names_a_backend(node: ast.AST) -> bool:
    """``backend``, ``req.backend``, ``w.backend``, ``self.backend_name``: an operand holding a backend."""
    if isinstance(node, ast.Name):
        return "backend" in node.id
    if isinstance(node, ast.Attribute):
        return "backend" in node.attr
    return False


def test_no_code_outside_the_backends_branches_on_a_backend_name() -> None:
    """``backend == "swift"``, ``w.backend in ("trl", ...)``: a framework's facts live in its backend."""
    names = _backend_names()
    found = []
    for module, path in _outside_backends():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                literals = {s for o in operands for s in _string_constants(o)}
                if literals & names and any(_names_a_backend(o) for o in operands):
                    found.append(f"{module}:{node.lineno}")
    assert found == []


def test_the_backend_name_check_can_fail() -> None:
    tree = ast.parse('if w.backend == "swift":\n    pass\nif fmt == "swift":\n    pass\n')
    flagged = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Compare) and any(_names_a_backend(o) for o in [n.left, *n.comparators])
    ]
    assert flagged == [1]


def _backend_home(module: str, names: set[str]) -> str | None:
    """The backend whose home ``module`` is in (``autotune.backends.swift.config`` → ``swift``), or None
    for the backends' shared modules (the contract, the registry, the shared vocabulary, ...)."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["autotune", "backends"] and parts[2] in names:
        return parts[2]
    return None


def _cross_backend_imports(graph: dict[str, list[str]], names: set[str]) -> list[str]:
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        if (home := _backend_home(module, names)) is not None
        for target in targets
        if (other := _backend_home(target, names)) is not None and other != home
    ]


def test_no_backend_imports_another_backends_modules() -> None:
    """What two frameworks share lives in a shared module under ``backends/`` (``_vocab``, ``_values``)
    or goes through the registry and the backend contract, never through another backend's modules."""
    assert _cross_backend_imports(GRAPH, _backend_names()) == []


def test_the_cross_backend_check_can_fail() -> None:
    names = _backend_names()
    graph = {
        "autotune.backends.command": ["autotune.backends.trl.config", "autotune.backends._registry"],
        "autotune.backends.trl.export": ["autotune.backends._vocab", "autotune.backends.trl.aliases"],
    }
    assert _cross_backend_imports(graph, names) == [
        "autotune.backends.command -> autotune.backends.trl.config"
    ]


def _packaged_knobs() -> dict[str, str]:
    """Knob name → the backend whose packaged space defines it."""
    out: dict[str, str] = {}
    for path in (ROOT / "search_spaces").glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        for knob in data["knobs"]:
            out[knob] = data["backend"]
    return out


def _jobconfig_fields() -> set[str]:
    from dataclasses import fields

    from autotune.jobconfig import JobConfig

    return {f.name for f in fields(JobConfig)}


# Modules that write another program's own vocabulary, which a framework's knob may share:
# DeepSpeed's JSON (``offload_optimizer``, ``offload_param``).
_OTHER_VOCABULARY = {"autotune.export.deepspeed"}


def test_no_framework_knob_is_named_outside_its_backend_and_space() -> None:
    """Adding a knob touches its backend, its space and their tests: no other code names it.

    A string that *is* a knob name, outside the backends, is a branch on the framework's vocabulary.
    JobConfig field names are the neutral words (``zero_stage``, ``sleep_level``): some equal a
    framework's knob name, so only knob names that are no field count. Prose in messages is free.
    """
    knobs = set(_packaged_knobs()) - _jobconfig_fields() - {"deepspeed"}  # also a package and a format
    assert "vllm_gpu_memory_utilization" in knobs  # the check has something to look for
    found = []
    for module, path in _outside_backends():
        if module in _OTHER_VOCABULARY:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = {
            id(n.body[0].value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body
            and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                hits = {
                    k
                    for k in knobs
                    if k == node.value or f"{k}=" in node.value or f" {k} " in f" {node.value} "
                }
                if hits:
                    found.append(f"{module}:{node.lineno} {sorted(hits)}")
    assert found == []


# -- search strategies: one class per strategy, reached through its contract -------------------------

#: words that name an operand holding a strategy's kind: ``strategy.kind``, ``cfg.search``, ``kind``
_STRATEGY_WORDS = ("kind", "search", "strategy")


def _strategy_registry() -> tuple[set[str], set[str]]:
    """The registered strategies' names and class names (``autotune.strategy.STRATEGIES``)."""
    from autotune.strategy import STRATEGIES

    return set(STRATEGIES), {entry.target.partition(":")[2] for entry in STRATEGIES.values()}


def _names_a_strategy(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return any(w in node.id.lower() for w in _STRATEGY_WORDS)
    if isinstance(node, ast.Attribute):
        return any(w in node.attr.lower() for w in _STRATEGY_WORDS)
    return False


def _strategy_branches(tree: ast.AST) -> list[int]:
    """Lines that branch on a strategy's kind: a comparison of a strategy-ish operand with a registered
    strategy's name (``strategy.kind == "grid"``, ``cfg.search in ("auto", "tpe")``), an
    ``isinstance`` on a registered strategy class, or a ``match`` on a strategy-ish subject with a case
    naming a strategy."""
    names, classes = _strategy_registry()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            literals = {s for o in operands for s in _string_constants(o)}
            if literals & names and any(_names_a_strategy(o) for o in operands):
                out.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
            kinds = node.args[1:2]
            if kinds and isinstance(kinds[0], ast.Tuple):
                kinds = list(kinds[0].elts)
            if any(isinstance(k, ast.Name | ast.Attribute) and _leaf(k) in classes for k in kinds):
                out.append(node.lineno)
        elif isinstance(node, ast.Match) and _names_a_strategy(node.subject):
            cases = {
                p.value.value
                for c in node.cases
                for p in ast.walk(c.pattern)
                if isinstance(p, ast.MatchValue) and isinstance(p.value, ast.Constant)
            }
            if cases & names:
                out.append(node.lineno)
    return sorted(out)


def _leaf(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def test_no_code_outside_the_strategies_branches_on_a_strategy_kind() -> None:
    """A strategy is added beside the others (``autotune/strategy/``, its registry entry), never as a
    branch on its name or class in the study loop, the application or the CLI."""
    found = [
        f"{module}:{line}"
        for module, path in MODULES.items()
        if not module.startswith("autotune.strategy")
        for line in _strategy_branches(ast.parse(path.read_text(), filename=str(path)))
    ]
    assert found == []


def test_the_strategy_kind_check_can_fail() -> None:
    source = (
        'if self.strategy.kind == "grid":\n    pass\n'  # 1: flagged
        'if cfg.search in ("auto", "tpe"):\n    pass\n'  # 3: flagged
        "if isinstance(s, GridStrategy):\n    pass\n"  # 5: flagged
        'match req.search:\n    case "random":\n        pass\n'  # 7: flagged
        'if fmt == "grid":\n    pass\n'  # 10: not a strategy operand
        'if setting.kind == "estimator":\n    pass\n'  # 12: not a strategy's name
        "if isinstance(p, Exhausted):\n    pass\n"  # 14: not a strategy class
    )
    assert _strategy_branches(ast.parse(source)) == [1, 3, 5, 7]


# -- rooms stay small -------------------------------------------------------------------------------

MAX_MODULE_LINES = 700


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _oversized(modules: dict[str, Path]) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines, with their length."""
    return [
        f"{name}: {n} lines"
        for name, path in sorted(modules.items())
        if (n := _lines(path)) > MAX_MODULE_LINES
    ]


def test_no_module_of_the_package_is_over_700_lines() -> None:
    assert any(name.startswith("autotune.study.") for name in MODULES)  # the check sees them
    assert any(name.startswith("autotune.reports.") for name in MODULES)
    assert _oversized(MODULES) == []


def test_the_module_size_check_can_fail(tmp_path: Path) -> None:
    big, small = tmp_path / "big.py", tmp_path / "small.py"
    big.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    small.write_text("x = 1\n" * MAX_MODULE_LINES)
    modules = {"autotune.export.big": big, "autotune.strategy.small": small}
    assert _oversized(modules) == [f"autotune.export.big: {MAX_MODULE_LINES + 1} lines"]


# -- the two records that cross the house are read through their reader, not by string key ----------

#: record → the names (a variable or an attribute, by its ending) that held it as a dict before it was
#: typed (TimelineSummary, a frozen dataclass; StudySettings, a pydantic model): a read by string key
#: of such a name is a dict creeping back in
KEYED_RECORDS = {"timeline summary": ("summary",), "study settings": ("settings",)}


def _holder(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _key_reads(tree: ast.AST) -> list[tuple[str, int]]:
    """``x["key"]`` and ``x.get("key")`` where ``x`` names one of :data:`KEYED_RECORDS`: (record, line)."""
    out = []
    for node in ast.walk(tree):
        target: ast.AST | None = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                target = node.func.value
        if target is None:
            continue
        name = _holder(target)
        out += [(record, node.lineno) for record, ends in KEYED_RECORDS.items() if name.endswith(ends)]
    return out


def _string_key_reads(modules: dict[str, Path]) -> list[str]:
    """Every module that reads either record by string key (none may: both are typed records now)."""
    out = []
    for name, path in sorted(modules.items()):
        reads = _key_reads(ast.parse(path.read_text(), filename=str(path)))
        if reads:
            where = ", ".join(f"{record} at line {line}" for record, line in reads)
            out.append(f"{name}: {len(reads)} string-key reads: {where}")
    return out


def test_no_string_key_read_of_the_timeline_summary_or_the_study_settings() -> None:
    assert _string_key_reads(MODULES) == []


def test_the_string_key_read_check_can_fail(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def f(rec, summary, sd, w):\n"
        "    a = summary['gpus']\n"
        "    b = rec.timeline_summary.get('host')\n"
        "    c = sd.read_settings()\n"
        "    summary['x'] = 1\n"  # a write is not a read
        "    d = w.settings.get('backend')\n"
        "    return a, b, c, d, summary.gpus, w.settings.backend\n"  # attribute reads are the way
    )
    reads = [("timeline summary", 2), ("timeline summary", 3), ("study settings", 6)]
    assert _key_reads(ast.parse(planted.read_text())) == reads
    found = _string_key_reads(
        {"autotune.trial.planted": planted, "autotune.studydir": MODULES["autotune.studydir"]}
    )
    assert found == [
        "autotune.trial.planted: 3 string-key reads: "
        "timeline summary at line 2, timeline summary at line 3, study settings at line 6"
    ]


# -- a trial result is made one way ------------------------------------------------------------------

#: the module whose named constructors make every TrialResult (running, interrupted, not_launched,
#: outline, measured) or read one back (from_json, from_dict)
RESULT_HOME = "autotune.records"
_RAW_RESULT = re.compile(
    r"(?:^|\.)TrialResult(?:\.model_(?:validate|validate_json|validate_strings|construct))?$"
)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _raw_results(modules: dict[str, Path]) -> list[str]:
    """Where a module outside :data:`RESULT_HOME` makes a TrialResult by hand: a call of the class or of
    pydantic's validators on it, or the class imported under another name (which would hide such a call)."""
    out = []
    for name, path in sorted(modules.items()):
        if name == RESULT_HOME:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and _RAW_RESULT.search(_dotted(node.func)):
                out.append(f"{name}:{node.lineno}: {_dotted(node.func)}(...)")
            elif isinstance(node, ast.ImportFrom):
                out += [
                    f"{name}:{node.lineno}: TrialResult imported as {a.asname}"
                    for a in node.names
                    if a.name == "TrialResult" and a.asname not in (None, "TrialResult")
                ]
    return out


def test_every_trial_result_is_made_by_its_named_constructors() -> None:
    assert RESULT_HOME in MODULES
    assert _raw_results(MODULES) == []


def test_the_trial_result_constructor_check_can_fail(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from autotune import records\n"
        "from autotune.records import TrialResult\n"
        "from autotune.records import TrialResult as R\n"
        "def f(raw):\n"
        "    a = TrialResult(number=1, params={}, status='COMPLETE', reason='')\n"
        "    b = records.TrialResult.model_validate(raw)\n"
        "    c = TrialResult.model_validate_json(raw)\n"
        "    d = TrialResult.running(1, {})\n"  # the named constructors are the way
        "    e = TrialResult.from_json(raw)\n"
        "    return a, b, c, d, e, R\n"
    )
    home = MODULES[RESULT_HOME]
    found = _raw_results({"autotune.study.planted": planted, RESULT_HOME: home})
    assert found == [
        "autotune.study.planted:3: TrialResult imported as R",
        "autotune.study.planted:5: TrialResult(...)",
        "autotune.study.planted:6: records.TrialResult.model_validate(...)",
        "autotune.study.planted:7: TrialResult.model_validate_json(...)",
    ], found


# -- floors: folders import downward only, and in no circle (imports inside functions included) -------

#: The house's floors, lowest first (docs/architecture.md, "Layers"). A module imports its own floor and
#: the floors below, never one above; folders that share a floor may import each other, in no circle.
#: Every folder has a floor (a new one is placed here when it is added).
FLOORS: tuple[tuple[str, ...], ...] = (
    # samplers that run beside or inside a trial: nothing of autotune but themselves
    ("autotune.probes",),
    # the core's records and rules: one root error, the version, typed records, spaces, values, texts
    (
        "autotune.errors",
        "autotune.version",
        "autotune.cachedir",
        "autotune.affinity",
        "autotune.jobconfig",
        "autotune.jobsemantics",
        "autotune.secrets",
        "autotune.plaintext",
        "autotune.tail",
        "autotune.writable",
        "autotune.yamlfile",
        "autotune.jsontypes",
        "autotune.values",
        "autotune.spacefile",
        "autotune.space",
        "autotune.fixed",
        "autotune.records",
        "autotune.studysettings",
        "autotune.recommend",
        "autotune.search_spaces",
        "autotune.assets",  # plugins that run inside ms-swift's process: they import nothing of ours
    ),
    ("autotune.studydir",),  # every file of a study, written and read one way
    ("autotune.estimate",),  # the memory and step-time model, catalogs, plan
    ("autotune.workload",),  # models and prompt datasets
    # the search strategies, the trackers, and what every export format is written with
    ("autotune.strategy", "autotune.trackers", "autotune.export"),
    ("autotune.backends",),  # one home per framework (its own export format builds on autotune.export)
    ("autotune.trial",),  # one trial
    ("autotune.study",),  # the study loop
    ("autotune.doctor",),  # the checks (they read the study's hardware)
    ("autotune.reports",),  # report.html / report.md from a study directory alone
    ("autotune.app",),  # the search, plan, profile and export jobs
    ("autotune.cli", "autotune.__main__"),  # one module per command
    (FACADE,),  # the Python API's façade (autotune.load_study, search, plan; the version)
)


def _folder(module: str) -> str:
    """The folder a module lives in (``autotune.study.loop`` → ``autotune.study``); a top module is its own."""
    head = ".".join(module.split(".")[:2])
    return head if _is_package(head) else module


def _floor(module: str) -> int | None:
    """The floor of ``module``'s folder in :data:`FLOORS` (None: a folder no floor names)."""
    folder = _folder(module)
    for i, floor in enumerate(FLOORS):
        if any(folder == f or (f != FACADE and folder.startswith(f"{f}.")) for f in floor):
            return i
    return None


def _upward_imports(graph: dict[str, list[str]]) -> list[str]:
    """``module -> target`` for every import from a lower floor to a higher one."""
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in targets
        if (low := _floor(module)) is not None and (high := _floor(target)) is not None and high > low
    ]


def test_every_folder_has_one_floor() -> None:
    placed = [f for floor in FLOORS for f in floor]
    assert len(placed) == len(set(placed))
    assert [m for m in MODULES if _floor(m) is None] == []


def test_no_import_from_a_lower_floor_to_a_higher_one() -> None:
    assert _upward_imports(GRAPH) == []


def test_the_floor_check_can_fail_on_an_import_inside_a_function(tmp_path: Path) -> None:
    # studydir (a floor below the study) reaching the study's recommendation inside a function, as it did
    planted = tmp_path / "studydir.py"
    planted.write_text(
        "def recommendation(sd):\n    from autotune.study.finish import Finisher\n    return Finisher\n"
    )
    edges = list(_imports("autotune.studydir", planted))
    assert edges == ["autotune.study.finish"]
    graph = {**GRAPH, "autotune.studydir": sorted({*GRAPH["autotune.studydir"], *edges})}
    assert _upward_imports(graph) == ["autotune.studydir -> autotune.study.finish"]
    # the same import the other way (the study reading the study directory) points down: allowed
    assert _upward_imports({"autotune.study.finish": ["autotune.studydir"]}) == []


def _folder_graph(graph: dict[str, list[str]]) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = out.setdefault(_folder(module), set())
        edges.update(_folder(t) for t in targets if _folder(t) != _folder(module))
    return {k: sorted(v) for k, v in out.items()}


def test_no_circle_between_folders() -> None:
    assert _cycles(_folder_graph(GRAPH)) == []


def test_the_folder_circle_check_can_fail(tmp_path: Path) -> None:
    # an import inside a function is read as an edge
    planted = tmp_path / "nvml.py"
    planted.write_text("def f():\n    from autotune.cli import app\n    return app\n")
    assert list(_imports("autotune.probes.nvml", planted)) == ["autotune.cli.app"]
    # the probes (below everything) importing the CLI, which reaches them: a circle of folders
    graph = {**GRAPH, "autotune.probes.nvml": [*GRAPH["autotune.probes.nvml"], "autotune.cli.app"]}
    circles = _cycles(_folder_graph(graph))
    assert any("autotune.probes" in c and "autotune.cli" in c for c in circles), circles
