"""The static KV cache of HF generate (common/generation/hf.py), loaded only for one: whether
transformers supports it for a model, and the cache that holds the compute dtype."""

from __future__ import annotations

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
