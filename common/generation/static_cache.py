"""The KV caches of HF generate (common/generation/hf.py) besides transformers' default dynamic one,
loaded only for one: whether transformers supports a static cache for a model, the static cache that
holds the compute dtype, and an offloaded cache asked for on CPU."""

from __future__ import annotations

import warnings

import torch
from transformers import StaticCache


class ComputeDtypeStaticCache(StaticCache):
    """transformers' `StaticCache` holding `--dtype`: under bf16 autocast over fp32 weights, keys
    come out of the rotary embedding in fp32 and values in bf16, which transformers' own static
    cache cannot store (docs/scaling.md)."""

    def __init__(
        self, config, max_cache_len: int, compute_dtype: torch.dtype, offloading: bool = False
    ):
        super().__init__(config=config, max_cache_len=max_cache_len, offloading=offloading)
        self.compute_dtype = compute_dtype

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(
            key_states.to(self.compute_dtype),
            value_states.to(self.compute_dtype),
            layer_idx,
            *args,
            **kwargs,
        )


def static_cache_supported(model_or_config) -> bool:
    """Whether transformers can generate with (and, on a GPU, compile the decoding step on) a static
    KV cache for this model: its class says it compiles whole-graph and takes `Cache` objects, and
    no quantizer rules compiling out. A config is looked up as the causal-LM class it builds."""
    from transformers import PretrainedConfig

    if isinstance(model_or_config, PretrainedConfig):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        try:
            cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(model_or_config)]
        except KeyError:
            return False
        quantizer = None
    else:
        model = model_or_config
        if hasattr(model, "get_base_model"):  # a PEFT wrapper: the class that generates is inside
            model = model.get_base_model()
        cls, quantizer = type(model), getattr(model, "hf_quantizer", None)
    supports_cache = getattr(cls, "_supports_default_dynamic_cache", None)
    return (
        bool(getattr(cls, "_can_compile_fullgraph", False))
        and (supports_cache is None or bool(supports_cache()))
        and (quantizer is None or bool(getattr(quantizer, "is_compileable", False)))
    )


def static_cache_kwargs(model, cache_implementation: str, dtype: str, max_cache_len: int) -> dict:
    """`generate`'s keywords for a static cache held in the compute dtype (offloaded for
    `offloaded_static`)."""
    from common.model.policy import DTYPES

    cache = ComputeDtypeStaticCache(
        model.config,
        max_cache_len,
        DTYPES[dtype],
        offloading=cache_implementation == "offloaded_static",
    )
    return {"past_key_values": cache}


def auto_on_cuda(model_or_config, fsdp: bool) -> tuple[str | None, str]:
    """--cache_implementation auto on CUDA, and its line: the static cache where transformers
    supports it for the model (it compiles the decoding step there: several times faster than the
    dynamic cache). Under `fsdp` the dynamic cache: the static one has not been run with FSDP on a
    GPU."""
    if fsdp:
        return None, (
            "KV cache: dynamic (--cache_implementation auto with --fsdp; "
            "--cache_implementation static to try the static cache)"
        )
    if not static_cache_supported(model_or_config):
        name = getattr(model_or_config, "model_type", None) or type(model_or_config).__name__
        return None, (
            f"KV cache: dynamic (--cache_implementation auto on cuda: transformers does not "
            f"support a static cache for {name})"
        )
    return "static", "KV cache: static (--cache_implementation auto on cuda)"


def without_offloading(cache_implementation: str) -> str:
    """The cache an offloaded `cache_implementation` asked for on CPU runs as, with a warning:
    offloading moves layers with CUDA streams, and a CPU cache already lives in host memory."""
    kept = {"offloaded": "dynamic", "offloaded_static": "static"}[cache_implementation]
    warnings.warn(
        f"--cache_implementation {cache_implementation} on CPU: the cache already lives in "
        f"host memory (offloading needs CUDA); using {kept}"
    )
    return kept
