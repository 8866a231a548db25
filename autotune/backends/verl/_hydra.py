"""The user's verl overrides, composed by hydra over verl's own ``ppo_trainer`` config, before any trial.

verl reads its command line with hydra: a key its config does not have (``use_dynamic_bsize``) or a value
the config's schema refuses stops ``main_ppo`` at start-up. The same composition runs once per study in
verl's interpreter (where its config files and hydra are), so such an override is refused in one line,
with the nearest key of verl's config, before the study directory exists.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from typing import Any

from autotune.errors import UsageError
from autotune.fixed import UnknownFlag

__all__ = ["check_overrides"]

_FRAMEWORK = "verl's config (hydra over ppo_trainer)"

_COMPOSE = r"""
import importlib.util, json, os, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

def paths(node, prefix=""):
    for key, value in node.items():
        yield prefix + str(key)
        if isinstance(value, dict):
            yield from paths(value, prefix + str(key) + ".")

overrides = json.load(sys.stdin)
config_dir = os.path.join(importlib.util.find_spec("verl").submodule_search_locations[0], "trainer", "config")
with initialize_config_dir(config_dir=config_dir, version_base=None):
    try:
        compose(config_name="ppo_trainer", overrides=overrides)
        answer = {"ok": True}
    except Exception as exc:
        base = OmegaConf.to_container(compose(config_name="ppo_trainer"), resolve=False)
        answer = {"ok": False, "error": str(exc).strip().splitlines()[0], "keys": sorted(paths(base))}
print("AUTOTUNE_HYDRA " + json.dumps(answer))
"""


def _compose(python: str, overrides: list[str], timeout_s: float) -> dict[str, Any] | None:
    """hydra's answer for ``overrides`` in verl's interpreter; None when that interpreter cannot compose
    verl's config at all (no hydra or no verl there: the probe and the trials say so)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}
    try:
        proc = subprocess.run(
            [python, "-c", _COMPOSE],
            input=json.dumps(overrides),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in proc.stdout.splitlines():
        if line.startswith("AUTOTUNE_HYDRA "):
            return json.loads(line.split(" ", 1)[1])
    return None


def check_overrides(python: str, flat: Mapping[str, str], *, timeout_s: float = 120.0) -> None:
    """Compose the user's overrides (``key`` → value text, as the trials render it) over verl's config.

    Raises:
        UnknownFlag: a key verl's config does not have, with its nearest key.
        UsageError: a value hydra or verl's config schema refuses, with hydra's own line.
    """
    if not flat:
        return
    answer = _compose(python, [f"{k}={v}" for k, v in flat.items()], timeout_s)
    if answer is None or answer["ok"]:
        return
    keys = set(answer["keys"])
    for name in flat:
        if name not in keys:
            raise UnknownFlag(name, keys, framework=_FRAMEWORK, place="your job's overrides")
    raise UsageError(
        f"verl's config refuses your job's overrides: {answer['error']}",
        hint="Check the value against verl's ppo_trainer config",
    )
