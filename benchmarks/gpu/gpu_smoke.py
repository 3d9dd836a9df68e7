"""GPU smoke and learning check: every method script on a real architecture, in one short GPU spell.

One command, `python benchmarks/gpu/smoke.py`, sized for one lent GPU (at most `--budget_s`, default 480 s, wall time):

0. **Model and warm start.** A randomly initialised Qwen2-architecture model (~143M parameters, `--size 150m`) and a
   byte-level BPE tokenizer trained here on generated Countdown text (nothing is downloaded), then supervised
   fine-tuning on generated Countdown demonstrations (the embedded base's recipe: solver solutions, a share of
   careless answers on the 3- and 5-number levels, loss on the answer only) until greedy pass@1 on training prompts
   reaches `--warm_target`, so every run below sees successes and failures. Cached in the model folder
   (`model-<size>-warm/warm_start.json`): a second command skips it. `--size tiny` (a CPU check) starts from the
   shipped embedded base instead, which is already warm.
1. **Parts, in priority order** (`--parts`): every script `plain`; then `fsdp` (FSDP2 on one process: its wrapping,
   gathers and checkpoint paths); then `gc_lora` (gradient checkpointing, LoRA r 16); then `learning` (a method and
   its baseline, RA-RLOO and `--replay none`, for as many steps as the budget leaves, held-out pass@1 with a 95%
   interval at start and end, a learning-curve PNG); then `speed` (one script's step time and generated tokens/s
   eager with HF generate's default cache, with `--cache_implementation static`, which transformers compiles on a
   GPU, and with `--torch_compile`, its compile time reported apart); then `peer` (TRL's GRPOTrainer against ours,
   `benchmarks/speed/trl_peer.py`, when trl imports or its wheels lie in `.whl/`). `--parts` in another order runs them
   in that order (the learning part takes whatever budget is left, so it belongs last when named with others).
   The plan printed first says what fits; a part that does not fit is skipped, a run never starts past the budget,
   and a timer stops a running script at the budget (its graceful stop: it saves and returns).
2. **Every run proves its update**: mean reward, the fraction of policy weights that changed (LoRA: adapter B entries
   that left zero; pros_ppo also the critic's), mean grad norm, ps_grpo's trained groups. The table ends with a
   verdict line, "policy updated in N of M runs", naming every run that did not.

Results go to `<output_dir>/smoke.json` and `smoke.md` after every run. SIGTERM or Ctrl-C ends the whole command:
the running script saves and stops, nothing more starts, and what was measured is written.

Needs, beyond PyTorch and transformers: accelerate, tokenizers, safetensors, numpy, tqdm and peft (all on the lent
GPU image, see docs/scaling.md); matplotlib for the PNG (else the command to draw it later is printed). Not needed:
datasets, math-verify, vllm.

    python benchmarks/gpu/smoke.py                                   # one CUDA GPU, <= 8 minutes
    bash benchmarks/gpu/spell.sh                                     # the same, small results copied to $OUT
    python benchmarks/gpu/smoke.py --parts learning,speed,peer       # a second spell: what did not fit
    python benchmarks/gpu/smoke.py --size tiny --steps 2 --parts plain --budget_s 300   # CPU check
"""
from __future__ import annotations

import gc
import importlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.cli import parse_args  # noqa: E402
from common.distributed import GracefulStop  # noqa: E402

T0 = time.time()  # the command's start: its budget counts from here, imports included
STOP_MARGIN_S = 15.0  # the budget timer fires this early: the running step, its checkpoint and the report fit after

SIZES = {  # Qwen2 configs: ~143M parameters (tied embeddings); the tests' small random model
    "150m": dict(hidden_size=1024, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4,
                 intermediate_size=2816, vocab_size=8192),
    "test": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=512),
}
PARTS = ("plain", "fsdp", "gc_lora", "learning", "speed", "peer")  # priority order
VARIANTS = {"plain": [], "fsdp": ["--fsdp"], "gradient_checkpointing": ["--gradient_checkpointing"],
            "lora": ["--lora_r", "16"]}
PART_VARIANTS = {"plain": ["plain"], "fsdp": ["fsdp"], "gc_lora": ["gradient_checkpointing", "lora"]}
SCRIPT_FLAGS = {"ada_seq": ["--max_rounds", "2", "--round_repeat", "4"], "ps_grpo": ["--mode", "text", "--n", "4"],
                "pros_ppo": ["--k", "4"], "ada_est": ["--prompt_pool", "64"], "ra_rloo": ["--k", "4"]}
# first guesses for the plan (seconds), replaced by measured ones as the command goes: a smoke run's fixed cost
# (model load, step-0 and final evaluation, checkpoint) and one step (150m: the 2026-11-26 H200 smoke of the random
# model, 64-token completions: ~22 s per 5-step run)
GUESS = {"150m": {"run_fixed_s": 7.0, "step_s": 3.0, "peer_s": 120.0},
         "tiny": {"run_fixed_s": 4.0, "step_s": 0.6, "peer_s": 60.0},
         "test": {"run_fixed_s": 4.0, "step_s": 0.6, "peer_s": 60.0}}
# the speed part's runs: eager with HF generate's default cache, its static cache, and --torch_compile
SPEED_RUNS = {"default": [], "static": ["--cache_implementation", "static"], "torch_compile": ["--torch_compile"]}
# the compile time each speed run adds to the plan (seconds): the H100 spell of 2026-11-27 at 150m compiled the static
# cache's decoding step in ~5 s and spent ~180 s compiling --torch_compile's first step
SPEED_COMPILE_S = {"static": 10.0, "torch_compile": 200.0}
LEARNING = {"method": ["--replay", "on_demand"], "baseline": ["--replay", "none"]}  # ra_rloo.py; same flags else
WHEELS = ROOT / ".whl"  # TRL's wheels for an image without it (docs/scaling.md); ignored by git, carried to the GPU


