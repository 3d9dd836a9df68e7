"""The GPU spell's settings and clock: its flags (`Args`), the part and run tables, the first guesses of the
plan, and the stop that a signal or the budget sets for the whole command."""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
T0 = time.time()  # the command's start: its budget counts from here, imports included
STOP_MARGIN_S = 15.0  # the budget timer fires this early: the running step, its checkpoint and the report fit after

SIZES = {  # Qwen2 configs: ~143M parameters (tied embeddings); the tests' small random model
    "150m": dict(
        hidden_size=1024,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=4,
        intermediate_size=2816,
        vocab_size=8192,
    ),
    "test": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=512,
    ),
}
PARTS = ("plain", "fsdp", "gc_lora", "learning", "speed", "peer")  # priority order
VARIANTS = {
    "plain": [],
    "fsdp": ["--fsdp"],
    "gradient_checkpointing": ["--gradient_checkpointing"],
    "lora": ["--lora_r", "16"],
}
PART_VARIANTS = {
    "plain": ["plain"],
    "fsdp": ["fsdp"],
    "gc_lora": ["gradient_checkpointing", "lora"],
}
SCRIPT_FLAGS = {
    "ada_seq": ["--max_rounds", "2", "--round_repeat", "4"],
    "ps_grpo": ["--mode", "text", "--num_generations", "4"],
    "pros_ppo": ["--num_generations", "4"],
    "ada_est": ["--prompt_pool", "64"],
    "ra_rloo": ["--num_generations", "4"],
}
# first guesses for the plan (seconds), replaced by measured ones as the command goes: a smoke run's fixed cost
# (model load, step-0 and final evaluation, checkpoint) and one step (150m: the 2026-11-27 H200 record, HF generate's
# dynamic cache: fixed 3-8 s, 0.8-0.9 s a learning step; the static cache, the default on CUDA, is faster) and the
# peer part (two trainers took ~60 s there; TRL now also runs with ours' cache)
GUESS = {
    "150m": {"run_fixed_s": 7.0, "step_s": 1.0, "peer_s": 120.0},
    "tiny": {"run_fixed_s": 4.0, "step_s": 0.6, "peer_s": 60.0},
    "test": {"run_fixed_s": 4.0, "step_s": 0.6, "peer_s": 60.0},
}
# the speed part's runs: eager with HF generate's dynamic cache (the default on CPU), its static cache (the default,
# `auto`, on CUDA) and --torch_compile
SPEED_RUNS = {
    "dynamic": ["--cache_implementation", "dynamic"],
    "static": ["--cache_implementation", "static"],
    "torch_compile": ["--torch_compile"],
}
# the compile time each speed run adds to the plan (seconds): the H100 spell of 2026-11-27 at 150m compiled the static
# cache's decoding step in ~5 s and spent ~180 s compiling --torch_compile's first step
SPEED_COMPILE_S = {"static": 10.0, "torch_compile": 200.0}
# the learning part: each method against its baseline (benchmarks/sweep/configs.py's pairs, at the smoke's sizes),
# as {method script: {arm: (label, script, flags)}}; both arms of a pair share every other flag
LEARNING = {
    "ra_rloo": {
        "method": ("RA-RLOO", "ra_rloo", ["--replay", "on_demand", "--num_generations", "4"]),
        "baseline": (
            "RLOO (--replay none)",
            "ra_rloo",
            ["--replay", "none", "--num_generations", "4"],
        ),
    },
    "ada_seq": {
        "method": (
            "SEQ-BALANCE",
            "ada_seq",
            ["--exit_condition", "balanced", *SCRIPT_FLAGS["ada_seq"]],
        ),
        "baseline": (
            "GRPO-n4",
            "ada_seq",
            [
                "--max_rounds",
                "1",
                "--round_repeat",
                "4",
                "--num_generations",
                "4",
                "--scale_rewards",
                "true",
            ],
        ),
    },
    "ada_est": {
        "method": ("EST", "ada_est", ["--prompt_pool", "256"]),
        "baseline": (
            "GRPO-n8 (ada_seq.py)",
            "ada_seq",
            [
                *("--max_rounds", "1", "--round_repeat", "8", "--num_generations", "8"),
                *("--scale_rewards", "true", "--prompt_pool", "256"),
            ],
        ),
    },
    "ps_grpo": {
        "method": (
            "Prefix Sampling (adaptive)",
            "ps_grpo",
            [*SCRIPT_FLAGS["ps_grpo"], "--prefix_sampling", "true", "--adaptive", "true"],
        ),
        "baseline": (
            "GRPO (--prefix_sampling false)",
            "ps_grpo",
            [*SCRIPT_FLAGS["ps_grpo"], "--prefix_sampling", "false"],
        ),
    },
    "pros_ppo": {
        "method": ("PPO + PROS", "pros_ppo", ["--num_generations", "4", "--pros", "bayes"]),
        "baseline": ("PPO (--pros off)", "pros_ppo", ["--num_generations", "4", "--pros", "off"]),
    },
}
WHEELS = (
    ROOT / ".whl"
)  # TRL's wheels for an image without it (docs/scaling.md); ignored by git, carried to the GPU


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
    max_completion_length: int = 64
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
    learning_methods: str = ",".join(LEARNING)
    """comma-separated methods of the learning part, each run against its baseline, in this order; each pair takes
    an equal share of the time left (a pair that cannot have 10 steps a run is skipped, said in its status)"""
    speed_runs: str = ",".join(SPEED_RUNS)
    """comma-separated runs of the speed part: dynamic, static, torch_compile (a cold compile on a CPU takes minutes)"""
    speed_steps: int = 4
    """steps of each speed run (the first, which compiles, is reported apart)"""
    keep_checkpoints: bool = False
    """keep each run's final checkpoint (at 150m about 1.7 GB each with the optimizer state: 40 GB for all runs);
    by default it is deleted once the run's update is measured"""

    def validate(self) -> None:
        bad = [p for p in self.parts.split(",") if p and p not in PARTS]
        bad += [s for s in self.scripts.split(",") if not (ROOT / f"{s}.py").exists()]
        bad += [r for r in self.speed_runs.split(",") if r and r not in SPEED_RUNS]
        bad += [m for m in self.learning_methods.split(",") if m and m not in LEARNING]
        if bad:
            raise SystemExit(
                f"--parts / --scripts / --speed_runs / --learning_methods: unknown {bad} (parts: "
                f"{', '.join(PARTS)}; speed runs: {', '.join(SPEED_RUNS)}; methods: {', '.join(LEARNING)})"
            )
        if self.steps < 1 or self.speed_steps < 2 or self.learning_max_steps < 1:
            raise SystemExit(
                "--steps must be >= 1, --speed_steps >= 2 and --learning_max_steps >= 1"
            )
        if not self.budget_s > 0 or not 0 < self.warm_target <= 1:
            raise SystemExit(
                f"--budget_s {self.budget_s} must be > 0, --warm_target {self.warm_target} in (0, 1]"
            )


