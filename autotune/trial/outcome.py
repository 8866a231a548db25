"""How a trial ended, decided from evidence; and whether a trial that ran actually learns.

Evidence is, in this order of weight: what we did to the process (our watchdog, our early stop, the
user's interrupt), the framework's own failure text on any rank, the exit code and signal, and the
last traceback. The word "error" alone never decides anything.
"""

from __future__ import annotations

import math
import re
import signal as signal_mod
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autotune.backends._base import FailurePattern
from autotune.plaintext import plain
from autotune.records import StepMetrics, TrialStatus
from autotune.trial.evidence import (
    COMMON_PATTERNS,
    EXCEPTION_LINE,
    last_error_line,
    match_patterns,
    raised_error_line,
    strip_rank_prefix,
)
from autotune.trial.run_record import RunRecord

__all__ = [
    "COMMON_PATTERNS",
    "Verdict",
    "classify",
    "health_check",
    "host_memory_note",
    "host_oom_reason",
    "last_error_line",
    "live_health",
    "LIVE_HEALTH_MIN_STEPS",
    "match_patterns",
    "ran_every_step",
    "strip_rank_prefix",
]

_MAX_REASON_CHARS = 300
_RANK = re.compile(r"\[(?:rank|default)(\d+)\]:")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)')
_TORCHRUN_SIGNAL = re.compile(r"exitcode\s*:\s*-(\d+)\b")
_TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\b")  # the "Root Cause" block of a failed child
_CONFIG_FRAME = re.compile(r"config|arg|param|option|setting|__post_init__|parse", re.IGNORECASE)
_SHELL_SIGNAL_BASE = 128


@dataclass(frozen=True)
class Verdict:
    """The outcome of one trial.

    Attributes:
        status: how the trial ended.
        reason: one line saying why, with the numbers.
        evidence: the output line (or watchdog fact) the decision rests on, when there is one.
        note: something the user should see although the status does not say it (a finished run
            that died at exit), for ``TrialResult.notes``; None when there is nothing.
    """

    status: TrialStatus
    reason: str
    evidence: str | None = None
    note: str | None = None


def _signal_name(signum: int) -> str:
    try:
        return signal_mod.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _one_line(text: str) -> str:
    text = " ".join(plain(text).split())  # no terminal control sequence reaches a record or a terminal
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 1] + "…"


def _rank_of(line: str) -> str:
    m = _RANK.search(line)
    return f" on rank {m.group(1)}" if m else ""


def _oom_detail(line: str) -> str:
    m = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", line)
    gpu = re.search(
        r"GPU (\d+) has a total capacity of ([\d.]+ [KMGT]?i?B) of which ([\d.]+ [KMGT]?i?B) is free", line
    )
    parts = []
    if m:
        parts.append(f"tried to allocate {m.group(1)}")
    if gpu:
        parts.append(f"GPU {gpu.group(1)} had {gpu.group(3)} free of {gpu.group(2)}")
    return f": {', '.join(parts)}" if parts else ""


def _config_traceback(lines: Sequence[str]) -> str | None:
    """The final exception line when the last traceback is an argument/config rejection, else None.

    A rejection is a ``ValueError``/``TypeError`` (or argparse's ``ArgumentError``/``ArgumentTypeError``)
    whose traceback passes through a frame whose file or function names configuration or argument
    handling (``config``, ``arg``, ``param``, ``option``, ``setting``, ``parse``, ``__post_init__``):
    e.g. TRL's ``GRPOConfig.__post_init__`` in ``grpo_config.py``, ms-swift's ``rlhf_args.py``. A
    ``TypeError: ... got an unexpected keyword argument`` counts without frames (a config class called
    with a name it does not have).
    """
    clean = [strip_rank_prefix(x) for x in lines]
    start = max(
        (i for i, x in enumerate(clean) if x.startswith("Traceback (most recent call last)")), default=None
    )
    if start is None:
        return None
    frames: list[tuple[str, str]] = []
    for line in clean[start + 1 :]:
        fm = _FRAME.match(line)
        if fm:
            frames.append((fm.group(1).rsplit("/", 1)[-1], fm.group(2)))
            continue
        em = EXCEPTION_LINE.match(line)
        if em:
            name = em.group(1)
            if name in ("ValueError", "TypeError", "ArgumentError", "ArgumentTypeError"):
                if "unexpected keyword argument" in line:
                    return line
                if any(_CONFIG_FRAME.search(f) or _CONFIG_FRAME.search(fn) for f, fn in frames):
                    return line
            return None
    return None


