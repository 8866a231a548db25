"""Early calls: end a failed trial as soon as its evidence is unambiguous, not when it exits on its own
or when the watchdog's no-step limit comes.

On real GPUs every minute a failed trial keeps running is GPU time on all of its GPUs. The runner
(:mod:`autotune.trial.runner`) asks these rules on every watchdog check when
``WatchdogConfig.early_calls`` is on; each call is made from evidence, and the evidence is recorded.

1. **A fatal line** (:class:`FatalLines`). The framework printed text that a failure pattern recognises
   (the backend's and :data:`autotune.trial.evidence.COMMON_PATTERNS`: CUDA OOM, vLLM's start-up
   refusals, NCCL's watchdog, torchrun's report of a SIGKILL, argument rejections before the first
   step). vLLM engine processes and Ray actors often live on for minutes after it. The process gets
   ``fatal_grace_s`` to finish its traceback (and to exit by itself, which changes nothing); then its
   group is ended. A step record after the line cancels the call: the framework recovered, and the
   trial is left to end as it would have. The outcome is decided from the same text as before, so the
   status and reason do not change.
2. **GPU spin** (:class:`GpuSpinWatch`, NVML only). No step, while every one of the trial's GPUs (at
   least two) is busy — utilization ≥ ``spin_util_pct`` — at low power — ≤ ``spin_power_frac`` of its
   enforced limit — on every sample, for the spin window. This is a collective waiting for a peer that
   never comes: NCCL's kernel polls a flag, so NVML counts a kernel running all the time (100 %), while
   the SMs do no work and the board draws close to idle.
3. **A weight sync that never ends** (the parser's :meth:`~autotune.backends.StepParser.open_phase`).
   The framework's own log shows the trial entered its weight sync (a blocking collective on every
   rank) and did not leave it, with no step, for the sync window. The backend owns the lines (or
   markers) and cites where the framework prints them.

Thresholds and windows (:class:`EarlyCallConfig`), and why:

- ``spin_util_pct`` 90: a spinning NCCL kernel reads 100 % (the counter is the share of time *any*
  kernel ran); 90 leaves room for samples that straddle the kernel's launch.
- ``spin_power_frac`` 0.25 of the enforced power limit: idle boards draw 10-20 % of their limit (H100
  ≈ 70 W of 700 W, A100 ≈ 55 W of 400 W), a spin barely more; decoding — the other busy-but-cool
  phase, memory-bound — sits between that and the 55 % the timeline calls training
  (``probes.timeline.InferenceThresholds.train_power_frac``). NVML power is a one-second average, so
  any second of real work breaks the run of samples. Without a known power limit nothing is called.
- At least two GPUs: a collective needs a peer; one GPU busy at low power is a decode. "Every GPU":
  while one rank works alone (rank 0 scoring rewards, saving, preprocessing) the others wait in a
  collective at exactly this signature, but the working rank's GPU is idle or hot, so the trial is
  not called.
- Spin window ``max(spin_floor_s, spin_k × median step)`` = max(30 s, 2 × median step). Every
  busy-and-cool phase of a healthy run (a low-power collective moving weights, a tiny model's decode)
  lies inside one step, so none lasts two median steps with no step at all; the 30 s floor is 180 of
  the driver's samples per GPU, and covers a median taken over very few steps.
- Sync window ``max(sync_floor_s, sync_k × median step)`` = max(60 s, 3 × median step). A weight sync
  is part of every step, so one lasting three median steps is not a slow sync. It rests on the log
  alone (no hardware corroborates it), hence the longer floor and factor than the spin's.
- Before any step duration is known (the first weight sync and rollout happen inside the first step,
  start-up includes model loading and vLLM's profiling), both windows are at least ``startup_frac`` of
  the start-up budget: 0.25 × 600 s = 150 s by default, 0.25 × 4920 s for a 72B model, whose first
  ZeRO-3 gather over PCIe can take minutes.
- Both windows count from the later of the signal's start and the last step: a step is progress.

The plain watchdog (``max(hang_k × median step, hang_floor_s)``, default max(5 × median, 60 s), and the
start-up budget) still applies on top; on a CPU-only run there are no NVML samples, so only rule 3 and
that watchdog can call a hang.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from autotune.backends._base import FailurePattern, OpenPhase
from autotune.errors import UsageError
from autotune.trial.evidence import strip_rank_prefix

__all__ = [
    "BLOCKING_PHASES",
    "EarlyCall",
    "EarlyCallConfig",
    "FatalLine",
    "FatalLines",
    "GpuSpinWatch",
    "LiveGpuSamples",
    "Spin",
    "require_non_negative",
    "spin_call",
    "sync_call",
]

#: Phases in which every rank waits on the others: one that never ends is a hang.
BLOCKING_PHASES = frozenset({"weight_sync"})
_MAX_LINE_CHARS = 300


def require_non_negative(value: object, what: str, name: str) -> None:
    """Raise a usage error unless ``value`` is a real number of 0 or more (bools and NaN refused);
    ``what`` names it in the message, ``name`` in the hint."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise UsageError(
            f"{what} must be a number of 0 or more, got {value!r}", hint=f"Give {name} a non-negative value"
        )


