"""What fits where: GPU memory of the training states, computed (not measured) from parameter counts.

Per GPU, for one policy of P parameters trained with AdamW and fp32 master weights (what `--dtype bfloat16`
does: bf16 compute, fp32 parameters, gradients and both Adam moments = 16 bytes per trained parameter), a frozen
reference model (2 bytes per parameter; under DDP its embeddings and norms stay fp32, 2 more bytes each, so that it
computes as the fp32 policy under autocast; with LoRA the reference is the same weights with adapters off: 0),
and optionally a colocated bf16 vLLM copy (2 bytes per parameter, never sharded here: one engine per rank).
DDP keeps everything on every GPU; FSDP shards the policy's states and the reference over the GPUs. With LoRA
the base weights are frozen bf16 (2 bytes) and only the adapters carry the 16 bytes. Activations come on top
and depend on micro-batch tokens: the per-token estimate printed below uses ~34·h bytes per token per layer for
a bf16 transformer layer without recomputation (Korthikanti et al., 2022, attention scores excluded as with
SDPA/flash) and 2·h bytes per token per layer (the layer inputs) plus one layer's full activations with
`--gradient_checkpointing`.

PPO's critic (pros_ppo.py) is the policy's backbone (an untied LM head left out) plus a scalar head, trained in
full in fp32 (16 bytes per parameter; sharded by FSDP, a full copy with LoRA). PPO's no-grad scoring pass (policy,
critic, reference) adds, in bf16: with FSDP one model's root (embeddings, final norm, head) and one decoder layer
at a time (the policy's, the largest); under DDP nothing is gathered, but autocast keeps the bf16 copy of every fp32
weight it casts until the pass ends (torch's autocast weight cache): the policy's (with LoRA its adapters only, the
base being bf16) and the critic's. Last, one line per script: the whole models gathered with `--fsdp`.

    python benchmarks/memory_table.py            # the markdown table and lines of docs/scaling.md
"""
from __future__ import annotations

# (name, parameters, hidden size, layers, LoRA-trainable parameters at r=16 on q,k,v,o,gate,up,down, vocabulary,
#  tied embeddings: the LM head is the embedding matrix)
MODELS = (
    ("Qwen2.5-0.5B", 0.494e9, 896, 24, 8.8e6, 151936, True),
    ("Qwen2.5-1.5B", 1.544e9, 1536, 28, 18.5e6, 151936, True),
    ("Qwen2.5-7B", 7.616e9, 3584, 28, 40.4e6, 152064, False),
)
GIB = 2 ** 30
# where each script gathers a whole model with --fsdp (the policy, in the compute dtype), what runs sharded, a note
GATHERS = (
    ("ra_rloo.py", "HF generation (sampling, evaluation)", "the update",
     " Seed scoring: nothing on a real dataset (nothing to seed); the whole policy on the embedded demo task."),
    ("ada_seq.py", "HF generation (all of a step's sampling rounds, evaluation)", "the update", ""),
    ("ada_est.py", "HF generation (sampling, evaluation)", "the update", ""),
    ("ps_grpo.py", "HF generation (sampling, multi-turn episodes, evaluation)", "the update", ""),
    ("pros_ppo.py", "HF generation (sampling, evaluation)",
     "the scoring pass (policy, critic, reference in turn) and the update", ""),
)


def state_gib(params: float, lora_params: float, gpus: int, fsdp: bool, lora: bool, vllm: bool,
              reference_fp32: float = 0.0) -> float:
    """`reference_fp32`: the reference's parameters kept fp32 under DDP (embeddings, norms: `reference_fp32_params`)."""
    shard = gpus if fsdp else 1
    if lora:  # frozen bf16 base (reference = adapters off), fp32 adapters + grads + Adam moments
        trained = (2 * params + 16 * lora_params) / shard
    else:  # fp32 master + grads + 2 Adam moments, and the frozen reference (bf16 but its fp32 part under DDP)
        trained = (16 * params + 2 * params + (0 if fsdp else 2 * reference_fp32)) / shard
    return (trained + (2 * params if vllm else 0)) / GIB


