"""Loading the policy and its tokenizer (hub name or local directory), and the compute dtype of
forward passes."""

from __future__ import annotations

import contextlib
import copy

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(model_name_or_path: str, dtype: str = "float32"):
    """(model, tokenizer); a tokenizer without a pad token pads with EOS. Trained models load in
    fp32 (master weights: a ~1e-6 AdamW step rounds away on bf16 weights); bf16 compute comes from
    `autocast` around forward passes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        with library_bars_off():
            model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype=DTYPES[dtype])
    except OSError as e:
        raise SystemExit(
            f"--model_name_or_path {model_name_or_path!r}: cannot load a model/tokenizer ({e})"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


@contextlib.contextmanager
def library_bars_off(datasets=None):
    """transformers' own progress bars ("Loading weights", "Writing model shards"), and the
    `datasets` module's when given, off inside: a run's output has one bar, its step bar (the hub's
    download bars stay)."""
    from transformers.utils import logging

    previous = logging.set_tqdm_hook(
        lambda factory, args, kwargs: factory(*args, **{**kwargs, "disable": True})
    )
    datasets_on = datasets is not None and datasets.is_progress_bar_enabled()
    if datasets_on:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        logging.set_tqdm_hook(previous)
        if datasets_on:
            datasets.enable_progress_bars()


def autocast(device: torch.device, dtype: str):
    """The compute dtype of forward passes over fp32 weights: torch autocast on CPU or CUDA
    (`float32`: a no-op)."""
    return torch.autocast(device.type, dtype=DTYPES[dtype], enabled=dtype != "float32")


def frozen_reference(policy: torch.nn.Module, dtype: str, fsdp: bool = False) -> torch.nn.Module:
    """The KL reference: a frozen copy of the initial `policy` that computes exactly as the policy
    does at step 0 (under the same autocast), so the KL before any update is 0. Stored in `dtype`
    only where the policy's forward rounds to it anyway: with `fsdp`, every parameter (FSDP's mixed
    precision gathers the policy's in `dtype`); without, the weights of linear layers (autocast
    casts them at each forward), while embeddings, norms and every buffer (e.g. rotary frequencies)
    stay fp32 as the policy keeps them."""
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if dtype == "float32":
        return reference
    if fsdp:
        params = list(reference.parameters())
    # a weight shared with another module (tied embeddings and head) is read outside autocast too:
    # kept fp32
    else:
        others = {
            id(param)
            for module in reference.modules()
            if not isinstance(module, torch.nn.Linear)
            for param in module.parameters(recurse=False)
        }
        params = [
            param
            for module in reference.modules()
            if isinstance(module, torch.nn.Linear)
            for param in module.parameters(recurse=False)
            if id(param) not in others
        ]
    for param in params:
        param.data = param.data.to(DTYPES[dtype])
    return reference


def tied_keys(model) -> set[str]:
    """The weights a model with tied embeddings does not save apart (the output head's)."""
    return {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