@dataclass
class Args:
    output_dir: str = "runs/gpu_smoke"
    """where the model folders, each run's output, smoke.json and smoke.md go"""
    size: Literal["150m", "tiny", "test"] = "150m"
    """`150m`: a random ~143M Qwen2 warm-started here (the GPU check); `tiny`: the shipped embedded base (a CPU check
    of this script); `test`: a small random Qwen2 warm-started briefly (the warm start's own test)"""
    budget_s: float = 480.0
    """wall-clock budget of the whole command, model build and warm start included (seconds)"""
    parts: str = ",".join(PARTS)
    """comma-separated parts to run, in the order given (the default is the priority order: plain, fsdp, gc_lora,
    learning, speed, peer; empty: only the model and its warm start)"""
    scripts: str = "ra_rloo,ada_seq,ada_est,ps_grpo,pros_ppo"
    """comma-separated method scripts of the smoke parts (plain, fsdp, gc_lora)"""
    steps: int = 2
    """training steps of each smoke run (the first update must show in the saved weights)"""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """compute dtype passed to the scripts (`--dtype`)"""
    prompts_per_step: int = 16
    """prompts per step in every run"""
    max_new_tokens: int = 64
    """completion length limit in every run"""
    prompt_pool: int = 0
    """training prompts every run draws from (0: each script's own default; ra_rloo.py scores a demonstration for
    each one at start-up, seconds for the whole pool on a CPU)"""
    learning_rate: float = 1e-5
    """learning rate of the smoke runs (LoRA runs use 10x)"""
    smoke_eval_prompts: int = 16
    """held-out prompts of each smoke run's own start and end evaluation (2 samples each)"""
    warm_target: float = 0.2
    """the warm start stops once greedy pass@1 on training prompts reaches this"""
    warm_max_steps: int = 4000
    """the warm start stops after this many SFT steps even below the target"""
    warm_max_s: float = 150.0
    """... or after this many seconds (what it reached is cached and reported either way)"""
    warm_lr: float = 3e-4
    """SFT learning rate of the warm start (AdamW, linear warm-up over 5% of warm_max_steps)"""
    warm_batch_size: int = 64
    """SFT demonstrations per step"""
    warm_check_every: int = 100
    """greedy pass@1 is measured every this many SFT steps (on 128 training prompts)"""
    learning_lr: float = 2e-5
    """learning rate of the learning part's two runs"""
    learning_eval_prompts: int = 128
    """held-out prompts of the learning part's start / end pass@1"""
    learning_eval_samples: int = 4
    """samples per held-out prompt in the learning part (pass@1 = their mean)"""
    learning_max_steps: int = 200
    """upper bound on each learning run's steps (the budget usually binds first)"""
    speed_runs: str = ",".join(SPEED_RUNS)
    """comma-separated runs of the speed part: default, static, torch_compile (a cold compile on a CPU takes minutes)"""
    speed_steps: int = 4
    """steps of each speed run (the first, which compiles, is reported apart)"""
    keep_checkpoints: bool = False
    """keep each run's final checkpoint (at 150m about 1.7 GB each with the optimizer state: 40 GB for all runs);
    by default it is deleted once the run's update is measured"""

    def validate(self) -> None:
        bad = [p for p in self.parts.split(",") if p and p not in PARTS]
        bad += [s for s in self.scripts.split(",") if not (ROOT / f"{s}.py").exists()]
        bad += [r for r in self.speed_runs.split(",") if r and r not in SPEED_RUNS]
        if bad:
            raise SystemExit(f"--parts / --scripts / --speed_runs: unknown {bad} (parts: {', '.join(PARTS)}; speed "
                             f"runs: {', '.join(SPEED_RUNS)})")
        if self.steps < 1 or self.speed_steps < 2 or self.learning_max_steps < 1:
            raise SystemExit("--steps must be >= 1, --speed_steps >= 2 and --learning_max_steps >= 1")
        if not self.budget_s > 0 or not 0 < self.warm_target <= 1:
            raise SystemExit(f"--budget_s {self.budget_s} must be > 0, --warm_target {self.warm_target} in (0, 1]")


# ---------------------------------------------------------------------------------------------------------------
# Stopping: a signal or the budget ends the whole command, never just one run
# ---------------------------------------------------------------------------------------------------------------

class Stop:
    """SIGINT / SIGTERM and the budget timer, for the whole command. Inside a script's main() the script's own
    graceful stop takes the signal (it saves and returns early); before it has installed its handler (model load,
    step-0 evaluation) there is no step to save, so the signal interrupts the run at once."""

    def __init__(self, budget_s: float):
        self.start = T0
        self.budget_s = budget_s - STOP_MARGIN_S
        self.reason: str | None = None  # "signal 15", "budget"
        self.in_run = False
        self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.timer = threading.Timer(max(0.0, self.left()), self._budget)
        self.timer.daemon = True
        self.timer.start()

    def _handle(self, signum, frame) -> None:
        self.reason = self.reason or f"signal {signum}"
        print(f"\ngpu_smoke: {self.reason}: stopping the whole command after what is running now", flush=True)
        if self.in_run:
            raise KeyboardInterrupt

    def _budget(self) -> None:
        """At the budget: the running script stops as on Ctrl-C (it saves after its step), nothing more starts."""
        if self.reason is None:
            self.reason = "budget"
            os.kill(os.getpid(), signal.SIGINT)

    def elapsed(self) -> float:
        return time.time() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def close(self) -> None:
        self.timer.cancel()
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------------------------------------------
# Model and warm start
# ---------------------------------------------------------------------------------------------------------------

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


def greedy_pass_rate(model, tokenizer, problems, max_new_tokens: int, dtype: str) -> float:
    """Greedy pass@1 (binary verifier) of `model` on (level tag, problem) pairs."""
    from common import countdown
    from common.data import PromptEncoder
    from common.generation import HFGenerator, SamplingConfig

    encode = PromptEncoder(tokenizer, templated=False)  # as the scripts encode Countdown prompts
    prompts = [encode(countdown.prompt_text(p)) for _, p in problems]
    gens = HFGenerator(model, tokenizer, dtype=dtype).generate(
        prompts, 1, SamplingConfig(max_new_tokens=max_new_tokens, temperature=0.0, logprobs=False))
    texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
    return sum(countdown.reward_binary(text, p) for text, (_, p) in zip(texts, problems)) / len(problems)


