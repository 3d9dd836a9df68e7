"""Every `--cache_implementation` value trains a step at every compute dtype: the static cache is built in the compute
dtype (under bf16 autocast over fp32 weights transformers' own would hold fp32 keys and refuse bf16 values), and the
offloaded caches, which need CUDA, fall back to their on-device twins on CPU with a warning."""

import importlib
import json
import warnings

import pytest
import torch
from transformers.generation.utils import GenerationMixin

from common.generation.hf import HFGenerator, SamplingConfig
from common.generation.static_cache import ComputeDtypeStaticCache
from common.model.policy import load_policy
from common.run.flags import parse_args

VALUES = [None, "dynamic", "static", "offloaded", "offloaded_static"]
ARGV = [
    "--max_steps",
    "1",
    "--eval_prompts",
    "2",
    "--eval_samples",
    "1",
    "--eval_train_prompts",
    "0",
    "--prompts_per_step",
    "2",
    "--num_threads",
    "1",
]


def one_step(script, tiny_base, out, flags, monkeypatch):
    """Runs one training step in-process; returns the step's metrics row and the caches generate was given."""
    module = importlib.import_module(script)
    caches = []
    real = GenerationMixin.generate

    def watch(self, *args, **kwargs):
        caches.append(kwargs.get("past_key_values"))
        return real(self, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(GenerationMixin, "generate", watch)
        module.main(
            parse_args(
                module.Args,
                ["--model_name_or_path", tiny_base, "--output_dir", str(out), *ARGV, *flags],
            )
        )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row.get("step") == 1][-1], caches


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_cache_value_trains_a_step_in_ra_rloo(dtype, tiny_base, tmp_path, monkeypatch):
    for value in VALUES:
        flags = ["--dtype", dtype, "--seed_buffer", "false"] + (
            ["--cache_implementation", value] if value else []
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            row, caches = one_step("ra_rloo", tiny_base, tmp_path / f"{value}", flags, monkeypatch)
        assert row["step"] == 1 and torch.isfinite(torch.tensor(row["loss"])), (value, row)
        static = value in ("static", "offloaded_static")
        assert caches and all(isinstance(c, ComputeDtypeStaticCache) == static for c in caches), (
            value
        )
        if static:  # the buffers hold the compute dtype, whatever the weights' dtype
            assert {layer.keys.dtype for layer in caches[-1].layers} == {getattr(torch, dtype)}
        offloaded_warned = any("offloading needs CUDA" in str(w.message) for w in caught)
        assert offloaded_warned == (value or "").startswith("offloaded"), value


@pytest.mark.parametrize("script", ["ps_grpo", "pros_ppo", "ada_seq", "ada_est"])
def test_static_cache_with_bf16_trains_a_step_in_each_script(
    script, tiny_base, tmp_path, monkeypatch
):
    row, caches = one_step(
        script,
        tiny_base,
        tmp_path / script,
        ["--dtype", "bfloat16", "--cache_implementation", "static"],
        monkeypatch,
    )
    assert row["step"] == 1 and any(isinstance(c, ComputeDtypeStaticCache) for c in caches)


def test_static_cache_matches_the_dynamic_cache_in_float32(tiny_base):
    model, tokenizer = load_policy(tiny_base)
    prompts = [
        tokenizer.encode(text, add_special_tokens=False) for text in ["12 7 3 =", "4 4 9 81 ="]
    ]
    cfg = SamplingConfig(max_new_tokens=12, temperature=0.0)
    dynamic = HFGenerator(model, tokenizer, batch_size=4).generate(prompts, 2, cfg)
    static = HFGenerator(model, tokenizer, batch_size=4, cache_implementation="static").generate(
        prompts, 2, cfg
    )
    assert static.completion_ids == dynamic.completion_ids
