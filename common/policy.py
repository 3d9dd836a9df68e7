"""Loading the policy and its tokenizer from a hub name or a local Hugging Face directory."""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy(model_name_or_path: str, dtype: str = "float32"):
    """(model, tokenizer); a tokenizer without a pad token pads with EOS (many base models ship without one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype=DTYPES[dtype])
    except OSError as e:
        raise SystemExit(f"--model_name_or_path {model_name_or_path!r}: cannot load a model/tokenizer ({e})")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
