"""Every override the verl backend writes, composed by hydra from verl 0.9.1's own ``ppo_trainer`` config.

Runs in the interpreter that has verl's config files and hydra (``$AUTOTUNE_VERL_PYTHON``, or
``.venv-verl``; see ``test_verl_export.py``): one process composes every trial's override list. Checks:
each knob's default in ``search_spaces/verl.yaml`` is verl's; every value of every knob, rendered into a
real trial's argv, composes and lands where verl reads it; the baseline trial passes verl's batch rules.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autotune.backends.verl.backend import VerlBackend
from autotune.records import TrialSpec
from autotune.space import load_space
from tests.backends.test_verl.test_verl_backend import baseline, make_ctx
from tests.backends.test_verl.test_verl_export import check_verl_rules, verl_python  # noqa: F401

_COMPOSE_MANY = r"""
import importlib.util, json, os, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
spec = importlib.util.find_spec("verl")
config_dir = os.path.join(spec.submodule_search_locations[0], "trainer", "config")
out = []
with initialize_config_dir(config_dir=config_dir, version_base=None):
    for overrides in json.load(sys.stdin):
        try:
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
            out.append({"config": OmegaConf.to_container(cfg, resolve=False)})
        except Exception as exc:  # report which list failed, with hydra's own message
            out.append({"error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


def compose_many(python: str, lists: list[list[str]]) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [python, "-c", _COMPOSE_MANY], input=json.dumps(lists), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def lookup(cfg: dict[str, Any], key: str) -> Any:
    node: Any = cfg
    for part in key.lstrip("+").split("."):
        node = node[part]
    return node


def trial_argv(tmp_path: Path, params: dict[str, Any]) -> list[str]:
    backend = VerlBackend(python="python3")
    ctx = make_ctx(tmp_path)
    spec = TrialSpec(number=2, params=params, derived=backend.derive(params, ctx))
    return list(backend.render(spec, ctx).argv[3:])


def _variants() -> list[dict[str, Any]]:
    """The baseline, then every value of every knob (its conditions made true) over the baseline."""
    backend = VerlBackend()
    space = load_space(backend.default_space(), backend="verl", known_knobs=backend.knob_names)
    base = baseline(backend)
    out = [base]
    for knob in space.knobs:
        for value in knob.values():
            params = {**base, **{k: v[0] for k, v in knob.when.items()}, knob.name: value}
            out.append(space.active(params))
    return out


def test_every_knob_default_is_verls(verl_python: str) -> None:  # noqa: F811
    (result,) = compose_many(verl_python, [[]])
    cfg = result["config"]
    space = load_space(VerlBackend().default_space(), backend="verl")
    for knob in space.knobs:
        assert lookup(cfg, knob.name) == knob.default, knob.name


def test_every_knob_value_composes_and_lands(tmp_path: Path, verl_python: str) -> None:  # noqa: F811
    variants = _variants()
    argvs = [trial_argv(tmp_path / str(i), params) for i, params in enumerate(variants)]
    results = compose_many(verl_python, argvs)
    assert len(results) == len(argvs) > 40
    for params, argv, result in zip(variants, argvs, results, strict=True):
        assert "error" not in result, f"{result.get('error')} for {argv}"
        cfg = result["config"]
        for item in argv:
            key, _, text = item.partition("=")
            want = json.loads(text.lower()) if text in ("true", "false") else text
            got = lookup(cfg, key)
            if isinstance(got, list):
                assert "[" + ",".join(map(str, got)) + "]" == text, key
            elif isinstance(want, bool):
                assert got is want, key
            else:
                assert str(got) == str(want) or float(got) == float(want), key
        for name, value in params.items():
            assert lookup(cfg, name) == value, name
        assert cfg["trainer"]["save_freq"] == -1 and cfg["trainer"]["val_before_train"] is False


def test_baseline_trial_passes_verls_batch_rules(tmp_path: Path, verl_python: str) -> None:  # noqa: F811
    (result,) = compose_many(verl_python, [trial_argv(tmp_path, baseline(VerlBackend()))])
    cfg = result["config"]
    check_verl_rules(cfg)
    assert cfg["algorithm"]["adv_estimator"] == "grpo"
    assert cfg["data"]["train_batch_size"] * cfg["actor_rollout_ref"]["rollout"]["n"] == 64


def test_a_misspelt_knob_would_be_refused(verl_python: str) -> None:  # noqa: F811
    (result,) = compose_many(verl_python, [["actor_rollout_ref.actor.use_dynamic_bsize=true"]])
    assert "error" in result and "use_dynamic_bsize" in result["error"]


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_trials_own_ray_cluster_and_force_full_length_completions_in_verls_config(
    tmp_path: Path,
    verl_python: str,  # noqa: F811
) -> None:
    """What only a trial sets lands where verl 0.9.1 reads it (``main_ppo.py``: ``ray.init(**ray_kwargs.
    ray_init)``; the rollout's ``ignore_eos``): no dashboard, an explicit CPU count, full-length completions."""
    (result,) = compose_many(verl_python, [trial_argv(tmp_path, baseline(VerlBackend()))])
    cfg = result["config"]
    ray_init = cfg["ray_kwargs"]["ray_init"]
    assert ray_init["include_dashboard"] is False
    assert isinstance(ray_init["num_cpus"], int) and ray_init["num_cpus"] >= 1
    assert cfg["actor_rollout_ref"]["rollout"]["ignore_eos"] is True