def classify(
    record: RunRecord,
    *,
    patterns: Sequence[FailurePattern] = (),
    health: Sequence[str] = (),
    steps_required: bool = True,
    steps_expected: int | None = None,
) -> Verdict:
    """Decide a trial's status from the evidence in ``record``.

    Rules, first that applies wins:

    1. Interrupted by the user (``stopped_by == "interrupt"``) → INTERRUPTED.
    2. The trial was making progress when *we* stopped it: ``early_stop`` → COMPLETE, ``pruned`` →
       PRUNED, ``max_steps`` (every allowed step made) → COMPLETE. A clean exit (code 0) with at least
       one step → COMPLETE. A COMPLETE or PRUNED trial
       with health problems (``health``, from :func:`health_check`) becomes UNHEALTHY (a trial stopped
       early by :func:`live_health` is "pruned" for its health).
    3. Otherwise the trial failed or was stopped by the watchdog. Failure text on any rank
       (``patterns`` first, then :data:`COMMON_PATTERNS`, searched in the lines the runner kept as
       evidence and in both tails): OOM, then VLLM_INIT — a rank that OOMs leaves the others waiting,
       so this beats the watchdog's HANG and the generic exit code.
    4. Our watchdog: ``hang`` / ``startup_timeout`` → HANG (its evidence says which signal called it,
       when an early call from evidence did), ``timeout`` → TIMEOUT.
    5. SIGKILL that we did not send (exit -9 or a shell's 137 while we stopped nothing, or torchrun's
       ``exitcode: -9`` / ``Signal 9 (SIGKILL) received by PID``), or the CPU allocator's failure text →
       HOST_OOM.
    6. The NCCL watchdog's text (``watchdog got stuck``, ``collective operation timeout``) → HANG; then a
       backend pattern naming any other status → that status.
    7. INVALID: the process ended non-zero before its first step *and* the evidence is an argument
       rejection: argparse's usage error (``prog: error: unrecognized arguments`` / ``argument`` /
       ``the following arguments are required``; exit code 2, argparse's own), HfArgumentParser's unused
       arguments, or a final ``ValueError``/``TypeError`` raised from config or argument construction
       (see :func:`_config_traceback`).
    8. A CRASH pattern's text → CRASH with its reason; exit 0 without a step → CRASH ("exited without
       a step"), or COMPLETE when ``steps_required`` is False (``autotune profile``: a run that prints no
       step records is still a finished run, profiled as a whole).
    9. Finished, then died at exit: the process ended on its own, non-zero or by a signal, after
       recording every one of ``steps_expected`` steps, with no failure text (rules 3-8 found none)
       and no exception the program raised (a launcher's ``ChildFailedError`` and ``Fatal Python
       error`` lines do not count) → COMPLETE, or UNHEALTHY by ``health``; the reason and the
       verdict's ``note`` say how it died (e.g. "finished all 4 steps; rank 1 then aborted at exit
       (SIGABRT)": gloo's threads calling ``std::terminate`` while the interpreter shuts down). The
       work measured is all there; what failed is the teardown, which says nothing of the
       configuration's speed or memory.
    10. CRASH with the last meaningful error line: the final ``SomethingError: ...`` line of a
        traceback, or the fatal signal's name (SIGSEGV, SIGABRT, ...).

    Each rule is one function below, called in this order.

    Args:
        record: what the runner observed.
        patterns: the backend's own failure patterns (:meth:`Backend.failure_patterns`).
        health: problems found by :func:`health_check` (empty = healthy).
        steps_required: whether a clean exit must have made a step (a trial's) or not (a profile's).
        steps_expected: the steps the run was asked for (a trial's ``max_steps``); None (a profile's)
            turns rule 9 off.
    """
    ours = _stopped_by_us_or_done(record, health)
    if ours is not None:
        return ours
    facts = _Facts.of(record, patterns)
    return (
        _gpu_failure_text(facts)
        or _watchdog_stop(facts)
        or _killed_or_stuck(facts)
        or _other_backend_status(facts)
        or _rejected_arguments(facts)
        or _crash_text_or_no_step(facts, steps_required)
        or _finished_then_died(facts, steps_expected, health)
        or _crash(facts)
    )


