"""Which trial an export describes: the study's recommendation, or a COMPLETE trial the user names.

:func:`load_winner` reads a study directory (``study.json``, the trials' ``result.json`` and, when there,
``launch.json``) and returns a :class:`Winner`: everything an exporter needs, read once, typed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from autotune.errors import NothingToRecommend, UsageError
from autotune.jobconfig import JobConfig
from autotune.records import Hardware, LaunchPlan, Recommendation, TrialResult, TrialStatus
from autotune.secrets import SecretRule
from autotune.studydir import StudyDir, read_json_guarded, regular_file
from autotune.studysettings import StudySettings

__all__ = ["BackendFacts", "BackendLookup", "Winner", "load_winner"]


class BackendFacts(Protocol):
    """What an export reads of the study's backend; a :class:`autotune.backends.Backend` class is one.

    The exports sit a floor below the backends (whose own formats are built on them), so they never
    look a backend up: whoever loads the winner hands the lookup in (:class:`BackendLookup`).
    """

    @property
    def display_name(self) -> str: ...

    def canonical_args(self, args: Mapping[str, object]) -> dict[str, Any]: ...

    def describe(
        self,
        params: Mapping[str, object],
        derived: Mapping[str, object],
        fixed: Mapping[str, object],
        n_gpus: int,
    ) -> JobConfig: ...

    def uses_demo_reward(self, fixed: Mapping[str, object]) -> bool: ...


@dataclass(frozen=True)
class BackendLookup:
    """The backends as an export sees them, handed in from above (``autotune.app.export``).

    Attributes:
        facts: a backend's name → its facts (``autotune.backends.backend_class``); raises
            :class:`UsageError` for a backend this version does not know.
        own_formats: the formats a backend writes in its framework's own files
            (``autotune.backends.EXPORTERS``), one per backend, named as the backend.
    """

    facts: Callable[[str], BackendFacts]
    own_formats: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Winner:
    """The trial an export describes and the study it belongs to.

    Attributes:
        study_dir: the study directory, where it is now (trial files are referenced from here).
        settings: ``study.json`` (:class:`~autotune.records.StudySettings`).
        result: the trial's ``result.json``.
        recommended: True when the trial is the study's recommendation (not picked with ``--trial``).
        backends: the backends' facts and formats (:class:`BackendLookup`).
        launch: the trial's ``launch.json`` when it exists (None for trials never launched).
        hardware: the study's hardware (None when ``study.json`` lacks it).
        why: one sentence on why this trial (the recommendation's reason or "chosen with --trial N").
        recommendation: the study's recommendation (its speedup, interval and verdict), when it has one.
        secret_names: argument names declared secret on top of the study's own (``--secret-arg``).
    """

    study_dir: Path
    settings: StudySettings
    result: TrialResult
    recommended: bool
    backends: BackendLookup
    launch: LaunchPlan | None = None
    hardware: Hardware | None = None
    why: str = ""
    recommendation: Recommendation | None = None
    secret_names: tuple[str, ...] = ()

    @property
    def secrets(self) -> SecretRule:
        """The secret rule of this export: the built-in one, the names the study declared secret
        (``study.json``'s ``secret_args``) and :attr:`secret_names`."""
        env = [self.launch.env] if self.launch is not None else []
        return SecretRule.for_environment((*self.settings.secret_args, *self.secret_names), env, environ={})

    @property
    def number(self) -> int:
        return self.result.number

    @property
    def study_name(self) -> str:
        """The study's recorded name, else its directory's."""
        return self.settings.name or self.study_dir.name

    @property
    def backend(self) -> str:
        return self.settings.backend or ""

    @property
    def backend_class(self) -> BackendFacts:
        """The class of the study's backend (its facts).

        Raises:
            UsageError: a backend this version of autotune does not know.
        """
        return self.backends.facts(self.backend)

    @property
    def own_format(self) -> str | None:
        """The study's framework's own export format, when its backend has one."""
        return self.backend if self.backend in self.backends.own_formats else None

    @property
    def trial_dir(self) -> Path:
        return StudyDir(self.study_dir).trial_dir(self.result.number)

    @property
    def cpu_only(self) -> bool:
        return self.hardware is None or not self.hardware.gpus

    @property
    def world_size(self) -> int:
        """Processes the trial ran: its derived world size, else the GPU count, else 1."""
        derived = self.result.derived.get("world_size")
        if isinstance(derived, int) and not isinstance(derived, bool) and derived > 0:
            return derived
        if self.hardware is not None and self.hardware.gpus:
            return len(self.hardware.gpus)
        return 1

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.hardware.gpus) if self.hardware is not None else ()

    @property
    def fixed(self) -> dict[str, Any]:
        """The study's fixed arguments, names normalised (``--lora-rank`` → ``lora_rank``) and spelled
        as the study's backend spells them today."""
        from autotune.fixed import flag_name

        out = {flag_name(str(k)): v for k, v in self.settings.fixed.items()}
        try:
            return self.backend_class.canonical_args(out)
        except UsageError:  # a study of a backend this version does not know: its names as they are
            return out

    @cached_property
    def config(self) -> JobConfig:
        """What the trial's knobs mean, read by the study's own backend.

        Raises:
            UsageError: the study's backend is unknown here, or a value means nothing.
        """
        job = {
            "global_batch": self.settings.global_batch or 16,
            "num_generations": self.settings.num_generations or 4,
            "max_completion_length": self.settings.max_completion_length or 16,
            **self.fixed,
        }
        n_gpus = len(self.hardware.gpus) if self.hardware is not None else 0
        derived = dict(self.result.derived)
        derived.setdefault("world_size", self.world_size)
        return self.backend_class.describe(self.result.params, derived, job, n_gpus)


def _launch(path: Path) -> LaunchPlan | None:
    """The trial's ``launch.json`` read the one way (:func:`~autotune.studydir.read_json_guarded`), or
    None when it is missing or not one (a link, a FIFO, too deep)."""
    if not regular_file(path):
        return None
    try:
        return LaunchPlan.model_validate(read_json_guarded(path, fix=""))
    except (UsageError, ValueError):
        return None


def load_winner(
    study_dir: Path,
    *,
    backends: BackendLookup,
    trial: int | None = None,
    secret_names: tuple[str, ...] = (),
) -> Winner:
    """Read a study directory and pick the trial to export.

    Args:
        study_dir: a directory written by ``autotune search``.
        backends: the backends' facts and formats, from the floor above (:class:`BackendLookup`).
        trial: a trial number to export instead of the recommendation; it must be COMPLETE.

    Raises:
        UsageError: not a study directory; the trial does not exist or is not COMPLETE.
        NothingToRecommend: no trial is recommended (no healthy trial with memory headroom).
    """
    sd = StudyDir(Path(study_dir).expanduser().absolute())
    if not sd.root.is_dir():
        raise UsageError(
            f"{sd.root} is not a directory", hint="Pass the runs/<study> directory autotune search wrote"
        )
    settings = sd.read_settings()  # raises a one-line UsageError without study.json (or not an object)
    try:
        results = sd.results()
    except ValueError as exc:
        raise UsageError(
            f"a result.json in {sd.trials_dir} cannot be read ({exc.__class__.__name__})",
            hint="Restore it, or remove that trial's directory",
        ) from None
    hardware = sd.hardware(settings)
    by_number = {r.number: r for r in results}
    if trial is not None:
        result = by_number.get(trial)
        if result is None:
            known = ", ".join(str(n) for n in sorted(by_number)) or "none"
            raise UsageError(
                f"trial {trial} is not in {sd.root}", hint=f"Pick one of the trials on disk: {known}"
            )
        if result.status is not TrialStatus.COMPLETE:
            raise UsageError(
                f"trial {trial} is {result.status.value} ({result.reason}), not COMPLETE",
                hint="Export the recommendation (no --trial) or a COMPLETE trial",
            )
        rec = sd.recommendation(settings, results)
        recommended = rec is not None and rec.trial == trial
        why = f"chosen with --trial {trial}" + (" (also the recommendation)" if recommended else "")
    else:
        rec = sd.recommendation(settings, results)
        if rec is None:
            counts: dict[str, int] = {}
            for r in results:
                counts[r.status.value] = counts.get(r.status.value, 0) + 1
            seen = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no trial results on disk"
            raise NothingToRecommend(
                f"{sd.root} has no recommendation: no healthy trial with memory headroom ({seen})",
                hint="Run more trials, or export a COMPLETE trial with --trial N",
            )
        if rec.trial not in by_number:
            raise UsageError(
                f"{sd.root} recommends trial {rec.trial}, but {sd.trial(rec.trial).result_json} is missing",
                hint="Restore that trial's directory, or export a COMPLETE trial with --trial N",
            )
        result = by_number[rec.trial]
        recommended = True
        why = rec.why
    return Winner(
        study_dir=sd.root,
        settings=settings,
        result=result,
        recommended=recommended,
        launch=_launch(sd.trial(result.number).launch_json),
        hardware=hardware,
        why=why,
        recommendation=rec,
        secret_names=tuple(secret_names),
        backends=backends,
    )
