"""TRL's GRPOTrainer as a throughput peer of our Dr. GRPO-n4, and a check that both define the same update.

Throughput: `--steps` TRL GRPO steps, then `--steps` steps of our Dr. GRPO-n4 (`ada_seq.py --max_rounds 1
--round_repeat 4 --adv_std_norm false --entropy_coef 0`), same base policy (the cached embedded tiny model), same
first `--prompt_pool` Countdown training prompts, same reward (the binary verifier), same batch (32 prompts x 4
completions of at most 32 tokens per optimizer step), same optimiser settings, fp32 on CPU. `--repeats` rounds,
alternating which trainer goes first, so that a slow spell of the shared machine does not land on one of them
only. Step 1 (warm-up) and the last step (ours evaluates the final policy inside it) are left out; the figures are
the median step time and the generated completion tokens per second over the steps in between, pooled over the
rounds.

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

import importlib.util
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

from common.cli import parse_args  # noqa: E402

TRL_MISSING = "trl is not installed for {python}: pip install trl (e.g. in a separate venv) to run this peer benchmark"


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
    max_new_tokens: int = 32
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
    """also write the full run's figures (and the definition check) as JSON to this path (empty: no JSON)"""
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

    def validate(self) -> None:
        if self.steps < 3:
            raise SystemExit(f"--steps {self.steps}: need >= 3 (step 1 and the last step are not timed)")
        if self.repeats < 1:
            raise SystemExit(f"--repeats {self.repeats}: need >= 1")
        if self.num_generations < 2 or self.prompts_per_step < 1 or self.max_new_tokens < 1:
            raise SystemExit("--num_generations >= 2, --prompts_per_step >= 1 and --max_new_tokens >= 1 please")
        batch = self.prompts_per_step * self.num_generations
        if batch % self.micro_batch_size:
            raise SystemExit(f"--micro_batch_size {self.micro_batch_size}: must divide prompts_per_step x "
                             f"num_generations = {batch} (TRL accumulates whole micro-batches)")


# ----------------------------------------------------------------------------------------------------
# Setup shared by both modes: trl, the base policy, prompts and reward
# ----------------------------------------------------------------------------------------------------

def require_trl() -> None:
    """Exit with an install hint before any heavy import when trl is absent."""
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(TRL_MISSING.format(python=sys.executable))


def load_base(model_name_or_path: str = "embedded"):
    """(model, tokenizer, dir) of the base policy, loaded the way our scripts load it.

    `embedded`: the cached embedded base, never built here (a missing cache would otherwise start a ~3 minute SFT
    inside a timed benchmark). `load_policy` is what every script uses; the round trip guards against a tokenizer
    reloaded as a class that drops characters (spaces, newlines), which would silently change every prompt.
    """
    from common import countdown
    from common.policy import load_policy
    from common.tiny_model import BaseRecipe, cache_root

    path = Path(model_name_or_path)
    if model_name_or_path == "embedded":
        path = cache_root() / f"countdown-base-{BaseRecipe().key()}"
        if not (path / "build_info.json").exists():
            raise SystemExit(f"no embedded base policy at {path}: build it first with "
                             "python -c 'from common.tiny_model import ensure_embedded_base; ensure_embedded_base()'")
    elif not (path / "config.json").exists():
        raise SystemExit(f"--model_name_or_path {model_name_or_path}: not a local Hugging Face model dir")
    model, tokenizer = load_policy(str(path))
    problem = countdown.make_splits()[0][0]
    probe = countdown.prompt_text(problem) + countdown.solution_text(countdown.solutions(problem)[0])
    if tokenizer.decode(tokenizer(probe).input_ids, skip_special_tokens=True) != probe:
        raise SystemExit(f"{path}: the tokenizer ({type(tokenizer).__name__}) does not round-trip Countdown text")
    return model, tokenizer, path


def countdown_examples(prompt_pool: int):
    """The training prompts our scripts see with `--prompt_pool N` (common/countdown.py countdown_task)."""
    from common.countdown import countdown_task

    task = countdown_task("binary", eval_prompts=1)
    return task.train[:prompt_pool] if prompt_pool > 0 else task.train, task.reward_fn


