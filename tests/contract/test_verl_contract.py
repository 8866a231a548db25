"""Every override list the verl backend renders, composed by hydra over verl 0.9.1's own config.

On a seeded sample of the verl plan (:mod:`tests.contract.plan_sample`), half of it under a user's job
whose overrides were read by the backend, each trial's ``key=value`` list is composed by hydra from
verl's ``ppo_trainer`` config in the verl environment (``$AUTOTUNE_VERL_PYTHON``), one interpreter for
the whole sample: a key verl's config does not have, or a value its schema refuses, fails here.

verl's own ``verl.utils.config.validate_config`` cannot run there: every ``verl.*`` import runs
``verl/__init__``, which imports ``verl.protocol`` (numpy, ray, tensordict, torch), and
``validate_config`` builds ``verl.workers.config.FSDPActorConfig`` (torch, transformers). The composed
config is therefore checked against the batch rules ``validate_config`` and ``ActorConfig.validate``
assert (:func:`tests.backends.test_verl.test_verl_export.check_verl_rules`), which ``validate_config``
applies only without dynamic batch size (``if not config.actor_rollout_ref.actor.use_dynamic_bsz``).

Composing 200 configurations with hydra takes over a minute of CPU: the test is in the e2e tier.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autotune.backends.verl.backend import VerlBackend
from tests.backends.test_verl.test_verl_compose import _COMPOSE_MANY, lookup
from tests.backends.test_verl.test_verl_export import check_verl_rules, verl_python  # noqa: F401
from tests.contract.plan_sample import SAMPLE, plan_sample


def compose_many(python: str, lists: list[list[str]]) -> list[dict[str, Any]]:
    """Each override list composed by hydra over verl's config, in one verl interpreter (hydra composes
    verl's config in about half a second of CPU: a sample takes minutes on a loaded host)."""
    proc = subprocess.run(
        [python, "-c", _COMPOSE_MANY], input=json.dumps(lists), capture_output=True, text=True, timeout=3600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


#: a user's job after `--` (hydra overrides)
JOB = [
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.project_name=mine",
]


@pytest.mark.e2e
def test_every_rendered_override_list_composes_and_keeps_verls_rules(
    tmp_path: Path,
    verl_python: str,  # noqa: F811
) -> None:
    backend = VerlBackend(python="python3")
    job = VerlBackend.parse_fixed_argv(JOB)
    sample = plan_sample(backend, tmp_path, seed=38, fixed_of=lambda i: job if i % 2 else {})
    assert len(sample) == SAMPLE
    argvs = [list(backend.render(item.spec, item.ctx).argv[3:]) for item in sample]
    results = compose_many(verl_python, [*argvs, ["actor_rollout_ref.actor.use_dynamic_bsize=true"]])
    *composed, refused = results
    assert "error" in refused and "use_dynamic_bsize" in refused["error"]  # the check can fail
    for item, argv, result in zip(sample, argvs, composed, strict=True):
        assert "error" not in result, f"hydra refuses {argv}: {result['error']}"
        cfg: dict[str, Any] = result["config"]
        for name, value in item.params.items():
            assert lookup(cfg, name) == value, (name, argv)
        if not cfg["actor_rollout_ref"]["actor"]["use_dynamic_bsz"]:
            check_verl_rules(cfg)
        if item.ctx.fixed:
            assert lookup(cfg, "actor_rollout_ref.actor.optim.lr") == 1e-6


def test_a_misspelt_override_is_refused_with_verls_nearest_key(verl_python: str) -> None:  # noqa: F811
    """The user's overrides are composed once, by hydra over verl's config, before any trial: a key verl
    does not have is one line with its nearest key, a value hydra cannot read is hydra's own line (verl's
    YAML config types no leaf: ``optim.lr=fast`` composes, and fails in verl's dataclasses at start-up)."""
    from autotune.errors import UsageError
    from autotune.fixed import UnknownFlag

    backend = VerlBackend(python=verl_python)
    with pytest.raises(
        UnknownFlag, match=r"did you mean actor_rollout_ref\.actor\.use_dynamic_bsz\?"
    ) as info:
        backend.check_flags(
            {}, {"actor_rollout_ref.actor.use_dynamic_bsize": "true", "trainer.project_name": "x"}
        )
    assert "\n" not in info.value.one_line()
    with pytest.raises(UsageError, match="verl's config refuses"):
        backend.check_flags({}, {"trainer.logger": "[console"})
    assert backend.check_flags({}, {"actor_rollout_ref.actor.optim.lr": "1e-6"}) == []
