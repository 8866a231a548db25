"""Facts for the doctor's checks: GPUs from the autospec NVML fake (through the real gatherer and the
probes' gate), the host and packages from a recorded CPU machine (``data/cpu_host.json``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from autotune.probes.testing import FakeGpu, fake_nvml

from autotune.doctor import Facts, HostFacts, gather_facts

DATA = Path(__file__).parent / "data"
GiB = 1024**3


def recorded_host(**changes: Any) -> HostFacts:
    """The host facts recorded on a CPU machine (2 cores, 24 GiB), with ``changes``."""
    data = json.loads((DATA / "cpu_host.json").read_text())["host"]
    data["out_dir"] = Path(data["out_dir"])
    return dataclasses.replace(HostFacts(**data), **changes)


def recorded_packages() -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """Versions and Requires-Dist of the watched packages, as recorded on that machine."""
    data = json.loads((DATA / "cpu_host.json").read_text())
    return dict(data["packages"]), {k: tuple(v) for k, v in data["requirements"].items()}


def gpu_facts(
    gpus: list[FakeGpu] | int = 2,
    *,
    environ: Mapping[str, str] | None = None,
    host: HostFacts | None = None,
    **fake_kwargs: Any,
) -> Facts:
    """Facts read through the real gatherer from a fake NVML (GPUs) and the recorded host."""
    fake = fake_nvml(gpus, **fake_kwargs)
    chosen = host or recorded_host()
    facts = gather_facts(
        chosen.out_dir, nvml=fake.module, environ=environ or {}, host=lambda *_a, **_k: chosen
    )
    packages, requirements = recorded_packages()
    return dataclasses.replace(facts, packages=packages, requirements=requirements, importable={})


@pytest.fixture
def make_facts() -> Callable[..., Facts]:
    return gpu_facts
