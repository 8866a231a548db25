"""Every ``swift rlhf`` argv the ms-swift backend renders, parsed by ms-swift's own ``RLHFArguments``.

On a seeded sample of the ms-swift plan (:mod:`tests.contract.plan_sample`), half of it under a user's
job, each trial's argv goes through the parser ``swift rlhf`` builds (``swift.utils.parse_args``:
transformers' ``HfArgumentParser`` over ``RLHFArguments``, with ms-swift's own type-hint patch), in the
ms-swift environment (``$AUTOTUNE_SWIFT_PYTHON``): one interpreter for the whole sample. A flag
ms-swift does not have, or a value its field type or choices refuse, fails here. Building the dataclass
itself (``RLHFArguments.__post_init__``) loads the model and the dataset, which is a trial's work, not a
parser's: the e2e tests do that.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autotune.backends.swift.backend import SwiftBackend
from tests.contract.plan_sample import SAMPLE, plan_sample

pytestmark = pytest.mark.swift

_PARSE_MANY = r"""
import contextlib, io, json, sys
from swift.arguments import RLHFArguments
from swift.utils.utils import _patch_get_type_hints
from transformers import HfArgumentParser
with _patch_get_type_hints():
    parser = HfArgumentParser([RLHFArguments])
out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            namespace, rest = parser.parse_known_args(argv)
        out.append({"rest": rest, "given": {k: repr(v) for k, v in vars(namespace).items()}})
    except SystemExit:
        out.append({"error": err.getvalue().strip().splitlines()[-1]})
print("AUTOTUNE_PARSED " + json.dumps(out))
"""


def _swift_python() -> str:
    python = os.environ.get("AUTOTUNE_SWIFT_PYTHON") or str(Path(".venv-swift/bin/python").absolute())
    if not Path(python).exists():
        pytest.skip(f"no ms-swift environment at {python} (set AUTOTUNE_SWIFT_PYTHON)")
    return python


def parse_many(python: str, argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Each argv through ``swift rlhf``'s parser, in one ms-swift interpreter."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [python, "-c", _PARSE_MANY],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("AUTOTUNE_PARSED ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].split(" ", 1)[1])


#: a user's job after `--`, as ms-swift users write it
JOB = {"beta": "0.04", "learning_rate": "1e-5", "temperature": "0.9", "tuner_type": "lora", "lora_rank": "8"}


#: argvs ms-swift must refuse, proving the check can fail: a flag it does not have, a value of the wrong type
REFUSED = [
    ["--rlhf_type", "grpo", "--vllm_max_num_sequences", "8"],
    ["--rlhf_type", "grpo", "--beta", "high"],
]


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """The sample's argvs and ms-swift's reading of each, then of :data:`REFUSED` (one interpreter)."""
    python = _swift_python()
    backend = SwiftBackend(executable="swift", version="4.6.0", python=python)
    sample = plan_sample(
        backend, tmp_path_factory.mktemp("swift"), seed=38, fixed_of=lambda i: JOB if i % 2 else {}
    )
    assert len(sample) == SAMPLE
    argvs = []
    for item in sample:
        argv = list(backend.render(item.spec, item.ctx).argv)
        assert argv[1] == "rlhf", argv
        argvs.append(argv[2:])
    return argvs, parse_many(python, [*argvs, *REFUSED])


def test_every_rendered_argv_parses_with_rlhf_arguments(
    parsed: tuple[list[list[str]], list[dict[str, Any]]],
) -> None:
    argvs, results = parsed
    assert any("--use_vllm" in a and a[a.index("--use_vllm") + 1] == "true" for a in argvs)
    for argv, result in zip(argvs, results[: len(argvs)], strict=True):
        assert "error" not in result, f"swift rlhf refuses {argv}: {result['error']}"
        assert result["rest"] == [], f"swift rlhf does not know {result['rest']} (argv {argv})"
        assert result["given"]["rlhf_type"] == "'grpo'"


def test_a_flag_ms_swift_refuses_fails_here(parsed: tuple[list[list[str]], list[dict[str, Any]]]) -> None:
    """The check can fail: a flag ms-swift does not have, a value its field type refuses."""
    typo, bad = parsed[1][-2:]
    assert typo["rest"] == ["--vllm_max_num_sequences", "8"]
    assert "invalid float value: 'high'" in bad["error"]


def test_a_misspelt_job_flag_is_refused_with_ms_swifts_nearest_field(tmp_path: Path) -> None:
    """The user's flags are checked against the installed ``RLHFArguments`` fields (read once in the
    ms-swift environment, then cached): a typo is one line with the nearest field, before any trial."""
    from autotune.fixed import UnknownFlag

    python = _swift_python()
    backend = SwiftBackend(executable="swift", version="4.6.0", python=python, flag_cache_dir=tmp_path)
    with pytest.raises(UnknownFlag, match=r"did you mean vllm_max_num_seqs\?") as info:
        backend.check_flags({}, {"beta": "0.04", "vllm_max_num_sequence": "8"})
    assert info.value.name == "vllm_max_num_sequence" and "\n" not in info.value.one_line()
    assert backend.check_flags({}, {"beta": "0.04", "vllm_max_num_seqs": "8"}) == []