def warm_start(random_dir: Path, warm_dir: Path, args: Args, stop: Stop) -> dict:
    """SFT of the random model on generated Countdown demonstrations until greedy pass@1 on 128 training prompts
    reaches `--warm_target` (the embedded base's recipe, common/tiny_model.py: solver solutions and, per level, its
    share of careless answers; loss on the answer only). Saved to `warm_dir` with warm_start.json; cached."""
    import torch

    from common import countdown
    from common.logprobs import token_logprobs
    from common.masking import pad_sequences
    from common.policy import autocast, load_policy
    from common.tiny_model import BaseRecipe

    if (warm_dir / "warm_start.json").exists():
        info = json.loads((warm_dir / "warm_start.json").read_text())
        print(f"warm start: cached in {warm_dir} ({info['steps']} steps, greedy pass@1 {info['greedy_pass@1']:.3f})")
        return {**info, "cached": True}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_policy(str(random_dir))
    model.to(device).train()
    rng = random.Random(0)
    train, _ = countdown.make_level_splits()
    careless = dict(zip([level.tag for level in countdown.LEVELS], BaseRecipe().careless, strict=True))
    probe = random.Random(1).sample(train, 128)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.warm_lr, weight_decay=0.0)
    warmup = max(1, args.warm_max_steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    eos, t0, trace, rate, step, first_loss = tokenizer.eos_token_id, time.time(), [], 0.0, 0, None
    print(f"warm start: SFT until greedy pass@1 >= {args.warm_target} on 128 training prompts "
          f"(at most {args.warm_max_steps} steps)", flush=True)
    while step < args.warm_max_steps and time.time() - t0 < args.warm_max_s and stop.reason is None:
        picks = [train[rng.randrange(len(train))] for _ in range(args.warm_batch_size)]
        prompts = [tokenizer(countdown.prompt_text(p), add_special_tokens=False).input_ids for _, p in picks]
        answers = [tokenizer(countdown.solution_text(countdown.sample_steps(p, rng, rng.random() >= careless[tag])),
                             add_special_tokens=False).input_ids + [eos] for tag, p in picks]
        batch = pad_sequences(prompts, answers, tokenizer.pad_token_id).to(device)
        with autocast(device, args.dtype):
            logp, _ = token_logprobs(model, batch)
        loss = -(logp * batch.loss_mask).sum() / batch.loss_mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        step += 1
        first_loss = first_loss if first_loss is not None else loss.item()
        last = step == args.warm_max_steps or time.time() - t0 >= args.warm_max_s
        if step % args.warm_check_every == 0 or last:
            rate = greedy_pass_rate(model, tokenizer, probe, args.max_new_tokens, args.dtype)
            model.train()
            trace.append({"step": step, "seconds": round(time.time() - t0, 1), "loss": round(loss.item(), 4),
                          "greedy_pass@1": rate})
            print(f"  warm start step {step}: {trace[-1]['seconds']} s, loss {loss.item():.3f}, "
                  f"greedy pass@1 {rate:.3f}", flush=True)
            if rate >= args.warm_target:
                break
    info = {"steps": step, "seconds": round(time.time() - t0, 1), "greedy_pass@1": rate, "first_loss": first_loss,
            "reached": rate >= args.warm_target, "target": args.warm_target, "lr": args.warm_lr,
            "batch_size": args.warm_batch_size, "device": str(device), "trace": trace}
    if stop.reason is not None:  # cut short: not a warm start to cache
        return {**info, "status": f"stopped ({stop.reason})"}
    tmp = warm_dir.with_name(warm_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "warm_start.json").write_text(json.dumps(info, indent=2))
    shutil.rmtree(warm_dir, ignore_errors=True)
    os.replace(tmp, warm_dir)
    print(f"warm start: {step} steps in {info['seconds']} s, greedy pass@1 {rate:.3f} "
          f"({'target reached' if info['reached'] else 'BELOW the target'}); saved {warm_dir}", flush=True)
    return {**info, "status": "ok"}


def embedded_warm_dir(path: Path) -> Path:
    """`--size tiny`: the shipped embedded base (already SFT'd by the same recipe), copied into the output dir."""
    from common import countdown
    from common.policy import load_policy
    from common.tiny_model import ensure_embedded_base

    if not (path / "warm_start.json").exists():
        base = ensure_embedded_base()
        shutil.copytree(base, path, dirs_exist_ok=True)
        model, tokenizer = load_policy(str(path))
        train, _ = countdown.make_level_splits()
        rate = greedy_pass_rate(model, tokenizer, random.Random(1).sample(train, 128), 48, "float32")
        (path / "warm_start.json").write_text(json.dumps({"steps": 0, "seconds": 0.0, "greedy_pass@1": rate,
                                                          "reached": True, "source": str(base)}))
    return path


# ---------------------------------------------------------------------------------------------------------------
# One run of a script, and the proof of its update
# ---------------------------------------------------------------------------------------------------------------

def changed_fraction(start: dict, end: dict, names: dict[str, str]) -> float:
    """Fraction of entries of `end[name]` differing from `start[names[name]]` (a bf16 round trip of the start counts
    as unchanged: LoRA stores its frozen base in the compute dtype)."""
    import torch

    changed = total = 0
    for name, start_name in names.items():
        # on the CPU: a trainer state saved on a GPU loads its tensors (pros_ppo's critic) back onto the GPU
        before, after = start[start_name].float().cpu(), end[name].float().cpu()
        differs = (after != before) & (after != before.to(torch.bfloat16).float())
        changed, total = changed + int(differs.sum()), total + after.numel()
    return changed / max(1, total)


def policy_changed(model_dir: Path, ckpt: Path) -> float:
    """Fraction of policy weights that differ from the start (LoRA: fraction of adapter B entries that left zero)."""
    from safetensors.torch import load_file

    if (ckpt / "adapter_model.safetensors").exists():
        adapter = load_file(str(ckpt / "adapter_model.safetensors"))
        lora_b = [t for name, t in adapter.items() if "lora_B" in name]
        return sum(int((t != 0).sum()) for t in lora_b) / max(1, sum(t.numel() for t in lora_b))
    start, end = load_file(str(model_dir / "model.safetensors")), load_file(str(ckpt / "model.safetensors"))
    return changed_fraction(start, end, {name: name for name in start})


def critic_changed(model_dir: Path, ckpt: Path) -> float | None:
    """pros_ppo's critic (saved in the trainer state): the fraction of its backbone entries that differ from the
    policy weights it was copied from, and of its zero-initialised head."""
    import torch
    from safetensors.torch import load_file

    from common.checkpoint import safe_load

    critic = safe_load(ckpt / "trainer_state.pt", ("state",))["state"].get("method", {}).get("critic")
    if not critic:
        return None
    start = load_file(str(model_dir / "model.safetensors"))
    start.update({name: torch.zeros_like(tensor) for name, tensor in critic.items() if name.startswith("head.")})
    names = {}
    for name in critic:  # backbone.<x> is the policy's model.<x>; LoRA wraps a linear's weight as base_layer
        start_name = name if name.startswith("head.") else "model." + name.removeprefix("backbone.")
        start_name = start_name.replace(".base_layer", "")
        if start_name in start:
            names[name] = start_name
    return changed_fraction(start, critic, names)


def run_script(script: str, flags: list[str], out: Path, model_dir: Path, steps: int, args: Args,
               stop: Stop) -> dict:
    """`script`'s main() in this process for `steps` steps; its metrics, timings, peak GPU memory, update proof."""
    import torch

    module = importlib.import_module(script)
    argv = ["--model_name_or_path", str(model_dir), "--output_dir", str(out), "--max_steps", str(steps),
            "--dtype", args.dtype, "--prompts_per_step", str(args.prompts_per_step), "--max_new_tokens",
            str(args.max_new_tokens), "--eval_every", "0", "--eval_prompts", str(args.smoke_eval_prompts),
            "--eval_samples", "2",
            "--eval_train_prompts", "0", "--save_every", "0", "--warmup_steps", "1",
            *(["--prompt_pool", str(args.prompt_pool)] if args.prompt_pool else []),
            "--overwrite_output_dir", *flags]  # a repeated smoke command replaces its own earlier runs
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    graphs, signals = _compiled_graphs(), len(GracefulStop.received)
    start = time.time()
    stop.in_run = True
    try:
        module.main(parse_args(module.Args, argv))
    except KeyboardInterrupt:  # a signal before the script took the signals over: nothing of its steps to save
        pass
    finally:
        stop.in_run = False
        if torch.distributed.is_initialized():  # --fsdp made a world of one in this process: drop it
            torch.distributed.destroy_process_group()
    if len(GracefulStop.received) > signals and stop.reason is None:  # the script took it, saved and returned
        stop.reason = f"signal {GracefulStop.received[-1]}"
    wall = time.time() - start
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None
    gc.collect()
    metrics = out / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()][1:] if metrics.exists() else []
    done = rows[-1]["step"] if rows else 0
    if not rows:
        return {"status": f"interrupted before step 1 ({stop.reason})", "wall_s": wall}
    gen_s, train_s, step_s = (sum(r[k] for r in rows) for k in ("time_gen_s", "time_train_s", "time_step_s"))
    result = {
        "status": "ok" if done == steps else f"stopped at step {done} of {steps} ({stop.reason})",
        "steps": done, "wall_s": wall, "fixed_s": wall - step_s, "step_s": step_s / len(rows),
        "gen_tokens_per_s": rows[-1]["gen_tokens"] / max(gen_s, 1e-9), "gen_s_per_step": gen_s / len(rows),
        "train_s_per_step": train_s / len(rows), "other_s_per_step": (step_s - gen_s - train_s) / len(rows),
        "peak_gpu_gib": peak, "reward_mean": sum(r["reward_mean"] for r in rows) / len(rows),
        "grad_norm_mean": sum(r["grad_norm"] for r in rows) / len(rows),
        "compiled_graphs": _compiled_graphs() - graphs,
    }
    if "ps_trained_groups" in rows[0]:
        result["groups_kept"] = int(sum(r["ps_trained_groups"] for r in rows))
    ckpt = out / f"checkpoint-{done}"
    if not (ckpt / "trainer_state.pt").exists():  # a second signal aborted the save: no update to measure
        result["status"] = f"stopped at step {done} of {steps} ({stop.reason}; no checkpoint, update not measured)"
        return result
    result["policy_changed_frac"] = policy_changed(model_dir, ckpt)
    if script == "pros_ppo":
        result["critic_changed_frac"] = critic_changed(model_dir, ckpt)
    result["checkpoint"] = str(ckpt)
    return result


