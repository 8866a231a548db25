"""What every export format is written with: the winner, the files, the refusals; and the
framework-neutral formats.

:func:`load_winner` reads a study and picks the trial (:class:`Winner`); an exporter returns an
:class:`Export` (file name → content, and the main file); :func:`write_export` writes it without
overwriting the user's own files. Each framework's own format is written by its backend; the
``autotune export`` job that picks the format is :mod:`autotune.app.export`. Formats:

- ``swift``: a runnable ``swift rlhf --rlhf_type grpo`` script (:mod:`autotune.backends.swift.export`).
- ``trl``: ``grpo.yaml`` for ``trl grpo --config`` + accelerate / DeepSpeed configs (:mod:`autotune.backends.trl.export`).
- ``verl``: the hydra overrides of ``verl.trainer.main_ppo`` as a script (:mod:`autotune.backends.verl.export`).
- ``deepspeed``: the ``ds_config.json`` of the ZeRO stage and offload (:mod:`autotune.export.deepspeed`).
- ``json``: knobs, fixed arguments, measurements, versions (:mod:`autotune.export.jsonfmt`).
- ``command``: the winning trial's own command (:mod:`autotune.export.command`).

A winner whose knobs a format cannot express is refused with a one-line
:class:`~autotune.errors.UsageError` naming the knob.
"""

from __future__ import annotations

from autotune.export._common import EXPORT_FORMATS, MARKER, Export, write_export
from autotune.export._winner import BackendFacts, BackendLookup, Winner, load_winner

__all__ = [
    "EXPORT_FORMATS",
    "MARKER",
    "Export",
    "BackendFacts",
    "BackendLookup",
    "Winner",
    "load_winner",
    "write_export",
]
