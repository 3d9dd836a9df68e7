"""Prefix Sampling (PS) on GRPO, one file.

Paper: Zhu et al., "Prefix Sampling: Targeting 50% Rollout Pass Rate for More Efficient Agentic RL", Baidu AI Cloud
Qianfan technical blog, 2026. Docs: docs/ps_grpo.md.

Baseline (`--prefix_sampling false`): GRPO with A = r - mean (the paper's appendix, Perspective 2: a group's Var(A) =
p(1-p) is the signal strength that peaks at p = 0.5), N rollouts per task, the clipped surrogate (DAPO clip-higher,
token mean), no KL, and rejection of tasks whose N rollouts all fail or all pass (the paper's DeepSWE baseline).
--scale_rewards gives the original GRPO (DeepSeekMath) A = (r - mean) / std, which sets every mixed group's Var(A)
to 1 and so removes the p(1-p) the paper argues with.
PS routes every fresh task by its rollout pass rate p = k/N: normal (low <= p <= high) trains as is; too-hard (0 < p <
low) and too-easy (high < p < 1) train as is AND send one trajectory to "Prefix & Mask": the first K steps of a rare
success (too-hard: a head start) or of a rare failure (too-easy: a handicap) become a prefix task injected into the
next batch. A prefix task is run by *replaying* those K steps -- a fresh environment re-executes the stored actions,
restoring its state and the conversation -- and the policy generates only the continuation; replayed tokens get loss
mask 0. An optional EMA controller moves each category's ratio so that prefix tasks pass about 50% of the time.
[PS] lines are the paper's; `--prefix_sampling false` runs none of them but no-ops marked "(also in GRPO: ...)".

Default task: multi-turn Countdown (common/demo/countdown_env.py), one arithmetic step per turn, the environment answers
with the remaining numbers; observation tokens are context with loss mask 0. Real math datasets use the single-turn
text mode, where a step is a line of the response and a prefix is its first K lines.

Design choices the paper leaves open (each is a flag or documented at its function):
- Batch: constant size --prompts_per_step; the previous step's prefix tasks come first, at most --max_prefix_frac of
  the batch, the rest are fresh tasks. Prefix tasks over the cap are dropped, never carried over (dynamic on-policy:
  only the current step's trajectories), and prefix tasks are never routed to Prefix & Mask again. A too-hard/too-easy
  task contributes one trajectory (chosen at random).
- Prefix length K is clamped to [1, T-1] (`prefix_steps`: 0 is the fresh task, T leaves nothing); T = 1: no prefix.
- Adaptive control keeps one EMA through its moves, as the paper's controller does (`PrefixController`); our variant
  `--ema_reset true` restarts it after each move (benchmark: `ps_adaptive` vs `ps_adaptive_reset`). A prefix task
  records the ratio that built it and runs one step later, after the controller's update, so only tasks built with
  the current ratio feed the controller (`attributed`); stale ones are discarded (ps_ctrl_stale_*) but still count in
  ps_prefix_pass_rate_*.
- Loss: the token-level clipped surrogate on generated tokens only (replayed prefix and observations: mask 0), DAPO
  token mean: each rank divides its sum by its own trained-token count (DDP then averages the ranks). No KL term (`kl`
  is logged as 0). Logged `loss`: the clipped surrogate per trained token (its sum over all ranks / their trained
  tokens); rejected (all-fail / all-pass) groups are not trained and not counted.
- Metrics (each one's meaning: docs/ps_grpo.md): reward_mean, reward_std, pass_rate and frac_zero_var_groups cover
  fresh tasks only (the paper's training score on no-prefix tasks); ps_* metrics cover prefix tasks.

    python ps_grpo.py                                   # PS (fixed ratios), multi-turn Countdown, CPU
    python ps_grpo.py --adaptive                        # PS with adaptive prefix control
    python ps_grpo.py --prefix_sampling false           # GRPO + rejection sampling baseline
    accelerate launch ps_grpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k \
        --dataset_config main --use_vllm --dtype bfloat16 --learning_rate 1e-6 --max_completion_length 512
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Annotated, Literal

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from common.run import checkpoint
from common.rl.advantages import grpo_advantages, zero_variance
from common.run.flags import BaseArgs, Range
from common.run.flags import parse_args
from common.tasks.loading import PromptEncoder, PromptSampler
from common.tasks.scoring import fixed_scored, reward_moments, reward_sums
from common.distributed.ranks import GracefulStop, collective_timeout, end_processes, gather_list, gathered, micro_batches, my_slice, rank_mean, reduce_sums
from common.rl.episode import Episode
from common.generation.hf import HFGenerator, SamplingConfig, end_token_ids
from common.run.launch import CpuThreads, resolve_accelerate_precision, resolve_accelerate_sharding
from common.rl.logprobs import token_logprobs
from common.rl.losses import clipped_surrogate
from common.rl.masking import pad_sequences, right_align
from common.run.logs import MetricsLogger, SampleLogger, check_tracker
from common.tasks.evaluation import evaluate, evaluate_train_prompts, pass_metrics, train_prompt_sample
from common.run.output_dir import claim_output_dir
from common.model.policy import autocast, load_policy
from common.run.summary import run_summary
from common.tasks.loading import make_task

CATEGORIES = ("hard", "easy")  # [PS] too-hard tasks replay a success, too-easy tasks a failure
ROUTES = ("all_fail", "all_pass", "normal", "too_hard", "too_easy")


@dataclass
class Args(BaseArgs):
    max_steps: Annotated[int, Range(1)] = 150
    """number of policy updates (one batch of tasks each)"""
    num_generations: Annotated[int, Range(2)] = 8
    """rollouts per task (N); the group for GRPO advantages and for the pass rate k/N"""
    epsilon: Annotated[float, Range(0, 1, hi_open=True)] = 0.2
    """clipped surrogate: lower clip range (ratio >= 1 - eps_low)"""
    epsilon_high: Annotated[float, Range(0)] = 0.28
    """clipped surrogate: upper clip range (ratio <= 1 + eps_high; DAPO clip-higher)"""
    scale_rewards: bool = False
    """GRPO advantages: false = r - mean (the paper's appendix: a group's Var(A) = p(1-p), the signal PS raises);
    true = (r - mean) / std (original GRPO, DeepSeekMath: every mixed group gets Var(A) = 1)"""
    mode: Literal["auto", "multiturn", "text"] = "auto"
    """`multiturn`: the Countdown environment, a step per turn; `text`: a line per step; `auto`: by --dataset_name
    (multiturn for countdown)"""
    env_numbers: Annotated[int, Range(2, zero="the embedded task's level mix of 2, 3 and 5 numbers")] = 0
    """[multiturn] numbers per Countdown problem (an episode takes env_numbers - 1 steps; the level mix: 1, 2 and
    4 steps)"""
    env_max_number: Annotated[int, Range(2)] = 10
    """[multiturn] with --env_numbers > 0, problem numbers are drawn from 1..env_max_number"""
    max_turns: Annotated[int, Range(1)] = 4
    """[multiturn] turn budget of an episode (it also ends with one number left, an invalid action or a stop)"""
    env_invalid: Literal["end", "retry"] = "end"
    """[multiturn] an invalid action: `end` the episode (reward 0), or `retry` (answered with an error + the state)"""
    max_action_tokens: Annotated[int, Range(1)] = 16
    """[multiturn] token cap of one action (a turn ends at a newline or EOS); text mode: --max_completion_length"""
    mt_sft_steps: Annotated[int, Range(0, zero="none")] = 400
    """[multiturn] embedded model: SFT steps on solver-built episodes before RL (built once, cached)"""
    prefix_sampling: bool = True
    """[PS] route skewed tasks to Prefix & Mask and inject prefix tasks into the next batch; false = the baseline"""
    low: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = 0.3
    """[PS] pass rate below this (with at least one success) is too-hard"""
    high: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = 0.7
    """[PS] pass rate above this (with at least one failure) is too-easy"""
    remaining_ratio: Annotated[float, Range(0, 1)] = 0.25
    """[PS] too-hard: replay T - min(int(T * remaining_ratio), remaining_cap) steps of a success (--adaptive: start)"""
    remaining_cap: Annotated[int, Range(0)] = 1000
    """[PS] cap on the remaining steps of a too-hard prefix task"""
    prefix_ratio: Annotated[float, Range(0, 1)] = 0.25
    """[PS] too-easy: replay min(int(T * prefix_ratio), prefix_cap) steps of a failure (--adaptive: start value)"""
    prefix_cap: Annotated[int, Range(0)] = 1000
    """[PS] cap on the replayed steps of a too-easy prefix task"""
    max_prefix_frac: Annotated[float, Range(0, 1)] = 0.5
    """[PS] at most this fraction of the batch's tasks are prefix tasks (the rest fresh; those over it: dropped)"""
    adaptive: bool = False
    """[PS] adaptive prefix control: move each category's ratio toward a prefix-task pass rate of 0.5"""
    ema_alpha: Annotated[float, Range(0, 1, lo_open=True)] = 0.05
    """[PS] adaptive: EMA coefficient of the per-category pass rate of prefix tasks built with the current ratio"""
    deadzone_low: Annotated[float, Range(0, 1)] = 0.47
    """[PS] adaptive: no adjustment while the EMA is within [deadzone_low, deadzone_high]"""
    deadzone_high: Annotated[float, Range(0, 1)] = 0.53
    """[PS] adaptive: upper edge of the deadzone"""
    ratio_step: Annotated[float, Range(0, 1, lo_open=True)] = 0.05
    """[PS] adaptive: size of one ratio adjustment"""
    cooldown: Annotated[int, Range(0)] = 5
    """[PS] adaptive: steps (with prefix tasks built with the current ratio) between two moves of a category's ratio"""
    ratio_min: Annotated[float, Range(0, 1)] = 0.05
    """[PS] adaptive: lower clamp of both ratios"""
    ratio_max: Annotated[float, Range(0, 1)] = 0.95
    """[PS] adaptive: upper clamp of both ratios"""
    ema_reset: bool = False
    """[PS] adaptive: restart the EMA after each move (our variant); false = one EMA throughout, the paper's"""

    def validate(self) -> None:  # single values: their declarations (common/run/flags.py); here, combinations
        for lo, hi in (("low", "high"), ("ratio_min", "ratio_max"), ("deadzone_low", "deadzone_high")):
            if getattr(self, lo) > getattr(self, hi):
                raise SystemExit(f"--{lo} {getattr(self, lo)} --{hi} {getattr(self, hi)}: need {lo} <= {hi}")
        if self.env_max_number != 10 and not (self.multiturn and self.env_numbers):  # 10: the default, unused
            raise SystemExit(f"--env_max_number {self.env_max_number}: applies to multiturn with --env_numbers > 0")
        if self.max_turns < (self.env_numbers or 5) - 1:
            raise SystemExit(f"--max_turns {self.max_turns}: {self.env_numbers} numbers need more turns")
        if self.multiturn:
            if self.dataset_name != "countdown":
                raise SystemExit(f"--mode multiturn needs --dataset_name countdown, got {self.dataset_name}: use --mode text")
            if self.reward != "binary" or self.reward_funcs or self.eval_reward_funcs:  # they apply to --mode text
                raise SystemExit(f"--reward {self.reward} / --reward_funcs: multi-turn keeps its binary reward")
        elif self.env_numbers:
            raise SystemExit(f"--env_numbers {self.env_numbers}: applies to --mode multiturn only")

    @property
    def multiturn(self) -> bool:
        return self.mode == "multiturn" or (self.mode == "auto" and self.dataset_name == "countdown")


