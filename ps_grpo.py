"""Prefix Sampling (PS) on GRPO, one file.

Paper: "Prefix Sampling: Targeting 50% Rollout Pass Rate for More Efficient Agentic RL"
(../shared/papers/000_18dc4b8a70b802ec.txt).

Baseline (the paper's DeepSWE recipe): GRPO, N rollouts per task, clipped surrogate, and rejection of
tasks whose N rollouts all fail or all pass. PS routes every fresh task by its rollout pass rate p = k/N:
normal (low <= p <= high) trains as is; too-hard (0 < p < low) and too-easy (high < p < 1) train as is AND
send one trajectory to "Prefix & Mask": the first K steps of a rare success (too-hard: a head start) or of a
rare failure (too-easy: a handicap) become a prefix task injected into the next batch. A prefix task is
run by *replaying* those K steps -- a fresh environment re-executes the stored actions, restoring its state
and the conversation -- and the policy generates only the continuation; replayed tokens get loss mask 0.
An optional EMA controller moves each category's ratio so that prefix tasks pass about 50% of the time.
Lines marked [PS] are what the paper adds; `--prefix_sampling false` switches them all off.

Default task: multi-turn Countdown (common/countdown_env.py), one arithmetic step per turn, the environment
answers with the remaining numbers; observation tokens are context with loss mask 0. Real math datasets use
the single-turn text mode, where a step is a line of the response and a prefix is its first K lines.

Design choices the paper leaves open (each is a flag or documented at its function):
- Batch: constant size --prompts_per_step; the previous step's prefix tasks come first, at most
  --max_prefix_frac of the batch, the rest are fresh tasks. Prefix tasks over the cap are dropped, never
  carried over (dynamic on-policy: only the current step's trajectories), and prefix tasks are never routed
  to Prefix & Mask again. A too-hard/too-easy task contributes one trajectory (chosen at random).
- Prefix length K is clamped to [1, T-1] (`prefix_steps`): 0 steps is the fresh task again, T steps leaves
  nothing to generate; a 1-step trajectory gives no prefix task.
- The core metrics reward_mean / pass_rate / frac_zero_var_groups are over fresh tasks only (the paper's
  training score on no-prefix tasks); ps_* metrics cover prefix tasks.
- Adaptive control restarts its EMA after every adjustment (`PrefixController`, --ema_reset).
- The default task has 4 numbers in 1..10, so a full trajectory has T = 3 steps and K is 1 or 2. With 3
  numbers (T = 2) every prefix is 1 step and the ratios (and the adaptive controller) could not change it.
- The embedded policy gets a multi-turn warm-up before RL (--mt_sft_steps, see countdown_env.py; about
  2 minutes once, then cached).

    python ps_grpo.py                                   # PS (fixed ratios), multi-turn Countdown, CPU
    python ps_grpo.py --adaptive                        # PS with adaptive prefix control
    python ps_grpo.py --prefix_sampling false           # GRPO + rejection sampling baseline
    accelerate launch ps_grpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset openai/gsm8k \
        --dataset_config main --use_vllm --dtype bfloat16 --learning_rate 1e-6 --max_new_tokens 512
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
import torch
from accelerate.utils import gather_object

from common.advantages import grpo_advantages, zero_variance
from common.args import BaseArgs
from common.cli import parse_args
from common.countdown_env import Episode, replay_episode
from common.data import PromptSampler
from common.generation import SamplingConfig
from common.losses import clipped_surrogate
from common.masking import right_align
from common.metrics import pass_at_k
from common.runtime import Run, accumulate_gradients, core_metrics, finish_step, my_slice, optimizer_step, start_run

CATEGORIES = ("hard", "easy")


@dataclass
class Args(BaseArgs):
    max_steps: int = 150
    """number of training steps (150: about 6 minutes of RL on 2 CPU cores with the multi-turn default; the closing comparison used 150)"""
    n: int = 8
    """rollouts per task (N); the group for GRPO advantages and for the pass rate k/N"""
    eps_low: float = 0.2
    """clipped surrogate: lower clip range (ratio >= 1 - eps_low)"""
    eps_high: float = 0.28
    """clipped surrogate: upper clip range (ratio <= 1 + eps_high; DAPO clip-higher)"""
    scale_advantages: bool = True
    """GRPO advantages (R - mean) / std; false = R - mean (Dr. GRPO)"""
    mode: Literal["auto", "multiturn", "text"] = "auto"
    """`multiturn`: the Countdown environment, one step per turn; `text`: single-turn completions, a step is a line; `auto`: multiturn for --dataset countdown, text otherwise"""
    env_numbers: int = 4
    """[multiturn] numbers per Countdown problem: 4 gives 3-step episodes, so a prefix can be 1 or 2 steps (3 gives 2-step episodes, where every prefix is 1 step and the ratios cannot change it)"""
    env_max_number: int = 10
    """[multiturn] problem numbers are drawn from 1..env_max_number (10 with 4 numbers: a space enumerated in about a second; 20 with 3 numbers is the single-turn default's space)"""
    max_turns: int = 4
    """[multiturn] turn budget of an episode (it also ends when one number is left, on an invalid action, or when the agent stops)"""
    env_invalid: Literal["end", "retry"] = "end"
    """[multiturn] an invalid action ends the episode (reward 0), or is answered with an error and the state, and the agent tries again"""
    max_action_tokens: int = 16
    """[multiturn] token cap of one action (a turn ends at a newline or EOS); --max_new_tokens caps text-mode completions"""
    mt_sft_steps: int = 400
    """[multiturn] with the embedded model: SFT steps on solver-built episodes of the environment before RL (built once, cached next to the base); the base was only SFT-ed on the single-turn text and cannot act in the environment. 0 = the base as is"""
    prefix_sampling: bool = True
    """[PS] route skewed tasks to Prefix & Mask and inject prefix tasks into the next batch; false = the baseline"""
    low: float = 0.3
    """[PS] pass rate below this (with at least one success) is too-hard"""
    high: float = 0.7
    """[PS] pass rate above this (with at least one failure) is too-easy"""
    remaining_ratio: float = 0.25
    """[PS] too-hard, remaining mode: remaining = min(int(T * remaining_ratio), remaining_cap), prefix = T - remaining steps of a success (initial value under --adaptive)"""
    remaining_cap: int = 1000
    """[PS] cap on the remaining steps of a too-hard prefix task"""
    prefix_ratio: float = 0.25
    """[PS] too-easy, prefix mode: prefix = min(int(T * prefix_ratio), prefix_cap) steps of a failure (initial value under --adaptive)"""
    prefix_cap: int = 1000
    """[PS] cap on the replayed steps of a too-easy prefix task"""
    max_prefix_frac: float = 0.5
    """[PS] at most this fraction of the batch's tasks are prefix tasks; the rest are fresh; prefix tasks over the cap are dropped"""
    adaptive: bool = False
    """[PS] adaptive prefix control: move each category's ratio toward a prefix-task pass rate of 0.5"""
    ema_alpha: float = 0.05
    """[PS] adaptive: EMA coefficient of the per-category prefix-task pass rate"""
    deadzone_low: float = 0.47
    """[PS] adaptive: no adjustment while the EMA is within [deadzone_low, deadzone_high]"""
    deadzone_high: float = 0.53
    """[PS] adaptive: upper edge of the deadzone"""
    ratio_step: float = 0.05
    """[PS] adaptive: size of one ratio adjustment"""
    cooldown: int = 5
    """[PS] adaptive: steps (with prefix tasks of the category) between two adjustments of its ratio"""
    ratio_min: float = 0.05
    """[PS] adaptive: lower clamp of both ratios"""
    ratio_max: float = 0.95
    """[PS] adaptive: upper clamp of both ratios"""
    ema_reset: bool = True
    """[PS] adaptive: restart the (bias-corrected) EMA after each adjustment, so it measures the new ratio only (false: one EMA throughout, which lags and overshoots)"""

    def validate(self) -> None:
        if self.n < 2:
            raise SystemExit(f"--n {self.n}: GRPO needs at least 2 rollouts per task")
        if not 0 < self.low <= self.high < 1:
            raise SystemExit(f"--low {self.low} --high {self.high}: need 0 < low <= high < 1")
        for name in ("remaining_ratio", "prefix_ratio", "max_prefix_frac"):
            if not 0 <= getattr(self, name) <= 1:
                raise SystemExit(f"--{name} {getattr(self, name)}: must be in [0, 1]")
        if not 0 <= self.ratio_min <= self.ratio_max <= 1:
            raise SystemExit(f"--ratio_min {self.ratio_min} --ratio_max {self.ratio_max}: need 0 <= min <= max <= 1")
        if not 0 < self.ema_alpha <= 1 or self.deadzone_low > self.deadzone_high:
            raise SystemExit("--ema_alpha must be in (0, 1] and --deadzone_low <= --deadzone_high")
        if self.remaining_cap < 0 or self.prefix_cap < 0 or self.cooldown < 0:
            raise SystemExit("--remaining_cap, --prefix_cap and --cooldown must be >= 0")
        if self.env_numbers < 2 or self.max_action_tokens < 1:
            raise SystemExit("--env_numbers must be >= 2 and --max_action_tokens >= 1")
        if self.max_turns < self.env_numbers - 1:
            raise SystemExit(f"--max_turns {self.max_turns}: {self.env_numbers} numbers need {self.env_numbers - 1} turns")
        if self.multiturn:
            if self.dataset != "countdown":
                raise SystemExit(f"--mode multiturn: the environment is Countdown; --dataset {self.dataset} needs --mode text")
            if self.reward != "binary":
                raise SystemExit(f"--reward {self.reward}: the multi-turn environment's reward is binary")
        elif (self.env_numbers, self.env_max_number) != (4, 10):  # changed from the defaults
            raise SystemExit("--env_numbers/--env_max_number apply to --mode multiturn only")

    @property
    def multiturn(self) -> bool:
        return self.mode == "multiturn" or (self.mode == "auto" and self.dataset == "countdown")


# ----------------------------------------------------------------------------------------------------
# [PS] Routing, prefix selection and adaptive prefix control (pure functions)
# ----------------------------------------------------------------------------------------------------

def route(k: int, n: int, low: float, high: float) -> str:
    """[PS] The paper's five paths for a task with k of n rollouts passing (Overview, Figure 2)."""
    if k == 0:
        return "all_fail"  # discarded: no success to build a prefix from
    if k == n:
        return "all_pass"  # discarded: no failure to build a prefix from
    p = k / n
    return "too_hard" if p < low else "too_easy" if p > high else "normal"


def prefix_steps(total: int, mode: str, ratio: float, cap: int) -> int | None:
    """[PS] Prefix length K (section "Prefix Selection"), or None when no useful prefix exists.

    remaining mode (too-hard): remaining = min(int(T * ratio), cap), K = T - remaining.
    prefix mode (too-easy):    K = min(int(T * ratio), cap).
    K is then clamped to [1, T - 1]: K = 0 would replay nothing (the same fresh task again, no change of
    difficulty) and K = T would replay the whole trajectory, leaving nothing to generate (its outcome is
    already decided). So a 1-step trajectory (T < 2) yields no prefix task.
    """
    if total < 2:
        return None
    if mode == "remaining":
        k = total - min(int(total * ratio), cap)
    elif mode == "prefix":
        k = min(int(total * ratio), cap)
    else:
        raise ValueError(f"mode must be 'remaining' or 'prefix', got {mode!r}")
    return min(max(k, 1), total - 1)


@dataclass
class PrefixController:
    """[PS] Adaptive prefix control for one category (section "Adaptive Prefix").

    EMA (alpha) of the category's prefix-task pass rate; when it leaves [lo, hi] the ratio moves by +-step
    toward a 50% pass rate, then `cooldown` observations pass before the next move. Both ratios move *up*
    when prefix tasks pass too often: too-hard's remaining_ratio up = fewer replayed success steps = harder,
    too-easy's prefix_ratio up = more replayed failure steps = harder (and down when they fail too often).
    The EMA is bias-corrected (its first value is the first observation) and, with `reset`, restarted after
    every move, so it only averages pass rates measured at the current ratio; a never-restarted EMA keeps
    reporting the old ratio for ~1/alpha steps and the controller overshoots (see tests).
    """
    ratio: float
    raw: float = 0.0  # EMA accumulator, bias-corrected by 1 - (1 - alpha)^n
    n: int = 0  # observations in the accumulator
    wait: int = 0  # observations left before the next move is allowed
    moves: int = 0

    def ema(self, alpha: float) -> float | None:
        return self.raw / (1 - (1 - alpha) ** self.n) if self.n else None

    def update(self, pass_rate: float | None, alpha: float, lo: float, hi: float, step: float, cooldown: int,
               rmin: float, rmax: float, reset: bool = True) -> float:
        """Feed one step's prefix-task pass rate (None: no prefix task of this category); returns the move."""
        if pass_rate is None:
            return 0.0
        self.raw = (1 - alpha) * self.raw + alpha * pass_rate
        self.n += 1
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
                self.raw, self.n = 0.0, 0
        return move


# ----------------------------------------------------------------------------------------------------
# Rollouts: fresh tasks start from the reset state, prefix tasks from a replayed one
# ----------------------------------------------------------------------------------------------------

def rollout_multiturn(generator, tokenizer, prompts: list[list[int]], problems: list, prefixes: list[list], n: int,
                      cfg: SamplingConfig, max_turns: int, invalid: str) -> list[Episode]:
    """n episodes per task, played turn by turn; one generate call per turn for every live episode.

    [PS] Prefix replay: each episode of a prefix task starts from a fresh environment that re-executes the
    stored actions (restoring the numbers, the turn count and the conversation); those tokens are context
    with mask 0 and cost no generation. Observations are context with mask 0 too.
    """
    encode = lambda s: tokenizer(s, add_special_tokens=False).input_ids
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    eos = tokenizer.eos_token_id
    episodes = [replay_episode(problems[g], prefixes[g], g, decode, encode, max_turns, invalid)
                for g in range(len(prompts)) for _ in range(n)]
    while live := [e for e in episodes if not e.env.done]:
        gens = generator.generate([prompts[e.group] + e.ids for e in live], 1, cfg)
        for e, ids, lps in zip(live, gens.completion_ids, gens.logprobs):
            res = e.env.step(decode(ids), final=bool(ids) and ids[-1] == eos)
            e.add_turn(ids, encode(res.observation), lps)  # action: mask 1; observation: mask 0
    for e in episodes:
        e.reward = e.env.reward
    return episodes


def split_lines(ids: list[int], is_break) -> list[list[int]]:
    """Token ids cut into lines: a line ends after a token whose text holds a newline (text-mode steps)."""
    lines, cur = [], []
    for t in ids:
        cur.append(t)
        if is_break(t):
            lines.append(cur)
            cur = []
    return lines + ([cur] if cur else [])


def rollout_text(generator, tokenizer, prompts: list[list[int]], prefixes: list[list], n: int, cfg: SamplingConfig,
                 reward_fn, examples: list, is_break) -> list[Episode]:
    """n single-turn completions per task. [PS] A prefix task's context is prompt + its first K lines
    (mask 0); the continuation gets the rest of the max_new_tokens budget; the reward scores the whole text."""
    contexts = [p + [t for a, _ in pre for t in a] for p, pre in zip(prompts, prefixes)]
    gens = generator.generate(contexts, n, cfg)
    episodes = []
    for i, (ids, lps) in enumerate(zip(gens.completion_ids, gens.logprobs)):
        g = i // n
        e = Episode(g)
        for a, _ in prefixes[g]:
            e.add_turn(a, [])  # replayed line, mask 0
        budget = max(0, cfg.max_new_tokens - len(e.ids))
        ids, lps = ids[:budget], lps[:budget]
        lines = split_lines(ids, is_break)
        if len(lines) > 1 and not tokenizer.decode(lines[-1], skip_special_tokens=True).strip():
            # a tail with no text (the stop token after the last newline) is not a step of its own: otherwise
            # "all but the last step" would replay the whole answer and leave only the stop token to generate
            lines[-2:] = [lines[-2] + lines[-1]]
        pos = 0
        for line in lines:
            e.add_turn(line, [], lps[pos:pos + len(line)])
            pos += len(line)
        e.reward = reward_fn(tokenizer.decode(e.ids, skip_special_tokens=True), examples[g])
        episodes.append(e)
    return episodes


def turn_config(tokenizer, args: Args) -> SamplingConfig:
    """Sampling for one turn: an action ends at the end of its line (or EOS), at most max_action_tokens."""
    nl = tokenizer("\n", add_special_tokens=False).input_ids[-1]
    return SamplingConfig(max_new_tokens=args.max_action_tokens, temperature=args.temperature, stop_token_ids=[nl])


def evaluate_episodes(run: Run, examples: list, args: Args) -> dict:
    """Held-out pass@1 / pass@k of whole episodes in the environment (prompts split across ranks)."""
    acc, k_max = run.acc, args.eval_samples
    mine = examples[acc.process_index::acc.num_processes]
    counts = []
    if mine:
        eps = rollout_multiturn(run.generator, run.tokenizer, [run.encode(e.prompt) for e in mine],
                                [e.answer for e in mine], [[] for _ in mine], k_max, turn_config(run.tokenizer, args),
                                args.max_turns, args.env_invalid)
        counts = [sum(e.reward >= 1.0 for e in eps[i * k_max:(i + 1) * k_max]) for i in range(len(mine))]
    counts = gather_object(counts) if acc.num_processes > 1 else counts
    return {f"eval_pass@{k}": float(np.mean([pass_at_k(k_max, c, k) for c in counts])) for k in sorted({1, k_max})}


def ps_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, n_tok: int,
            eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GRPO clipped surrogate over tokens with mask 1 (DAPO token mean over the batch's n_tok).
    [PS] Prefix masking: replayed prefix tokens (and observations) have mask 0, so they get no gradient."""
    per_tok, clipped = clipped_surrogate(logp, old_logp, adv[:, None], eps_low, eps_high)
    return (per_tok * mask).sum() / max(1, n_tok), (clipped * mask).sum()


def main(args: Args) -> None:
    from common.countdown_env import MultiTurnRecipe, ensure_multiturn_policy, make_env_task
    from common.policy import EMBEDDED, ensure_embedded_base

    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    if args.multiturn and args.model_name_or_path == EMBEDDED and args.mt_sft_steps > 0:
        # the embedded base, warmed up on episodes of the environment (deterministic, so ranks agree on it)
        recipe = MultiTurnRecipe(args.env_numbers, args.env_max_number, args.mt_sft_steps)
        args.model_name_or_path = str(ensure_multiturn_policy(str(ensure_embedded_base()), recipe))
    if args.multiturn:
        env_train, env_eval = make_env_task(args.env_numbers, args.env_max_number, args.eval_prompts, args.prompt_pool)
        # held-out evaluation plays whole episodes; set on the class so start_run's step-0 evaluation does too
        Run.evaluate = lambda self: evaluate_episodes(self, env_eval, args)
    run = start_run(args, "ps_grpo", need_ref=False)
    acc, tokenizer, n = run.acc, run.tokenizer, args.n
    breaks: dict[int, bool] = {}

    def is_break(t: int) -> bool:  # text mode: does this token end a line?
        if t not in breaks:
            breaks[t] = "\n" in tokenizer.decode([t])
        return breaks[t]

    if args.multiturn:
        env_cfg = turn_config(tokenizer, args)
        train, sampler = env_train, PromptSampler(len(env_train), args.seed)
        if "sampler" in run.method_state:
            sampler.load_state_dict(run.method_state["sampler"])
    else:
        train, sampler = run.task.train, run.sampler
    # [PS] prefix tasks for the next batch (identical on every rank), and one controller per category
    queue: list[dict] = run.method_state.get("queue", [])
    init = {"hard": args.remaining_ratio, "easy": args.prefix_ratio}
    ctrl = {c: PrefixController(**run.method_state["ctrl"][c]) if "ctrl" in run.method_state
            else PrefixController(init[c], wait=args.cooldown) for c in CATEGORIES}  # first move after `cooldown` observations

    for step in range(run.start_step + 1, args.max_steps + 1):
        t0 = time.time()
        # ---- [PS] the batch: queued prefix tasks (at most max_prefix_frac of it), then fresh tasks ----
        n_prefix = min(len(queue), int(args.max_prefix_frac * args.prompts_per_step))
        dropped = len(queue) - n_prefix  # dynamic on-policy: prefix tasks are never carried over
        tasks = queue[:n_prefix] + [{"id": i, "cat": None, "steps": []}
                                    for i in sampler.next_ids(args.prompts_per_step - n_prefix)]
        tasks = my_slice(tasks, acc)
        examples = [train[t["id"]] for t in tasks]
        prompts = [run.encode(ex.prompt) for ex in examples]
        prefixes = [t["steps"] for t in tasks]

        # ---- sample N rollouts per task (prefix tasks: [PS] replay the prefix, generate the rest) ----
        if args.multiturn:
            episodes = rollout_multiturn(run.generator, tokenizer, prompts, [ex.answer for ex in examples], prefixes,
                                         n, env_cfg, args.max_turns, args.env_invalid)
        else:
            episodes = rollout_text(run.generator, tokenizer, prompts, prefixes, n, run.sampling, run.task.reward_fn,
                                    examples, is_break)
        t_gen = time.time() - t0
        rewards = torch.tensor([e.reward for e in episodes]).view(-1, n).float()
        success = rewards >= 1.0
        k_pass = success.sum(-1).tolist()
        fresh = torch.tensor([t["cat"] is None for t in tasks], dtype=torch.bool)

        # ---- [PS] route fresh tasks; too-hard / too-easy send one trajectory to Prefix & Mask ----
        routes = [route(k, n, args.low, args.high) for k in k_pass]
        new_tasks = []
        for g, (t, r) in enumerate(zip(tasks, routes)):
            if not args.prefix_sampling or t["cat"] is not None or r not in ("too_hard", "too_easy"):
                continue  # prefix tasks are not recycled again
            cat, want, mode = ("hard", True, "remaining") if r == "too_hard" else ("easy", False, "prefix")
            src = random.choice([e for e in episodes[g * n:(g + 1) * n] if bool(e.reward >= 1.0) == want])
            cap = args.remaining_cap if cat == "hard" else args.prefix_cap
            k = prefix_steps(len(src.steps), mode, ctrl[cat].ratio, cap)
            if k is not None:
                new_tasks.append({"id": t["id"], "cat": cat, "steps": src.steps[:k], "T": len(src.steps)})
        if acc.num_processes > 1:
            new_tasks = gather_object(new_tasks)  # every rank keeps the same queue

        # ---- GRPO advantages (A = (r - mean) / std; the paper's appendix, Perspective 2 uses r - mean);
        #      rejection sampling drops groups whose rollouts all fail or all pass (DeepSWE baseline) ----
        keep = ~zero_variance(rewards)
        adv = grpo_advantages(rewards, scale=args.scale_advantages)
        rows = [i for i in range(len(episodes)) if keep[i // n]]
        adv_rows = adv.flatten()[rows].to(acc.device)
        train_eps = [episodes[i] for i in rows]
        n_tok = sum(e.generated_tokens for e in train_eps)

        # ---- update: clipped surrogate on generated tokens only ([PS] replayed prefix: mask 0) ----
        t1 = time.time()

        def loss_fn(batch, logp, ent, idx):
            mask = batch.loss_mask
            old = right_align([train_eps[i].old_logp for i in idx], batch.completion_width).to(logp.device)
            loss, clipped = ps_loss(logp, old, adv_rows[idx], mask, n_tok, args.eps_low, args.eps_high)
            return loss, {"loss_sum": loss.item() * max(1, n_tok), "ent_sum": (ent * mask).sum().item(),
                          "tok": mask.sum().item(), "clip_sum": clipped.item()}

        sums = accumulate_gradients(run.model, acc, [prompts[e.group] for e in train_eps], [e.ids for e in train_eps],
                                    tokenizer.pad_token_id, args.micro_batch_size, loss_fn,
                                    masks=[e.mask for e in train_eps], temperature=args.temperature)
        optimizer_step(run)
        t_train = time.time() - t1

        # ---- log (core metrics: fresh tasks only, the paper's "training score on no-prefix tasks") ----
        fr = fresh.nonzero().flatten().tolist()
        pre = {c: [g for g, t in enumerate(tasks) if t["cat"] == c] for c in CATEGORIES}
        extra = {
            "solve_partial": float(sum(0 < k < n for k in k_pass)), "prefix_tasks": float(len(tasks) - len(fr)),
            "gen_step": float(sum(e.generated_tokens for e in episodes)),
            "replayed": float(sum(e.replayed_tokens for e in episodes)),
            "kept": float(keep.sum()), "clip_sum": sums.get("clip_sum", 0.0),
            **{f"route_{r}": float(sum(routes[g] == r for g in fr))
               for r in ("all_fail", "all_pass", "normal", "too_hard", "too_easy")},
            **{f"pre_{c}_succ": float(success[pre[c]].sum()) for c in CATEGORIES},
            **{f"pre_{c}_n": float(len(pre[c]) * n) for c in CATEGORIES},
            **{f"pre_{c}_k": float(sum(len(tasks[g]["steps"]) for g in pre[c])) for c in CATEGORIES},
        }
        row, x = core_metrics(run, step, {
            "groups": len(fr), "rollouts": len(episodes), "gen_tokens": extra["gen_step"],
            "reward_sum": float(rewards[fr].sum()), "rewarded": float(rewards[fr].numel()),
            "success": float(success[fr].sum()), "zero_var": float(zero_variance(rewards[fr]).sum()) if fr else 0.0,
            "loss_sum": sums.get("loss_sum", 0.0), "seqs": max(1, n_tok), "kl_sum": 0.0,  # loss: per trained token
            "ent_sum": sums.get("ent_sum", 0.0), "tok": sums.get("tok", 0.0), "t_gen": t_gen, "t_train": t_train,
        }, extra=extra)

        # ---- [PS] adaptive prefix control on this step's prefix-task pass rates (identical on all ranks) ----
        rates = {c: x[f"pre_{c}_succ"] / x[f"pre_{c}_n"] if x[f"pre_{c}_n"] else None for c in CATEGORIES}
        if args.prefix_sampling and args.adaptive:
            for c in CATEGORIES:
                ctrl[c].update(rates[c], args.ema_alpha, args.deadzone_low, args.deadzone_high, args.ratio_step,
                               args.cooldown, args.ratio_min, args.ratio_max, args.ema_reset)
        n_pre_rollouts = x["pre_hard_n"] + x["pre_easy_n"]
        row.update({  # [PS] mechanism metrics
            "ps_solve_partial": x["solve_partial"], "ps_prefix_tasks": x["prefix_tasks"],
            "ps_prefix_pass_rate": (x["pre_hard_succ"] + x["pre_easy_succ"]) / n_pre_rollouts if n_pre_rollouts else None,
            **{f"ps_prefix_pass_rate_{c}": rates[c] for c in CATEGORIES},
            **{f"ps_prefix_steps_{c}": x[f"pre_{c}_k"] * n / x[f"pre_{c}_n"] if x[f"pre_{c}_n"] else None
               for c in CATEGORIES},
            "ps_ratio_hard": ctrl["hard"].ratio, "ps_ratio_easy": ctrl["easy"].ratio,
            **{f"ps_ema_{c}": ctrl[c].ema(args.ema_alpha) for c in CATEGORIES},
            "ps_replayed_tokens": x["replayed"], "ps_generated_tokens": x["gen_step"],
            "ps_fresh_pass_rate": row["pass_rate"], "ps_trained_groups": x["kept"],
            "ps_clip_frac": x["clip_sum"] / max(1.0, x["tok"]),
            "ps_queued": len(new_tasks), "ps_dropped": dropped,
            **{f"ps_route_{r}": x[f"route_{r}"] for r in ("all_fail", "all_pass", "normal", "too_hard", "too_easy")},
        })
        queue = new_tasks  # [PS] injected into the next batch
        state = {"queue": queue, "ctrl": {c: asdict(ctrl[c]) for c in CATEGORIES}}
        if args.multiturn:
            state["sampler"] = sampler.state_dict()
        finish_step(run, step, row, t0, state)


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