@dataclass(frozen=True)
class _Facts:
    """What the failure rules of :func:`classify` read: the record, its output and the text found in it.

    Attributes:
        record: what the runner observed.
        lines: the evidence lines, then the stderr tail, then the stdout tail (the order searched).
        found: status name → (the first pattern of that status that matched, the line it matched).
        shell_signal: the signal a shell reported as exit code 128 + n, when the record has no signal.
    """

    record: RunRecord
    lines: list[str]
    found: dict[str, tuple[FailurePattern, str]]
    shell_signal: int | None

    @classmethod
    def of(cls, record: RunRecord, patterns: Sequence[FailurePattern]) -> _Facts:
        lines = [x.text for x in record.evidence] + list(record.stderr_tail) + list(record.stdout_tail)
        exit_code = record.exit_code
        shell_signal = None
        if (
            record.signal is None
            and exit_code is not None
            and _SHELL_SIGNAL_BASE < exit_code <= _SHELL_SIGNAL_BASE + 64
        ):
            shell_signal = exit_code - _SHELL_SIGNAL_BASE
        return cls(record, lines, match_patterns(lines, tuple(patterns) + COMMON_PATTERNS), shell_signal)

    @property
    def at_step(self) -> str:
        """Where the trial was when it ended, for a reason: `` at step N`` or `` before the first step``."""
        steps = self.record.steps
        return f" at step {steps[-1].step}" if steps else " before the first step"

    def by_pattern(self, status: str, reason: str) -> Verdict:
        """The verdict ``status`` resting on the line its pattern matched."""
        _, line = self.found[status]
        return Verdict(TrialStatus(status), _one_line(reason), line)


def _stopped_by_us_or_done(record: RunRecord, health: Sequence[str]) -> Verdict | None:
    """Rules 1-2: the user's interrupt, our early stop or prune, or a clean exit after steps."""
    n_steps = len(record.steps)
    if record.stopped_by == "interrupt":
        return Verdict(TrialStatus.INTERRUPTED, record.stop_reason or "stopped by the user")
    if record.stopped_by == "early_stop":
        return _complete_or_unhealthy(
            record.stop_reason or f"stopped at steady state after {n_steps} steps", health
        )
    if record.stopped_by == "max_steps":  # every allowed step made; the script would have gone on
        return _complete_or_unhealthy(record.stop_reason or f"completed {n_steps} steps", health)
    if record.stopped_by == "pruned":  # by the study (slower than the best) or for its health
        if health:
            return _unhealthy(health)
        return Verdict(TrialStatus.PRUNED, _one_line(record.stop_reason or "pruned by the study"))
    if record.stopped_by is None and record.exit_code == 0 and n_steps > 0:
        return _complete_or_unhealthy(f"completed {n_steps} steps", health)
    return None


def _complete_or_unhealthy(reason: str, health: Sequence[str]) -> Verdict:
    """COMPLETE with ``reason``, or UNHEALTHY with the first health problem when there is one."""
    return _unhealthy(health) if health else Verdict(TrialStatus.COMPLETE, reason)


def _unhealthy(health: Sequence[str]) -> Verdict:
    """UNHEALTHY with the first of the (non-empty) health problems."""
    more = f" (and {len(health) - 1} more)" if len(health) > 1 else ""
    return Verdict(TrialStatus.UNHEALTHY, _one_line(health[0] + more))


def _gpu_failure_text(facts: _Facts) -> Verdict | None:
    """Rule 3: GPU out of memory, then vLLM's start-up failure, on any rank."""
    for status in ("OOM", "VLLM_INIT"):
        if status in facts.found:
            pattern, line = facts.found[status]  # a vLLM line that gives sizes has them quoted too
            return facts.by_pattern(status, f"{pattern.reason}{_rank_of(line)}{_oom_detail(line)}")
    return None


