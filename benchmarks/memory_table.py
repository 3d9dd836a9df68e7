"""What fits where: GPU memory of the training states, computed (not measured) from parameter counts.

Per GPU, for one policy of P parameters trained with AdamW and fp32 master weights (what `--dtype bfloat16`
does: bf16 compute, fp32 parameters, gradients and both Adam moments = 16 bytes per trained parameter), a frozen
bf16 reference model (2 bytes per parameter; with LoRA the reference is the same weights with adapters off: 0),
and optionally a colocated bf16 vLLM copy (2 bytes per parameter, never sharded here: one engine per rank).
DDP keeps everything on every GPU; FSDP shards the policy's states and the reference over the GPUs. With LoRA
the base weights are frozen bf16 (2 bytes) and only the adapters carry the 16 bytes. Activations come on top
and depend on micro-batch tokens: the per-token estimate printed below uses ~34·h bytes per token per layer for
a bf16 transformer layer without recomputation (Korthikanti et al., 2022, attention scores excluded as with
SDPA/flash) and 2·h bytes per token per layer (the layer inputs) plus one layer's full activations with
`--gradient_checkpointing`. PPO's critic (pros_ppo.py) is a second trained copy: double the policy's states.

    python benchmarks/memory_table.py            # the markdown table of docs/scaling.md
"""
from __future__ import annotations

# (name, parameters, hidden size, layers, LoRA-trainable parameters at r=16 on q,k,v,o,gate,up,down)
MODELS = (
    ("Qwen2.5-0.5B", 0.494e9, 896, 24, 8.8e6),
    ("Qwen2.5-1.5B", 1.544e9, 1536, 28, 18.5e6),
    ("Qwen2.5-7B", 7.616e9, 3584, 28, 40.4e6),
)
GIB = 2 ** 30


def state_gib(params: float, lora_params: float, gpus: int, fsdp: bool, lora: bool, vllm: bool) -> float:
    shard = gpus if fsdp else 1
    if lora:  # frozen bf16 base (reference = adapters off), fp32 adapters + grads + Adam moments
        trained = (2 * params + 16 * lora_params) / shard
    else:  # fp32 master + grads + 2 Adam moments, and a bf16 frozen reference
        trained = (16 * params + 2 * params) / shard
    return (trained + (2 * params if vllm else 0)) / GIB


def activation_mib_per_1k_tokens(hidden: int, layers: int, checkpointing: bool) -> float:
    per_token = (2 * hidden * layers + 34 * hidden) if checkpointing else 34 * hidden * layers
    return per_token * 1000 / 2 ** 20


def table() -> str:
    lines = ["| model | setting | 1 GPU | 8 GPUs | activations per 1k tokens in a micro-batch (no ckpt / ckpt) |",
             "|---|---|---|---|---|"]
    for name, params, hidden, layers, lora_params in MODELS:
        acts = (f"{activation_mib_per_1k_tokens(hidden, layers, False):,.0f} MiB / "
                f"{activation_mib_per_1k_tokens(hidden, layers, True):,.0f} MiB")
        for label, fsdp, lora in (("DDP", False, False), ("FSDP", True, False), ("DDP + LoRA r=16", False, True)):
            cells = []
            for gpus in (1, 8):
                both = [state_gib(params, lora_params, gpus, fsdp, lora, vllm) for vllm in (False, True)]
                cells.append(f"{both[0]:.1f} GiB ({both[1]:.1f} with vLLM)")
            lines.append(f"| {name} | {label} | {cells[0]} | {cells[1]} | {acts} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print("Computed, not measured: training states per GPU (weights, gradients, AdamW moments, frozen reference, "
          "optional bf16 vLLM copy); activations and the vLLM KV cache come on top.\n")
    print(table())
