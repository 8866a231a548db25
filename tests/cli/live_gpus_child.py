"""Drives the search's live view with one running trial on two fake GPUs (``probes.testing``), for
``test_live_gpus.py``: utilisation 10 % until the file named by argv[1] exists, then 90 %; the trial
enters its rollout phase at its first step. Exits once the file named by argv[2] exists."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

from autotune.probes.nvml import NvmlSampler
from autotune.probes.testing import FakeGpu, fake_nvml
from rich.console import Console

from autotune.cli._live import RichView


def main() -> None:
    switch, done = Path(sys.argv[1]), Path(sys.argv[2])
    gpus = [FakeGpu(gpu_util_pct=10, power_mw=100_000), FakeGpu(gpu_util_pct=10, power_mw=120_000)]
    fake = fake_nvml(gpus)
    view = RichView(Console(), gpu_lines_every_s=0.3)
    view.study_started(SimpleNamespace(confirm_runs=2), 0, 3)
    view.trial_started(1, {"per_device_train_batch_size": 4}, False)
    phase = SimpleNamespace(phase=None)
    run = view.gpu_board().open("trial 1", lambda: phase if phase.phase else None)
    factory = run.samplers(
        lambda pid: [NvmlSampler([0, 1], nvml=fake.module, interval_s=0.05, slow_interval_s=0.2, gpm=False)]
    )
    assert factory is not None
    samplers = factory(0)
    for s in samplers:
        s.start()
    deadline = time.monotonic() + 60
    while not done.exists() and time.monotonic() < deadline:
        if switch.exists() and gpus[0].gpu_util_pct != 90:
            for g in gpus:
                g.gpu_util_pct = 90
            run.stepped(1)
            phase.phase = "rollout"
            view.trial_step(1, 1, 2.5)
        time.sleep(0.05)
    for s in samplers:
        s.stop()
    run.close()
    view.close()


if __name__ == "__main__":
    main()
