"""A job shape refuses a DeepSpeed JSON of the user's own with one exact, actionable line, and reads
every other field through to its configuration."""

from __future__ import annotations

import pytest

from autotune.backends import job_shape
from autotune.errors import UsageError
from autotune.estimate import JobShape, find_model
from autotune.jobconfig import JobConfig

MODEL = find_model("Qwen2.5-0.5B")
CAUSE = "is a DeepSpeed config of its own: its ZeRO stage and offload cannot be estimated"
FIX = "Tune one of the framework's DeepSpeed presets instead"


def _config(**fields: object) -> JobConfig:
    base: dict[str, object] = {
        "world_size": 2,
        "global_batch": 16,
        "num_generations": 8,
        "per_device_batch": 4,
        "grad_accum": 2,
    }
    return JobConfig(**{**base, **fields})  # type: ignore[arg-type]


def test_an_own_deepspeed_json_is_refused_naming_the_field() -> None:
    assert MODEL is not None
    with pytest.raises(UsageError) as info:
        JobShape(_config(ds_config_path="ds.json"), MODEL, 2)
    # no knob set the field here, so the message names the field itself
    assert info.value.message == f"knob ds_config_path {CAUSE}"
    assert info.value.hint == FIX
    assert info.value.exit_code == 2


def test_an_own_deepspeed_json_is_refused_naming_the_users_knob() -> None:
    assert MODEL is not None
    with pytest.raises(UsageError) as info:
        job_shape(
            "swift", {"deepspeed": "/x/ds.json"}, {}, {"global_batch": 8, "num_generations": 8}, MODEL, 1
        )
    assert str(info.value) == f"knob deepspeed=/x/ds.json {CAUSE}. {FIX}"


def test_without_a_json_the_shape_is_built_and_reads_its_config_through() -> None:
    assert MODEL is not None
    s = JobShape(_config(zero_stage=2, deepspeed=True, beta=0.04), MODEL, 2)
    assert (s.world_size, s.global_batch, s.per_device_batch, s.grad_accum) == (2, 16, 4, 2)
    assert (s.zero_stage, s.deepspeed, s.beta, s.ds_config_path) == (2, True, 0.04, None)
    with pytest.raises(AttributeError):
        _ = s.no_such_field
