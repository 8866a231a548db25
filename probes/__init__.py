"""Probes: samplers that run beside (or inside) a trial. This package never imports ``autotune``."""

from __future__ import annotations

__all__: list[str] = []
