"""TRL's GRPOTrainer as a throughput peer of our Dr. GRPO-n4, and a check that both define the same update.

Throughput: `--steps` TRL GRPO steps, then `--steps` steps of our Dr. GRPO-n4 (`ada_seq.py --max_rounds 1
--round_repeat 4 --scale_rewards false --entropy_coef 0`), same base policy (the cached embedded tiny model), same
first `--prompt_pool` Countdown training prompts, same reward (the binary verifier), same batch (32 prompts x 4
completions of at most 32 tokens per optimizer step), same optimiser settings, fp32 on CPU. `--repeats` rounds,
alternating which trainer goes first, so that a slow spell of the shared machine does not land on one of them
only. Step 1 (warm-up) and the last step (ours evaluates the final policy inside it) are left out; the figures are
the median step time and the generated completion tokens per second over the steps in between, pooled over the
rounds.

KV cache: ours runs with `--cache_implementation` (default `auto`: static on CUDA where transformers supports it,
dynamic on CPU). TRL runs as a TRL user runs it by default (its `cache_implementation=None`: transformers' dynamic
cache) and, where ours resolves to another cache, once more with `GRPOConfig(cache_implementation=<ours>)`; the
page gives ours / TRL against both.

Definition check (`--check`, also part of the full run): on a fixed batch (2 prompts x 4 completions of varied
length, fixed rewards, fixed old log-probs with some ratios outside the clip range) it runs TRL's own code --
`_generate_and_score_completions` (advantages) fed by a `rollout_func` that returns the fixed completions, and
`compute_loss` -- and compares advantages, loss and gradient with ours (`ada_seq.global_advantages`,
ada_seq.py's summed clipped surrogate / (responses x max_new_tokens)).

    pip install trl                                              # (a separate venv is fine)
    flock /tmp/cpu.lock python benchmarks/speed/trl_peer.py --steps 20  # check + throughput -> results/trl_peer.md
    python benchmarks/speed/trl_peer.py --check                         # the definition check only (prints)
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.speed.trl_check import definition_check, render_check  # noqa: E402
from benchmarks.speed.trl_setup import (  # noqa: E402
    CountdownReward,
    build_dataset,
    countdown_examples,
    grpo_config,
    load_base,
    require_trl,
)
from common.run.flags import parse_args  # noqa: E402


@dataclass
class Args:
    steps: int = 20
    """optimizer steps of each trainer (step 1 and the last step are not timed; needs >= 3)"""
    num_threads: int = 2
    """torch CPU threads for both trainers"""
    prompt_pool: int = 256
    """train on the first N Countdown training prompts (as the benchmark sweep does)"""
    prompts_per_step: int = 32
    """prompts per optimizer step"""
    num_generations: int = 4
    """completions per prompt (the group size n of GRPO-n)"""
    max_completion_length: int = 32
    """maximum completion length (TRL: max_completion_length)"""
    micro_batch_size: int = 64
    """sequences per forward/backward (ours: --micro_batch_size; TRL: per_device_train_batch_size)"""
    learning_rate: float = 5e-5
    """AdamW learning rate (the sweep's)"""
    warmup_steps: int = 5
    """linear warm-up steps, then constant (our BaseArgs default)"""
    repeats: int = 3
    """measurement rounds, each one run of each trainer, alternating which goes first (cancels drift)"""
    seed: int = 0
    """seed of both runs (the same in every round: each round repeats the same sampled work)"""
    check: bool = False
    """run only the definition check (no training, a few seconds) and print it"""
    out: str = "benchmarks/speed/results/trl_peer.md"
    """where the full run writes its results page (relative to the repo root)"""
    json: str = ""
    """also write the full run's figures (and the definition check) as JSON to this path (default: none, no
    JSON)"""
    device: Literal["cpu", "cuda"] = "cpu"
    """where both trainers and the definition check run (`cuda`: the first GPU)"""
    model_name_or_path: str = "embedded"
    """the base policy of both trainers: `embedded` (the cached tiny model) or a local HF model dir whose tokenizer
    round-trips Countdown text (e.g. benchmarks/gpu/smoke.py's warm-started model)"""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """compute dtype of both trainers' throughput runs (ours: --dtype, autocast over fp32 weights; TRL: bf16=True,
    the same); the definition check is always fp32"""
    torch_compile: bool = False
    """ours with --torch_compile (its decoding step and packed training forward compiled)"""
    trl_torch_compile: bool = False
    """TRL with its own torch_compile=True (TrainingArguments: the model compiled by the Trainer)"""
    cache_implementation: Literal["auto", "dynamic", "static"] = "auto"
    """ours' HF generate KV cache (`--cache_implementation`; `auto`: static on CUDA where transformers supports it,
    dynamic on CPU); TRL is timed at its default cache and, where this resolves to another, with this one too"""

    def validate(self) -> None:
        if self.steps < 3:
            raise SystemExit(
                f"--steps {self.steps}: need >= 3 (step 1 and the last step are not timed)"
            )
        if self.repeats < 1:
            raise SystemExit(f"--repeats {self.repeats}: need >= 1")
        if self.num_generations < 2 or self.prompts_per_step < 1 or self.max_completion_length < 1:
            raise SystemExit(
                "--num_generations >= 2, --prompts_per_step >= 1 and --max_completion_length >= 1 please"
            )
        batch = self.prompts_per_step * self.num_generations
        if batch % self.micro_batch_size:
            raise SystemExit(
                f"--micro_batch_size {self.micro_batch_size}: must divide prompts_per_step x "
                f"num_generations = {batch} (TRL accumulates whole micro-batches)"
            )


# ----------------------------------------------------------------------------------------------------
# Setup shared by both modes: trl, the base policy, prompts and reward
# ----------------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------------
# Throughput
# ----------------------------------------------------------------------------------------------------


def throughput(runs: list[dict]) -> dict:
    """Figures over steps 2..N-1 of every run ({"step_times", "tokens"} per step), pooled.

    Step 1 is warm-up and our last step also evaluates the final policy. steps/s is 1 / the median step time;
    tokens/s is total generated tokens / total time of the pooled steps.
    """
    t, k = [], []
    for r in runs:
        if len(r["step_times"]) != len(r["tokens"]):
            raise ValueError(
                f"{len(r['step_times'])} step times but {len(r['tokens'])} token counts"
            )
        t += r["step_times"][1:-1]
        k += r["tokens"][1:-1]
    if not t:
        raise ValueError("no timed steps: runs need >= 3 steps (step 1 and the last are not timed)")
    med = statistics.median(t)
    return {
        "steps": [2, len(runs[0]["step_times"]) - 1],
        "timed": len(t),
        "step_s": med,
        "steps_per_s": 1.0 / med,
        "tokens_per_step": sum(k) / len(k),
        "tokens_per_s": sum(k) / sum(t),
        "step_s_min": min(t),
        "step_s_max": max(t),
    }


def compare(trl: dict, ours: dict) -> dict:
    """Ours / TRL: > 1 means ours is faster."""
    return {
        "steps_per_s": ours["steps_per_s"] / trl["steps_per_s"],
        "tokens_per_s": ours["tokens_per_s"] / trl["tokens_per_s"],
    }


def same_cache(args: Args) -> str | None:
    """The cache ours generates with on `--device` (`--cache_implementation` resolved as our scripts resolve it);
    None: transformers' dynamic cache, which is also TRL's default."""
    from transformers import AutoConfig

    from benchmarks.speed.trl_setup import base_dir
    from common.generation.hf import resolve_cache_implementation

    config = AutoConfig.from_pretrained(base_dir(args.model_name_or_path))
    cache, _ = resolve_cache_implementation(args.cache_implementation, args.device, config)
    return None if cache == "dynamic" else cache


def run_trl(args: Args, output_dir: str, cache: str | None = None) -> dict:
    """One TRL run; `cache`: GRPOConfig's cache_implementation (None: TRL's default)."""
    import torch
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step (its generation, rewards, forward/backward and AdamW step)."""

        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.times.append(time.perf_counter() - self.t0)

    torch.set_num_threads(args.num_threads)
    model, tokenizer, _ = load_base(args.model_name_or_path)
    examples, reward_fn = countdown_examples(args.prompt_pool)
    reward = CountdownReward(examples, reward_fn)
    timer = StepTimer()
    batch = args.prompts_per_step * args.num_generations
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=grpo_config(args, output_dir, batch, args.micro_batch_size, cache),
        train_dataset=build_dataset(examples),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    if len(reward.tokens_per_call) != len(timer.times):
        raise RuntimeError(
            f"{len(reward.tokens_per_call)} reward calls for {len(timer.times)} steps: the "
            "generation batch is not one optimizer step"
        )
    return {
        "step_times": timer.times,
        "tokens": reward.tokens_per_call,
        "wall_s": wall,
        "cache_implementation": trainer.args.cache_implementation,  # what TRL was given
    }


def ours_command(args: Args, output_dir: str) -> list[str]:
    """Our Dr. GRPO-n (`ada_seq.py --max_rounds 1 --round_repeat n --scale_rewards false`, no entropy bonus: the
    update TRL's `loss_type='dr_grpo'`, `scale_rewards='none'` makes), the sweep's budget flags, a tiny final
    evaluation (it runs inside the last step, which is not timed) and no intermediate checkpoints."""
    n = str(args.num_generations)
    return [
        sys.executable,
        "ada_seq.py",
        "--max_rounds",
        "1",
        "--round_repeat",
        n,
        "--num_generations",
        n,
        "--scale_rewards",
        "false",
        "--entropy_coef",
        "0",
        "--prompt_pool",
        str(args.prompt_pool),
        "--prompts_per_step",
        str(args.prompts_per_step),
        "--max_completion_length",
        str(args.max_completion_length),
        "--micro_batch_size",
        str(args.micro_batch_size),
        "--learning_rate",
        repr(args.learning_rate),
        "--warmup_steps",
        str(args.warmup_steps),
        "--max_steps",
        str(args.steps),
        "--eval_steps",
        "0",
        "--eval_prompts",
        "8",
        "--eval_samples",
        "1",
        "--save_steps",
        "0",
        "--num_threads",
        str(args.num_threads),
        "--seed",
        str(args.seed),
        "--output_dir",
        output_dir,
        "--model_name_or_path",
        args.model_name_or_path,
        "--dtype",
        args.dtype,
        # --torch_compile decodes on a static cache of its own (auto leaves it to it)
        *(["--torch_compile"] if args.torch_compile else []),
        "--cache_implementation",
        "auto" if args.torch_compile else args.cache_implementation,
    ]


def read_ours(metrics_path: Path) -> tuple[list[float], list[int]]:
    """Per-step times and generated tokens (`gen_tokens` is cumulative) from our metrics.jsonl."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r.get("step", 0) >= 1]
    cum = [0] + [r["gen_tokens"] for r in rows]
    return [r["time_step_s"] for r in rows], [b - a for a, b in zip(cum, cum[1:])]


def run_ours(args: Args, output_dir: str) -> dict:
    cmd = ours_command(args, output_dir)
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.num_threads),
        TOKENIZERS_PARALLELISM="false",
        **({"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {}),
    )  # ours takes a GPU when it sees one
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"ada_seq.py failed ({r.returncode}):\n{r.stderr[-3000:]}")
    times, tokens = read_ours(Path(output_dir) / "metrics.jsonl")
    return {"step_times": times, "tokens": tokens, "wall_s": wall}


# ----------------------------------------------------------------------------------------------------
# Results page
# ----------------------------------------------------------------------------------------------------


def machine(device: str = "cpu") -> dict:
    cpu, gpu = "", None
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name(0)
    try:
        cpu = next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")
            ),
            "",
        )
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu or platform.processor(),
        "python": platform.python_version(),
        "gpu": gpu,
    }