def _watchdog_stop(facts: _Facts) -> Verdict | None:
    """Rule 4: our watchdog stopped a trial that made no progress or ran out of time."""
    record = facts.record
    if record.stopped_by in ("hang", "startup_timeout"):
        return Verdict(TrialStatus.HANG, _one_line(record.stop_reason or "no progress"), record.stop_evidence)
    if record.stopped_by == "timeout":
        return Verdict(TrialStatus.TIMEOUT, _one_line(record.stop_reason or "trial wall budget ran out"))
    return None


def _killed_or_stuck(facts: _Facts) -> Verdict | None:
    """Rules 5-6: a SIGKILL we did not send, the host allocator's text, the NCCL watchdog's text."""
    sig, exit_code = facts.record.signal, facts.record.exit_code
    ours = facts.record.stopped_by is not None  # e.g. a fatal line's group ended by us: our SIGKILL
    if not ours and (sig == signal_mod.SIGKILL or facts.shell_signal == signal_mod.SIGKILL):
        how = (
            "exit -9" if sig == signal_mod.SIGKILL else f"exit code {exit_code}, a shell's report of SIGKILL"
        )
        return Verdict(
            TrialStatus.HOST_OOM,
            f"killed by SIGKILL that autotune did not send ({how}){_LIKELY_HOST_OOM}",
        )
    for status in ("HOST_OOM", "HANG"):
        if status in facts.found:
            pattern, line = facts.found[status]
            return facts.by_pattern(status, f"{pattern.reason}{_rank_of(line)}")
    return None


_LIKELY_HOST_OOM = ": most likely the host ran out of RAM"
# A host that kept this much memory available in every sample did not visibly run out.
HOST_AMPLE_FRACTION = 0.10
HOST_AMPLE_MIN_BYTES = 1 << 30


def host_memory_note(min_available_bytes: int | None, ram_total_bytes: int | None) -> str | None:
    """What to say of a HOST_OOM trial whose own host samples contradict "the host ran out of RAM".

    None when they do not: memory unknown, or available fell under 10 % of RAM (or 1 GiB). Otherwise one
    clause quoting the figures and the other causes of a SIGKILL nobody in autotune sent. The samplers
    read every fraction of a second, so a spike between two samples is still possible: the note says the
    figures, never that memory was fine.
    """
    if min_available_bytes is None or not ram_total_bytes:
        return None
    ample = max(HOST_AMPLE_FRACTION * ram_total_bytes, HOST_AMPLE_MIN_BYTES)
    if min_available_bytes < ample:
        return None
    gib = 1 << 30
    return (
        f"yet host memory available never fell below {min_available_bytes / gib:.1f} GiB of "
        f"{ram_total_bytes / gib:.1f} GiB in the samples: a container's or cgroup's memory limit, another "
        "process, or a spike between samples sent it"
    )


def host_oom_reason(reason: str, min_available_bytes: int | None, ram_total_bytes: int | None) -> str:
    """A HOST_OOM trial's reason made consistent with its host samples (:func:`host_memory_note`)."""
    note = host_memory_note(min_available_bytes, ram_total_bytes)
    return _one_line(f"{reason.replace(_LIKELY_HOST_OOM, '')}; {note}") if note else reason


def _other_backend_status(facts: _Facts) -> Verdict | None:
    """Rule 6, end: a backend pattern naming a status the rules do not handle by name (OOM, VLLM_INIT,
    HOST_OOM and HANG were decided by the rules before; INVALID and CRASH come after)."""
    for status in facts.found:
        if status not in ("INVALID", "CRASH"):
            return facts.by_pattern(status, facts.found[status][0].reason)
    return None


def _rejected_arguments(facts: _Facts) -> Verdict | None:
    """Rule 7: a non-zero exit before the first step whose evidence is an argument rejection."""
    record = facts.record
    if record.steps or record.exit_code in (None, 0):
        return None
    if "INVALID" in facts.found:
        pattern, line = facts.found["INVALID"]
        return facts.by_pattern("INVALID", f"{pattern.reason}: {strip_rank_prefix(line)}")
    rejected = _config_traceback(record.stderr_tail) or _config_traceback(record.stdout_tail)
    if rejected:
        return Verdict(
            TrialStatus.INVALID,
            _one_line(f"the framework rejected its configuration: {rejected}"),
            rejected,
        )
    if record.exit_code == 2 and record.signal is None:
        err_lines = list(record.stderr_tail) + list(record.stdout_tail)
        last = last_error_line(err_lines) or _last_nonblank(record.stderr_tail)
        tail = f": {last}" if last else ""
        return Verdict(
            TrialStatus.INVALID, _one_line(f"exit code 2 before the first step (usage error){tail}"), last
        )
    return None