# ----------------------------------------------------------------------------------------------------
# [PS] Routing, prefix selection and adaptive prefix control (pure functions)
# ----------------------------------------------------------------------------------------------------

def route(k: int, n: int, low: float, high: float) -> str:
    """[PS] (also in GRPO: counted in `ps_route_*`) The paper's five paths for k of n rollouts passing (Figure 2)."""
    if k in (0, n):  # discarded: no success (all_fail) / no failure (all_pass) to build a prefix from
        return "all_fail" if k == 0 else "all_pass"
    return "too_hard" if k / n < low else "too_easy" if k / n > high else "normal"


def prefix_steps(total: int, mode: str, ratio: float, cap: int) -> int | None:
    """[PS] Prefix length K (section "Prefix Selection"), or None when no useful prefix exists.

    remaining mode (too-hard): remaining = min(int(T * ratio), cap), K = T - remaining; prefix mode (too-easy):
    K = min(int(T * ratio), cap). K is then clamped to [1, T - 1]: K = 0 would replay nothing (the same fresh task
    again, no change of difficulty) and K = T would replay the whole trajectory, leaving nothing to generate (its
    outcome is already decided). So a 1-step trajectory (T < 2) yields no prefix task.
    """
    if mode not in ("remaining", "prefix"):
        raise ValueError(f"mode must be 'remaining' or 'prefix', got {mode!r}")
    k = min(int(total * ratio), cap)  # prefix mode: K; remaining mode: the steps left to generate
    return None if total < 2 else min(max(k if mode == "prefix" else total - k, 1), total - 1)