def per_round(res: dict) -> str:
    """One line per measurement round: each trainer's median s/step and the round's ratio."""
    same = bool(res["raw"].get("trl_same"))
    out = [
        "| round (first) | TRL median s/step | ours median s/step | ours/TRL steps/s | ours/TRL tokens/s |"
        + (" TRL same cache s/step | ours/TRL same cache steps/s |" if same else ""),
        "|---|---|---|---|---|" + ("---|---|" if same else ""),
    ]
    for k, (a, b, r) in enumerate(zip(res["raw"]["trl"], res["raw"]["ours"], res["rounds"])):
        first = "TRL" if k % 2 == 0 else "ours"
        line = (
            f"| {k + 1} ({first}) | {statistics.median(a['step_times'][1:-1]):.3f} | "
            f"{statistics.median(b['step_times'][1:-1]):.3f} | {r['steps_per_s']:.2f}x | "
            f"{r['tokens_per_s']:.2f}x |"
        )
        if same:
            c = res["raw"]["trl_same"][k]
            line += (
                f" {statistics.median(c['step_times'][1:-1]):.3f} | "
                f"{r['same_cache']['steps_per_s']:.2f}x |"
                if c and r.get("same_cache")
                else " - | - |"
            )
        out.append(line)
    return "\n".join(out)