def plan_costs(args: Args, guess: dict, cached: bool) -> dict[str, float]:
    """The plan's estimate of each part, in `--parts` order, the warm start first (seconds; `cached`: the warm start
    is on disk). The learning part's is its floor, every method and its baseline at 10 steps a run: it takes
    whatever is left, so more when the rest goes faster."""
    run_s = lambda steps: guess["run_fixed_s"] + steps * guess["step_s"]  # noqa: E731
    scripts = [s for s in args.scripts.split(",") if s]
    cost = {"warm start": 0.0 if cached else args.warm_max_s}  # its upper bound
    for part in dict.fromkeys(p for p in args.parts.split(",") if p):
        if part in PART_VARIANTS:
            cost[part] = len(scripts) * len(PART_VARIANTS[part]) * run_s(args.steps)
        elif part == "learning":
            methods = [m for m in dict.fromkeys(args.learning_methods.split(",")) if m]
            least = min(10, args.learning_max_steps)
            # two runs a method, their end measurements, and the start measurement once
            cost[part] = (
                len(methods) * (2 * run_s(least) + 2 * guess["run_fixed_s"]) + guess["run_fixed_s"]
            )
        elif part == "speed":
            runs = [r for r in args.speed_runs.split(",") if r]
            cost[part] = len(runs) * run_s(args.speed_steps) + sum(
                SPEED_COMPILE_S.get(r, 0.0) for r in runs
            )
        else:
            cost[part] = guess["peer_s"]
    return cost


def left_out(args: Args, parts: list[str]) -> list[str]:
    """What a command with these flags does not try: parts, speed runs and learning methods not named."""
    lines = [f"part {p}" for p in PARTS if p not in parts]
    if "speed" in parts:
        named = args.speed_runs.split(",")
        lines += [
            f"speed run {r}"
            + (
                f" (~{SPEED_COMPILE_S[r]:.0f} s of compiling at 150m)"
                if r in SPEED_COMPILE_S
                else ""
            )
            for r in SPEED_RUNS
            if r not in named
        ]
    if "learning" in parts:
        named = args.learning_methods.split(",")
        lines += [f"learning of {m}" for m in LEARNING if m not in named]
    return lines


class Stop:
    """SIGINT / SIGTERM and the budget timer, for the whole command. Inside a script's main() the script's own
    graceful stop takes the signal (it saves and returns early); before it has installed its handler (model load,
    step-0 evaluation) there is no step to save, so the signal interrupts the run at once."""

    def __init__(self, budget_s: float):
        self.start = T0
        self.budget_s = budget_s - STOP_MARGIN_S
        self.reason: str | None = None  # "signal 15", "budget"
        self.in_run = False
        self.previous = {
            sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        self.timer = threading.Timer(max(0.0, self.left()), self._budget)
        self.timer.daemon = True
        self.timer.start()

    def _handle(self, signum, frame) -> None:
        self.reason = self.reason or f"signal {signum}"
        print(
            f"\ngpu_smoke: {self.reason}: stopping the whole command after what is running now",
            flush=True,
        )
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


def error_status(error: Exception) -> str:
    """A run's or part's status line for an exception, after printing its traceback to the log."""
    traceback.print_exc()
    return f"error: {type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"
