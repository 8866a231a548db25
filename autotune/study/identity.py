"""What defines a study: the settings a resumed study must keep, and what differs when they are not.

A study's trials compare with each other only if they ran the same job: the same backend and model,
the same batch shape and dataset, the same search space, the same fixed arguments and (for the
``command`` backend) the same command. ``study.json`` records these as ``identity``; running again
on the same directory with any of them changed is refused, naming what differs. The budget
(``--trials``, ``--time-budget``), the search, the seed, the trial length and the re-measurement may
change between runs: they change how much is measured, not what.

Values are stored as short digests, so a secret among the fixed arguments is never written (names
are).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["study_identity", "identity_differences"]

# Plain values, compared and named as they are.
_PLAIN = ("backend", "model", "global_batch", "num_generations", "max_completion_length", "dataset")
# Mappings of name → digest: the differing names are listed.
_KEYED = {
    "space": "a different search space (knobs: {})",
    "fixed": "different fixed arguments ({})",
    "backend_args": "a different {}",
}


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def study_identity(
    plain: Mapping[str, object],
    knobs: list[dict[str, Any]],
    fixed: Mapping[str, object],
    backend_args: Mapping[str, object],
) -> dict[str, Any]:
    """The identity ``study.json`` records.

    Args:
        plain: backend, model, global_batch, num_generations, max_completion_length, dataset.
        knobs: the space as ``SearchSpace.describe()`` gives it (a knob's values, default and
            conditions define it; its help text does not).
        fixed: the user's fixed arguments.
        backend_args: what the backend instance adds (``Backend.study_identity()``).
    """
    space = {
        k["name"]: _digest({f: k.get(f) for f in ("type", "values", "default", "when", "applies")})
        for k in knobs
    }
    return {
        **{key: plain.get(key) for key in _PLAIN},
        "space": space,
        "fixed": {name: _digest(value) for name, value in fixed.items()},
        "backend_args": {name: _digest(value) for name, value in backend_args.items()},
    }


def identity_differences(old: Mapping[str, object], new: Mapping[str, object]) -> list[str]:
    """What differs between a recorded identity and this run's, one phrase each (empty: the same).

    Only what both record is compared, so a study written by an older autotune (which recorded less)
    still resumes.
    """
    out: list[str] = []
    for key in _PLAIN:
        if key in old and key in new and old[key] != new[key]:
            out.append(f"{key} {old[key]!r}, not {new[key]!r}")
    for key, phrase in _KEYED.items():
        a, b = old.get(key), new.get(key)
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            continue
        names = sorted(n for n in {*a, *b} if a.get(n) != b.get(n))
        if names:
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            out.append(phrase.format(shown))
    return out