def _crash_text_or_no_step(facts: _Facts, steps_required: bool) -> Verdict | None:
    """Rule 8: a CRASH pattern's text; or exit 0 without a single step."""
    record = facts.record
    if "CRASH" in facts.found:
        return facts.by_pattern("CRASH", facts.found["CRASH"][0].reason)
    if record.exit_code == 0 and not record.steps and not steps_required:
        return Verdict(
            TrialStatus.COMPLETE,
            "finished (exit code 0) without step records: the timeline covers the whole run",
        )
    if record.exit_code == 0 and not record.steps:
        return Verdict(
            TrialStatus.CRASH, "exited without a step (exit code 0)", _last_nonblank(record.stdout_tail)
        )
    return None


def ran_every_step(record: RunRecord, steps_expected: int | None) -> bool:
    """Whether the process ended on its own after recording ``steps_expected`` distinct steps (so
    whatever went wrong after that happened once its work was done)."""
    if steps_expected is None or steps_expected <= 0 or record.stopped_by is not None:
        return False
    return len({s.step for s in record.steps}) >= steps_expected


def _finished_then_died(facts: _Facts, steps_expected: int | None, health: Sequence[str]) -> Verdict | None:
    """Rule 9: every expected step recorded, then a death at exit with no failure text nor exception."""
    record = facts.record
    if record.exit_code in (None, 0) or facts.found or not ran_every_step(record, steps_expected):
        return None
    if raised_error_line(record.stderr_tail) or raised_error_line(record.stdout_tail):
        return None  # the program raised after its last step: a failure of its own, not of teardown
    sig = _fatal_signal(facts)
    rank = _root_cause_rank(facts.lines)
    who = f"rank {rank}" if rank is not None else "the process"
    if sig == signal_mod.SIGABRT:
        how = "aborted at exit (SIGABRT)"
    elif sig is not None:
        how = f"died at exit ({_signal_name(sig)})"
    else:
        how = f"exited with code {record.exit_code}"
    what = f"finished all {len({s.step for s in record.steps})} steps; {who} then {how}"
    verdict = _complete_or_unhealthy(_one_line(what), health)
    return replace(verdict, note=f"{what}: the steps are measured, the trial counts as finished")


def _root_cause_rank(lines: Sequence[str]) -> str | None:
    """The rank torchrun names as the root cause of a failed run (the other ranks it lists are the
    ones it then stopped itself), or the first rank it names when there is no such block."""
    start = max((i for i, x in enumerate(lines) if "Root Cause" in x), default=0)
    for part in (lines[start:], lines):
        for line in part:
            m = _TORCHRUN_RANK.match(strip_rank_prefix(line))
            if m:
                return m.group(1)
    return None


def _fatal_signal(facts: _Facts) -> int | None:
    """The signal that ended the run: its own, a shell's 128 + n, or the one torchrun reports."""
    record = facts.record
    if record.signal is not None:
        return record.signal
    if facts.shell_signal is not None:
        return facts.shell_signal
    m = next((_TORCHRUN_SIGNAL.search(x) for x in reversed(facts.lines) if _TORCHRUN_SIGNAL.search(x)), None)
    return int(m.group(1)) if m else None


def _crash(facts: _Facts) -> Verdict:
    """Rule 10: CRASH named by the fatal signal, else by the traceback's last error line, else the tail."""
    record = facts.record
    last = last_error_line(record.stderr_tail) or last_error_line(record.stdout_tail)
    fatal_sig = _fatal_signal(facts)
    at = facts.at_step
    if fatal_sig is not None:
        name = _signal_name(fatal_sig)
        detail = f" ({last})" if last else ""
        return Verdict(TrialStatus.CRASH, _one_line(f"killed by {name}{at}{detail}"), last)
    if last:
        return Verdict(TrialStatus.CRASH, _one_line(f"exit code {record.exit_code}{at}: {last}"), last)
    fallback = _last_nonblank(record.stderr_tail) or _last_nonblank(record.stdout_tail)
    tail = f": {strip_rank_prefix(fallback)}" if fallback else ""
    return Verdict(TrialStatus.CRASH, _one_line(f"exit code {record.exit_code}{at}{tail}"), fallback)