def render_md(res: dict) -> str:
    """The results page from the measured figures (pure: tests feed it hand-made numbers)."""
    t, o, r, v = res["trl"], res["ours"], res["ratio"], res["versions"]
    # the KV caches (absent in pages written before the same-cache comparison)
    cache, same, rs = res.get("cache"), res.get("trl_same_cache"), res.get("ratio_same_cache")
    ours_cache = cache["ours"] if cache else ""
    trl_cache = ", default (dynamic) cache" if cache else ""
    ours_label = f", {ours_cache} cache" if cache else ""
    same_lines = []
    if cache and cache.get("trl_same_error"):
        same_lines = [
            "",
            f"**Ours / TRL with the same ({ours_cache}) cache: not measured**: TRL failed with it "
            f"({cache['trl_same_error']}).",
        ]
    elif rs:
        same_lines = [
            "",
            f"**Ours / TRL with the same ({ours_cache}) cache: {rs['steps_per_s']:.2f}x steps/s, "
            f"{rs['tokens_per_s']:.2f}x generated tokens/s**"
            + ("." if same else " (TRL's default is this cache: one TRL run serves both ratios)."),
        ]
    row = lambda name, x: (  # noqa: E731
        f"| {name} | {x['step_s']:.3f} | {x['steps_per_s']:.3f} | {x['tokens_per_step']:.0f} | "
        f"{x['tokens_per_s']:.0f} | {x['step_s_min']:.3f} - {x['step_s_max']:.3f} |"
    )
    a, b = t["steps"]
    lines = [
        "# TRL GRPOTrainer as a throughput peer of our Dr. GRPO-n4",
        "",
        "Written by `benchmarks/speed/trl_peer.py`. Same base policy "
        f"({res.get('model', 'the cached embedded tiny model')}),"
        " the first "
        f"{res['prompt_pool']} Countdown training prompts, binary verifier reward, {res['prompts_per_step']} prompts x "
        f"{res['num_generations']} completions of at most {res['max_completion_length']} tokens per optimizer step, "
        f"micro-batches of {res['micro_batch_size']}, AdamW lr {res['learning_rate']:g} with {res['warmup_steps']} "
        f"warm-up steps, no reference model, {res.get('dtype', 'float32')}, HF `generate` on "
        f"{res['machine'].get('gpu') or 'CPU'}, {res['num_threads']} torch threads. {res['repeats']} rounds of one "
        f"{res['steps']}-step run of each trainer "
        "(alternating which goes first, same seed every round), all inside one `flock` on the same machine.",
        "",
        f"Steps {a}-{b} of every run are timed (step 1 is warm-up; ours evaluates the final policy inside the last "
        f"step), {t['timed']} steps per trainer pooled. Median step time; tokens/s = generated completion tokens "
        "(stop token included) / time over those steps.",
        "",
        "| trainer | median s/step | steps/s | tokens/step | tokens/s | s/step min - max |",
        "|---|---|---|---|---|---|",
        row(f"TRL {v['trl']} `GRPOTrainer`{trl_cache}", t),
        *([row(f"TRL {v['trl']} `GRPOTrainer`, {ours_cache} cache", same)] if same else []),
        row(f"ours (`ada_seq.py` Dr. GRPO-n4){ours_label}", o),
        "",
        f"**Ours / TRL{' at its default' if cache else ''}: {r['steps_per_s']:.2f}x steps/s, "
        f"{r['tokens_per_s']:.2f}x generated tokens/s** (> 1: ours faster).",
        *same_lines,
        "",
        *([per_round(res), ""] if res.get("raw") else []),
        "Not identical work per step: the two policies sample different completions (different RNG streams), so "
        "tokens/step differ; both take pi_old from the update's own forward pass (on-policy, one epoch: no scoring "
        "pass after generation), and ours packs the update's sequences (padding-free rows of 128 tokens) where TRL "
        "pads. "
        "TRL's `constant_with_warmup` starts at lr 0 on its first step, ours at lr/5 (the same ramp, one step later).",
        "",
        f"Versions: trl {v['trl']}, torch {v['torch']}, transformers {v['transformers']}, "
        f"Python {res['machine']['python']}. "
        f"Machine: {res['machine']['nproc']} CPUs (`nproc`), {res['machine']['cpu']}"
        + (f", GPU {res['machine']['gpu']}." if res["machine"].get("gpu") else "."),
        "",
        "Commands:",
        "",
        "```",
        res["commands"]["this"],
        "# ours, run by it:",
        res["commands"]["ours"],
        "# TRL, in-process: GRPOConfig(" + res["commands"]["trl_config"] + ")",
        "```",
    ]
    if res.get("check"):
        lines += [
            "",
            "## Definition check: same advantages, loss and gradient",
            "",
            render_check(res["check"]),
        ]
    return "\n".join(lines) + "\n"


