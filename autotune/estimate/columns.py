"""Many job shapes at once: one numpy column per field the estimates read (``autotune plan``).

:class:`ShapeColumns` reads like a :class:`~autotune.estimate.shape.JobShape` whose every field is a
column with a row per candidate, so the memory and step-time formulas (written once, with
:mod:`autotune.estimate._vec`) evaluate every candidate of a space in one pass. The derived properties
below are :class:`JobShape`'s, column-wise; ``tests/estimate/test_plan_columns.py`` holds them to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from autotune.estimate.catalog import ModelSpec

__all__ = ["CONFIG_COLUMNS", "ShapeColumns"]

#: the JobConfig fields the estimates read, and the dtype of their column (None values become 0 / "").
CONFIG_COLUMNS: dict[str, Any] = {
    "world_size": np.int64,
    "global_batch": np.int64,
    "num_generations": np.int64,
    "per_device_batch": np.int64,
    "grad_accum": np.int64,
    "max_prompt_length": np.int64,
    "max_completion_length": np.int64,
    "gradient_checkpointing": np.bool_,
    "dataloader_num_workers": np.int64,
    "deepspeed": np.bool_,
    "zero_stage": np.int64,
    "ds_offload_optimizer": np.bool_,
    "ds_offload_param": np.bool_,
    "fsdp": np.bool_,
    "micro_batch_tokens": np.int64,
    "reference_offload": np.bool_,
    "lora_rank": np.int64,
    "beta": np.float64,
    "use_vllm": np.bool_,
    "vllm_mode": np.str_,
    "vllm_util": np.float64,
    "vllm_tp": np.int64,
    "sleep_level": np.int64,
    "rollout_offload_model": np.bool_,
    "rollout_offload_optimizer": np.bool_,
    "move_model_batches": np.int64,
    "vllm_max_model_len": np.int64,
    "vllm_max_num_seqs": np.int64,
    "vllm_max_num_batched_tokens": np.int64,
    "vllm_chunked_prefill": np.bool_,
    "weight_sync": np.str_,
    "loads_before_vllm": np.bool_,
    "ds_bucket_elements": np.int64,
}


def column(values: list[Any], dtype: Any) -> np.ndarray:
    """One JobConfig field of many configurations as a column (None → 0, or "" for text)."""
    if dtype is np.str_:
        return np.array(["" if x is None else str(x) for x in values])
    return np.array([0 if x is None else x for x in values], dtype=dtype)


@dataclass(frozen=True)
class ShapeColumns:
    """Candidates on one model and ``n_gpus`` GPUs, a column per JobConfig field.

    Attributes:
        config: field name → column (every key of :data:`CONFIG_COLUMNS`).
        model: architecture facts.
        n_gpus: GPUs per trial (plans run on GPUs: > 0).
    """

    config: Mapping[str, np.ndarray]
    model: ModelSpec
    n_gpus: int

    def __len__(self) -> int:
        return len(self.config["world_size"])

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not fields or properties of the columns themselves.
        try:
            return self.config[name]
        except KeyError:
            raise AttributeError(name) from None

    def take(self, rows: np.ndarray) -> ShapeColumns:
        """The candidates at ``rows`` (an index or mask array)."""
        return ShapeColumns({k: c[rows] for k, c in self.config.items()}, self.model, self.n_gpus)

    # --- JobShape's properties, column-wise ---------------------------------------------------

    @property
    def on_gpu(self) -> bool:
        return self.n_gpus > 0

    @cached_property
    def use_vllm(self) -> np.ndarray:
        return self.config["use_vllm"] & self.on_gpu

    @cached_property
    def vllm_mode(self) -> np.ndarray:
        mode = self.config["vllm_mode"]
        return np.where(mode == "", "colocate", mode)

    @cached_property
    def colocate(self) -> np.ndarray:
        return self.use_vllm & (self.vllm_mode == "colocate")

    @cached_property
    def vllm_tp(self) -> np.ndarray:
        return np.where(self.use_vllm, self.config["vllm_tp"], 1)

    @cached_property
    def sleep_level(self) -> np.ndarray:
        return np.where(self.colocate, self.config["sleep_level"], 0)

    @cached_property
    def rollout_offload_model(self) -> np.ndarray:
        return self.config["rollout_offload_model"] & self.colocate

    @cached_property
    def rollout_offload_optimizer(self) -> np.ndarray:
        return self.config["rollout_offload_optimizer"] & self.colocate

    @cached_property
    def move_model_batches(self) -> np.ndarray:
        return np.where(self.config["zero_stage"] == 3, self.config["move_model_batches"], 0)

    @cached_property
    def vllm_max_model_len(self) -> np.ndarray:
        given = self.config["vllm_max_model_len"]
        return np.where(given > 0, given, self.model.max_position)

    @cached_property
    def lora(self) -> np.ndarray:
        return self.config["lora_rank"] > 0

    @cached_property
    def seq_len(self) -> np.ndarray:
        return self.config["max_prompt_length"] + self.config["max_completion_length"]

    @cached_property
    def states_sharding(self) -> np.ndarray:
        """JobConfig.states_sharding, with 0 for None (every process holds the states whole)."""
        c = self.config
        return np.where((c["deepspeed"] | c["fsdp"]) & (c["zero_stage"] > 0), c["zero_stage"], 0)

    @cached_property
    def micro_batch_tokens(self) -> np.ndarray:
        packed = self.config["micro_batch_tokens"]
        return np.where(packed > 0, packed, self.config["per_device_batch"] * self.seq_len)

    @cached_property
    def has_reference(self) -> np.ndarray:
        return (self.config["beta"] > 0) & ~self.lora
