"""GPU smoke run: every method script for a few steps on a real architecture, ready for when a GPU is lent.

It builds a randomly initialised Qwen2-architecture model (~143M parameters with the default `--size 150m`) and a
byte-level BPE tokenizer trained here on generated Countdown text (nothing is downloaded), saves them as a Hugging
Face directory, then runs each script in this process on the embedded Countdown task for `--steps` steps in bf16
with the HF generation backend, once per variant: `plain`, `gradient_checkpointing`, `lora` (r 16), and `fsdp`
(FSDP2 on one process: the wrapping, gathers and checkpoint paths, not a memory saving). Per run it prints generated
tokens per second, the step time split into generation / training (the update, its log-prob passes included) / the
rest, peak GPU memory, and whether the loss and the weights changed. Results also go to `<output_dir>/smoke.json`. A
random model solves nothing, so ps_grpo.py (which drops groups whose rollouts all fail) trains nothing here:
"weights changed 0%" is expected for it; the other scripts get a gradient anyway (RLOO's replayed demonstrations,
the entropy bonus, PPO's critic).

Needs, beyond PyTorch and transformers: accelerate, tokenizers, safetensors, numpy, tqdm and peft (all in the GPU
image described in ../shared/notes/stack-facts.md). Not needed on this path: datasets and math-verify (real
datasets only), vllm. If one is missing, bring it as a wheel: `pip download <name> --no-deps -d wheels/` on a
machine with internet (accelerate, peft and tokenizers together are well under 64 MiB), copy `wheels/` along and
`pip install --no-index wheels/*.whl` there.

    python benchmarks/gpu_smoke.py                                  # on one CUDA GPU: 5 scripts x 4 variants
    python benchmarks/gpu_smoke.py --size tiny --steps 2 --scripts ra_rloo --variants plain,lora   # CPU check
"""
from __future__ import annotations

import gc
import importlib
import json
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.cli import parse_args  # noqa: E402

SIZES = {  # Qwen2 configs: ~143M parameters (tied embeddings) and a CPU-sized check
    "150m": dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4,
                 intermediate_size=2816, vocab_size=8192),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=512),
}
VARIANTS = {"plain": [], "gradient_checkpointing": ["--gradient_checkpointing"], "lora": ["--lora_r", "16"],
            "fsdp": ["--fsdp"]}
SCRIPT_FLAGS = {"ada_seq": ["--max_rounds", "2", "--round_repeat", "4"], "ps_grpo": ["--mode", "text", "--n", "4"],
                "pros_ppo": ["--k", "4"], "ada_est": ["--prompt_pool", "64"], "ra_rloo": ["--k", "4"]}


@dataclass
class Args:
    output_dir: str = "runs/gpu_smoke"
    """where the model directory, each run's output and smoke.json go"""
    size: Literal["150m", "tiny"] = "150m"
    """model size: `150m` (~143M parameters, the GPU smoke) or `tiny` (a CPU check of this script)"""
    steps: int = 10
    """training steps per run"""
    scripts: str = "ra_rloo,ada_seq,ada_est,ps_grpo,pros_ppo"
    """comma-separated method scripts to run"""
    variants: str = "plain,gradient_checkpointing,lora,fsdp"
    """comma-separated variants: plain, gradient_checkpointing, lora, fsdp"""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """compute dtype passed to the scripts (`--dtype`)"""
    prompts_per_step: int = 16
    """prompts per step in every run"""
    max_new_tokens: int = 64
    """completion length limit in every run"""
    learning_rate: float = 1e-5
    """learning rate of every run (LoRA runs use 10x)"""

    def validate(self) -> None:
        bad = [v for v in self.variants.split(",") if v not in VARIANTS]
        bad += [s for s in self.scripts.split(",") if not (ROOT / f"{s}.py").exists()]
        if bad or self.steps < 1:
            raise SystemExit(f"--scripts/--variants/--steps: unknown {bad} or steps < 1 (variants: {list(VARIANTS)})")


