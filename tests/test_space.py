from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import SpaceError
from autotune.space import Platform, canonical_key, load_space

SPACE = """
backend: trl
knobs:
  per_device_train_batch_size: {type: int, choices: [2, 4, 8], default: 8, memory: increasing}
  zero_stage: {type: int, choices: [0, 2, 3], default: 0, memory: decreasing}
  offload_optimizer: {type: bool, default: false, when: {zero_stage: [2, 3]}, memory: decreasing}
  offload_param: {type: bool, default: false, when: {zero_stage: [3]}}
  use_vllm: {type: bool, default: false, applies: gpu}
  vllm_gpu_memory_utilization: {type: float, low: 0.3, high: 0.9, step: 0.3, default: 0.3, when: {use_vllm: [true]}, applies: gpu}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "space.yaml"
    p.write_text(text)
    return p


def test_conditional_knobs_do_not_multiply_the_space(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, SPACE), backend="trl")
    cpu = space.restrict(Platform.machine(gpu_present=False))
    # batch 3 × (zero0: 1, zero2: 2 offload, zero3: 2×2) = 3 × 7
    assert cpu.size() == 21
    assert set(cpu.dropped) == {"use_vllm", "vllm_gpu_memory_utilization"}
    gpu = space.restrict(Platform.machine(gpu_present=True))
    # × (vllm off: 1, on: 3 utilizations) = 21 × 4
    assert gpu.size() == 84
    grid = list(gpu.grid())
    assert all("offload_param" not in p for p in grid if p["zero_stage"] != 3)
    assert len({canonical_key(p) for p in grid}) == len(grid)


def test_active_drops_inactive_knobs_and_fills_defaults(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, SPACE)).restrict(Platform.machine(gpu_present=False))
    assert space.active({"zero_stage": 0, "offload_optimizer": True}) == {
        "per_device_train_batch_size": 8,
        "zero_stage": 0,
    }
    assert space.active({"zero_stage": 3})["offload_param"] is False


def test_suggest_asks_only_active_knobs(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, SPACE)).restrict(Platform.machine(gpu_present=True))
    asked: list[str] = []

    class Fake:
        def suggest_categorical(self, name, choices):
            asked.append(name)
            return {"zero_stage": 2, "use_vllm": False}.get(name, choices[0])

        def suggest_int(self, name, low, high, step=1, log=False):
            raise AssertionError("no int ranges here")

        def suggest_float(self, name, low, high, *, step=None, log=False):
            asked.append(name)
            return low

    params = space.suggest(Fake())
    assert asked == ["per_device_train_batch_size", "zero_stage", "offload_optimizer", "use_vllm"]
    assert params == {
        "per_device_train_batch_size": 2,
        "zero_stage": 2,
        "offload_optimizer": False,
        "use_vllm": False,
    }


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("knobs: [unclosed", "not valid YAML"),
        (
            "knobs:\n  bs: {type: int, choices: [1, 2]}\n",
            "has no default. Add default: the framework's default",
        ),
        ("knobs:\n  bs: {type: int, choices: [1, 'x'], default: 1}\n", "is not a int"),
        ("knobs:\n  bs: {type: int, low: 1, high: 'big', default: 1}\n", "is not a int"),
        (
            "knobs:\n  a: {type: bool, default: false, when: {b: [true]}}\n  b: {type: bool, default: false}\n",
            "not an earlier knob",
        ),
        (
            "knobs:\n  bs: {type: integer, choices: [1], default: 1}\n",
            "type is 'integer'. Type should be 'int'",
        ),
        ("knobs:\n  bs: {type: int, choices: [1], default: 1, colour: red}\n", "has unknown field 'colour'"),
        ("knobs:\n  bs: {type: int, choices: [], default: 1}\n", "choices is []"),
        ("knobs:\n  bs: {type: int, low: 1, high: 2, log: 'yes', default: 1}\n", "log is 'yes'"),
        ("knobs:\n  bs: {type: int, choices: [1], default: 1, memory: up}\n", "memory is 'up'"),
        ("nothing: here\n", "no 'knobs' mapping"),
        ("knobs:\n  bs: {type: int, choices: [1, 2], default: 3}\n", "default 3 is not one of its values"),
    ],
)
def test_bad_space_files_give_one_line_errors(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(SpaceError) as info:
        load_space(write(tmp_path, text))
    message = info.value.one_line()
    assert needle in message
    assert "\n" not in message


def test_unknown_knob_for_backend(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match="unknown knob 'bogus'"):
        load_space(
            write(tmp_path, "knobs:\n  bogus: {type: int, choices: [1], default: 1}\n"),
            backend="trl",
            known_knobs=frozenset({"zero_stage"}),
        )


def test_space_for_another_backend_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpaceError, match="written for backend 'swift'"):
        load_space(
            write(tmp_path, "backend: swift\nknobs:\n  a: {type: int, choices: [1], default: 1}\n"),
            backend="trl",
        )


def test_float_range_values_and_contains(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, SPACE))
    knob = space["vllm_gpu_memory_utilization"]
    assert knob.values() == (0.3, 0.6, 0.9)
    assert knob.contains(0.45) and not knob.contains(0.95) and not knob.contains(True)


def test_narrow_keeps_listed_values_and_rejects_outside(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, SPACE)).restrict(Platform.machine(gpu_present=False))
    narrowed = space.narrow({"zero_stage": [3]})
    assert {p["zero_stage"] for p in narrowed.grid()} == {3}
    with pytest.raises(SpaceError, match="outside knob"):
        space.narrow({"zero_stage": [1]})


def test_canonical_key_is_order_and_float_stable() -> None:
    assert canonical_key({"a": 1, "b": 0.30000000000000004}) == canonical_key({"b": 0.3, "a": 1})
    assert canonical_key({"a": True}) != canonical_key({"a": 1.5})


def test_a_pinned_knob_has_one_value_in_every_configuration(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, SPACE), backend="trl").restrict(Platform.machine(gpu_present=True))
    pinned = space.pin({"per_device_train_batch_size": 4})
    grid = list(pinned.grid())
    assert grid and {p["per_device_train_batch_size"] for p in grid} == {4}
    assert len(grid) == space.size() // 3  # one of three batch sizes, the rest untouched
    assert pinned.defaults()["per_device_train_batch_size"] == 4  # the baseline holds it too
    assert pinned.pinned == {"per_device_train_batch_size": 4}
    assert "per_device_train_batch_size" not in pinned.searched and "zero_stage" in pinned.searched
    described = {k["name"]: k["pinned"] for k in pinned.describe()}
    assert described["per_device_train_batch_size"] is True and described["zero_stage"] is False


def test_pinning_a_conditional_knob_keeps_its_condition(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, SPACE), backend="trl").restrict(Platform.machine(gpu_present=True))
    grid = list(space.pin({"offload_param": True}).grid())
    # offload_param exists only under ZeRO-3: pinning it keeps ZeRO-3 in every configuration
    assert grid and all(p["zero_stage"] == 3 and p["offload_param"] is True for p in grid)


@pytest.mark.parametrize(
    ("pins", "needle", "hint"),
    [
        ({"no_such": 1}, "cannot pin 'no_such': no such knob", "Knobs: per_device_train_batch_size"),
        ({"per_device_train_batch_size": 3}, "to 3: not one of its values", "Allowed: 2, 4, 8"),
        ({"use_vllm": True}, "it was dropped (needs a GPU", "Knobs:"),
        (
            {"offload_param": True, "zero_stage": 2},
            "exists only when zero_stage is one of [3]",
            "Pin zero_stage to one of [3]",
        ),
    ],
)
def test_a_bad_pin_names_the_valid_choices(tmp_path: Path, pins: dict, needle: str, hint: str) -> None:
    space = load_space(write(tmp_path, SPACE), backend="trl").restrict(Platform.machine(gpu_present=False))
    with pytest.raises(SpaceError) as info:
        space.pin(pins)
    assert needle in info.value.message and hint in (info.value.hint or "")
    assert info.value.exit_code == 2


PLATFORM_SPACE = """
backend: swift
knobs:
  use_vllm: {type: bool, default: false, applies: vllm}
  vllm_mode: {type: str, choices: [colocate, server], default: colocate, when: {use_vllm: [true]}, applies: vllm_server}
  vllm_gpu_memory_utilization:
    type: float
    low: 0.3
    high: 0.9
    step: 0.1
    default: 0.9
    when: {use_vllm: [true], vllm_mode: [colocate]}
    applies: vllm
    cpu: {low: 0.1, high: 0.2, default: 0.1}
  sleep_level: {type: int, choices: [0, 1, 2], default: 0, when: {use_vllm: [true]}, applies: vllm_sleep}
