"""``study.json``: what a study is (its backend, model, job, space, budget) and how it ended, as one
typed record with one reader (:meth:`autotune.studydir.StudyDir.read_settings`) and one writer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from autotune.records import ModelRef

__all__ = ["StudyBudget", "StudyModel", "StudySettings"]


class StudyModel(BaseModel):
    """``study.json``'s ``model``: what the study trains (:class:`ModelRef` as written)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str | None = None
    path_or_id: str | None = None
    local: bool | str | None = None  # true: path_or_id is a local folder
    facts: dict[str, Any] = Field(default_factory=dict)  # params, layers, hidden, vocab, ...

    @property
    def loaded(self) -> str:
        """What the framework loads: the path or hub id, else the name the user typed ("" if neither)."""
        return self.path_or_id or self.name or ""

    def ref(self) -> ModelRef:
        """The study's :class:`ModelRef` as written."""
        return ModelRef(
            name=self.name or self.path_or_id or "",
            path_or_id=self.loaded,
            local=bool(self.local),
            facts=dict(self.facts),
        )


class StudyBudget(BaseModel):
    """``study.json``'s ``budget``: the trials and seconds the search may spend (None: no limit)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    trials: int | None = None
    time_s: float | int | None = None


class StudySettings(BaseModel):
    """``study.json``: what a study is (its backend, model, job, space, budget) and how it ended.

    Read only through :meth:`autotune.studydir.StudyDir.read_settings` (the guarded reader) and
    :meth:`from_json`; written by :meth:`to_json` in the shape it was read. Every field is optional: a
    file of an older version lacks the later ones, and a key left out stays out when written back
    (``model_fields_set``); a key this version does not know is kept (extra). A value of the wrong type
    reads as missing (the readers before this record skipped it too) and is written back as it was.

    The nested documents that have their own reader stay JSON here: ``hardware``
    (:meth:`~autotune.studydir.StudyDir.hardware`), ``recommendation``
    (:meth:`~autotune.studydir.StudyDir.recommendation`), ``identity``
    (:func:`autotune.study.identity.identity_differences`), ``outcome``, ``space``, ``calibration``.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    name: str | None = None
    uid: str | None = None
    created_wall_s: float | int | None = None
    finished_wall_s: float | int | None = None
    backend: str | None = None
    backend_version: str | None = None
    command: str | list[str] | None = None
    model: StudyModel = Field(default_factory=StudyModel)
    hardware: dict[str, object] | None = None
    global_batch: int | None = None
    num_generations: int | None = None
    max_steps: int | None = None
    max_completion_length: int | None = None
    semantics: dict[str, object] | None = None
    fixed: dict[str, object] = Field(default_factory=dict)
    dataset: str | None = None
    seed: int | None = None
    confirm_runs: int | None = None
    space: list[object] | dict[str, object] | None = None
    space_source: str | None = None
    dropped_knobs: dict[str, object] | None = None
    versions: dict[str, object] = Field(default_factory=dict)
    search: str | None = None
    budget: StudyBudget = Field(default_factory=StudyBudget)
    storage: str | None = None
    secret_args: list[str] = Field(default_factory=list)
    identity: dict[str, object] = Field(default_factory=dict)
    outcome: dict[str, object] | None = None
    recommendation: object = None  # any JSON: its reader says in one line when it is not one
    calibration: dict[str, object] | None = None

    #: entries of the wrong type, kept aside to be written back as they were
    _damaged: dict[str, object] = PrivateAttr(default_factory=dict)
    #: the keys in the order the file held them (written back in that order)
    _order: tuple[str, ...] = PrivateAttr(default=())

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> StudySettings:
        """The settings from ``study.json``'s object; an entry of the wrong type reads as missing."""
        data = {str(k): v for k, v in raw.items()}
        damaged: dict[str, object] = {}
        while True:
            try:
                settings = cls.model_validate(data)
                break
            except ValidationError as exc:
                bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"] and str(e["loc"][0]) in data}
                if not bad:  # pragma: no cover - every error of a top-level model names its key
                    raise
                damaged.update({k: data.pop(k) for k in bad})
        settings._damaged = damaged
        settings._order = tuple(str(k) for k in raw)
        return settings

    def to_json(self) -> dict[str, object]:
        """``study.json``'s object: the keys read, and only those (an entry of the wrong type as it was)."""
        out = {**self.model_dump(mode="json", exclude_unset=True), **self._damaged}
        return {**{k: out.pop(k) for k in self._order if k in out}, **out}

    @property
    def job_sizes(self) -> dict[str, int]:
        """The job's sizes the study recorded: ``global_batch``, ``num_generations``,
        ``max_completion_length`` (each when recorded), in the words a backend's ``describe`` reads."""
        sizes = {
            "global_batch": self.global_batch,
            "num_generations": self.num_generations,
            "max_completion_length": self.max_completion_length,
        }
        return {k: v for k, v in sizes.items() if v is not None}

    @property
    def knobs(self) -> list[dict[str, Any]]:
        """The search space as recorded, one mapping per knob (``name``, ``values``, ``default``,
        ``pinned``, ``memory``, ...); empty when the study recorded none."""
        return [k for k in self.space if isinstance(k, dict)] if isinstance(self.space, list) else []

    @property
    def stored_recommendation(self) -> bool:
        """The study ended and stored its recommendation (null when there was none to make)."""
        return "recommendation" in self.model_fields_set
