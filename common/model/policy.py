"""Loading the policy and its tokenizer (hub name or local directory), and the compute dtype of
forward passes."""

from __future__ import annotations

import contextlib

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


def tied_keys(model) -> set[str]:
    """The weights a model with tied embeddings does not save apart (the output head's)."""
    return {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