def _last_nonblank(lines: Sequence[str]) -> str | None:
    return next((x for x in reversed(lines) if x.strip()), None)


# ---------------------------------------------------------------------------------------------------
# Health gate


def _series(steps: Sequence[StepMetrics], key: str) -> list[tuple[int, float]]:
    ordered = sorted(steps, key=lambda s: s.step)
    return [(s.step, float(s.values[key])) for s in ordered if key in s.values and s.values[key] is not None]


def _non_finite(steps: Sequence[StepMetrics]) -> list[str]:
    problems: list[str] = []
    for key in ("loss", "grad_norm", "kl"):
        bad = [(st, v) for st, v in _series(steps, key) if not math.isfinite(v)]
        if bad:
            kind = "NaN" if math.isnan(bad[0][1]) else "infinite"
            problems.append(
                f"{key} is {kind} at step {bad[0][0]} ({len(bad)} of {len(steps)} steps not finite)."
            )
    return problems


LIVE_HEALTH_MIN_STEPS = 4  # steps a trial shows a never-moving model before it is stopped as UNHEALTHY


def live_health(
    steps: Sequence[StepMetrics], *, beta: float | None, baseline: Sequence[StepMetrics] | None = None
) -> list[str]:
    """Problems conclusive while the trial still runs, so it can be stopped early; empty = go on.

    The failures a run never recovers from: a non-finite ``loss``, ``grad_norm`` or ``kl`` (at once);
    ``grad_norm`` exactly 0 on every step so far, or ``kl`` exactly 0 on every step after the first
    while ``beta`` > 0, once :data:`LIVE_HEALTH_MIN_STEPS` steps (after the first, for kl) show it;
    every completion clipped at the max length (``completions/clipped_ratio`` 1) on each of the last
    :data:`LIVE_HEALTH_MIN_STEPS` steps while the baseline (same model and data) clipped under 90 % -
    degenerate rollouts, e.g. after a broken weight reload. What a few steps cannot prove
    (``reward_std`` 0, a collapsing reward) is left to :func:`health_check` at the end of the trial.
    """
    problems = _non_finite(steps)
    clip = [v for _, v in _series(steps, "completions/clipped_ratio")][-LIVE_HEALTH_MIN_STEPS:]
    if len(clip) == LIVE_HEALTH_MIN_STEPS:
        problems += _all_clipped(clip, baseline or (), limit="", span=f"the last {len(clip)} steps")
    return problems + _never_moves(steps, beta=beta, min_steps=LIVE_HEALTH_MIN_STEPS)


def _never_moves(steps: Sequence[StepMetrics], *, beta: float | None, min_steps: int) -> list[str]:
    """``grad_norm`` 0 on every step, or ``kl`` 0 on every step after the first while ``beta`` > 0,
    each over at least ``min_steps`` steps."""
    problems = []
    grad = [v for _, v in _series(steps, "grad_norm")]
    if len(grad) >= min_steps and all(v == 0.0 for v in grad):
        problems.append(f"grad_norm is 0 on all {len(grad)} steps: the model is never updated.")
    if beta is not None and beta > 0:
        kl = _series(steps, "kl")[1:]
        if len(kl) >= min_steps and all(v == 0.0 for _, v in kl):
            problems.append(
                f"kl is 0 on all {len(kl)} steps after the first although beta = {beta:g}: "
                "the policy never moves away from the reference."
            )
    return problems