@dataclass(frozen=True)
class EarlyCallConfig:
    """Thresholds and windows of the early calls (the module docstring says why each value).

    Attributes:
        fatal_grace_s: after a fatal line, how long the process may go on (to finish its traceback, or
            to exit by itself) before its group is ended.
        spin_util_pct: GPU utilization at or above which a GPU counts as busy.
        spin_power_frac: power at or below this share of the enforced limit counts as low.
        spin_min_gpus: the fewest trial GPUs the spin rule judges (a collective needs a peer).
        spin_floor_s, spin_k: spin window ``max(spin_floor_s, spin_k × median step)``.
        sync_floor_s, sync_k: weight-sync window ``max(sync_floor_s, sync_k × median step)``.
        startup_frac: before a step duration is known, each window is at least this share of the
            start-up budget.
        sample_stale_s: a GPU whose last utilization or power sample is older than this shows nothing.

    Raises:
        UsageError: a negative or NaN value, a fraction above 1, or fewer than 2 GPUs for the spin.
    """

    fatal_grace_s: float = 5.0
    spin_util_pct: float = 90.0
    spin_power_frac: float = 0.25
    spin_min_gpus: int = 2
    spin_floor_s: float = 30.0
    spin_k: float = 2.0
    sync_floor_s: float = 60.0
    sync_k: float = 3.0
    startup_frac: float = 0.25
    sample_stale_s: float = 10.0

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            require_non_negative(getattr(self, name), f"early-call setting {name}", name)
        if self.spin_power_frac > 1 or self.startup_frac > 1:
            raise UsageError(
                "spin_power_frac and startup_frac are shares: give values from 0 to 1",
                hint="e.g. spin_power_frac=0.25, startup_frac=0.25",
            )
        if self.spin_min_gpus < 2:
            raise UsageError(
                "spin_min_gpus must be at least 2: a collective needs a peer",
                hint="Leave spin_min_gpus at 2 or raise it",
            )

    def spin_window_s(self, median_step_s: float | None, startup_timeout_s: float) -> tuple[float, str]:
        """The spin window and its rule in words (for the stop reason)."""
        return _window(self.spin_floor_s, self.spin_k, self.startup_frac, median_step_s, startup_timeout_s)

    def sync_window_s(self, median_step_s: float | None, startup_timeout_s: float) -> tuple[float, str]:
        """The weight-sync window and its rule in words (for the stop reason)."""
        return _window(self.sync_floor_s, self.sync_k, self.startup_frac, median_step_s, startup_timeout_s)


def _window(
    floor_s: float, k: float, startup_frac: float, median_step_s: float | None, startup_timeout_s: float
) -> tuple[float, str]:
    if median_step_s is not None:
        return (
            max(floor_s, k * median_step_s),
            f"max({k:g} × median step {median_step_s:.3g} s, floor {floor_s:g} s)",
        )
    return (
        max(floor_s, startup_frac * startup_timeout_s),
        f"max({startup_frac:g} × start-up budget {startup_timeout_s:g} s, floor {floor_s:g} s), "
        "no step duration known yet",
    )


@dataclass(frozen=True)
class EarlyCall:
    """A hang called from evidence.

    Attributes:
        signal: which rule called it: ``gpu_spin`` or ``weight_sync_log``.
        reason: one line with the numbers (the trial's stop reason).
        evidence: what the call rests on, prefixed by the signal's name (the result's evidence).
    """

    signal: str
    reason: str
    evidence: str