@dataclass
class PrefixController:
    """[PS] (also in GRPO: built, never moved) Adaptive prefix control for one category (section "Adaptive Prefix").

    EMA (alpha) of the category's prefix-task pass rate; when it leaves [lo, hi] the ratio moves by +-step
    toward a 50% pass rate, then `cooldown` observations pass before the next move. Both ratios move *up*
    when prefix tasks pass too often: too-hard's remaining_ratio up = fewer replayed success steps = harder,
    too-easy's prefix_ratio up = more replayed failure steps = harder (and down when they fail too often).
    The EMA is bias-corrected (its first value is the first observation) and kept through the moves (the paper);
    with `reset` (our variant) it restarts after every move, so it only averages pass rates measured at the
    current ratio: a never-restarted EMA keeps reporting the old ratio for ~1/alpha steps and the controller
    overshoots (see tests). The caller feeds only
    prefix tasks built with the current ratio (`attributed`): those run one step after they were built, so the
    first batch after a move still measures the old ratio.
    """
    ratio: float
    raw: float = 0.0  # EMA accumulator, bias-corrected by 1 - (1 - alpha)^n
    num_generations: int = 0  # observations in the accumulator
    wait: int = 0  # observations left before the next move is allowed
    moves: int = 0

    def ema(self, alpha: float) -> float | None:
        return self.raw / (1 - (1 - alpha) ** self.num_generations) if self.num_generations else None

    def update(self, pass_rate: float | None, alpha: float, lo: float, hi: float, step: float, cooldown: int,
               rmin: float, rmax: float, reset: bool = False) -> float:
        """Feed one step's prefix-task pass rate (None: no prefix task of this category); returns the move."""
        if pass_rate is None:
            return 0.0
        self.raw = (1 - alpha) * self.raw + alpha * pass_rate
        self.num_generations += 1
        if self.wait > 0:
            self.wait -= 1
            return 0.0
        ema = self.ema(alpha)
        target = self.ratio + step if ema > hi else self.ratio - step if ema < lo else self.ratio
        new = round(min(rmax, max(rmin, target)), 10)
        move = new - self.ratio
        if move != 0:
            self.ratio, self.wait, self.moves = new, cooldown, self.moves + 1
            if reset:
                self.raw, self.num_generations = 0.0, 0
        return move


def attributed(tasks: list[dict], passes: list[int], category: str, ratio: float) -> dict[str, int]:
    """[PS] (also in GRPO: counts none) Controller input: `category`'s prefix tasks built with `ratio`, its current one.

    A prefix task is built at step t with the ratio before the controller's update at the end of step t, and runs
    at step t + 1; after a move its pass rate measures the old ratio. Such stale tasks (and tasks queued by older
    checkpoints, which recorded no ratio) are counted but discarded, never attributed to the new ratio. Returns
    {"tasks", "success" (passing rollouts), "stale"}; the caller sums them over ranks.
    """
    mine = [group for group, task in enumerate(tasks) if task["cat"] == category]
    current = [group for group in mine if tasks[group].get("ratio") == ratio]
    return {"tasks": len(current), "success": sum(passes[g] for g in current), "stale": len(mine) - len(current)}


# ----------------------------------------------------------------------------------------------------
# Rollouts: fresh tasks start from the reset state, prefix tasks from a replayed one
# ----------------------------------------------------------------------------------------------------

def rollout_multiturn(generator, tokenizer, prompts: list[list[int]], problems: list, prefixes: list[list], n: int,
                      cfg: SamplingConfig, max_turns: int, invalid: str) -> tuple[list[Episode], list[bool]]:
    """n episodes per task, played turn by turn; one generate call per turn for every live episode.

    [PS] Prefix replay: each episode of a prefix task starts from a fresh environment that re-executes the stored
    actions (restoring the numbers, the turn count and the conversation); those tokens are context with mask 0 and
    cost no generation. Observations are context with mask 0 too. Returns (episodes, clipped): clipped[i] is True
    when an action of episode i hit cfg.max_new_tokens.
    """
    from common.demo.countdown_env import replay_episode

    encode = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    episodes = [replay_episode(problems[group], prefixes[group], group, decode, encode, max_turns, invalid)
                for group in range(len(prompts)) for _ in range(n)]
    clipped = [False] * len(episodes)
    while live := [i for i, episode in enumerate(episodes) if not episode.env.done]:
        gens = generator.generate([prompts[episodes[i].group] + episodes[i].ids for i in live], 1, cfg)
        for i, ids, logprobs, reason in zip(live, gens.completion_ids, gens.logprobs, gens.finish_reasons):
            result = episodes[i].env.step(decode(ids), final=bool(ids) and ids[-1] in generator.end_ids)
            episodes[i].add_turn(ids, encode(result.observation), logprobs)  # action: mask 1; observation: mask 0
            clipped[i] = clipped[i] or reason == "length"
    for episode in episodes:
        episode.reward = episode.env.reward
    return episodes, clipped