"""


def test_a_knob_is_dropped_with_the_platforms_own_reason_for_what_it_needs(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, PLATFORM_SPACE))
    cpu = space.restrict(
        Platform.machine(
            gpu_present=False, vllm_sleep="Sleep mode is not supported", vllm_server="needs CUDA"
        )
    )
    assert cpu.dropped == {"vllm_mode": "needs CUDA", "sleep_level": "Sleep mode is not supported"}
    util = cpu["vllm_gpu_memory_utilization"]  # its cpu: values
    assert (util.values()[0], util.values()[-1], util.default) == pytest.approx((0.1, 0.2, 0.1))
    # the dropped mode's default lets the utilization exist, under use_vllm only
    assert sorted(map(canonical_key, cpu.grid())) == sorted(
        map(canonical_key, [{"use_vllm": False}, {"use_vllm": True, "vllm_gpu_memory_utilization": 0.1},
                            {"use_vllm": True, "vllm_gpu_memory_utilization": 0.2}])
    )  # fmt: skip
    assert cpu.pin({"vllm_gpu_memory_utilization": 0.2})["use_vllm"].values() == (True,)
    gpu = space.restrict(Platform.machine(gpu_present=True))
    assert gpu.dropped == {} and gpu["vllm_gpu_memory_utilization"].high == pytest.approx(0.9)
    none = space.restrict(Platform.machine(gpu_present=False, vllm="no vLLM here"))
    assert none.dropped["use_vllm"] == "no vLLM here"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("applies: tpu", "applies is 'tpu'. Applies should be one of: any, gpu, cpu, vllm"),
        ("cpu: {low: 1.0}", "low 1.0 is above high 0.9"),
        (
            "cpu: {colour: red}",
            "cpu has unknown field 'colour'. Fields: choices, low, high, step, log, default",
        ),
        ("cpu: {}", "must map some of"),
    ],
)
def test_a_bad_applies_or_cpu_block_is_refused(tmp_path: Path, extra: str, message: str) -> None:
    text = f"""
backend: trl
knobs:
  vllm_gpu_memory_utilization: {{type: float, low: 0.3, high: 0.9, default: 0.3, {extra}}}
"""
    with pytest.raises(SpaceError, match=message):
        load_space(write(tmp_path, text))


def test_a_knob_no_configuration_makes_active_is_not_searched(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, SPACE), backend="trl").restrict(Platform.machine(gpu_present=True))
    assert "offload_optimizer" in space.searched  # ZeRO 2 or 3 can be drawn
    zero0 = space.narrow({"zero_stage": [0]})
    assert "offload_optimizer" not in zero0.searched  # exists only at ZeRO 2/3: never active here
    assert "offload_optimizer" not in zero0.reachable() and "zero_stage" in zero0.reachable()
    assert "per_device_train_batch_size" in zero0.searched