def build_dataset(examples):
    """TRL's dataset: a `prompt` column of plain strings (no chat template: the char tokenizer has none) and
    the example id, which TRL passes on to the reward function as a keyword."""
    import datasets

    return datasets.Dataset.from_dict({"prompt": [ex.prompt for ex in examples],
                                       "problem_id": [ex.id for ex in examples]})


class CountdownReward:
    """TRL reward function wrapping the repo's training reward, called as ada_seq calls `task.reward_fn`.

    It also records the completion tokens of each call: TRL scores one generation batch (one optimizer step
    here) per call, so these are the generated tokens per step, counted like our `gen_tokens` (stop token in).
    """
    __name__ = "countdown_binary"  # TRL names the reward's metrics after it

    def __init__(self, examples, reward_fn):
        self.by_id = {ex.id: ex for ex in examples}
        self.reward_fn = reward_fn
        self.tokens_per_call: list[int] = []

    def __call__(self, prompts, completions, completion_ids, problem_id, **_) -> list[float]:
        self.tokens_per_call.append(sum(len(ids) for ids in completion_ids))
        return [float(self.reward_fn(text, self.by_id[i])) for text, i in zip(completions, problem_id)]


def grpo_config(args: Args, output_dir: str, batch: int, micro: int):
    """TRL's GRPOConfig for our GRPO-n setting: one generation batch of `batch` completions per optimizer step,
    trained in micro-batches of `micro` (gradient accumulation), no reference model, on `--device` in `--dtype`."""
    from trl import GRPOConfig

    accum = batch // micro
    return GRPOConfig(
        output_dir=output_dir, use_cpu=args.device == "cpu", bf16=args.dtype == "bfloat16", fp16=False, seed=args.seed,
        gradient_checkpointing=False,  # TRL defaults it on; we never recompute activations
        max_steps=args.steps, per_device_train_batch_size=micro, gradient_accumulation_steps=accum,
        steps_per_generation=accum,  # = accumulation: one generate per optimizer step, on-policy (no old-logp pass)
        num_generations=args.num_generations, max_completion_length=args.max_new_tokens, temperature=1.0,
        learning_rate=args.learning_rate, optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0,
        lr_scheduler_type="constant_with_warmup", warmup_steps=args.warmup_steps,
        beta=0.0, epsilon=0.2, epsilon_high=0.28,  # ada_seq's eps_low / eps_high (inactive on-policy)
        loss_type="dr_grpo", scale_rewards="none",  # = ours, see the definition check
        use_vllm=False, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        dataloader_pin_memory=False, torch_compile=args.trl_torch_compile,
    )


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
            raise ValueError(f"{len(r['step_times'])} step times but {len(r['tokens'])} token counts")
        t += r["step_times"][1:-1]
        k += r["tokens"][1:-1]
    if not t:
        raise ValueError("no timed steps: runs need >= 3 steps (step 1 and the last are not timed)")
    med = statistics.median(t)
    return {"steps": [2, len(runs[0]["step_times"]) - 1], "timed": len(t), "step_s": med, "steps_per_s": 1.0 / med,
            "tokens_per_step": sum(k) / len(k), "tokens_per_s": sum(k) / sum(t), "step_s_min": min(t),
            "step_s_max": max(t)}


def compare(trl: dict, ours: dict) -> dict:
    """Ours / TRL: > 1 means ours is faster."""
    return {"steps_per_s": ours["steps_per_s"] / trl["steps_per_s"],
            "tokens_per_s": ours["tokens_per_s"] / trl["tokens_per_s"]}


def run_trl(args: Args, output_dir: str) -> dict:
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
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=grpo_config(args, output_dir, batch,
                          args.micro_batch_size), train_dataset=build_dataset(examples), processing_class=tokenizer,
                          callbacks=[timer])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    if len(reward.tokens_per_call) != len(timer.times):
        raise RuntimeError(f"{len(reward.tokens_per_call)} reward calls for {len(timer.times)} steps: the "
                           "generation batch is not one optimizer step")
    return {"step_times": timer.times, "tokens": reward.tokens_per_call, "wall_s": wall}


