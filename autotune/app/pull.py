"""``report`` and ``export`` with ``--storage … --study-name …``: the study comes from the storage."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import UsageError

__all__ = ["pull_if_asked"]


def pull_if_asked(directory: Path, storage: str | None, study_name: str | None) -> None:
    """Write the study of ``storage`` named ``study_name`` into ``directory`` (nothing without them).

    Raises:
        UsageError: one of the two options without the other; the storage or the study cannot be read.
    """
    if storage is None and study_name is None:
        return
    if storage is None or study_name is None:
        given, missing = ("--storage", "--study-name") if storage else ("--study-name", "--storage")
        raise UsageError(
            f"{given} needs {missing}",
            hint="Pass both to read a study from its storage, e.g. --storage postgresql://… --study-name NAME",
        )
    from autotune.secrets import SecretRule
    from autotune.study.mirror import pull

    pull(storage, study_name, directory, SecretRule().learning(["--storage", storage]))