# ---------------------------------------------------------------------------------------------------
# 1. Fatal lines


@dataclass(frozen=True)
class FatalLine:
    """The first fatal line of a trial: when it arrived, which pattern it matched, the line itself."""

    t_mono_s: float
    pattern: FailurePattern
    line: str


class FatalLines:
    """Which output lines are fatal: those a failure pattern recognises.

    Every status the outcome rules read from text is fatal (OOM, VLLM_INIT, HOST_OOM, HANG, CRASH, a
    backend's own); INVALID only before the first step, where the outcome rules read it.

    Args:
        patterns: the backend's failure patterns, then the common ones (the order the outcome reads).
    """

    def __init__(self, patterns: Sequence[FailurePattern]) -> None:
        self._compiled = [(p, re.compile(p.regex)) for p in patterns]

    def match(self, text: str, t_mono_s: float, *, before_first_step: bool) -> FatalLine | None:
        """The fatal line ``text`` is, or None. Call it only for lines kept as evidence (cheap then)."""
        clean = strip_rank_prefix(text)
        for pattern, rx in self._compiled:
            if pattern.status == "INVALID" and not before_first_step:
                continue
            if rx.search(clean) or rx.search(text):
                return FatalLine(t_mono_s, pattern, text.strip()[:_MAX_LINE_CHARS])
        return None


# ---------------------------------------------------------------------------------------------------
# 2. GPU spin


@runtime_checkable
class LiveGpuSamples(Protocol):
    """A sampler whose rows can be read while it runs (``probes.nvml.NvmlSampler.samples_since``)."""

    def samples_since(self, cursor: int, columns: Sequence[str]) -> tuple[list[tuple[float, ...]], int]: ...


_COLUMNS = ("t_mono_s", "device", "gpu_util_pct", "power_w", "power_limit_w", "proc_mem_bytes")


@dataclass
class _Gpu:
    """One GPU as the spin rule follows it. ``*_since``: start of the current run of busy (or low-power)
    samples, None while the last sample was not; ``*_last``: the newest sample of that series."""

    busy_since: float | None = None
    busy_last: float = -math.inf
    util_pct: float = math.nan
    cool_since: float | None = None
    cool_last: float = -math.inf
    power_w: float = math.nan
    power_limit_w: float = math.nan
    proc_mem_bytes: float = math.nan


@dataclass(frozen=True)
class Spin:
    """Every trial GPU busy at low power since ``since_mono_s``; ``detail`` gives the last numbers."""

    since_mono_s: float
    gpus: tuple[int, ...]
    detail: str