def versions() -> dict:
    import torch
    import transformers
    import trl

    return {
        "trl": trl.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def main(args: Args) -> dict:
    require_trl()
    if args.check:
        c = definition_check(args)
        print(render_check(c))
        return {"check": c}
    import torch

    torch.set_num_threads(args.num_threads)
    print("definition check ...", flush=True)
    check = definition_check(args)
    print(render_check(check), flush=True)
    # --torch_compile: ours decodes on its own static cache
    cache = "static" if args.torch_compile else same_cache(args)
    # round order: TRL first, then the other way round (ours first)
    raw = {"trl": [], **({"trl_same": []} if cache else {}), "ours": []}
    same_error = None
    with tempfile.TemporaryDirectory(prefix="trl-peer-") as tmp:
        for k in range(args.repeats):
            order = list(raw) if k % 2 == 0 else list(raw)[::-1]  # alternate: drift hits all alike
            for who in order:
                print(f"round {k + 1}/{args.repeats}: {who}, {args.steps} steps ...", flush=True)
                out_dir = str(Path(tmp) / f"{who}{k}")
                if who == "ours":
                    raw[who].append(run_ours(args, out_dir))
                elif who == "trl":
                    raw[who].append(run_trl(args, out_dir))
                elif same_error:
                    raw[who].append(None)
                else:
                    # TRL with our cache is the second comparison: its failure leaves the first
                    try:
                        raw[who].append(run_trl(args, out_dir, cache))
                    except Exception as error:
                        same_error = f"{type(error).__name__}: {str(error).strip()[:200]}"
                        print(f"TRL with cache_implementation={cache!r}: {same_error}", flush=True)
                        raw[who].append(None)
    ours_cmd = ours_command(args, "<tmp>")
    trl_fig, ours_fig = throughput(raw["trl"]), throughput(raw["ours"])
    same_runs = [x for x in raw.get("trl_same", []) if x]
    same_fig = throughput(same_runs) if cache and not same_error else None
    rounds = [compare(throughput([a]), throughput([b])) for a, b in zip(raw["trl"], raw["ours"])]
    for k, r in enumerate(rounds):
        other = raw["trl_same"][k] if cache else raw["trl"][k]
        r["same_cache"] = (
            compare(throughput([other]), throughput([raw["ours"][k]])) if other else None
        )
    cfg = (
        f"use_cpu={args.device == 'cpu'}, bf16={args.dtype == 'bfloat16'}, gradient_checkpointing=False, "
        f"per_device_train_batch_size={args.micro_batch_size}, gradient_accumulation_steps="
        f"{args.prompts_per_step * args.num_generations // args.micro_batch_size}, steps_per_generation=same, "
        f"num_generations={args.num_generations}, max_completion_length={args.max_completion_length}, temperature=1.0, "
        f"learning_rate={args.learning_rate:g}, optim='adamw_torch', lr_scheduler_type='constant_with_warmup', "
        f"warmup_steps={args.warmup_steps}, max_grad_norm=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28, "
        "loss_type='dr_grpo', scale_rewards='none', use_vllm=False, max_steps=<steps>"
        + (", torch_compile=True" if args.trl_torch_compile else "")
        + (f"; and with cache_implementation='{cache}'" if cache else "")
    )
    keys = (
        "steps",
        "repeats",
        "num_threads",
        "prompt_pool",
        "prompts_per_step",
        "num_generations",
        "max_completion_length",
        "micro_batch_size",
        "learning_rate",
        "warmup_steps",
        "device",
        "dtype",
    )
    res = {
        **{k: getattr(args, k) for k in keys},
        "trl": trl_fig,
        "ours": ours_fig,
        "ratio": compare(trl_fig, ours_fig),
        "trl_same_cache": same_fig,
        # against TRL with ours' cache: the default run itself where that is TRL's default
        "ratio_same_cache": compare(same_fig, ours_fig)
        if same_fig
        else None
        if cache
        else compare(trl_fig, ours_fig),
        "cache": {
            "ours": cache or "dynamic",
            "trl_default": "dynamic",
            "trl_same": cache or "dynamic",
            **({"trl_same_error": same_error} if same_error else {}),
        },
        "rounds": rounds,
        "versions": versions(),
        "machine": machine(args.device),
        "check": check,
        "raw": raw,
        "model": "the cached embedded tiny model"
        if args.model_name_or_path == "embedded"
        else f"`{args.model_name_or_path}`",
        "commands": {
            "this": "flock /tmp/cpu.lock python benchmarks/speed/trl_peer.py "
            + " ".join(
                f"--{k} {getattr(args, k)}"
                for k in (
                    "steps",
                    "repeats",
                    "num_threads",
                    "device",
                    "model_name_or_path",
                    "dtype",
                    "torch_compile",
                    "trl_torch_compile",
                    "cache_implementation",
                )
            ),
            "ours": shlex.join(["python", *ours_cmd[1:]]),
            "trl_config": cfg,
        },
    }
    md = render_md(res)
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    print(md)
    print(f"wrote {out}")
    return res


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