def build_model_dir(path: Path, size: str) -> Path:
    """A random Qwen2 model + a byte-level BPE trained on generated Countdown text, saved as an HF dir (cached)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from common import countdown

    if (path / "config.json").exists():
        return path
    cfg = dict(SIZES[size])
    train, _ = countdown.make_splits()
    corpus = [countdown.prompt_text(p) + countdown.solution_text(countdown.solutions(p)[0]) for p in train[:4000]]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=cfg.pop("vocab_size"),
                                                        special_tokens=["<|endoftext|>", "<|pad|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|pad|>")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                         max_position_embeddings=2048, **cfg))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    sample = corpus[0]
    reloaded = AutoTokenizer.from_pretrained(path)  # the scripts load it this way: it must round-trip
    if reloaded.decode(reloaded(sample, add_special_tokens=False).input_ids) != sample:
        raise SystemExit(f"{path}: the saved tokenizer does not round-trip {sample!r} through AutoTokenizer")
    print(f"built {path}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"vocabulary {len(tokenizer)}", flush=True)
    return path


def weights_changed(model_dir: Path, ckpt: Path) -> float:
    """Fraction of weights that differ from the start (LoRA: fraction of adapter B entries that left zero)."""
    from safetensors.torch import load_file

    if (ckpt / "adapter_model.safetensors").exists():
        adapter = load_file(str(ckpt / "adapter_model.safetensors"))
        b = [t for k, t in adapter.items() if "lora_B" in k]
        return sum(int((t != 0).sum()) for t in b) / max(1, sum(t.numel() for t in b))
    start, end = load_file(str(model_dir / "model.safetensors")), load_file(str(ckpt / "model.safetensors"))
    return sum(int((end[k] != start[k]).sum()) for k in start) / sum(t.numel() for t in start.values())


def run_one(script: str, variant: str, model_dir: Path, args: Args) -> dict:
    import torch

    from benchmarks.run import script_flags

    flags = [*VARIANTS[variant], *SCRIPT_FLAGS.get(script, [])]
    known = script_flags(ROOT / f"{script}.py") or {}
    missing = [f for f in flags if f.startswith("--") and f[2:] not in known]
    if missing:
        return {"script": script, "variant": variant, "status": f"missing {missing}"}
    out = Path(args.output_dir) / f"{script}-{variant}"
    lr = args.learning_rate * (10 if variant == "lora" else 1)
    argv = ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_steps", str(args.steps),
            "--dtype", args.dtype, "--prompts_per_step", str(args.prompts_per_step), "--max_new_tokens",
            str(args.max_new_tokens), "--learning_rate", repr(lr), "--eval_every", "0", "--eval_prompts", "16",
            "--eval_samples", "2", "--save_every", "0", "--warmup_steps", "1", *flags]
    module = importlib.import_module(script)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.time()
    try:
        module.main(parse_args(module.Args, argv))
    finally:
        if torch.distributed.is_initialized():  # --fsdp made a world of one in this process: drop it
            torch.distributed.destroy_process_group()
    wall = time.time() - start
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None
    gc.collect()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    gen_s, train_s, step_s = (sum(r[k] for r in rows) for k in ("time_gen_s", "time_train_s", "time_step_s"))
    losses = [r["loss"] for r in rows]
    return {"script": script, "variant": variant, "status": "ok", "steps": len(rows), "wall_s": wall,
            "gen_tokens_per_s": rows[-1]["gen_tokens"] / max(gen_s, 1e-9), "gen_s_per_step": gen_s / len(rows),
            "train_s_per_step": train_s / len(rows), "other_s_per_step": (step_s - gen_s - train_s) / len(rows),
            "peak_gpu_gib": peak, "loss_changed": len(set(losses)) > 1,
            "weights_changed_frac": weights_changed(model_dir, out / f"checkpoint-{args.steps}")}


def table(results: list[dict], device: str) -> str:
    lines = [f"GPU smoke on {device}", "",
             "| script | variant | gen tokens/s | s/step: gen / train / rest | peak GPU memory | loss changed | "
             "weights changed |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['script']} | {r['variant']} | {r['status']} | | | | |")
            continue
        peak = "n/a (CPU)" if r["peak_gpu_gib"] is None else f"{r['peak_gpu_gib']:.2f} GiB"
        lines.append(f"| {r['script']} | {r['variant']} | {r['gen_tokens_per_s']:,.0f} | "
                     f"{r['gen_s_per_step']:.2f} / {r['train_s_per_step']:.2f} / {r['other_s_per_step']:.2f} | "
                     f"{peak} | {'yes' if r['loss_changed'] else 'NO'} | {r['weights_changed_frac']:.1%} |")
    return "\n".join(lines)


def main(args: Args) -> None:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (no GPU: a check of this script)"
    model_dir = build_model_dir(Path(args.output_dir) / f"model-{args.size}", args.size)
    results = []
    for script in args.scripts.split(","):
        for variant in args.variants.split(","):
            print(f"--- {script} / {variant}", flush=True)
            try:
                results.append(run_one(script, variant, model_dir, args))
            except Exception as e:  # a smoke run reports every failure and goes on with the next run
                traceback.print_exc()
                results.append({"script": script, "variant": variant, "status": f"error: {type(e).__name__}: {e}"})
            # written after every run, so a smoke cut short (a time limit, Ctrl-C) keeps what it measured
            (Path(args.output_dir) / "smoke.json").write_text(json.dumps({"device": device, "results": results},
                                                                         indent=2))
    print(table(results, device))


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
