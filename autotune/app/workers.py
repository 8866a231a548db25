"""How ``autotune search`` runs its workers: the GPU sets trials share a host on, one worker per set
(threads of this process), and the stop signals that end the current trials cleanly."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections.abc import Iterator
from typing import Any

from rich.console import Console

from autotune.errors import UsageError

__all__ = ["check_workers", "gpu_slices", "run_workers", "stop_on_signals"]


def check_workers(study_name: str | None, gpus_per_trial: int | None) -> None:
    """--study-name and --gpus-per-trial, checked before anything is touched."""
    import re

    if study_name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", study_name):
        raise UsageError(
            f"--study-name {study_name!r} is not a study name",
            hint="Use letters, digits, '.', '_' and '-' (at most 128), e.g. --study-name qwen7b-grpo",
        )
    if gpus_per_trial is not None and gpus_per_trial < 1:
        raise UsageError(
            f"--gpus-per-trial must be at least 1, got {gpus_per_trial}",
            hint="Give the GPUs one trial uses, e.g. --gpus-per-trial 4 on an 8-GPU host",
        )


def gpu_slices(gpus: tuple[Any, ...], per_trial: int | None) -> list[tuple[Any, ...]]:
    """The disjoint GPU sets trials run on at once: consecutive groups of ``per_trial`` GPUs (one set of
    every GPU without ``per_trial``).

    Raises:
        UsageError: more GPUs per trial than the host has, or a CPU-only host.
    """
    if per_trial is None:
        return [gpus]
    if not gpus:
        raise UsageError(
            "--gpus-per-trial needs GPUs and none is detected or declared here",
            hint="Drop --gpus-per-trial on a CPU-only host, or declare GPUs with --gpus N --gpu-type A10",
        )
    if per_trial > len(gpus):
        raise UsageError(
            f"--gpus-per-trial {per_trial} is more than the {len(gpus)} GPU(s) of this study",
            hint=f"Use --gpus-per-trial {len(gpus)} or fewer",
        )
    n = len(gpus) // per_trial
    return [tuple(gpus[i * per_trial : (i + 1) * per_trial]) for i in range(n)]


def run_workers(studies: list[Any], stop_event: threading.Event) -> Any:
    """Run the workers (one in this thread; several each in its own) and return the study's outcome:
    the one of the worker that ended the study.

    The main thread only waits, so it keeps taking stop signals; a forced stop (KeyboardInterrupt) waits
    for the workers to end their trials (they see the stop) and is raised again.
    """
    if len(studies) == 1:
        return studies[0].run()
    outcomes: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    def run(i: int) -> None:
        try:
            outcomes[i] = studies[i].run()
        except BaseException as exc:  # noqa: BLE001 - raised again in the main thread
            errors[i] = exc
            stop_event.set()  # one worker failing (storage, disk) stops the others cleanly

    threads = [threading.Thread(target=run, args=(i,), name=f"worker-{i}") for i in range(len(studies))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.2)
    except KeyboardInterrupt:
        stop_event.set()
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[min(errors)]
    final = [o for o in outcomes.values() if o.final]
    last = (final or sorted(outcomes.values(), key=lambda o: len(o.results)))[-1]
    return dataclasses.replace(last, trials_run_now=sum(o.trials_run_now for o in outcomes.values()))


# Ctrl-C, and what `timeout`, Slurm, `docker stop` and a closed terminal send.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals(stop_event: threading.Event, console: Console) -> Iterator[None]:
    """The first stop signal ends the current trial cleanly (the study stops, consistent and
    resumable); a second one forces (KeyboardInterrupt: the trial's processes are still ended).
    Only the main thread can take signals: elsewhere nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = {"n": 0}

    def on_signal(signum: int, frame: object) -> None:
        received["n"] += 1
        if received["n"] > 1:
            raise KeyboardInterrupt
        stop_event.set()
        name = "interrupt" if signum == signal.SIGINT else signal.Signals(signum).name
        again = "press Ctrl-C again" if signum == signal.SIGINT else "send it again"
        console.print(
            f"\n{name}: ending the current trial cleanly ({again} to force)", markup=False, style="yellow"
        )

    previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
