"""Search strategy: which configuration to try next, what can be skipped, when to stop."""

from __future__ import annotations

from autotune.search._inference import oom_dominated
from autotune.search._strategy import SEARCH_KINDS, SearchStrategy

__all__ = ["SEARCH_KINDS", "SearchStrategy", "oom_dominated"]