def split_lines(ids: list[int], is_break) -> list[list[int]]:
    """Token ids cut into lines: a line ends after a token whose text holds a newline (text-mode steps)."""
    lines, current = [], []
    for token in ids:
        current.append(token)
        if is_break(token):
            lines.append(current)
            current = []
    return lines + ([current] if current else [])


def rollout_text(generator, tokenizer, prompts: list[list[int]], prefixes: list[list], n: int, cfg: SamplingConfig,
                 is_break) -> tuple[list[Episode], list[bool]]:
    """n single-turn completions per task. [PS] A prefix task's context is prompt + its first K lines
    (mask 0); the continuation gets the rest of the max_new_tokens budget; the caller's reward scores the whole text.
    Returns (episodes, clipped): clipped[i] is True when completion i was cut by max_new_tokens or the budget."""
    contexts = [prompt + [t for action, _ in prefix for t in action] for prompt, prefix in zip(prompts, prefixes)]
    gens = generator.generate(contexts, n, cfg)
    episodes, clipped = [], []
    for i, (ids, logprobs) in enumerate(zip(gens.completion_ids, gens.logprobs)):
        group = i // n
        episode = Episode(group)
        for action, _ in prefixes[group]:
            episode.add_turn(action, [])  # [PS] replayed line, mask 0
        budget = max(0, cfg.max_new_tokens - len(episode.ids))
        clipped.append(gens.finish_reasons[i] == "length" or len(ids) > budget)
        ids, logprobs = ids[:budget], logprobs[:budget]
        lines = split_lines(ids, is_break)
        if len(lines) > 1 and not tokenizer.decode(lines[-1], skip_special_tokens=True).strip():
            # a tail with no text (the stop token after the last newline) is not a step of its own: otherwise
            # "all but the last step" would replay the whole answer and leave only the stop token to generate
            lines[-2:] = [lines[-2] + lines[-1]]
        position = 0
        for line in lines:
            episode.add_turn(line, [], logprobs[position:position + len(line)])
            position += len(line)
        episodes.append(episode)
    return episodes, clipped


def turn_config(tokenizer, args: Args, temperature: float) -> SamplingConfig:
    """Sampling for one turn at `temperature`: an action ends at the end of its line (or EOS), max_action_tokens."""
    newline = tokenizer("\n", add_special_tokens=False).input_ids[-1]
    return SamplingConfig(max_new_tokens=args.max_action_tokens, temperature=temperature, stop_token_ids=[newline])


def evaluate_episodes(generator, tokenizer, encode, examples: list, args: Args, accelerator, cfg) -> dict:
    """Held-out pass@1 / pass@k (every power of two k <= --eval_samples) of whole episodes in the environment,
    turns sampled with `cfg` (prompts split across ranks)."""
    samples = args.eval_samples
    mine = examples[accelerator.process_index::accelerator.num_processes]
    counts = []
    if mine:
        episodes, clipped = rollout_multiturn(generator, tokenizer, [encode(example.prompt) for example in mine],
                                              [example.answer for example in mine], [[] for _ in mine], samples,
                                              cfg, args.max_turns, args.env_invalid)
        passed = [episode.reward >= 1.0 and not cut for episode, cut in zip(episodes, clipped)]  # training's rule
        counts = [(sum(passed[i * samples:(i + 1) * samples]), example.tag) for i, example in enumerate(mine)]
    counts = gather_list(accelerator, counts)
    return pass_metrics([c for c, _ in counts], samples, [t for _, t in counts])