def ours_command(args: Args, output_dir: str) -> list[str]:
    """Our Dr. GRPO-n (`ada_seq.py --max_rounds 1 --round_repeat n --adv_std_norm false`, no entropy bonus: the
    update TRL's `loss_type='dr_grpo'`, `scale_rewards='none'` makes), the sweep's budget flags, a tiny final
    evaluation (it runs inside the last step, which is not timed) and no intermediate checkpoints."""
    n = str(args.num_generations)
    return [sys.executable, "ada_seq.py", "--max_rounds", "1", "--round_repeat", n, "--final_keep_per_prompt", n,
            "--adv_std_norm", "false", "--entropy_coef", "0",
            "--prompt_pool", str(args.prompt_pool), "--prompts_per_step", str(args.prompts_per_step),
            "--max_new_tokens", str(args.max_new_tokens), "--micro_batch_size", str(args.micro_batch_size),
            "--learning_rate", repr(args.learning_rate), "--warmup_steps", str(args.warmup_steps),
            "--max_steps", str(args.steps), "--eval_every", "0", "--eval_prompts", "8", "--eval_samples", "1",
            "--save_every", "0", "--num_threads", str(args.num_threads), "--seed", str(args.seed),
            "--output_dir", output_dir, "--model_name_or_path", args.model_name_or_path, "--dtype", args.dtype,
            *(["--torch_compile"] if args.torch_compile else [])]


