"""``python -m autotune``: the same command as the ``autotune`` console script."""

from __future__ import annotations

from autotune.cli.app import main

if __name__ == "__main__":
    main()