def drop_checkpoint(result: dict, args: Args) -> None:
    """Delete a measured run's checkpoint unless --keep_checkpoints (a GPU machine's disk holds only a few)."""
    if not args.keep_checkpoints and result.get("checkpoint"):
        shutil.rmtree(result["checkpoint"], ignore_errors=True)


def _compiled_graphs() -> int:
    """Graphs torch.compile has built in this process so far (transformers compiles generate's decoding step)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"]["unique_graphs"])


# ---------------------------------------------------------------------------------------------------------------
# The learning part: a method and its baseline, held-out pass@1 with a 95% interval, a curve
# ---------------------------------------------------------------------------------------------------------------

def heldout_pass_rates(model_dir: Path, args: Args) -> list[float]:
    """Per held-out prompt: the fraction of `--learning_eval_samples` samples (T = 1) the binary verifier accepts."""
    import torch

    from common.countdown import countdown_task
    from common.data import PromptEncoder
    from common.generation import HFGenerator, SamplingConfig
    from common.policy import load_policy

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_policy(str(model_dir))
    model.to(device)
    task = countdown_task("binary", args.learning_eval_prompts)
    n = args.learning_eval_samples
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device.type == "cuda" else []):
        torch.manual_seed(1234)  # the same draws for every policy measured
        gens = HFGenerator(model, tokenizer, dtype=args.dtype).generate(
            [PromptEncoder(tokenizer, task.templated)(ex.prompt) for ex in task.eval], n,
            SamplingConfig(max_new_tokens=args.max_new_tokens, logprobs=False))
    texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
    del model
    gc.collect()
    return [sum(task.eval_reward_fn(texts[i * n + j], ex) for j in range(n)) / n for i, ex in enumerate(task.eval)]


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (normal approximation over prompts; the standard library's
    quantile, since the GPU image has no scipy)."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)
    return mean, statistics.NormalDist().inv_cdf(0.975) * math.sqrt(var / len(values))


def plan_learning_steps(left_s: float, fixed_s: float, step_s: float, max_steps: int) -> int:
    """Steps each of the two learning runs can take in `left_s` (each run also pays `fixed_s`, and the three
    held-out measurements about one run's fixed cost together)."""
    return max(0, min(max_steps, int((left_s - 3 * fixed_s) / 2 / step_s)))


def plot_learning(learning: dict, path: Path) -> str:
    """The learning curve PNG (training reward per step, and held-out pass@1 at start and end with its interval);
    returns what was done."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no matplotlib here: draw it later with python benchmarks/gpu/smoke.py --plot {path.parent}"
    fig, (ax_reward, ax_eval) = plt.subplots(1, 2, figsize=(10, 3.8))
    for arm, style in (("method", "-"), ("baseline", "--")):
        run = learning.get(arm)
        if not run or not run.get("reward_curve"):
            continue
        label = f"{run['label']}{' (baseline)' if arm == 'baseline' else ''}"
        curve, window = run["reward_curve"], max(1, len(run["reward_curve"]) // 10)  # a moving mean past 20 steps
        smooth = [sum(curve[max(0, i - window + 1):i + 1]) / len(curve[max(0, i - window + 1):i + 1])
                  for i in range(len(curve))] if len(curve) > 20 else curve
        ax_reward.plot(range(1, len(curve) + 1), smooth, style, label=label)
        if "end" in run:
            steps = [0, len(run["reward_curve"])]
            means = [learning["start"]["pass@1"], run["end"]["pass@1"]]
            errors = [learning["start"]["ci95"], run["end"]["ci95"]]
            ax_eval.errorbar(steps, means, yerr=errors, fmt="o" + style, capsize=4, label=label)
    ax_reward.set(xlabel="step", ylabel="training reward (mean)", title="training reward (fresh rollouts)")
    ax_eval.set(xlabel="step", ylabel="held-out pass@1 (95% interval)", title="held-out pass@1")
    for axis in (ax_reward, ax_eval):
        axis.legend(fontsize=8)
    fig.suptitle(f"ra_rloo.py on {learning.get('device', '?')}, warm-started Qwen2", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


# ---------------------------------------------------------------------------------------------------------------
# The TRL peer
# ---------------------------------------------------------------------------------------------------------------

def peer_python(out: Path) -> tuple[str | None, str]:
    """A Python that imports trl: this one, or a venv over this one's packages with TRL's wheels from `.whl/`."""
    if importlib.util.find_spec("trl") is not None and importlib.util.find_spec("datasets") is not None:
        return sys.executable, "trl imports here"  # (trl imports datasets at once)
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    if not wheels:
        return None, (f"skipped: trl (or datasets) does not import and {WHEELS} holds no wheels (docs/scaling.md "
                      "lists them, with the pip download line)")
    venv = out / "peer-venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    done = subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(WHEELS), "trl"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"skipped: installing trl from {WHEELS} failed: {done.stderr.strip().splitlines()[-1:]}"
    return python, f"trl installed from {len(wheels)} wheels in {WHEELS}"


def run_peer(model_dir: Path, out: Path, args: Args, stop: Stop, timeout_s: float) -> dict:
    python, how = peer_python(out)
    if python is None:
        return {"status": how}
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cmd = [python, "benchmarks/speed/trl_peer.py", "--device", device, "--model_name_or_path", str(model_dir),
           "--dtype", args.dtype, "--steps", "5", "--repeats", "1", "--prompts_per_step", str(args.prompts_per_step),
           "--max_new_tokens", str(args.max_new_tokens), "--micro_batch_size", str(args.prompts_per_step * 4),
           "--out", str(out / "trl_peer.md"), "--json", str(out / "trl_peer.json")]
    print("peer:", how, "\n  " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT)
    stop.in_run = True
    try:
        proc.wait(timeout=max(1.0, timeout_s))
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        proc.terminate()
        proc.wait()
        return {"status": f"stopped ({stop.reason or 'budget'})", "command": cmd}
    finally:
        stop.in_run = False
    if proc.returncode != 0 or not (out / "trl_peer.json").exists():
        return {"status": f"error: trl_peer.py exited {proc.returncode}", "command": cmd}
    result = json.loads((out / "trl_peer.json").read_text())
    return {"status": "ok", "how": how, "command": cmd, "ratio": result["ratio"], "trl": result["trl"],
            "ours": result["ours"], "check_agree": result["check"]["agree"], "versions": result["versions"]}


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------

def error_status(error: Exception) -> str:
    """A run's or part's status line for an exception, after printing its traceback to the log."""
    traceback.print_exc()
    return f"error: {type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def verdict(runs: list[dict]) -> str:
    """'policy updated in N of M runs' over the runs that started (an error counts as not updated), naming every
    run whose policy did not change; runs the budget or a signal skipped are counted apart."""
    started = [r for r in runs if not r["status"].startswith("skipped")]
    stale = [f"{r['script']}/{r['variant']}" + ("" if "policy_changed_frac" in r else f" ({r['status'][:60]})")
             for r in started if r.get("policy_changed_frac", 0) <= 0]
    line = f"policy updated in {len(started) - len(stale)} of {len(started)} runs"
    skipped = len(runs) - len(started)
    return line + (f"; not updated: {', '.join(stale)}" if stale else "") + (f"; {skipped} skipped" if skipped else "")


def table(report: dict) -> str:
    runs = report["runs"]
    lines = [f"# GPU smoke on {report['device']}", "",
             f"Versions: {report['versions']}. Budget {report['budget_s']:.0f} s; elapsed {report['elapsed_s']:.0f} s; "
             f"stopped: {report['stopped'] or 'no'}.", ""]
    warm = report.get("warm_start") or {}
    if warm:
        lines += [f"Warm start: {warm.get('steps')} SFT steps, {warm.get('seconds')} s, greedy pass@1 on training "
                  f"prompts {warm.get('greedy_pass@1', 0):.3f}{' (cached)' if warm.get('cached') else ''}.", ""]
    lines += ["| script | variant | status | reward | policy changed | critic changed | grad norm | groups kept | "
              "gen tokens/s | s/step: gen / train / rest | peak GPU |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "policy_changed_frac" not in r:
            lines.append(f"| {r['script']} | {r['variant']} | {r['status']} | | | | | | | | |")
            continue
        critic = "" if r.get("critic_changed_frac") is None else f"{r['critic_changed_frac']:.1%}"
        peak = "n/a (CPU)" if r["peak_gpu_gib"] is None else f"{r['peak_gpu_gib']:.2f} GiB"
        lines.append(f"| {r['script']} | {r['variant']} | {r['status']} | {r['reward_mean']:.3f} | "
                     f"{r['policy_changed_frac']:.1%} | {critic} | {r['grad_norm_mean']:.3g} | "
                     f"{r.get('groups_kept', '')} | {r['gen_tokens_per_s']:,.0f} | {r['gen_s_per_step']:.2f} / "
                     f"{r['train_s_per_step']:.2f} / {r['other_s_per_step']:.2f} | {peak} |")
    lines += ["", f"**{verdict(runs)}**"]
    learning = report.get("learning")
    if learning and "start" in learning:
        lines += ["", "## Learning: ra_rloo.py (RA-RLOO) and its baseline `--replay none`", "",
                  f"Held-out pass@1 ({learning['prompts']} prompts x {learning['samples']} samples, T = 1; 95% "
                  f"interval over prompts). Start (the warm-started model): {learning['start']['pass@1']:.3f} "
                  f"± {learning['start']['ci95']:.3f}.", "", "| run | steps | end pass@1 | change from start |",
                  "|---|---|---|---|"]
        for arm in ("method", "baseline"):
            run = learning.get(arm) or {}
            if "end" in run:
                lines.append(f"| {run['label']} | {run['steps']} | {run['end']['pass@1']:.3f} ± "
                             f"{run['end']['ci95']:.3f} | {run['end']['pass@1'] - learning['start']['pass@1']:+.3f} |")
            elif run:  # it did not reach its measurement: its own status says why
                lines.append(f"| {run['label']} | {run.get('steps', 0)} | {run['status']} | |")
        lines.append(f"\n{learning.get('plot', '')}")
    speed = report.get("speed") or []
    if speed:
        lines += ["", "## Speed (ra_rloo.py, HF generate)", "",
                  "| run | s/step (steps 2+, compile apart) | median s/step (steps 2+) | gen tokens/s (steps 2+) | "
                  "first step s (gen s) | compile s | graphs compiled |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {s['cache_implementation']} | {s.get('step_s_after_first', 0):.3f} | "
                  f"{s.get('step_s_median_after_first', 0):.3f} | "
                  f"{s.get('gen_tokens_per_s_after_first', 0):,.0f} | {s.get('first_step_s') or 0:.2f} "
                  f"({s.get('first_step_gen_s', 0):.2f}) | "
                  f"{'' if s.get('compile_s') is None else format(s['compile_s'], '.1f')} | "
                  f"{s.get('compiled_graphs', '')} |" if s["status"] == "ok"
                  else f"| {s['cache_implementation']} | {s['status']} | | | | | |" for s in speed]
    peer = report.get("peer")
    if peer:
        lines += ["", "## TRL peer", "", f"status: {peer['status']}"]
        if peer["status"] == "ok":
            ratio = peer["ratio"]
            lines.append(f"ours / TRL: {ratio['steps_per_s']:.2f}x steps/s, {ratio['tokens_per_s']:.2f}x tokens/s; "
                         f"definition check {'agrees' if peer['check_agree'] else 'DOES NOT agree'}")
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path, stop: Stop) -> None:
    report["elapsed_s"] = stop.elapsed()
    report["stopped"] = stop.reason
    report["verdict"] = verdict(report["runs"])
    (out / "smoke.json").write_text(json.dumps(report, indent=2))
    (out / "smoke.md").write_text(table(report))


# ---------------------------------------------------------------------------------------------------------------
# main: plan, then the parts in priority order
# ---------------------------------------------------------------------------------------------------------------

def main(args: Args) -> dict:
    import torch
    import transformers

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stop = Stop(args.budget_s)
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else "CPU (no GPU: a check of this script)"
    report = {"device": device, "versions": f"torch {torch.__version__}, transformers {transformers.__version__}, "
              f"Python {sys.version.split()[0]}", "budget_s": args.budget_s, "args": asdict(args), "plan": [],
              "runs": [], "warm_start": None, "learning": None, "speed": [], "peer": None}
    guess = dict(GUESS[args.size])
    scripts, parts = args.scripts.split(","), list(dict.fromkeys(p for p in args.parts.split(",") if p))
    try:
        # ---------------- plan ----------------
        run_s = lambda steps: guess["run_fixed_s"] + steps * guess["step_s"]  # noqa: E731
        warm_dir = out / f"model-{args.size}-warm"
        cached = (warm_dir / "warm_start.json").exists() or args.size == "tiny"
        cost = {"warm start": 0.0 if cached else args.warm_max_s}  # its upper bound
        for part in parts:
            if part in PART_VARIANTS:
                cost[part] = len(scripts) * len(PART_VARIANTS[part]) * run_s(args.steps)
            elif part == "learning":
                cost[part] = 2 * run_s(10) + 3 * guess["run_fixed_s"]  # at least ~10 steps each to be worth it
            elif part == "speed":
                runs = [r for r in args.speed_runs.split(",") if r]
                cost[part] = len(runs) * run_s(args.speed_steps) + sum(SPEED_COMPILE_S.get(r, 0.0) for r in runs)
            else:
                cost[part] = guess["peer_s"]
        total, usable = 0.0, stop.left()
        print(f"gpu_smoke on {device}: budget {args.budget_s:.0f} s, {usable:.0f} s left for the work. Plan (first "
              "guesses, revised as runs finish):")
        for name, seconds in cost.items():
            total += seconds
            fits = "fits" if total <= usable else "may not fit: runs only if time is left"
            report["plan"].append({"part": name, "estimate_s": round(seconds), "cumulative_s": round(total)})
            print(f"  {name:<10} ~{seconds:5.0f} s   cumulative ~{total:5.0f} s   {fits}", flush=True)

        # ---------------- model and warm start ----------------
        if args.size == "tiny":
            model_dir = embedded_warm_dir(warm_dir)
            report["warm_start"] = json.loads((model_dir / "warm_start.json").read_text())
        else:
            random_dir = build_model_dir(out / f"model-{args.size}", args.size)
            report["warm_start"] = warm_start(random_dir, warm_dir, args, stop)
            model_dir = warm_dir
        write(report, out, stop)

        # ---------------- the parts, in priority order ----------------
        measured = []  # (fixed_s, step_s) of finished smoke runs: the plan's guesses are revised from them
        for part in parts:
            if stop.reason and part not in PART_VARIANTS:
                continue  # said below; the smoke parts list each run they skip
            print(f"\n=== part {part} ({stop.left():.0f} s left) ===", flush=True)
            if part in PART_VARIANTS:
                for script in scripts:
                    for variant in PART_VARIANTS[part]:
                        entry = {"script": script, "variant": variant, "part": part}
                        if stop.reason or stop.left() < run_s(args.steps):
                            report["runs"].append({**entry, "status": "skipped: budget" if not stop.reason
                                                   else f"skipped ({stop.reason})"})
                            continue
                        print(f"--- {script} / {variant} ({stop.left():.0f} s left)", flush=True)
                        lr = args.learning_rate * (10 if variant == "lora" else 1)
                        flags = [*VARIANTS[variant], *SCRIPT_FLAGS.get(script, []), "--learning_rate", repr(lr)]
                        try:
                            result = run_script(script, flags, out / f"{script}-{variant}", model_dir, args.steps,
                                                args, stop)
                        except Exception as error:  # a smoke run reports its failure and the command goes on
                            result = {"status": error_status(error)}
                        drop_checkpoint(result, args)
                        report["runs"].append({**entry, **result})
                        if result["status"] == "ok":
                            measured.append((result["fixed_s"], result["step_s"]))
                            guess["run_fixed_s"] = sum(m[0] for m in measured) / len(measured)
                            guess["step_s"] = sum(m[1] for m in measured) / len(measured)
                        write(report, out, stop)
            else:
                try:
                    if part == "learning":
                        report["learning"] = learning_part(model_dir, out, args, stop, guess, device, report)
                    elif part == "speed":
                        report["speed"] = speed_part(model_dir, out, args, stop, guess, report)
                    elif stop.left() < guess["peer_s"]:
                        report["peer"] = {"status": f"skipped: {stop.left():.0f} s left, the peer needs "
                                                    f"~{guess['peer_s']:.0f}"}
                    else:
                        report["peer"] = run_peer(model_dir, out / "peer", args, stop, stop.left() - 5)
                except Exception as error:  # a part reports its failure, keeps what it recorded; the command goes on
                    failed = {"status": error_status(error)}
                    if part == "speed":  # the runs it finished stay, each with its own status
                        report["speed"] = [*report["speed"], {"cache_implementation": "-", **failed}]
                    else:
                        report[part] = {**(report.get(part) or {}), **failed}
            write(report, out, stop)
        for part in PARTS:  # what the budget left out, said once
            if part in parts and part not in ("plain", "fsdp", "gc_lora") and report.get(part) in (None, []):
                report[part] = {"status": f"not run ({stop.reason or 'budget'})"} if part != "speed" else \
                    [{"cache_implementation": "-", "status": f"not run ({stop.reason or 'budget'})"}]
    finally:
        write(report, out, stop)
        stop.close()
    print("\n" + table(report), flush=True)
    if stop.reason and stop.reason.startswith("signal"):
        raise SystemExit(128 + int(stop.reason.split()[1]))  # interrupted: the shell sees it; results are written
    return report


def learning_part(model_dir: Path, out: Path, args: Args, stop: Stop, guess: dict, device: str,
                  report: dict) -> dict:
    """ra_rloo.py and `--replay none` from the warm-started model, as many steps each as the budget leaves. Each arm
    records its own status: an arm that fails leaves the other's figures in `report["learning"]`."""
    steps = plan_learning_steps(stop.left() - 10, guess["run_fixed_s"], guess["step_s"], args.learning_max_steps)
    if steps < 2:
        return {"status": f"skipped: {stop.left():.0f} s left is not enough for two runs of 2 steps"}
    learning = {"device": device, "steps_planned": steps, "prompts": args.learning_eval_prompts,
                "samples": args.learning_eval_samples, "learning_rate": args.learning_lr}
    report["learning"] = learning
    print(f"learning: 2 runs x {steps} steps (~{guess['step_s']:.2f} s/step measured), held-out pass@1 on "
          f"{args.learning_eval_prompts} prompts x {args.learning_eval_samples}", flush=True)
    start = heldout_pass_rates(model_dir, args)
    learning["start"] = dict(zip(("pass@1", "ci95"), mean_ci(start)))
    for arm, label in (("method", "RA-RLOO"), ("baseline", "RLOO (--replay none)")):
        if stop.reason:
            break
        flags = [*LEARNING[arm], "--k", "4", "--learning_rate", repr(args.learning_lr), "--save_every", "0",
                 "--reward", "binary"]
        run_dir = out / f"learning-{arm}"
        shutil.rmtree(run_dir, ignore_errors=True)
        result = {}
        try:
            result = run_script("ra_rloo", flags, run_dir, model_dir, steps, args, stop)
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:] \
                if (run_dir / "metrics.jsonl").exists() else []
            learning[arm] = {"label": label, "status": result["status"], "steps": result.get("steps", 0),
                             "step_s": result.get("step_s"), "reward_curve": [r["reward_mean"] for r in rows],
                             "policy_changed_frac": result.get("policy_changed_frac")}
            if rows and not stop.reason:  # past the budget or signalled: no further measurement
                rates = heldout_pass_rates(run_dir / f"checkpoint-{rows[-1]['step']}", args)
                learning[arm]["end"] = dict(zip(("pass@1", "ci95"), mean_ci(rates)))
                changes = [end - begin for begin, end in zip(start, rates)]  # paired by prompt
                learning[arm]["paired_change"] = dict(zip(("mean", "ci95"), mean_ci(changes)))
                learning[arm]["end_rates"] = rates
        except Exception as error:  # this arm's failure is its own: the other arm still runs and reports
            learning[arm] = {**learning.get(arm, {"label": label}), "status": error_status(error)}
        drop_checkpoint(result, args)
    if learning.get("method", {}).get("end") and learning.get("baseline", {}).get("end"):
        learning["method_minus_baseline_end"] = learning["method"]["end"]["pass@1"] - \
            learning["baseline"]["end"]["pass@1"]
        # the same held-out prompts for both arms: the difference's interval is paired by prompt
        diffs = [m - b for m, b in zip(learning["method"]["end_rates"], learning["baseline"]["end_rates"])]
        learning["method_minus_baseline"] = dict(zip(("mean", "ci95"), mean_ci(diffs)))
    (out / "learning.json").write_text(json.dumps(learning, indent=2))
    learning["plot"] = plot_learning(learning, out / "learning.png")
    return learning