def read_ours(metrics_path: Path) -> tuple[list[float], list[int]]:
    """Per-step times and generated tokens (`gen_tokens` is cumulative) from our metrics.jsonl."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r.get("step", 0) >= 1]
    cum = [0] + [r["gen_tokens"] for r in rows]
    return [r["time_step_s"] for r in rows], [b - a for a, b in zip(cum, cum[1:])]


def run_ours(args: Args, output_dir: str) -> dict:
    cmd = ours_command(args, output_dir)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.num_threads), TOKENIZERS_PARALLELISM="false",
               **({"CUDA_VISIBLE_DEVICES": ""} if args.device == "cpu" else {}))  # ours takes a GPU when it sees one
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"ada_seq.py failed ({r.returncode}):\n{r.stderr[-3000:]}")
    times, tokens = read_ours(Path(output_dir) / "metrics.jsonl")
    return {"step_times": times, "tokens": tokens, "wall_s": wall}


# ----------------------------------------------------------------------------------------------------
# Definition check: TRL's code vs ours on a fixed batch
# ----------------------------------------------------------------------------------------------------

def cite(path: str, needle: str) -> str:
    """`file:line` of the first line of `path` containing `needle`, for the installed TRL version."""
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if needle in line:
            return f"trl/{Path(path).relative_to(Path(path).parents[1]).as_posix()}:{i}"
    return f"({needle!r} not found in {Path(path).name})"


def fixed_batch(examples, tokenizer, max_new_tokens: int):
    """2 prompts x 4 completions of varied length, some correct, one group with rewards (1, 0, 0, 1) and one with
    (0, 0, 0, 1): both with a stop token and truncated at max_new_tokens, an empty answer (stop token only)."""
    from common import countdown

    eos = tokenizer.eos_token_id
    enc = lambda s: tokenizer(s, add_special_tokens=False).input_ids  # noqa: E731
    p0, p1 = examples[0], examples[1]
    sols0, sols1 = countdown.solutions(p0.answer), countdown.solutions(p1.answer)
    right0, other0 = countdown.solution_text(sols0[0]), countdown.solution_text(sols0[-1])
    right1 = countdown.solution_text(sols1[0])
    texts = [
        (p0, enc(right0) + [eos]),
        (p0, enc(countdown.solution_text(sols0[0][:1])) + [eos]),  # first step only: numbers left unused
        (p0, enc(right0 * 4)[:max_new_tokens]),  # ran to max_new_tokens without a stop token
        (p0, enc(other0) + [eos]),
        (p1, enc("1+1=2\n") + [eos]),
        (p1, [eos]),
        (p1, enc((right1 + "9") * 4)[:max_new_tokens]),
        (p1, enc(right1) + [eos]),
    ]
    return [ex for ex, _ in texts], [c for _, c in texts]


def definition_check(args: Args) -> dict:
    import inspect

    import torch
    import trl
    from trl import GRPOTrainer
    from trl.trainer import grpo_trainer
    from trl.trainer import utils as trl_utils

    import ada_seq
    from common.logprobs import token_logprobs
    from common.losses import clipped_surrogate
    from common.masking import pad_sequences, right_align

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is flagged experimental
    n, L = args.num_generations, args.max_new_tokens
    if n != 4:
        raise SystemExit("--check uses a fixed batch of 2 prompts x 4 completions: run it with --num_generations 4")
    device = torch.device(args.device)
    ours_model, tokenizer, _ = load_base(args.model_name_or_path)
    trl_model, _, _ = load_base(args.model_name_or_path)  # TRL patches its model's forward; keep ours untouched
    ours_model.to(device)
    examples, reward_fn = countdown_examples(args.prompt_pool)
    rows, completions = fixed_batch(examples, tokenizer, L)
    prompt_ids = [tokenizer(ex.prompt).input_ids for ex in rows]  # as PromptEncoder (Countdown: no chat template)
    rewards = [float(reward_fn(tokenizer.decode(c, skip_special_tokens=True), ex)) for ex, c in zip(rows, completions)]
    # fixed old log-probs: the current ones shifted by a fixed +-0.3 pattern, so some ratios leave [0.8, 1.28]
    with torch.no_grad():
        batch = pad_sequences(prompt_ids, completions, tokenizer.pad_token_id).to(device)
        cur, _ = token_logprobs(ours_model, batch)
    cur = cur.cpu()
    shift = 0.3 * torch.sign(torch.sin(torch.arange(batch.completion_width, dtype=torch.float32) * 1.7 + 0.5))
    old = [(cur[i, batch.completion_width - len(c):] + shift[:len(c)]).tolist() for i, c in enumerate(completions)]

    # ---- ours: ada_seq with one round of n (advantages), clipped surrogate / (responses x max_new_tokens) ----
    adv_ours = []
    for g in range(0, len(rewards), n):
        adv_ours += ada_seq.global_advantages(rewards[g:g + n], rewards[g:g + n], 0.7, False, "none")
    adv_ours_std = []
    for g in range(0, len(rewards), n):
        adv_ours_std += ada_seq.global_advantages(rewards[g:g + n], rewards[g:g + n], 0.7, True, "none")
    logp, _ = token_logprobs(ours_model, batch)
    old_t = right_align(old, batch.completion_width).to(device)
    per_token, clipped_tok = clipped_surrogate(logp, old_t, torch.tensor(adv_ours, device=device)[:, None], 0.2, 0.28)
    loss_sum = (per_token * batch.loss_mask).sum()  # as ada_seq.py's update
    clipped = (clipped_tok * batch.loss_mask).sum()
    loss_ours = loss_sum / (len(completions) * L)  # ada_seq: norm = prompts_per_step * n / world * max_new_tokens
    loss_ours.backward()

    # ---- TRL: its own scoring/advantage path and compute_loss, fed the same completions ----
    def rollout(prompts, trainer):
        if len(prompts) != len(completions):
            raise RuntimeError(f"rollout_func got {len(prompts)} prompts, expected {len(completions)}")
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": old}

    cfg_args = Args(**{**vars(args), "steps": 1, "dtype": "float32"})  # the check compares fp32 sums
    with tempfile.TemporaryDirectory(prefix="trl-check-") as tmp:
        trainer = GRPOTrainer(model=trl_model, reward_funcs=[CountdownReward(examples, reward_fn)],
                              args=grpo_config(cfg_args, tmp, len(completions), len(completions)),
                              train_dataset=build_dataset(examples[:2]), processing_class=tokenizer,
                              rollout_func=rollout)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop in training; one micro-batch here
    inputs = [{"prompt": ex.prompt, "problem_id": ex.id} for ex in rows]
    scored = trainer._generate_and_score_completions(inputs)
    adv_trl = scored["advantages"].tolist()
    scored["old_per_token_logps"] = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(o) for o in old], batch_first=True).to(device)  # right-padded, TRL's completion layout
    loss_trl = trainer.compute_loss(trainer.model, scored)
    loss_trl.backward()
    with torch.no_grad():
        other = {}
        for lt in ("dr_grpo", "dapo", "grpo", "bnpo"):  # TRL's other normalisations on the same batch
            trainer.loss_type = lt
            other[lt] = float(trainer.compute_loss(trainer.model, scored))
        trainer.loss_type = "dr_grpo"
        trainer.scale_rewards = "group"
        adv_trl_std = trainer._generate_and_score_completions(inputs)["advantages"].tolist()
        trainer.scale_rewards = "none"

    g_ours = dict(ours_model.named_parameters())
    g_diff = g_max = 0.0
    for name, p in trl_model.named_parameters():
        q = g_ours[name]
        if p.grad is None or q.grad is None:
            raise RuntimeError(f"no gradient for {name}")
        g_diff = max(g_diff, (p.grad.to(q.grad.device) - q.grad).abs().max().item())
        g_max = max(g_max, q.grad.abs().max().item())

    src, usrc = inspect.getsourcefile(grpo_trainer), inspect.getsourcefile(trl_utils)
    adv_diff = max(abs(a - b) for a, b in zip(adv_ours, adv_trl))
    out = {
        "trl": trl.__version__, "rewards": rewards, "lengths": [len(c) for c in completions],
        "adv_ours": adv_ours, "adv_trl": adv_trl, "adv_max_diff": adv_diff,
        "loss_ours": loss_ours.item(), "loss_trl": loss_trl.item(),
        "loss_diff": abs(loss_ours.item() - loss_trl.item()), "grad_max_diff": g_diff, "grad_max_abs": g_max,
        "clipped_tokens": int(clipped), "tokens": int(batch.loss_mask.sum()),
        "trl_loss_types": other, "adv_ours_std": adv_ours_std, "adv_trl_group": adv_trl_std,
        "cites": {
            "group mean": cite(src, "mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations)"),
            "A = r - mean": cite(src, "advantages = rewards - mean_grouped_rewards"),
            "/ (std + 1e-4) unless scale_rewards='none'": cite(src, "advantages = advantages / (std_rewards + 1e-4)"),
            "std with Bessel's correction (n-1)": cite(usrc, "variance *= correction"),
            "old logps = current (detached) when on-policy":
                cite(src, "old_per_token_logps = per_token_logps.detach() if"),
            "per-token clipped loss": cite(src, "per_token_loss = -torch.min(per_token_loss1, per_token_loss2)"),
            "dr_grpo: sum / (B x max_completion_length)":
                cite(src, "/ (per_token_loss.size(0) * self.max_completion_length)"),
        },
    }
    out["agree"] = adv_diff < 1e-6 and out["loss_diff"] < 1e-6 and g_diff <= 1e-4 * max(g_max, 1e-12)
    inspect_ratio = [b / a for a, b in zip(adv_trl_std, adv_ours_std) if abs(a) > 1e-9]
    out["std_ratio_ours_over_trl"] = statistics.mean(inspect_ratio) if inspect_ratio else None
    return out


def render_check(c: dict) -> str:
    f = lambda xs: "[" + ", ".join(f"{x:+.4f}" for x in xs) + "]"  # noqa: E731
    lines = [
        f"Fixed batch: 2 prompts x 4 completions, lengths {c['lengths']} (tokens incl. the stop token; two ran to "
        f"max_new_tokens), rewards {c['rewards']} (repo binary verifier); fixed old log-probs = current +-0.3, so "
        f"{c['clipped_tokens']} of {c['tokens']} tokens are clipped. TRL's numbers come from TRL {c['trl']}'s "
        "own code: "
        "`GRPOTrainer._generate_and_score_completions` (fed the fixed completions through `rollout_func`) and "
        "`GRPOTrainer.compute_loss`, on a second copy of the same model.",
        "",
        "| quantity | ours | TRL (`loss_type='dr_grpo'`, `scale_rewards='none'`) | max abs diff |",
        "|---|---|---|---|",
        f"| advantages | {f(c['adv_ours'])} | {f(c['adv_trl'])} | {c['adv_max_diff']:.1e} |",
        f"| loss | {c['loss_ours']:.8f} | {c['loss_trl']:.8f} | {c['loss_diff']:.1e} |",
        f"| gradient (all parameters) | | | {c['grad_max_diff']:.1e} (largest entry {c['grad_max_abs']:.1e}) |",
        "",
        f"**{'Agree' if c['agree'] else 'DO NOT agree'}** (advantages and loss to 1e-6; gradient to 1e-4 of its "
        "largest entry, fp32 sums in different orders). "
        "Ours (Dr. GRPO-n4 = `ada_seq.py --max_rounds 1 --round_repeat 4 --adv_std_norm false --entropy_coef 0`, "
        "`--prompt_weight none`) corresponds to TRL `loss_type='dr_grpo'`, `scale_rewards='none'`, `beta=0`, "
        "`epsilon=0.2`, `epsilon_high=0.28`.",
        "",
        "TRL's other normalisations on the same batch: "
        + ", ".join(f"`{k}` {v:.6f}" for k, v in c["trl_loss_types"].items())
        + " (`dapo`/`bnpo` divide by the token count, `grpo` by each completion's length: they differ from ours "
        "whenever completion lengths vary).",
        "",
        f"With std scaling the two differ: ours `--adv_std_norm` {f(c['adv_ours_std'])} vs TRL `scale_rewards='group'` "
        f"{f(c['adv_trl_group'])}: ours divides by the population std + 1e-6, TRL by the sample (n-1) std + 1e-4 "
        + (f"(ratio ours/TRL {c['std_ratio_ours_over_trl']:.4f}, about sqrt(n/(n-1)) = 1.1547 for n = 4)."
           if c["std_ratio_ours_over_trl"] else "."),
        "",
        "Where TRL defines it (installed version):",
        "",
        *[f"- {k}: `{v}`" for k, v in c["cites"].items()],
    ]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# Results page
# ----------------------------------------------------------------------------------------------------

def machine(device: str = "cpu") -> dict:
    cpu, gpu = "", None
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name(0)
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "")
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu or platform.processor(), "python": platform.python_version(),
            "gpu": gpu}


def per_round(res: dict) -> str:
    """One line per measurement round: each trainer's median s/step and the round's ratio."""
    out = ["| round (first) | TRL median s/step | ours median s/step | ours/TRL steps/s | ours/TRL tokens/s |",
           "|---|---|---|---|---|"]
    for k, (a, b, r) in enumerate(zip(res["raw"]["trl"], res["raw"]["ours"], res["rounds"])):
        first = "TRL" if k % 2 == 0 else "ours"
        out.append(f"| {k + 1} ({first}) | {statistics.median(a['step_times'][1:-1]):.3f} | "
                   f"{statistics.median(b['step_times'][1:-1]):.3f} | {r['steps_per_s']:.2f}x | "
                   f"{r['tokens_per_s']:.2f}x |")
    return "\n".join(out)


def render_md(res: dict) -> str:
    """The results page from the measured figures (pure: tests feed it hand-made numbers)."""
    t, o, r, v = res["trl"], res["ours"], res["ratio"], res["versions"]
    row = lambda name, x: (  # noqa: E731
        f"| {name} | {x['step_s']:.3f} | {x['steps_per_s']:.3f} | {x['tokens_per_step']:.0f} | "
        f"{x['tokens_per_s']:.0f} | {x['step_s_min']:.3f} - {x['step_s_max']:.3f} |")
    a, b = t["steps"]
    lines = [
        "# TRL GRPOTrainer as a throughput peer of our Dr. GRPO-n4",
        "",
        f"Written by `benchmarks/speed/trl_peer.py`. Same base policy ({res.get('model', 'the cached embedded tiny model')}),"
        " the first "
        f"{res['prompt_pool']} Countdown training prompts, binary verifier reward, {res['prompts_per_step']} prompts x "
        f"{res['num_generations']} completions of at most {res['max_new_tokens']} tokens per optimizer step, "
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
        row(f"TRL {v['trl']} `GRPOTrainer`", t),
        row("ours (`ada_seq.py` Dr. GRPO-n4)", o),
        "",
        f"**Ours / TRL: {r['steps_per_s']:.2f}x steps/s, {r['tokens_per_s']:.2f}x generated tokens/s** "
        "(> 1: ours faster).",
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
        lines += ["", "## Definition check: same advantages, loss and gradient", "", render_check(res["check"])]
    return "\n".join(lines) + "\n"


def versions() -> dict:
    import torch
    import transformers
    import trl

    return {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__}


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
    raw = {"trl": [], "ours": []}
    with tempfile.TemporaryDirectory(prefix="trl-peer-") as tmp:
        for k in range(args.repeats):
            for who in ("trl", "ours") if k % 2 == 0 else ("ours", "trl"):  # alternate: drift hits both alike
                print(f"round {k + 1}/{args.repeats}: {who}, {args.steps} steps ...", flush=True)
                run = run_trl if who == "trl" else run_ours
                raw[who].append(run(args, str(Path(tmp) / f"{who}{k}")))
    ours_cmd = ours_command(args, "<tmp>")
    trl_fig, ours_fig = throughput(raw["trl"]), throughput(raw["ours"])
    rounds = [compare(throughput([a]), throughput([b])) for a, b in zip(raw["trl"], raw["ours"])]
    cfg = (f"use_cpu={args.device == 'cpu'}, bf16={args.dtype == 'bfloat16'}, gradient_checkpointing=False, "
           f"per_device_train_batch_size={args.micro_batch_size}, gradient_accumulation_steps="
           f"{args.prompts_per_step * args.num_generations // args.micro_batch_size}, steps_per_generation=same, "
           f"num_generations={args.num_generations}, max_completion_length={args.max_new_tokens}, temperature=1.0, "
           f"learning_rate={args.learning_rate:g}, optim='adamw_torch', lr_scheduler_type='constant_with_warmup', "
           f"warmup_steps={args.warmup_steps}, max_grad_norm=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28, "
           "loss_type='dr_grpo', scale_rewards='none', use_vllm=False, max_steps=<steps>"
           + (", torch_compile=True" if args.trl_torch_compile else ""))
    keys = ("steps", "repeats", "num_threads", "prompt_pool", "prompts_per_step", "num_generations", "max_new_tokens",
            "micro_batch_size", "learning_rate", "warmup_steps", "device", "dtype")
    res = {**{k: getattr(args, k) for k in keys},
           "trl": trl_fig, "ours": ours_fig, "ratio": compare(trl_fig, ours_fig), "rounds": rounds,
           "versions": versions(), "machine": machine(args.device), "check": check, "raw": raw,
           "model": "the cached embedded tiny model" if args.model_name_or_path == "embedded" else
                    f"`{args.model_name_or_path}`",
           "commands": {"this": "flock /tmp/cpu.lock python benchmarks/speed/trl_peer.py " + " ".join(
                            f"--{k} {getattr(args, k)}" for k in ("steps", "repeats", "num_threads", "device",
                                                                  "model_name_or_path", "dtype", "torch_compile",
                                                                  "trl_torch_compile")),
                        "ours": shlex.join(["python", *ours_cmd[1:]]), "trl_config": cfg}}
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