def reference_fp32_params(hidden: int, layers: int, vocab: int) -> float:
    """The reference's parameters outside linear layers, kept fp32 under DDP: the embedding (with tied embeddings
    also the head) and the norms (two per layer and the final one)."""
    return vocab * hidden + hidden * (2 * layers + 1)


def critic_params(params: float, hidden: int, vocab: int, tied: bool) -> float:
    """PPO's critic: the policy's backbone (without an untied LM head) and a scalar head."""
    return params - (0 if tied else vocab * hidden) + hidden + 1


def critic_gib(critic: float, gpus: int, fsdp: bool) -> float:
    """The critic's fp32 weights, gradients and AdamW moments per GPU (16 bytes per parameter)."""
    return 16 * critic / (gpus if fsdp else 1) / GIB


def scoring_gib(params: float, hidden: int, layers: int, vocab: int, tied: bool, lora_params: float, critic: float,
                fsdp: bool, lora: bool) -> float:
    """What PPO's bf16 scoring pass holds on top of the states: FSDP, the policy's root and one layer (the largest
    root of the three models); DDP, the autocast copies of the fp32 weights (policy or its adapters, and critic)."""
    if fsdp:
        root = vocab * hidden * (1 if tied else 2) + hidden
        return 2 * (root + (params - root) / layers) / GIB
    return 2 * ((lora_params if lora else params) + critic) / GIB


def activation_mib_per_1k_tokens(hidden: int, layers: int, checkpointing: bool) -> float:
    per_token = (2 * hidden * layers + 34 * hidden) if checkpointing else 34 * hidden * layers
    return per_token * 1000 / 2 ** 20


def table() -> str:
    lines = ["| model | setting | 1 GPU | 8 GPUs | PPO's critic adds (1 GPU / 8 GPUs) | PPO's scoring pass adds "
             "| activations per 1k tokens in a micro-batch (no ckpt / ckpt) |", "|---|---|---|---|---|---|---|"]
    for name, params, hidden, layers, lora_params, vocab, tied in MODELS:
        acts = (f"{activation_mib_per_1k_tokens(hidden, layers, False):,.0f} MiB / "
                f"{activation_mib_per_1k_tokens(hidden, layers, True):,.0f} MiB")
        critic = critic_params(params, hidden, vocab, tied)
        for label, fsdp, lora in (("DDP", False, False), ("FSDP", True, False), ("DDP + LoRA r=16", False, True)):
            cells = []
            for gpus in (1, 8):
                both = [state_gib(params, lora_params, gpus, fsdp, lora, vllm,
                                  reference_fp32_params(hidden, layers, vocab)) for vllm in (False, True)]
                cells.append(f"{both[0]:.1f} GiB ({both[1]:.1f} with vLLM)")
            cells.append(" / ".join(f"{critic_gib(critic, gpus, fsdp):.1f} GiB" for gpus in (1, 8)))
            cells.append(f"{scoring_gib(params, hidden, layers, vocab, tied, lora_params, critic, fsdp, lora):.1f} GiB")
            lines.append(f"| {name} | {label} | {' | '.join(cells)} | {acts} |")
    return "\n".join(lines)


def gathers() -> str:
    """One line per script: where it gathers a whole model with --fsdp, and the bytes (bf16: 2 per parameter)."""
    sizes = " / ".join(f"{2 * params / GIB:.1f}" for _, params, *_ in MODELS)
    names = " / ".join(name for name, *_ in MODELS)
    lines = [f"Whole models gathered per GPU with --fsdp and --dtype bfloat16 ({names}):"]
    for script, where, sharded, note in GATHERS:
        lines.append(f"- {script}: the policy for {where}, {sizes} GiB; --use_vllm: none. Sharded (a root and "
                     f"one layer at a time): {sharded}.{note}")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # no flags; --help says what it prints
    print("Computed, not measured: training states per GPU (weights, gradients, AdamW moments, frozen reference, "
          "optional bf16 vLLM copy), what PPO's critic and its scoring pass add; activations and the vLLM KV cache "
          "come on top.\n")
    print(table())
    print()
    print(gathers())
