"""A TRL job as the user has it: the YAML that ``trl grpo --config`` reads, kept the way TRL keeps it.

``trl grpo`` reads one YAML into three dataclasses — ``GRPOConfig`` (training), ``ModelConfig`` (the
model's dtype, attention, LoRA through ``use_peft`` / ``lora_*``) and its script arguments
(``dataset_name``, ``reward_funcs``, ``reward_model_name_or_path``, ...) — and hands every other key to
``accelerate launch`` (``accelerate_config``, ``num_processes``, ``mixed_precision``, ...). A study's
``--fixed`` file may be that YAML as it is:

- ``GRPOConfig`` and ``ModelConfig`` fields are kept in every trial (the TRL worker builds the LoRA
  adapter config from the ``ModelConfig`` ones, as ``trl grpo`` does);
- ``dataset_name`` is the study's dataset when ``--dataset`` is not given; ``reward_funcs`` and
  ``reward_model_name_or_path`` are the trials' rewards;
- what autotune sets in every trial (output directory, step budget, logging, the batch autotune derives)
  and the accelerate keys (the processes and ZeRO stage are knobs) cannot stay fixed: they are named in
  one line, never kept silently.

The field names come from the installed TRL's own dataclasses, so a release that adds or renames a field
is followed without a table here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from autotune.errors import BackendError

__all__ = ["TrlFields", "installed_fields", "job_notes", "model_fields_of", "SCRIPT_KEEPS"]

#: script arguments a trial keeps (read by the backend, not by ``GRPOConfig``)
SCRIPT_KEEPS = frozenset(
    {"dataset_name", "dataset_config", "dataset_train_split", "reward_funcs", "reward_model_name_or_path"}
)


@dataclass(frozen=True)
class TrlFields:
    """The field names of the installed TRL's ``trl grpo`` dataclasses."""

    grpo: frozenset[str]
    model: frozenset[str]
    script: frozenset[str]

    def kind(self, name: str) -> str | None:
        """``grpo``, ``model`` or ``script`` for a field of those classes (first match), else None."""
        for kind, names in (("grpo", self.grpo), ("model", self.model), ("script", self.script)):
            if name in names:
                return kind
        return None


@cache
def installed_fields() -> TrlFields | None:
    """The installed TRL's fields (None when TRL cannot be imported here)."""
    try:
        from trl import GRPOConfig, ModelConfig
        from trl.scripts.grpo import GRPOScriptArguments
    except Exception:  # noqa: BLE001 - no TRL here: nothing can be checked
        return None
    return TrlFields(
        grpo=frozenset(f.name for f in dataclasses.fields(GRPOConfig)),
        model=frozenset(f.name for f in dataclasses.fields(ModelConfig)),
        script=frozenset(f.name for f in dataclasses.fields(GRPOScriptArguments)),
    )


def model_fields_of(fixed: Mapping[str, object], fields: TrlFields) -> dict[str, Any]:
    """The ``ModelConfig`` fields of ``fixed`` that are not ``GRPOConfig``'s too."""
    return {k: v for k, v in fixed.items() if fields.kind(k) == "model"}


def job_notes(fixed: Mapping[str, object], owned: frozenset[str], fields: TrlFields | None) -> list[str]:
    """What of the user's TRL job cannot stay fixed, in one line (empty when all of it can).

    Raises:
        BackendError: ``model_name_or_path`` in the job (the model is autotune's ``--model``).
    """
    if "model_name_or_path" in fixed:
        raise BackendError(
            f"model_name_or_path ({fixed['model_name_or_path']}) is among the fixed arguments",
            hint="Give the model with autotune's --model option",
        )
    set_by_autotune = sorted(k for k in fixed if k in owned)
    script_only = sorted(
        k for k in fixed if fields is not None and fields.kind(k) == "script" and k not in SCRIPT_KEEPS
    )
    accelerate = sorted(k for k in fixed if fields is not None and fields.kind(k) is None and k not in owned)
    parts = []
    if set_by_autotune:
        parts.append(f"{', '.join(set_by_autotune)} (autotune sets them in every trial)")
    if accelerate:
        parts.append(f"{', '.join(accelerate)} (accelerate's: processes and ZeRO are knobs here)")
    if script_only:
        parts.append(f"{', '.join(script_only)} (trl grpo's script options)")
    return [f"not kept from your TRL job: {'; '.join(parts)}"] if parts else []