def speed_part(model_dir: Path, out: Path, args: Args, stop: Stop, guess: dict, report: dict) -> list[dict]:
    """ra_rloo.py's step time and generated tokens/s over steps 2+ eager with transformers' default cache, with a static
    one (compiled by transformers on a GPU) and with `--torch_compile`, the first step and the compile time apart;
    each run records its own status, and one that fails leaves the others' figures in `report["speed"]`."""
    results = []
    for cache in dict.fromkeys(r for r in args.speed_runs.split(",") if r):
        extra = SPEED_RUNS[cache]
        if stop.reason or stop.left() < guess["run_fixed_s"] + args.speed_steps * guess["step_s"] + 15:
            results.append({"cache_implementation": cache, "status": "skipped: budget" if not stop.reason
                            else f"skipped ({stop.reason})"})
            continue
        run_dir = out / f"speed-{cache}"
        shutil.rmtree(run_dir, ignore_errors=True)
        try:
            result = run_script("ra_rloo", ["--k", "4", "--save_every", "0", *extra], run_dir, model_dir,
                                args.speed_steps, args, stop)
        except Exception as error:  # this run's failure is its own: the other runs' figures stay in the report
            result = {"status": error_status(error)}
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:] \
            if not result["status"].startswith("error") and (run_dir / "metrics.jsonl").exists() else []
        drop_checkpoint(result, args)
        entry = {"cache_implementation": cache, "status": result["status"],
                 "compiled_graphs": result.get("compiled_graphs")}
        if len(rows) >= 2:
            later = rows[1:]
            tokens = rows[-1]["gen_tokens"] - rows[0]["gen_tokens"]
            entry["gen_tokens_per_s_after_first"] = tokens / sum(r["time_gen_s"] for r in later)
            # a recompilation in a later step is compile time too: reported apart, not in the step time
            entry["step_s_after_first"] = sum(r.get("time_step_s", 0.0) - r.get("time_compile_s", 0.0)
                                              for r in later) / len(later)
            entry["step_s_median_after_first"] = statistics.median(r.get("time_step_s", 0.0) for r in later)
            entry["first_step_s"] = rows[0].get("time_step_s")
            entry["first_step_gen_s"] = rows[0]["time_gen_s"]
            if "time_compile_s" in rows[0]:  # --torch_compile: seconds spent compiling, step 0's evaluation included
                every = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
                entry["compile_s"] = sum(r.get("time_compile_s", 0.0) for r in every)
                entry["compile_recompiles"] = rows[-1].get("compile_recompiles")
        results.append(entry)
        report["speed"] = results
    return results


