"""The registry of backends and of their export formats, and what is built from it by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

from autotune.backends._base import Backend
from autotune.errors import UsageError

if TYPE_CHECKING:
    from autotune.estimate.catalog import ModelSpec
    from autotune.estimate.shape import JobShape

__all__ = [
    "BACKENDS",
    "EXPORTERS",
    "backend_class",
    "exporter",
    "get_backend",
    "job_shape",
    "planned_backends",
]

# name -> "module:Class"; modules import their framework lazily, so listing them here is cheap.
BACKENDS: dict[str, str] = {
    "trl": "autotune.backends.trl.backend:TrlBackend",
    "swift": "autotune.backends.swift.backend:SwiftBackend",
    "command": "autotune.backends.command:CommandBackend",
    "verl": "autotune.backends.verl.backend:VerlBackend",
}


#: export format -> "module:function" writing a winner in that framework's own files; each framework's
#: format is its backend's (autotune.export adds the framework-neutral ones).
EXPORTERS: dict[str, str] = {
    "swift": "autotune.backends.swift.export:export_swift",
    "trl": "autotune.backends.trl.export:export_trl",
    "verl": "autotune.backends.verl.export:export_verl",
}


def _load(target: str) -> Any:
    module_name, attr = target.split(":")
    return getattr(import_module(module_name), attr)


def backend_class(name: str) -> type[Backend]:
    """The class of the backend called ``name`` (its facts, without building it).

    Raises:
        UsageError: an unknown name, as one line listing the known ones.
    """
    target = BACKENDS.get(name)
    if target is None:
        raise UsageError(
            f"unknown backend {name!r}",
            hint=f"Use --backend with one of: {', '.join(sorted(BACKENDS))}",
        )
    cls: type[Backend] = _load(target)
    return cls


def planned_backends() -> list[str]:
    """The backends ``plan`` can judge: those with a packaged search space (a framework's)."""
    return [name for name in BACKENDS if backend_class(name).space_name is not None]


def get_backend(name: str, **options: object) -> Backend:
    """Build the backend called ``name``; unknown names raise a one-line :class:`UsageError`."""
    return backend_class(name)(**options)


def exporter(fmt: str) -> Callable[..., Any] | None:
    """The function writing the winner in framework format ``fmt``, or None when no backend has it."""
    target = EXPORTERS.get(fmt)
    return None if target is None else _load(target)


def job_shape(
    backend: str,
    params: Mapping[str, object],
    derived: Mapping[str, object],
    fixed: Mapping[str, object],
    model: ModelSpec,
    n_gpus: int,
) -> JobShape:
    """One candidate of backend ``backend`` as the estimator sees it.

    Args:
        backend: the backend's name; its :meth:`~autotune.backends.Backend.describe` reads the knobs.
        params: the candidate's active knobs, named as the framework names them.
        derived: ``world_size`` and ``gradient_accumulation_steps`` when the backend derived them.
        fixed: the job facts that are the same for every trial (``global_batch``, ``num_generations``,
            ``max_prompt_length``, ``max_completion_length``, ``beta``, LoRA, ...), in the framework's
            own argument names.
        model: architecture facts.
        n_gpus: GPUs of the trial; 0 for a CPU-only trial.

    Raises:
        UsageError: an unknown backend, or a value that cannot be a number of the kind required.
    """
    from autotune.estimate.shape import JobShape

    try:
        config = backend_class(backend).describe(params, derived, fixed, n_gpus)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"cannot read the job shape: {exc}", hint="Check the knob and fixed-argument values"
        ) from None
    return JobShape(config, model, n_gpus)
