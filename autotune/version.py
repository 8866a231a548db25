"""autotune's version, on the lowest floor: the CLI's ``--version``, ``study.json``'s versions and the
package's ``autotune.__version__`` (served by the façade on first use) all read it here."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"  # pyproject.toml's [project] version says the same