GPU_RESULTS = ROOT / "benchmarks" / "gpu" / "results"


def docs_block(results: Path = GPU_RESULTS) -> str:
    """The GPU paragraph of docs/scaling.md and docs/benchmark.md, from the newest committed spell with a smoke.json
    (`benchmarks/gpu/results/<date>-<device>/`), regenerated by `python benchmarks/sweep/report.py --write_docs`."""
    import textwrap

    found = sorted(results.glob("*/smoke.json")) if results.is_dir() else []
    if not found:
        return "No GPU spell of `benchmarks/gpu/spell.sh` has been committed under `benchmarks/gpu/results/` yet.\n"
    folder = found[-1].parent
    report = json.loads(found[-1].read_text())
    rel = Path(os.path.relpath(folder, ROOT)).as_posix()
    device_txt = (folder / "device.txt").read_text().split("\n")[0].strip() if (folder / "device.txt").exists() \
        else report["device"]
    args = report["args"]
    lines = [f"The newest GPU spell, `bash benchmarks/gpu/spell.sh` (results: [{rel}/](../{rel}/)): {device_txt}; "
             f"{report['versions']}; budget {report['budget_s']:.0f} s, {report['elapsed_s']:.0f} s used"
             + (f" (stopped: {report['stopped']})" if report.get("stopped") else "") + f"; parts `{args['parts']}`, "
             f"--size {args['size']}, --dtype {args['dtype']}, {args['prompts_per_step']} prompts a step, at most "
             f"{args['max_new_tokens']} new tokens.", ""]
    warm = report.get("warm_start") or {}
    if "pass_rate" in warm or "greedy_pass@1" in warm:
        rate = warm.get("greedy_pass@1", warm.get("pass_rate"))
        lines.append(f"- warm start: greedy pass@1 {rate:.3f} on training prompts after {warm.get('steps', '?')} SFT "
                     f"steps, {warm.get('seconds', warm.get('wall_s', 0)):.0f} s")
    ran = [r for r in report["runs"] if not r["status"].startswith("skipped")]
    if report["runs"]:
        per = "; ".join(f"{r['script']}/{r['variant']} {r['status']}"
                        + (f", {r['gen_tokens_per_s']:,.0f} gen tokens/s, {r['step_s']:.2f} s/step, peak "
                           f"{r['peak_gpu_gib']:.2f} GiB, {100 * r['policy_changed_frac']:.0f}% of weights changed"
                           if r["status"] == "ok" and r.get("peak_gpu_gib") is not None else "") for r in ran)
        lines.append(f"- smoke ({args['steps']} steps a run): **{report['verdict']}**" + (f" ({per})" if per else ""))
    learning = report.get("learning") or {}
    if learning.get("method_minus_baseline"):
        diff = learning["method_minus_baseline"]
        low, high = diff["mean"] - diff["ci95"], diff["mean"] + diff["ci95"]
        word = "method above baseline" if low > 0 else "method below baseline" if high < 0 else "inconclusive"
        arms = "; ".join(f"{learning[a]['label']} {learning[a]['steps']} steps, {learning[a]['end']['pass@1']:.3f}"
                         for a in ("method", "baseline"))
        lines.append(f"- learning (held-out pass@1, {learning['prompts']} prompts x {learning['samples']} samples): "
                     f"start {learning['start']['pass@1']:.3f}; {arms}; RA-RLOO minus RLOO {diff['mean']:+.3f} "
                     f"[{low:+.3f}, {high:+.3f}] (95%, paired by prompt): **{word}**")
    elif learning.get("status"):
        lines.append(f"- learning: {learning['status']}")
    speed = [s for s in report.get("speed") or [] if s.get("status") == "ok" and "step_s_after_first" in s]
    if speed:
        figures = "; ".join(f"`{s['cache_implementation']}` {s['step_s_after_first']:.3f} s/step (median "
                            f"{s.get('step_s_median_after_first', 0):.3f}), "
                            f"{s['gen_tokens_per_s_after_first']:,.0f} gen tokens/s (first step "
                            f"{s['first_step_s']:.1f} s" + (f"; {s['compile_s']:.1f} s compiling in all, step 0's "
                                                            f"evaluation included, {s['compile_recompiles']} "
                                                            "recompilation(s)"
                                                            if s.get("compile_s") is not None else "") + ")"
                            for s in speed)
        lines.append(f"- speed (ra_rloo.py, {args['speed_steps']} steps; mean of steps 2+ less their compile time, "
                     f"and its median): {figures}")
    for s in report.get("speed") or []:
        if s.get("status") != "ok":
            lines.append(f"- speed `{s['cache_implementation']}`: {s['status']}")
    peer = report.get("peer") or {}
    if peer.get("status") == "ok":
        ratio = peer["ratio"]
        lines.append(f"- against TRL {peer['versions'].get('trl', '')} `GRPOTrainer` on the same GPU "
                     f"(`benchmarks/speed/trl_peer.py`, 5 steps, one round): ours / TRL {ratio['steps_per_s']:.2f}x "
                     f"steps/s, {ratio['tokens_per_s']:.2f}x tokens/s; definition check "
                     + ("agrees" if peer["check_agree"] else "DOES NOT agree"))
    elif peer:
        lines.append(f"- TRL peer: {peer['status']}")
    if (folder / "README.md").exists():  # what went wrong in that spell, and what was done about it
        lines += ["", f"What this spell showed and what failed in it: [{rel}/README.md](../{rel}/README.md)."]
    return "\n".join(textwrap.fill(line, 120, subsequent_indent="  " if line.startswith("- ") else "",
                                    break_on_hyphens=False, break_long_words=False) if line else ""
                      for line in lines) + "\n"


def replot(folder: str) -> None:
    """`--plot DIR`: draw learning.png from a finished command's learning.json (e.g. one copied from a GPU)."""
    learning = json.loads((Path(folder) / "learning.json").read_text())
    print(plot_learning(learning, Path(folder) / "learning.png"))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--plot"]:
        replot(sys.argv[2])
    else:
        main(parse_args(Args, description=__doc__.split("\n\n")[0]))
