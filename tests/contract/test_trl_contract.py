"""What a TRL trial renders, built by the installed frameworks' own constructors.

On a seeded sample of the TRL plan (:mod:`tests.contract.plan_sample`), half of it under a user's job
whose flags were typed by ``trl grpo``'s parser, each trial's ``GRPOConfig`` keywords are built the way
``trl grpo`` builds them (``HfArgumentParser`` over ``GRPOConfig`` and ``ModelConfig``: an unknown key or
a value TRL refuses fails here, not on a GPU), and, when the trial uses vLLM, its generation kwargs build
the ``vllm.SamplingParams`` TRL 1.16 builds in colocate mode (``generation/vllm_generation.py``). The
DeepSpeed JSON those trials write is checked in ``test_deepspeed_contract.py``.

The trials are rendered for four declared H100s; this host has none, so transformers' check that the
host supports bf16 (a fact of the GPU, not of the arguments) answers as an H100 would.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.contract.plan_sample import SAMPLE, plan_sample

pytestmark = pytest.mark.trl
pytest.importorskip("trl")

from autotune.backends.trl.backend import TrlBackend  # noqa: E402 - after the skip

#: a user's job, as typed after `--` (half the sample runs under it)
JOB = ["--beta", "0.04", "--learning_rate", "1e-5", "--use_peft", "--lora_r", "8", "--temperature", "0.9"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each sampled trial's ``grpo_config``, as the worker reads it from ``trial_config.json``."""
    backend = TrlBackend()
    job = TrlBackend.parse_fixed_argv(JOB)
    sample = plan_sample(
        backend, tmp_path_factory.mktemp("trl"), seed=38, fixed_of=lambda i: job if i % 2 else {}
    )
    out = []
    for item in sample:
        backend.render(item.spec, item.ctx)
        out.append(json.loads((item.ctx.trial_dir / "trial_config.json").read_text())["grpo_config"])
    return out


def test_the_sample_covers_the_plan(rendered: list[dict[str, Any]]) -> None:
    assert len(rendered) == SAMPLE
    assert {bool(c.get("use_vllm")) for c in rendered} == {True, False}
    assert {"deepspeed" in c for c in rendered} == {True, False}
    assert len({json.dumps(c, sort_keys=True) for c in rendered}) > SAMPLE // 2


def test_every_rendered_config_builds_a_grpo_config(
    rendered: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.training_args
    from transformers import HfArgumentParser
    from trl import GRPOConfig, ModelConfig

    from autotune.backends.trl.aliases import current_names, deprecated_aliases

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    parser = HfArgumentParser((GRPOConfig, ModelConfig))
    for kwargs in rendered:
        kwargs = current_names(kwargs, deprecated_aliases(GRPOConfig))  # as the worker does
        try:
            config, model = parser.parse_dict(kwargs)  # allow_extra_keys=False: an unknown key fails
        except (ValueError, TypeError) as exc:
            pytest.fail(f"GRPOConfig refuses {kwargs}: {exc}")
        assert config.per_device_train_batch_size == kwargs["per_device_train_batch_size"]
        assert bool(config.use_vllm) == bool(kwargs.get("use_vllm"))
        if "beta" in kwargs:
            assert config.beta == 0.04 and config.learning_rate == 1e-5 and model.lora_r == 8


def test_every_vllm_trials_generation_kwargs_build_sampling_params(rendered: list[dict[str, Any]]) -> None:
    """TRL 1.16 colocate mode: its own keys, updated with ``generation_kwargs``, into ``SamplingParams``
    (a ``msgspec.Struct``: ``min_new_tokens`` is not one of its fields, ``min_tokens`` is)."""
    try:
        from vllm import SamplingParams
    except Exception as exc:  # noqa: BLE001 - the CPU build of vLLM is an optional extra
        pytest.skip(f"vllm does not import here ({type(exc).__name__}: {exc})")
    with_vllm = [c for c in rendered if c.get("use_vllm")]
    assert with_vllm
    for config in with_vllm:
        kwargs: dict[str, Any] = {
            "n": 1,
            "repetition_penalty": 1.0,
            "temperature": config.get("temperature", 1.0),
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "max_tokens": config["max_completion_length"],
            "logprobs": 0,
        }
        kwargs.update(config.get("generation_kwargs") or {})
        try:
            params = SamplingParams(**kwargs)
        except TypeError as exc:
            pytest.fail(f"vllm.SamplingParams refuses the trial's generation_kwargs {kwargs}: {exc}")
        # the completion length is forced, so step times compare
        assert params.min_tokens == params.max_tokens == config["max_completion_length"]