class GpuSpinWatch:
    """Follows the live NVML samples and says since when every trial GPU shows the spin signature.

    The trial's GPUs are those sampled, less those on which NVML attributes no memory to the trial's
    processes while it does on others (a trial that uses fewer GPUs than were selected). Where NVML
    cannot attribute memory at all (containers with their own pid namespace) every sampled GPU counts.

    Samples are judged in the order they arrive; the driver's buffered samples come a second or two
    late, so a run's start is seen late, never early.

    Args:
        sources: the samplers to read (each read from where the last read ended).
        config: the thresholds.
    """

    def __init__(self, sources: Sequence[LiveGpuSamples], config: EarlyCallConfig) -> None:
        self.sources = tuple(sources)
        self.config = config
        self._cursors = [0] * len(self.sources)
        self._gpus: dict[int, _Gpu] = {}

    def update(self) -> None:
        """Read the samples taken since the last call."""
        for k, source in enumerate(self.sources):
            rows, self._cursors[k] = source.samples_since(self._cursors[k], _COLUMNS)
            for row in rows:
                self._take(*row)

    def _take(
        self, t: float, device: float, util: float, power: float, limit: float, proc_mem: float
    ) -> None:
        gpu = self._gpus.setdefault(int(device), _Gpu())
        cfg = self.config
        if limit == limit:  # not NaN
            gpu.power_limit_w = limit
        if proc_mem == proc_mem:
            gpu.proc_mem_bytes = proc_mem
        if util == util:
            gpu.util_pct = util
            gpu.busy_last = max(gpu.busy_last, t)
            if util < cfg.spin_util_pct:
                gpu.busy_since = None
            elif gpu.busy_since is None:
                gpu.busy_since = t
        if power == power:
            gpu.power_w = power
            gpu.cool_last = max(gpu.cool_last, t)
            cap = gpu.power_limit_w
            if not cap > 0 or power > cfg.spin_power_frac * cap:  # no known limit: cannot call it low
                gpu.cool_since = None
            elif gpu.cool_since is None:
                gpu.cool_since = t

    def trial_gpus(self) -> list[int]:
        """The GPUs the rule judges (see the class docstring)."""
        indices = sorted(self._gpus)
        held = [i for i in indices if self._gpus[i].proc_mem_bytes > 0]
        return held if held else indices

    def spin(self, now_mono_s: float) -> Spin | None:
        """Since when every trial GPU has been busy at low power, or None when one is not (or its
        samples are stale, or there are fewer than ``spin_min_gpus``)."""
        indices = self.trial_gpus()
        if len(indices) < self.config.spin_min_gpus:
            return None
        fresh = now_mono_s - self.config.sample_stale_s
        since = -math.inf
        for i in indices:
            gpu = self._gpus[i]
            if gpu.busy_since is None or gpu.cool_since is None or min(gpu.busy_last, gpu.cool_last) < fresh:
                return None
            since = max(since, gpu.busy_since, gpu.cool_since)
        detail = "; ".join(
            f"GPU {i} {self._gpus[i].util_pct:.0f} % busy at {self._gpus[i].power_w:.0f} W "
            f"of {self._gpus[i].power_limit_w:.0f} W"
            for i in indices
        )
        return Spin(since, tuple(indices), detail)


def spin_call(
    spin: Spin,
    *,
    now_mono_s: float,
    last_progress_mono_s: float,
    after: str,
    window_s: float,
    rule: str,
    config: EarlyCallConfig,
) -> EarlyCall | None:
    """The hang call when the spin has lasted the window with no step, else None.

    Args:
        spin: what :meth:`GpuSpinWatch.spin` saw.
        now_mono_s: now.
        last_progress_mono_s: the last step's arrival (launch, before the first).
        after: where the trial was (`` after step N`` / `` before the first step``).
        window_s, rule: the window (:meth:`EarlyCallConfig.spin_window_s`).
        config: the thresholds, for the evidence text.
    """
    lasted = now_mono_s - max(spin.since_mono_s, last_progress_mono_s)
    if lasted < window_s:
        return None
    gpus = ", ".join(map(str, spin.gpus))
    return EarlyCall(
        "gpu_spin",
        f"GPUs {gpus} all busy at low power for {lasted:.1f} s with no step for "
        f"{now_mono_s - last_progress_mono_s:.1f} s{after} (limit {window_s:.3g} s = {rule}): a "
        "collective waiting on a peer that never comes",
        f"gpu_spin: GPUs {gpus} at >= {config.spin_util_pct:g} % utilization and <= "
        f"{config.spin_power_frac:.0%} of their power limit on every sample for {lasted:.1f} s with no "
        f"step ({spin.detail})",
    )


# ---------------------------------------------------------------------------------------------------
# 3. A weight sync that never ends


def sync_call(
    phase: OpenPhase,
    *,
    now_mono_s: float,
    last_progress_mono_s: float,
    after: str,
    window_s: float,
    rule: str,
) -> EarlyCall | None:
    """The hang call when the log shows a blocking phase open for the window with no step, else None.

    Args:
        phase: what the parser's :meth:`~autotune.backends.StepParser.open_phase` says.
        now_mono_s, last_progress_mono_s, after: as for :func:`spin_call`.
        window_s, rule: the window (:meth:`EarlyCallConfig.sync_window_s`).
    """
    if phase.phase not in BLOCKING_PHASES:
        return None
    lasted = now_mono_s - max(phase.since_mono_s, last_progress_mono_s)
    if lasted < window_s:
        return None
    name = phase.phase.replace("_", " ")
    return EarlyCall(
        "weight_sync_log",
        f"in {name} for {lasted:.1f} s with no step{after} (limit {window_s:.3g} s = {rule}): the "
        "framework's log shows it entered and never left",
        f"weight_sync_log: {phase.phase} entered and not left for {lasted:.1f} s ({phase.evidence})",
    )
