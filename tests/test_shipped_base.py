"""The built embedded policies ship with the repo (assets/): a fresh clone uses them instead of ~15 minutes of SFT,
only while their recipe hash matches, and a rebuild from the recipe retraces the shipped build."""

import json
import shutil
from dataclasses import asdict

import pytest
import torch

from common.demo import countdown_env, tiny_model
from common.demo.tiny_model import (
    BaseRecipe,
    build_char_tokenizer,
    build_tiny_model,
    ensure_embedded_base,
)


def _no_build(*_args, **_kwargs):
    raise AssertionError("built from the recipe although a shipped copy matches")


def test_the_default_base_and_multiturn_warmup_come_from_assets_without_sft(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    monkeypatch.delenv("RLVR_NO_SHIPPED", raising=False)
    monkeypatch.setattr(tiny_model, "sft_base_policy", _no_build)
    monkeypatch.setattr(countdown_env, "sft_multiturn", _no_build)
    logs = []
    path = ensure_embedded_base(log=logs.append)
    shipped = tiny_model.SHIPPED / path.name
    assert path.parent == tmp_path and shipped.is_dir() and any("shipped" in line for line in logs)
    info = json.loads((path / "build_info.json").read_text())
    assert (
        tiny_model.weights_sha256(path)
        == info["weights_sha256"]
        == tiny_model.weights_sha256(shipped)
    )
    assert info["recipe"] == json.loads(
        json.dumps(asdict(BaseRecipe()))
    )  # the default recipe's build
    from ps_grpo import Args as PSArgs  # the warm-up ps_grpo.py asks for by default

    ps = PSArgs()
    recipe = countdown_env.MultiTurnRecipe(ps.env_numbers, ps.env_max_number, ps.mt_sft_steps)
    mt = countdown_env.ensure_multiturn_policy(str(path), recipe, log=logs.append)
    assert mt.parent == tmp_path and (tiny_model.SHIPPED / mt.name).is_dir()
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(mt).num_parameters() == info["params"]


def test_a_damaged_shipped_copy_or_another_recipe_is_not_used(tmp_path, monkeypatch):
    name = f"countdown-base-{BaseRecipe().key()}"
    assets = tmp_path / "assets"
    shutil.copytree(tiny_model.SHIPPED / name, assets / name)
    weights = assets / name / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")  # one flipped tail
    monkeypatch.setattr(tiny_model, "SHIPPED", assets)
    logs = []
    assert tiny_model.restore_shipped(tmp_path / "cache" / name, logs.append) is False
    assert "does not match" in logs[0] and not (tmp_path / "cache" / name).exists()
    assert (
        tiny_model.restore_shipped(
            tmp_path / "cache" / f"countdown-base-{BaseRecipe(seed=1).key()}"
        )
        is False
    )
    monkeypatch.setattr(tiny_model, "SHIPPED", tiny_model.SHIPPED.parent / "assets")
    monkeypatch.setenv("RLVR_NO_SHIPPED", "1")  # the escape hatch: always build from the recipe
    assert tiny_model.restore_shipped(tmp_path / "cache2" / name) is False


def test_a_rebuild_from_the_recipe_retraces_the_shipped_build(monkeypatch):
    # the cache name hashes the recipe and the task's levels, not the code: a change to the data generator, the
    # model's init or the SFT step would leave the name (and the shipped copy) in place. The first SFT losses of a
    # rebuild must match those the shipped build recorded.
    recipe = BaseRecipe()
    info = json.loads(
        (tiny_model.SHIPPED / f"countdown-base-{recipe.key()}" / "build_info.json").read_text()
    )
    trace = info["sft_loss_trace"]
    assert len(trace) == tiny_model.TRACE_STEPS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the build's own setting (build_info: torch_threads)
    try:
        tokenizer = build_char_tokenizer()
        with torch.random.fork_rng(devices=[]):
            model = build_tiny_model(recipe, len(tokenizer))
            got = tiny_model.sft_base_policy(
                model, tokenizer, recipe, log=lambda *_: None, stop_after=len(trace)
            )
    finally:
        torch.set_num_threads(threads)
    assert got["sft_loss_trace"] == pytest.approx(trace, abs=1e-4)
    assert (
        got["sft_loss_trace"][-1] < got["sft_loss_trace"][0] - 0.5
    )  # it is learning, not a constant
