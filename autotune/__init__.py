"""autotune: profile and auto-tune GRPO fine-tuning jobs (ms-swift, TRL, verl)."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