def ps_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, n_tok: float,
            eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GRPO clipped surrogate over tokens with mask 1 (DAPO token mean: n_tok, the batch's tokens per rank),
    and the number of clipped tokens. [PS] Prefix masking: replayed prefix tokens (and observations) have
    mask 0, so they get no gradient."""
    per_token, clipped = clipped_surrogate(logp, old_logp, adv[:, None], eps_low, eps_high)
    return (per_token * mask).sum() / (n_tok or 1), (clipped * mask).sum()


def main(args: Args) -> None:
    # ---------------- set-up: accelerator, seeds, output dir ----------------
    args.fsdp, args.dtype = resolve_accelerate_sharding(args.fsdp), resolve_accelerate_precision(args.dtype)
    cpu_threads = CpuThreads(args.num_threads, hold=args.torch_compile)  # --num_threads, or free cores: launch.py
    torch.set_num_threads(cpu_threads.count(torch.get_num_threads(), settle=0.2))  # before any torch work
    check_tracker(args.report_to)
    args.output_dir = args.output_dir or f"runs/ps_grpo-seed{args.seed}"
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), project_dir=args.output_dir,
                              log_with=None if args.report_to == "none" else args.report_to,
                              kwargs_handlers=collective_timeout(args.collective_timeout))  # one line on expiry
    device, world = accelerator.device, accelerator.num_processes
    log = lambda msg: print(msg, flush=True) if accelerator.is_main_process else None  # noqa: E731  (once a run)
    rank_seed = args.seed + accelerator.process_index  # ranks sample different rollouts
    for seed in (random.seed, np.random.seed, torch.manual_seed):
        seed(rank_seed)
    claim_output_dir(args, accelerator, log)  # before any model: refuses a used or unshared folder

    # ---------------- policy, optimizer (no reference model: no KL term) ----------------
    model_path = args.model_name_or_path
    if model_path == "embedded":  # the tiny Countdown model: rank 0 builds it once, the others find it cached
        from common.demo.tiny_model import ensure_embedded_base

        with accelerator.main_process_first():
            model_path = str(ensure_embedded_base(log=log))
            if args.multiturn and args.mt_sft_steps > 0:  # warmed up on solver episodes of the environment
                from common.demo.countdown_env import MultiTurnRecipe, ensure_multiturn_policy

                recipe = MultiTurnRecipe(args.env_numbers, args.env_max_number, args.mt_sft_steps)
                model_path = str(ensure_multiturn_policy(model_path, recipe, log=log))
    policy, tokenizer = load_policy(model_path)  # fp32 master weights; --dtype is the compute dtype (autocast)
    policy.to(device).train()  # training mode: from_pretrained returns eval mode (checkpointing needs train)
    if args.gradient_checkpointing:  # activations recomputed in backward (training passes only; generate is eval)
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora_r:  # LoRA: only the adapters train (fp32); the frozen base is stored in the compute dtype
        from common.model.lora import add_lora

        policy = add_lora(policy, args.lora_r, args.lora_alpha, args.lora_target_modules, args.dtype)
    if args.fsdp:  # FSDP2: each rank keeps 1/world of every weight (common/distributed/fsdp.py); the optimizer sees the shards
        from common.distributed.fsdp import shard

        policy = shard(policy, args.dtype)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=args.weight_decay)
    warmup = max(1, args.warmup_steps)  # linear warm-up, then constant
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    # `model`: DDP-wrapped for the backward pass (FSDP: the sharded policy is its own wrapper)
    model, optimizer = (policy, accelerator.prepare(optimizer)) if args.fsdp else accelerator.prepare(policy, optimizer)

    # ---------------- data (multi-turn: the environment's problems; text: the dataset) and generator ----------------
    if args.multiturn:
        from common.demo.countdown_env import make_env_task

        train, held_out = make_env_task(args.env_numbers, args.env_max_number, args.eval_prompts, args.prompt_pool)
        text_task, encode = None, PromptEncoder(tokenizer, templated=False)  # prompts: the reset observations
    else:  # Countdown's single-turn text form or a dataset; --reward_funcs: yours (docs/custom_task.md)
        text_task = make_task(args, tokenizer, log)
    if text_task is not None:
        train, held_out, encode = text_task.train, text_task.eval, PromptEncoder(tokenizer, text_task.templated)
    success_reward = text_task.success_reward if text_task else (1.0 if args.success_reward is None else args.success_reward)
    sampler = PromptSampler(len(train), args.seed)
    compiled = None  # --torch_compile: the decoding step and the packed training forward compiled (common/generation/compile.py)
    if args.torch_compile:
        from common.generation.compile import TorchCompile

        compiled = TorchCompile(log=log)
    if args.use_vllm:
        from common.generation.vllm_backend import VLLMGenerator

        generator = VLLMGenerator(model_path, policy, tokenizer, seed=args.seed, dtype=args.dtype,
                                  max_model_len=args.vllm_max_model_length,
                                  gpu_memory_utilization=args.vllm_gpu_memory_utilization, accelerator=accelerator)
    else:
        generator = HFGenerator(policy, tokenizer, batch_size=args.gen_batch_size, dtype=args.dtype,
                                cache_implementation=args.cache_implementation, compiled=compiled)
    generator.end_ids = end_token_ids(tokenizer, policy, args.stop_token_ids, log)  # EOS, end-of-turn, flag
    sampling = SamplingConfig(max_new_tokens=args.max_completion_length, temperature=args.temperature)  # text mode
    turn_sampling = turn_config(tokenizer, args, args.temperature)  # multi-turn: one action per generate call
    eval_temperature = args.temperature if args.eval_temperature is None else args.eval_temperature  # 0: greedy
    eval_sampling = SamplingConfig(max_new_tokens=args.max_completion_length, temperature=eval_temperature, logprobs=False)
    temperature = args.temperature if args.temperature > 0 else 1.0  # the generator scores greedy samples at T=1
    pack = (args.pack_row_tokens or (2048 if device.type == "cuda" else 128)) if args.padding_free else 0  # rows
    line_ends: dict[int, bool] = {}

    def is_break(token: int) -> bool:  # text mode: does this token end a line (a step)?
        if token not in line_ends:
            line_ends[token] = "\n" in tokenizer.decode([token])
        return line_ends[token]

    def run_eval() -> dict:
        torch.set_num_threads(cpu_threads.count(torch.get_num_threads()))  # fit the free cores
        with gathered(policy, enabled=generator.reads_policy):  # FSDP + HF generate: whole weights (else no-op)
            if args.multiturn:  # whole episodes in the environment
                score = lambda examples: evaluate_episodes(generator, tokenizer, encode, examples, args,  # noqa: E731
                                                           accelerator, turn_config(tokenizer, args, eval_temperature))
            else:
                score = lambda examples: evaluate(generator, tokenizer, examples, encode,  # noqa: E731
                                                  text_task.eval_success, eval_sampling, args.eval_samples,
                                                  accelerator)
            train_fit = evaluate_train_prompts(score, train_prompt_sample(train, args.eval_train_prompts))
            return {**score(held_out), **train_fit}  # eval_train_*: the pool's fit, to compare with held-out

    # ---------------- resume ----------------
    start_step, counters, method_state = 0, {"rollouts": 0, "gen_tokens": 0}, {}
    resume_from = checkpoint.resolve_resume(args.resume_from_checkpoint, args.output_dir)
    if resume_from is not None:
        start_step, state = checkpoint.load_checkpoint(resume_from, accelerator, model, optimizer, scheduler)
        counters, method_state = state["counters"], state["method"]
        sampler.load_state_dict(method_state.get("sampler", state["sampler"]))  # multi-turn: under "method"
        generator.sync_weights(policy)
        log(f"resumed from {resume_from} at step {start_step}")
    # [PS] (also in GRPO: empty) prefix tasks for the next batch (the same on every rank), one controller per category
    queue: list[dict] = method_state.get("queue", [])
    initial_ratio = {"hard": args.remaining_ratio, "easy": args.prefix_ratio}
    controllers = {category: PrefixController(**method_state["ctrl"][category]) if "ctrl" in method_state
                   else PrefixController(initial_ratio[category], wait=args.cooldown)  # first move after `cooldown`
                   for category in CATEGORIES}

    # ---------------- logging, step-0 evaluation, graceful stop ----------------
    logger = MetricsLogger(args.output_dir, accelerator, args.report_to, vars(args),
                           resume_step=start_step if resume_from is not None else None)
    sample_log = SampleLogger(args.output_dir, accelerator, args.log_samples_every, args.log_samples_per_kind,
                              resume_step=start_step if resume_from is not None else None)
    warned_logp_diff = False
    if start_step == 0:
        row = {"step": 0, **run_eval(), "num_threads": torch.get_num_threads(),
               **(compiled.metrics(accelerator) if compiled else {})}
        logger.log(row)
        log(f"step 0 (starting policy): {row}")
    stop = GracefulStop(log)
    progress = tqdm(range(start_step + 1, args.max_steps + 1), initial=start_step, total=args.max_steps,
                    desc="ps_grpo", disable=not accelerator.is_main_process)
    n = args.num_generations

    for step in range(start_step + 1, args.max_steps + 1):
        t_start = time.time()
        threads = cpu_threads.count(torch.get_num_threads())  # a shared CPU: fit the free cores
        torch.set_num_threads(threads)
        # ================ [PS] (also in GRPO: all fresh) the batch: prefix tasks (<= max_prefix_frac), then fresh ===
        n_prefix = min(len(queue), int(args.max_prefix_frac * args.prompts_per_step))
        dropped = len(queue) - n_prefix  # dynamic on-policy: prefix tasks are never carried over
        tasks = queue[:n_prefix] + [{"id": i, "cat": None, "steps": []}
                                    for i in sampler.next_ids(args.prompts_per_step - n_prefix)]
        tasks = my_slice(tasks, accelerator)  # strided: every rank gets prefix and fresh tasks
        examples, prefixes = [train[task["id"]] for task in tasks], [task["steps"] for task in tasks]
        prompts = [encode(example.prompt) for example in examples]

        # ================ sample: N rollouts per task (a prefix task replays its prefix, generates the rest) ========
        with gathered(policy, enabled=generator.reads_policy):  # FSDP + HF generate: whole weights (else no-op)
            if args.multiturn:
                problems = [example.answer for example in examples]
                episodes, clipped = rollout_multiturn(generator, tokenizer, prompts, problems, prefixes, n,
                                                      turn_sampling, args.max_turns, args.env_invalid)
            else:
                episodes, clipped = rollout_text(generator, tokenizer, prompts, prefixes, n, sampling, is_break)
        generator.sleep()  # vLLM on a GPU: its memory goes to training; the push brings the weights back
        t_gen = time.time() - t_start

        # ================ verify: the environment's or the task's reward of the whole text; a cut rollout gets 0 ==
        scored = fixed_scored([ep.reward for ep in episodes], clipped, success_reward) if args.multiturn else \
            text_task.score([tokenizer.decode(ep.ids, skip_special_tokens=True) for ep in episodes],
                            [examples[ep.group] for ep in episodes], [ep.ids for ep in episodes], clipped, step)
        for episode, total in zip(episodes, scored.total):
            episode.reward = total  # cut: 0 under the built-in rewards; NaN: no function scored it (advantage 0)
        rewards = torch.tensor([episode.reward for episode in episodes]).view(-1, n).float()
        success = torch.tensor(scored.success, dtype=torch.bool).view(-1, n)
        passes = success.sum(-1).tolist()  # k of N, per task
        fresh = [group for group, task in enumerate(tasks) if task["cat"] is None]
        prefix_groups = {category: [group for group, task in enumerate(tasks) if task["cat"] == category]
                         for category in CATEGORIES}

        # ================ [PS] (also in GRPO: skips all) route fresh tasks; too-hard / too-easy -> Prefix & Mask ====
        routes = [route(k, n, args.low, args.high) for k in passes]
        new_tasks = []
        for group, (task, task_route) in enumerate(zip(tasks, routes)):
            if not args.prefix_sampling or task["cat"] is not None or task_route not in ("too_hard", "too_easy"):
                continue  # prefix tasks are not recycled again
            # [PS] a skewed fresh task: one of its trajectories, cut to a prefix, is queued for the next batch
            category, want_success, mode = (("hard", True, "remaining") if task_route == "too_hard"
                                            else ("easy", False, "prefix"))
            source = random.choice([episode for i, episode in enumerate(episodes[group * n:(group + 1) * n])
                                    if bool(success[group, i]) == want_success])  # unscored: not a success
            cap = args.remaining_cap if category == "hard" else args.prefix_cap
            steps = prefix_steps(len(source.steps), mode, controllers[category].ratio, cap)
            if steps is not None:
                new_tasks.append((group * world + accelerator.process_index, {"id": task["id"], "cat": category,
                    "steps": source.steps[:steps], "T": len(source.steps), "ratio": controllers[category].ratio}))
        new_tasks = [new for _, new in sorted(gather_list(accelerator, new_tasks))]  # by place in the batch (my_slice)

        # ================ advantages: GRPO r - mean (appendix, Perspective 2; --scale_rewards: / std);
        #                  rejection sampling drops groups whose rollouts all fail or all pass (DeepSWE baseline) ====
        keep = ~zero_variance(rewards)
        advantages = grpo_advantages(rewards, scale=args.scale_rewards)
        rows = [i for i in range(len(episodes)) if keep[i // n]]
        trained_advantages = advantages.flatten()[rows].to(device)
        trained = [episodes[i] for i in rows]
        masks = [[0] * len(episodes[i].mask) if args.mask_truncated_completions and clipped[i] else episodes[i].mask
                 for i in rows]  # --mask_truncated_completions: rollouts cut by a length limit get no gradient
        n_tokens = rank_mean(accelerator, sum(map(sum, masks)))  # the DAPO token mean over the whole batch

        # ================ update: clipped surrogate on generated tokens only (a replayed prefix has mask 0) ========
        t_train_start = time.time()
        sums = {"loss_sum": 0.0, "ent_sum": 0.0, "tok": 0.0, "clip_sum": 0.0, "gap_sum": 0.0, "gap_tok": 0.0}
        lengths = [len(prompts[episode.group]) + len(episode.ids) for episode in trained]
        for batch_rows in micro_batches(len(trained), args.micro_batch_size, accelerator, model, lengths=lengths,
                                        max_tokens=args.max_tokens_per_microbatch):
            batch = pad_sequences([prompts[trained[i].group] for i in batch_rows], [trained[i].ids for i in batch_rows],
                                  tokenizer.pad_token_id, [masks[i] for i in batch_rows], pack).to(device)
            with autocast(device, args.dtype):  # bf16 compute over fp32 weights with --dtype bfloat16
                logp, entropy = token_logprobs(model, batch, temperature, compiled=compiled)
            mask = batch.loss_mask
            old_logp = right_align([trained[i].old_logp for i in batch_rows], batch.completion_width).to(device)
            loss, clipped_tokens = ps_loss(logp, old_logp, trained_advantages[batch_rows], mask, n_tokens,
                                           args.epsilon, args.epsilon_high)
            accelerator.backward(loss)
            sums["loss_sum"] += loss.item() * (n_tokens or 1)  # back to a sum: normalised over ranks below
            sums["ent_sum"] += (entropy * mask).sum().item()
            sums["tok"] += mask.sum().item()
            sums["clip_sum"] += clipped_tokens.item()
            sums["gap_sum"] += ((logp.detach() - old_logp).abs() * mask).sum().item()  # sampler vs first pass
            sums["gap_tok"] += mask.sum().item()
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        t_train = time.time() - t_train_start

        # ================ push the new weights to the generator, once per update phase (no-op for HF) ============
        generator.sync_weights(policy)

        # ================ metrics: one reduce of named sums over ranks, each ratio next to its name ================
        fresh_rewards = rewards[fresh]
        totals = reduce_sums(accelerator, {
            "groups": len(fresh), "fresh_rollouts": fresh_rewards.numel(), "rollouts": len(episodes),
            "gen_tokens": sum(episode.generated_tokens for episode in episodes),
            "replayed_tokens": sum(episode.replayed_tokens for episode in episodes),
            **reward_sums(fresh_rewards),  # NaN (no function scored it): out of reward_mean / _std
            "success": float(success[fresh].sum()), "zero_var": float(zero_variance(fresh_rewards).sum()),
            "truncated": sum(clipped), "trained_groups": float(keep.sum()), **sums,
            "adv_sq_sum": float((trained_advantages ** 2).sum()),  # [PS] the appendix's signal strength, below
            "solve_partial": sum(0 < k < n for k in passes),  # [PS] every task of the batch, prefix tasks too
            **{f"route_{name}": sum(routes[group] == name for group in fresh) for name in ROUTES},
            **{f"prefix_{category}_tasks": len(prefix_groups[category]) for category in CATEGORIES},
            **{f"prefix_{category}_success": float(success[prefix_groups[category]].sum()) for category in CATEGORIES},
            **{f"prefix_{category}_steps": sum(len(tasks[group]["steps"]) for group in prefix_groups[category])
               for category in CATEGORIES},
            **{f"ctrl_{category}_{key}": value for category in CATEGORIES  # [PS] controller input (`attributed`)
               for key, value in attributed(tasks, passes, category, controllers[category].ratio).items()},
            "t_gen": t_gen, "t_train": t_train,
        })
        counters = {key: value + int(totals[key]) for key, value in counters.items()}  # rollouts, gen_tokens
        fresh_samples, samples, tokens = (max(1.0, totals["fresh_rollouts"]), max(1.0, totals["rollouts"]),
                                          max(1.0, totals["tok"]))
        reward_mean, reward_std = reward_moments(totals, totals["fresh_rollouts"])  # the rewarded ones
        row = {
            "step": step, "rollouts": counters["rollouts"], "gen_tokens": counters["gen_tokens"],
            "reward_mean": reward_mean, "reward_std": reward_std,  # fresh tasks: the paper's training score
            "pass_rate": totals["success"] / fresh_samples, **scored.metrics(accelerator),
            "frac_zero_var_groups": totals["zero_var"] / max(1.0, totals["groups"]),  # fresh tasks only
            "completion_len_mean": totals["gen_tokens"] / samples,  # generated tokens per rollout (no replayed ones)
            "clipped_ratio": totals["truncated"] / samples,  # rollouts cut by a length limit
            "loss": totals["loss_sum"] / tokens,  # clipped surrogate per trained token
            "kl": 0.0, "entropy": totals["ent_sum"] / tokens,  # kl: no KL term
            "grad_norm": float(grad_norm), "lr": scheduler.get_last_lr()[0],
            "time_gen_s": totals["t_gen"] / world, "time_train_s": totals["t_train"] / world,
            "sampler_logp_diff": totals["gap_sum"] / totals["gap_tok"] if totals["gap_tok"] else None,
        }
        gap = row["sampler_logp_diff"]  # None: not measured this step
        if not warned_logp_diff and gap is not None and gap >= args.logp_diff_warn:
            warned_logp_diff = True
            log(f"warning: sampler_logp_diff {gap:.4f} >= --logp_diff_warn {args.logp_diff_warn}: "
                "the generator does not sample from the policy being trained (stale weights, dtype, temperature?)")

        # ================ [PS] (also in GRPO: no pass rate) adaptive prefix control (the same on all ranks) ========
        prefix_rollouts = {category: totals[f"prefix_{category}_tasks"] * n for category in CATEGORIES}
        prefix_pass_rates = {category: totals[f"prefix_{category}_success"] / prefix_rollouts[category]
                             if prefix_rollouts[category] else None for category in CATEGORIES}
        # the controller sees only prefix tasks built with its current ratio (stale ones measure the previous ratio)
        ctrl_pass_rates = {category: totals[f"ctrl_{category}_success"] / (totals[f"ctrl_{category}_tasks"] * n)
                           if totals[f"ctrl_{category}_tasks"] else None for category in CATEGORIES}
        if args.prefix_sampling and args.adaptive:  # [PS]
            for category in CATEGORIES:
                controllers[category].update(ctrl_pass_rates[category], args.ema_alpha, args.deadzone_low,
                                             args.deadzone_high, args.ratio_step, args.cooldown, args.ratio_min,
                                             args.ratio_max, args.ema_reset)
        all_prefix_rollouts = prefix_rollouts["hard"] + prefix_rollouts["easy"]
        row.update({  # [PS] (also in GRPO, as its reference) mechanism metrics
            "ps_solve_partial": totals["solve_partial"],
            "ps_prefix_tasks": totals["prefix_hard_tasks"] + totals["prefix_easy_tasks"],
            "ps_prefix_pass_rate": (totals["prefix_hard_success"] + totals["prefix_easy_success"]) / all_prefix_rollouts
            if all_prefix_rollouts else None,
            **{f"ps_prefix_pass_rate_{category}": prefix_pass_rates[category] for category in CATEGORIES},
            **{f"ps_ctrl_pass_rate_{category}": ctrl_pass_rates[category] for category in CATEGORIES},  # its input
            **{f"ps_ctrl_stale_{category}": totals[f"ctrl_{category}_stale"] for category in CATEGORIES},
            **{f"ps_prefix_steps_{category}": totals[f"prefix_{category}_steps"] / totals[f"prefix_{category}_tasks"]
               if totals[f"prefix_{category}_tasks"] else None for category in CATEGORIES},  # mean K
            "ps_ratio_hard": controllers["hard"].ratio, "ps_ratio_easy": controllers["easy"].ratio,
            **{f"ps_ema_{category}": controllers[category].ema(args.ema_alpha) for category in CATEGORIES},
            "ps_replayed_tokens": totals["replayed_tokens"], "ps_generated_tokens": totals["gen_tokens"],
            "ps_fresh_pass_rate": row["pass_rate"], "ps_trained_groups": totals["trained_groups"],
            "ps_clip_frac": totals["clip_sum"] / tokens,
            # mean A^2 of trained rollouts: a group's p(1-p) with A = r - mean (appendix, Perspective 2); 1 with / std
            "ps_signal_strength": totals["adv_sq_sum"] / (n * totals["trained_groups"]) if totals["trained_groups"]
            else None,
            "ps_queued": len(new_tasks), "ps_dropped": dropped,
            **{f"ps_route_{name}": totals[f"route_{name}"] for name in ROUTES},  # fresh tasks
        })
        queue = new_tasks  # [PS] (also in GRPO: empty) injected into the next batch

        # ================ sample log / evaluate / log / checkpoint / stop ================
        evaluating = (args.eval_steps and step % args.eval_steps == 0) or step == args.max_steps
        if sample_log.due(step, evaluating):  # a few fresh and (with PS) prefix-task rollouts -> samples.jsonl
            kinds = ["fresh" if task["cat"] is None else f"prefix_{task['cat']}" for task in tasks for _ in range(n)]
            sample_log.log(step, [{  # advantage 0 and trained False: a group dropped by rejection sampling
                "kind": kinds[i], "prompt": tokenizer.decode(prompts[i // n]), "completion": tokenizer.decode(ep.ids),
                "reward": ep.reward, "advantage": advantages.flatten()[i].item() if keep[i // n] else 0.0,
                "trained": bool(keep[i // n]), "truncated": clipped[i], "ps_prefix_steps": len(tasks[i // n]["steps"]),
                **({"ps_ratio": tasks[i // n].get("ratio")} if kinds[i] != "fresh" else {}), **scored.columns(i)}
                for i, ep in ((i, episodes[i]) for i in sample_log.pick(kinds))])
        if evaluating:
            row.update(run_eval())
        row.update(compiled.metrics(accelerator) if compiled else {})  # --torch_compile: compile time, recompiles
        row["time_step_s"] = time.time() - t_start
        row["num_threads"] = threads  # the step's count: with a fixed one the run repeats exactly
        logger.log(row)
        progress.update(1)
        progress.set_postfix({"reward": f"{row['reward_mean']:.3f}", "zero_var": f"{row['frac_zero_var_groups']:.2f}",
                              **({"eval": f"{row['eval_pass@1']:.3f}"} if "eval_pass@1" in row else {})})
        stopping = stop.agreed(accelerator)
        if (args.save_steps and step % args.save_steps == 0) or step == args.max_steps or stopping:
            method = {"queue": queue, "ctrl": {category: asdict(controllers[category]) for category in CATEGORIES}}
            if args.multiturn:  # where older checkpoints kept the environment's sampler
                method["sampler"] = sampler.state_dict()
            state = {"sampler": sampler.state_dict(), "counters": counters, "method": method}
            path = checkpoint.save_checkpoint(args.output_dir, step, accelerator, model, tokenizer, optimizer,
                                              scheduler, state, args.save_total_limit, args.lora_merged_export)
            if stopping:
                log(f"stopped at step {step}; continue with --resume_from_checkpoint auto (checkpoint {path})")
                break
    progress.close()
    end_processes(accelerator)  # trackers finish and the process group ends now, not at exit: no hang, no abort
    stop.close()
    log(run_summary(args.output_dir, ["ps_prefix_pass_rate", "ps_trained_groups", "ps_ratio_hard", "ps_ratio_easy"]))


if __name__ == "__main__":
    raise SystemExit(main(parse_args(Args, description=__doc__.split("\n\n")[0])) or GracefulStop.exit_status())
