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

The second table: the log-prob step (common/rl/logprobs.py) per micro-batch, now and before it recomputed each chunk in
backward. Now autograd keeps the fp32 last hidden state and the target id per completion token (4·h + 8 bytes), and
the step's working memory is one chunk of CHUNK_TOKENS tokens: float32 logits, softmax and gradient plus the bf16
gradient (14·V bytes per chunk token), whatever the micro-batch. Before, the model's bf16 logits of the whole
micro-batch existed (2·V per token) and autograd kept each chunk's float32 logits until backward (4·V per token; 8·V
with the entropy bonus, ada_seq's and ada_est's default). `--measure` measures the per-token bytes autograd keeps (CPU,
saved-tensor hooks, bf16 autocast over fp32 weights, each model's h and V, the head alone) and writes them to
benchmarks/speed/results/logprob_memory.json, which the table then shows next to the formula. Last, ra_rloo.py's replay
buffers per rank (host memory, every rank holds the same): int32 token ids plus ~200 bytes per stored success, against
Python int lists before (REPLAY_BYTES_PER_TOKEN, measured by tracemalloc at 500-token successes).

    python benchmarks/speed/memory_table.py            # the markdown tables and lines of docs/scaling.md
    python benchmarks/speed/memory_table.py --measure  # first measure the log-prob step's bytes (~1 min, 4 GB)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# (name, parameters, hidden size, layers, LoRA-trainable parameters at r=16 on q,k,v,o,gate,up,down, vocabulary,
#  tied embeddings: the LM head is the embedding matrix)
MODELS = (
    ("Qwen2.5-0.5B", 0.494e9, 896, 24, 8.8e6, 151936, True),
    ("Qwen2.5-1.5B", 1.544e9, 1536, 28, 18.5e6, 151936, True),
    ("Qwen2.5-7B", 7.616e9, 3584, 28, 40.4e6, 152064, False),
)
GIB = 2**30
MEASURED = Path(__file__).resolve().parent / "results" / "logprob_memory.json"
CHUNK_TOKENS = (
    512  # common/rl/logprobs.py CHUNK_TOKENS (tests/test_benchmarks.py checks they agree)
)
# micro-batch tokens: the token budget docs/custom_task.md recommends (--max_tokens_per_microbatch 16384), and the
# default --micro_batch_size 64 with 1k-token completions
MICRO_BATCHES = (("16k tokens (recommended)", 16384), ("64 x 1k tokens (default)", 65536))
# replay buffers: bytes per stored token (tracemalloc, 500-token successes, tests/test_ra_rloo.py bounds it) now and
# as Python int lists before, and MATH's training set at ra_rloo's default capacity with 600-token successes
REPLAY_BYTES_PER_TOKEN = {"now": 4.32, "before": 40.25}
REPLAY_TOKENS = 7500 * 16 * 600
# where each script gathers a whole model with --fsdp (the policy, in the compute dtype), what runs sharded, a note
GATHERS = (
    (
        "ra_rloo.py",
        "HF generation (sampling, evaluation)",
        "the update",
        " Seed scoring: nothing on a real dataset (nothing to seed); the whole policy on the embedded demo task.",
    ),
    ("ada_seq.py", "HF generation (all of a step's sampling rounds, evaluation)", "the update", ""),
    ("ada_est.py", "HF generation (sampling, evaluation)", "the update", ""),
    ("ps_grpo.py", "HF generation (sampling, multi-turn episodes, evaluation)", "the update", ""),
    (
        "pros_ppo.py",
        "HF generation (sampling, evaluation)",
        "the scoring pass (policy, critic, reference in turn) and the update",
        "",
    ),
)


def state_gib(
    params: float,
    lora_params: float,
    gpus: int,
    fsdp: bool,
    lora: bool,
    vllm: bool,
    reference_fp32: float = 0.0,
) -> float:
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


def scoring_gib(
    params: float,
    hidden: int,
    layers: int,
    vocab: int,
    tied: bool,
    lora_params: float,
    critic: float,
    fsdp: bool,
    lora: bool,
) -> float:
    """What PPO's bf16 scoring pass holds on top of the states: FSDP, the policy's root and one layer (the largest
    root of the three models); DDP, the autocast copies of the fp32 weights (policy or its adapters, and critic)."""
    if fsdp:
        root = vocab * hidden * (1 if tied else 2) + hidden
        return 2 * (root + (params - root) / layers) / GIB
    return 2 * ((lora_params if lora else params) + critic) / GIB


def activation_mib_per_1k_tokens(hidden: int, layers: int, checkpointing: bool) -> float:
    per_token = (2 * hidden * layers + 34 * hidden) if checkpointing else 34 * hidden * layers
    return per_token * 1000 / 2**20


def logprob_kept_per_token(hidden: int, vocab: int, entropy: bool, before: bool) -> float:
    """Bytes autograd keeps for the log-prob step per completion token: the fp32 last hidden state and the int64
    target now; before, each chunk's float32 logits (and its softmax with the entropy bonus)."""
    return 4 * vocab * (2 if entropy else 1) if before else 4 * hidden + 8


def logprob_step_gib(hidden: int, vocab: int, tokens: int, entropy: bool, before: bool) -> float:
    """The log-prob step's memory for a micro-batch of `tokens` completion tokens: what autograd keeps plus the
    working memory (now one chunk, 14 bytes x V per chunk token; before, the micro-batch's bf16 logits, 2 x V per
    token)."""
    working = CHUNK_TOKENS * vocab * 14 if not before else tokens * vocab * 2
    return (tokens * logprob_kept_per_token(hidden, vocab, entropy, before) + working) / GIB


def measure_logprob_bytes(hidden: int, vocab: int, tokens=(16, 48)) -> dict:
    """Bytes autograd keeps per completion token for the log-prob step (saved-tensor hooks; the slope between two
    token counts), with and without the entropy bonus, through the head alone under bf16 autocast over fp32
    weights: "before" is the formula the step used before (the head's logits, a float32 copy, logsumexp)."""
    import torch

    from common.rl.logprobs import ChunkedLogProbs

    torch.manual_seed(0)
    weight = torch.randn(vocab, hidden) / hidden**0.5

    def kept(count: int, entropy: bool, before: bool) -> int:
        storages = {}

        def pack(tensor):
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        hidden_states = torch.randn(count, hidden, requires_grad=True)
        targets = torch.randint(vocab, (count,))
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
            torch.autocast("cpu", torch.bfloat16),
        ):
            if before:
                x = torch.nn.functional.linear(hidden_states, weight).float()
                lse = torch.logsumexp(x, dim=-1)
                out = x.gather(-1, targets[:, None]).squeeze(-1) - lse
                if entropy:
                    out = out + lse - (torch.softmax(x, dim=-1) * x).sum(-1)
            else:
                lp, ent = ChunkedLogProbs.apply(
                    hidden_states, weight, targets, 1.0, CHUNK_TOKENS, entropy, torch.bfloat16
                )
                out = lp + ent
        out.sum().backward()
        return sum(storages.values())

    return {
        f"{'before' if before else 'now'}{'_entropy' if entropy else ''}": (
            kept(tokens[1], entropy, before) - kept(tokens[0], entropy, before)
        )
        / (tokens[1] - tokens[0])
        for before in (True, False)
        for entropy in (False, True)
    }


