"""The schema of a search-space file's knob: its fields and their shapes, as pydantic models.

:mod:`autotune.space` loads a file through these and then checks what a schema cannot say alone: a
knob's values typed by its own ``type``, conditions naming earlier knobs, ranges and defaults that fit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from autotune.errors import SpaceError

__all__ = ["NEEDS", "CpuValues", "KnobFields", "KnobType", "validated"]

KnobType = Literal["int", "float", "bool", "str"]
_Model = TypeVar("_Model", bound=BaseModel)

#: what a knob may need of the machine its trials run on (its ``applies:``); a space's ``Platform`` says
#: which of them it cannot give, and why.
NEEDS: Mapping[str, str] = {
    "any": "nothing: it applies everywhere",
    "gpu": "a GPU",
    "cpu": "a CPU-only run",
    "vllm": "the vLLM engine, in the trials' interpreter, built for this machine's platform",
    "vllm_sleep": "vLLM's sleep mode (memory released between rollouts)",
    "vllm_server": "training against a vLLM server (the trainer sends it the weights)",
}


class CpuValues(BaseModel):
    """A knob's ``cpu:`` block: the value fields it replaces on a CPU-only run (checked once merged)."""

    model_config = ConfigDict(extra="forbid")

    choices: object = Field(None, description="its choices there")
    low: object = Field(None, description="its lower bound there")
    high: object = Field(None, description="its upper bound there")
    step: object = Field(None, description="its step there")
    log: object = Field(None, description="its scale there")
    default: object = Field(None, description="its default there")


class KnobFields(BaseModel):
    """One knob as a space file writes it: the fields and their shapes. The values' own types follow
    ``type`` and ``when`` names earlier knobs, so those checks are the loader's (:mod:`autotune.space`)."""

    model_config = ConfigDict(extra="forbid")

    type: KnobType = Field(description="int, float, bool or str")
    default: object = Field(description="the framework's default")
    choices: list[object] | None = Field(None, min_length=1, description="a list of values")
    low: object = Field(None, description="the lower bound of a range")
    high: object = Field(None, description="the upper bound of a range")
    step: object = Field(None, description="the step of a range")
    log: StrictBool = Field(False, description="true for a log-scale range")
    when: dict[str, object] | None = Field(None, description="{earlier_knob: [values]}")
    applies: str = Field("any", description=f"what it needs of the machine: one of {', '.join(NEEDS)}")
    cpu: dict[str, object] | None = Field(None, description="its values on a CPU-only run")
    memory: Literal["increasing", "decreasing"] | None = Field(None, description="increasing or decreasing")
    help: Annotated[str, BeforeValidator(str)] = Field("", description="one line for the report")
    label: Annotated[str, BeforeValidator(str)] = Field("", description="a short name for tables")

    @field_validator("applies")
    @classmethod
    def _a_need(cls, value: str) -> str:
        if value not in NEEDS:
            raise PydanticCustomError("need", "Input should be one of: {needs}", {"needs": ", ".join(NEEDS)})
        return value


def validated(model: type[_Model], data: Mapping[str, object], here: str) -> _Model:
    """``data`` validated by ``model``. Raises its first error as one :class:`SpaceError` line."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _schema_error(model, exc.errors(include_url=False)[0], here) from None


def _schema_error(model: type[BaseModel], error: ErrorDetails, here: str) -> SpaceError:
    """One line naming the field, what it holds and what it should hold."""
    field = ".".join(str(part) for part in error["loc"])
    info = model.model_fields.get(str(error["loc"][0]))
    if error["type"] == "missing":
        return SpaceError(f"{here} has no {field}", hint=f"Add {field}: {info.description if info else ''}")
    if error["type"] == "extra_forbidden":
        return SpaceError(
            f"{here} has unknown field {field!r}", hint=f"Fields: {', '.join(model.model_fields)}"
        )
    shown = repr(error["input"])
    shown = shown if len(shown) <= 40 else shown[:39] + "…"
    return SpaceError(
        f"{here}: {field} is {shown}", hint=error["msg"].replace("Input", field.capitalize(), 1)
    )