def _all_clipped(
    clip: Sequence[float], baseline: Sequence[StepMetrics], *, limit: str, span: str
) -> list[str]:
    """Every completion clipped on each of ``clip``'s steps while the baseline clipped under 90 %."""
    base_clip = [v for _, v in _series(baseline, "completions/clipped_ratio")]
    if not base_clip or not all(v >= 0.999 for v in clip):
        return []
    base_mean = statistics.fmean(base_clip)
    if base_mean >= 0.9:
        return []
    return [
        f"every completion hit the max length{limit} on {span} (clipped ratio 1.0) "
        f"while the baseline clipped {base_mean:.0%}: rollouts are degenerate."
    ]


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def health_check(
    steps: Sequence[StepMetrics],
    *,
    beta: float | None,
    max_completion_length: int | None,
    baseline: Sequence[StepMetrics] | None,
) -> list[str]:
    """Problems that show a trial does not learn; each one sentence with the numbers. Empty = healthy.

    Checks (metric names as TRL and ms-swift log them):

    - ``loss``, ``grad_norm`` or ``kl`` NaN or infinite on any step.
    - ``grad_norm`` exactly 0 on every step (at least 2): the weights never change.
    - ``kl`` exactly 0 on every step after the first (at least 2 of them) while ``beta`` > 0.
    - ``reward_std`` 0 on every step (at least 2): every completion of a prompt gets the same reward,
      so every advantage is 0.
    - Against the baseline trial only (fixed-length completions clip every sample by design, so a
      fully clipped trial alone proves nothing): every completion clipped at max length
      (``completions/clipped_ratio`` 1, or ``completions/mean_length`` at ``max_completion_length``)
      while the baseline's were not; or the reward collapsing — its mean over the trial's second half
      more than one baseline ``reward_std`` below the baseline's mean reward and below the trial's own
      first half.

    A loss near 0 is normal for GRPO (advantages are zero-mean) and is not a problem.
    """
    problems = _non_finite(steps) + _never_moves(steps, beta=beta, min_steps=2)

    rstd = [v for _, v in _series(steps, "reward_std")]
    if len(rstd) >= 2 and all(v == 0.0 for v in rstd):
        problems.append(
            f"reward_std is 0 on all {len(rstd)} steps: every completion of a prompt gets the same reward, "
            "so every advantage is 0."
        )

    if baseline:
        problems.extend(_degenerate_rollouts(steps, baseline, max_completion_length))
    return problems


def _degenerate_rollouts(
    steps: Sequence[StepMetrics], baseline: Sequence[StepMetrics], max_completion_length: int | None
) -> list[str]:
    problems: list[str] = []
    clip = [v for _, v in _series(steps, "completions/clipped_ratio")]
    limit = f" ({max_completion_length} tokens)" if max_completion_length else ""
    if len(clip) >= 2:
        problems += _all_clipped(clip, baseline, limit=limit, span=f"all {len(clip)} steps")
    elif max_completion_length and not clip:
        length = [v for _, v in _series(steps, "completions/mean_length")]
        base_len = [v for _, v in _series(baseline, "completions/mean_length")]
        if len(length) >= 2 and base_len and all(v >= max_completion_length - 0.5 for v in length):
            base_mean = statistics.fmean(base_len)
            if base_mean < 0.9 * max_completion_length:
                problems.append(
                    f"mean completion length is the max ({max_completion_length} tokens) on all {len(length)} "
                    f"steps while the baseline's was {_fmt(base_mean)}: rollouts are degenerate."
                )

    reward = [v for _, v in _series(steps, "reward") if math.isfinite(v)]
    base_reward = [v for _, v in _series(baseline, "reward") if math.isfinite(v)]
    if len(reward) >= 2 and len(base_reward) >= 2:
        half = len(reward) // 2
        early, late = statistics.fmean(reward[:half]), statistics.fmean(reward[half:])
        base_mean = statistics.fmean(base_reward)
        base_std = [v for _, v in _series(baseline, "reward_std") if math.isfinite(v)]
        scale = statistics.fmean(base_std) if base_std else 0.0
        if scale <= 0:
            scale = statistics.stdev(base_reward) or 0.1 * abs(base_mean) or 1e-9
        if late < base_mean - scale and late < early:
            problems.append(
                f"reward fell to {_fmt(late)} over the last {len(reward) - half} steps against {_fmt(base_mean)} "
                f"in the baseline (more than one reward_std, {_fmt(scale)}, below): rewards are collapsing."
            )
    return problems
