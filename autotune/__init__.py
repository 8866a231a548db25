"""autotune: profile and auto-tune GRPO fine-tuning jobs (ms-swift, TRL, verl).

From Python::

    import autotune

    study = autotune.load_study("runs/demo")  # .trials, .timelines, .phases (pandas)
    summary = autotune.search(model="tiny-qwen2", trials=4, out="runs/demo")
    plan = autotune.plan("Qwen2-7B", gpus=4, gpu_type="A10")

``import autotune`` stays cheap: these come from :mod:`autotune.app.api`, imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# the Python API (autotune.app.api), imported on first use so that `import autotune` loads nothing
_API = ("load_study", "search", "plan", "StudyFrames", "SearchSummary")

__all__ = ["__version__", "load_study", "search", "plan", "StudyFrames", "SearchSummary"]

if TYPE_CHECKING:
    from autotune.app.api import SearchSummary, StudyFrames, load_study, plan, search
    from autotune.version import __version__


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the version lives on the lowest floor (autotune.version)
        from autotune.version import __version__

        return __version__
    if name in _API:
        from autotune.app import api

        return getattr(api, name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API, "__version__"})
