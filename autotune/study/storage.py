"""Where a study's Optuna records live: opening the storage, and the one-line error when it cannot be.

The default is SQLite inside the study directory; ``--storage`` takes any Optuna storage URL
(``postgresql://…`` for workers on several hosts). Nothing here prints a URL's password: every URL
shown goes through :meth:`SecretRule.redact_url`.
"""

from __future__ import annotations

from autotune.errors import UsageError
from autotune.secrets import SecretRule

__all__ = ["storage_error"]


def storage_error(url: str, exc: Exception, secrets: SecretRule) -> UsageError:
    """The one-line error for a storage that cannot be opened: a URL no driver knows, a missing
    directory, a driver not installed, a server out of reach (the URL's password masked)."""
    cause = getattr(exc, "orig", None) or exc
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    text = lines[0] if lines else type(cause).__name__
    if isinstance(exc, ImportError) or "DB access module" in text:
        module = getattr(exc.__cause__, "name", None) or getattr(exc, "name", None)
        text = "the database driver for this URL is not installed" + (
            f" (no module {module})" if module else ""
        )
    return UsageError(
        f"cannot open study storage {secrets.redact_url(url)}: {secrets.mask(text)[:200]}",
        hint="Pass a valid Optuna storage URL with --storage (sqlite:////abs/path.db, postgresql://…) whose "
        "directory or server exists",
    )