def measured() -> dict:
    return json.loads(MEASURED.read_text()) if MEASURED.exists() else {}


def logprob_table() -> str:
    """Per model: the log-prob step's bytes per token (formula, and measured where --measure ran), its memory at the
    documented micro-batches now and before (with the entropy bonus / without), and the replay buffers."""
    found = measured()
    head = [
        "| model | kept per token now / before (lp; lp + entropy), computed | measured (CPU, saved-tensor hooks) "
        + "".join(
            f"| log-prob step, {label}: now / before (lp + entropy; lp) "
            for label, _ in MICRO_BATCHES
        )
        + "| ra_rloo replay buffers, MATH (7.5k prompts x 16 x 600 tokens) per rank: now / before |",
        "|---|---|---|" + "---|" * len(MICRO_BATCHES) + "---|",
    ]
    lines = head
    for name, _, hidden, _, _, vocab, _ in MODELS:
        computed = (
            f"{logprob_kept_per_token(hidden, vocab, False, False) / 1024:.1f} KiB / "
            f"{logprob_kept_per_token(hidden, vocab, False, True) / 1024:,.0f}; "
            f"{logprob_kept_per_token(hidden, vocab, True, True) / 1024:,.0f} KiB"
        )
        got = found.get(name)
        seen = (
            (
                f"{got['now'] / 1024:.1f} / {got['now_entropy'] / 1024:.1f} KiB now; {got['before'] / 1024:,.0f}; "
                f"{got['before_entropy'] / 1024:,.0f} KiB before"
            )
            if got
            else "not measured"
        )
        cells = [computed, seen]
        for _, tokens in MICRO_BATCHES:
            now = logprob_step_gib(hidden, vocab, tokens, True, False)
            cells.append(
                f"{now:.1f} GiB / {logprob_step_gib(hidden, vocab, tokens, True, True):.1f}; "
                f"{logprob_step_gib(hidden, vocab, tokens, False, True):.1f} GiB"
            )
        cells.append(
            " / ".join(
                f"{REPLAY_TOKENS * REPLAY_BYTES_PER_TOKEN[when] / GIB:.2f} GiB"
                for when in ("now", "before")
            )
        )
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def recommended() -> str:
    """The sentence on the largest model at the documented micro-batches (the log-prob step with the entropy bonus)."""
    name, _, hidden, _, _, vocab, _ = MODELS[-1]
    parts = [
        f"{logprob_step_gib(hidden, vocab, tokens, True, False):.1f} GiB for {label} "
        f"({logprob_step_gib(hidden, vocab, tokens, True, True):.1f} GiB before)"
        for label, tokens in MICRO_BATCHES
    ]
    return (
        f"For {name}, the log-prob step with the entropy bonus holds "
        + " and ".join(parts)
        + ", on top of the training states and the activations of the table above."
    )


