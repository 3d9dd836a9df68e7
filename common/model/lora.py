"""LoRA for the policy (peft, optional): the adapters, the reference as the same weights with the
adapters off, and the merged full weights for the vLLM push and checkpoint exports. Imported only
with --lora_r (or by the vLLM backend and checkpoints when the model carries adapters)."""

from __future__ import annotations

import torch

from common.model.policy import DTYPES


def add_lora(model, r: int, alpha: int, target_modules: str, dtype: str = "float32"):
    """LoRA adapters (peft) on `model`: only they train. With bf16 compute the frozen base is stored
    in bf16 while the adapters stay fp32 (peft upcasts them), so the adapters are the fp32 master
    weights."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise SystemExit("--lora_r: LoRA needs peft (pip install peft)") from None
    if r < 1 or alpha <= 0:
        raise SystemExit(
            f"--lora_r {r} / --lora_alpha {alpha}: need lora_r >= 1 (0 = no LoRA) and lora_alpha > "
            "0"
        )
    targets = (
        target_modules
        if target_modules == "all-linear"
        else [m.strip() for m in target_modules.split(",")]
    )
    try:
        return get_peft_model(
            model.to(DTYPES[dtype]),
            LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, task_type="CAUSAL_LM"),
        )
    except ValueError as e:  # e.g. a target module name the model does not have
        raise SystemExit(f"--lora_target_modules {target_modules!r}: {e}") from None


class AdaptersOff(torch.nn.Module):
    """A LoRA policy's frozen reference: the same weights with the adapters disabled (no second
    copy)."""

    def __init__(self, peft_model):
        super().__init__()
        # in a list: not registered as a submodule, so it adds no parameters
        self.peft = [peft_model]

    @torch.no_grad()
    def forward(self, **kwargs):
        with self.peft[0].disable_adapter():
            return self.peft[0](**kwargs)


@torch.no_grad()
def merged_state_dict(model) -> dict:
    """Full weights under the base model's own names, LoRA deltas (B·A·alpha/r) folded in without
    touching the model (peft's merge/unmerge would round the frozen base a little at every call);
    plain state_dict otherwise."""
    if not hasattr(model, "get_base_model"):
        return model.state_dict()
    base = model.get_base_model()
    deltas = {
        f"{name}.base_layer.weight": module.get_delta_weight(module.active_adapters[0])
        for name, module in base.named_modules()
        if hasattr(module, "get_delta_weight")
    }
    return {
        key.replace(".base_layer", ""): value + deltas[key].to(value.dtype)
        if key in deltas
        else value
        for key, value in base.state_dict().items()
        if "lora_" not in key
    }