def sources() -> str:
    """The line saying which figures of the log-prob table are measured and which computed, with the GPU spells'
    peaks read from benchmarks/gpu/results/*/mem.json."""
    peaks = []
    for path in sorted(MEASURED.parent.glob("gpu/*/mem.json")):
        for run in json.loads(path.read_text()):
            if run.get("peak_gpu_gib") and run.get("predicted_states_gib"):
                peaks.append(
                    f"{run['script']}.py ({run['variant']}, {run['params'] / 1e9:.2f}B parameters) peaked at "
                    f"{run['peak_gpu_gib']:.1f} GiB against {run['predicted_states_gib']:.1f} GiB of computed "
                    f"states ({path.parent.name})"
                )
    found = ", ".join(name for name in measured()) or "no model yet"
    return (
        "Measured: the bytes autograd keeps per token (CPU, saved-tensor hooks, `--measure`: "
        + found
        + "), the "
        "replay buffers' bytes per token (tracemalloc) and, on a GPU, only whole-run peaks: "
        + ("; ".join(peaks) or "none")
        + " (short completions, before the log-prob step recomputed its chunks: "
        "no log-prob figure here comes from a GPU). Computed: every GiB figure of the table, from the formulas "
        f"above at the chunk of {CHUNK_TOKENS} tokens."
    )


def table() -> str:
    lines = [
        "| model | setting | 1 GPU | 8 GPUs | PPO's critic adds (1 GPU / 8 GPUs) | PPO's scoring pass adds "
        "| activations per 1k tokens in a micro-batch (no ckpt / ckpt) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, params, hidden, layers, lora_params, vocab, tied in MODELS:
        acts = (
            f"{activation_mib_per_1k_tokens(hidden, layers, False):,.0f} MiB / "
            f"{activation_mib_per_1k_tokens(hidden, layers, True):,.0f} MiB"
        )
        critic = critic_params(params, hidden, vocab, tied)
        for label, fsdp, lora in (
            ("DDP", False, False),
            ("FSDP", True, False),
            ("DDP + LoRA r=16", False, True),
        ):
            cells = []
            for gpus in (1, 8):
                both = [
                    state_gib(
                        params,
                        lora_params,
                        gpus,
                        fsdp,
                        lora,
                        vllm,
                        reference_fp32_params(hidden, layers, vocab),
                    )
                    for vllm in (False, True)
                ]
                cells.append(f"{both[0]:.1f} GiB ({both[1]:.1f} with vLLM)")
            cells.append(" / ".join(f"{critic_gib(critic, gpus, fsdp):.1f} GiB" for gpus in (1, 8)))
            cells.append(
                f"{scoring_gib(params, hidden, layers, vocab, tied, lora_params, critic, fsdp, lora):.1f} GiB"
            )
            lines.append(f"| {name} | {label} | {' | '.join(cells)} | {acts} |")
    return "\n".join(lines)


def gathers() -> str:
    """One line per script: where it gathers a whole model with --fsdp, and the bytes (bf16: 2 per parameter)."""
    sizes = " / ".join(f"{2 * params / GIB:.1f}" for _, params, *_ in MODELS)
    names = " / ".join(name for name, *_ in MODELS)
    lines = [f"Whole models gathered per GPU with --fsdp and --dtype bfloat16 ({names}):"]
    for script, where, sharded, note in GATHERS:
        lines.append(
            f"- {script}: the policy for {where}, {sizes} GiB; --use_vllm: none. Sharded (a root and "
            f"one layer at a time): {sharded}.{note}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--measure",
        action="store_true",
        help="first measure the bytes autograd keeps per token of the log-prob step on this CPU "
        f"(saved-tensor hooks, each model's hidden size and vocabulary) into {MEASURED.name}",
    )
    if parser.parse_args().measure:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        import torch

        torch.set_num_threads(1)
        MEASURED.write_text(
            json.dumps(
                {
                    name: measure_logprob_bytes(hidden, vocab)
                    for name, _, hidden, _, _, vocab, _ in MODELS
                },
                indent=1,
            )
            + "\n"
        )
    print(
        "Computed, not measured: training states per GPU (weights, gradients, AdamW moments, frozen reference, "
        "optional bf16 vLLM copy), what PPO's critic and its scoring pass add; activations and the vLLM KV cache "
        "come on top.\n"
    )
    print(table())
    print()
    print(gathers())
    print()
    print(logprob_table())
    print()
    print(recommended())
    print()
    print(sources())
