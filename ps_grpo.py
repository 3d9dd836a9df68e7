"""Prefix Sampling (PS) on GRPO, one file.

Paper: Zhu et al., "Prefix Sampling: Targeting 50% Rollout Pass Rate for More Efficient Agentic RL",
Baidu AI Cloud Qianfan technical blog, 2026. Docs: docs/ps_grpo.md.

Baseline (`--prefix_sampling false`): GRPO with A = r - mean (the paper's appendix, Perspective 2: a
group's Var(A) = p(1-p) is the signal strength that peaks at p = 0.5), N rollouts per task, the
clipped surrogate (DAPO clip-higher, token mean), no KL, and rejection of tasks whose N rollouts all
fail or all pass (the paper's DeepSWE baseline). --scale_rewards gives the original GRPO
(DeepSeekMath) A = (r - mean) / std, which sets every mixed group's Var(A) to 1 and so removes the
p(1-p) the paper argues with.
PS routes every fresh task by its rollout pass rate p = k/N: normal (low <= p <= high) trains as is;
too-hard (0 < p < low) and too-easy (high < p < 1) train as is AND send one trajectory to "Prefix &
Mask": the first K steps of a rare success (too-hard: a head start) or of a rare failure (too-easy:
a handicap) become a prefix task injected into the next batch. A prefix task is run by *replaying*
those K steps -- a fresh environment re-executes the stored actions, restoring its state and the
conversation -- and the policy generates only the continuation; replayed tokens get loss mask 0. An
optional EMA controller moves each category's ratio so that prefix tasks pass about 50% of the time.
[PS] lines are the paper's; `--prefix_sampling false` runs none of them but no-ops marked "(also in
GRPO: ...)".

Default task: multi-turn Countdown (common/demo/countdown_env.py), one arithmetic step per turn, the
environment answers with the remaining numbers; observation tokens are context with loss mask 0.
`--environment path.py:ClassName` plays your own environment the same way (common/envs,
docs/custom_env.md).
Real math datasets use the single-turn text mode, where a step is a line of the response and a
prefix is its first K lines.

Design choices the paper leaves open (each is a flag or documented at its function):
- Batch: constant size --prompts_per_step; the previous step's prefix tasks come first, at most
  --max_prefix_frac of the batch, the rest are fresh tasks. Prefix tasks over the cap are dropped,
  never carried over (dynamic on-policy: only the current step's trajectories), and prefix tasks are
  never routed to Prefix & Mask again. A too-hard/too-easy task contributes one trajectory (chosen
  at random).
- Prefix length K is clamped to [1, T-1] (`prefix_steps`: 0 is the fresh task, T leaves nothing);
  T = 1: no prefix.
- Adaptive control keeps one EMA through its moves, as the paper's controller does
  (`PrefixController`); our variant `--ema_reset true` restarts it after each move (benchmark:
  `ps_adaptive` vs `ps_adaptive_reset`). A prefix task records the ratio that built it and runs one
  step later, after the controller's update, so only tasks built with the current ratio feed the
  controller (`attributed`); stale ones are discarded (ps_ctrl_stale_*) but still count in
  ps_prefix_pass_rate_*.
- Loss: the token-level clipped surrogate on generated tokens only (replayed prefix and
  observations: mask 0), DAPO token mean: each rank divides its sum by the ranks' mean trained-token
  count, so that DDP's average over the ranks is the batch's sum over its trained tokens. No KL term
  (`kl` is logged as 0). Logged `loss`: the clipped surrogate per trained token (its sum over all
  ranks / their trained tokens); rejected (all-fail / all-pass) groups are not trained and not
  counted.
- Metrics (each one's meaning: docs/ps_grpo.md): reward_mean, reward_std, pass_rate and
  frac_zero_var_groups cover fresh tasks only (the paper's training score on no-prefix tasks); ps_*
  metrics cover prefix tasks.

    python ps_grpo.py                                   # PS (fixed ratios), multi-turn Countdown
    python ps_grpo.py --adaptive                        # PS with adaptive prefix control
    python ps_grpo.py --prefix_sampling false           # GRPO + rejection sampling baseline
    python ps_grpo.py --environment my_env.py:MyGame    # your own agent environment
    accelerate launch ps_grpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --dataset_name openai/gsm8k --dataset_config main --use_vllm --dtype bfloat16 \
        --learning_rate 1e-6 --max_completion_length 512
"""

from __future__ import annotations

import functools
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated, ClassVar, Literal, Optional

import torch

from common.distributed.ranks import (
    gather_list,
    gathered,
    micro_batches,
    my_slice,
    rank_mean,
)
from common.generation.hf import SamplingConfig
from common.rl.advantages import grpo_advantages, zero_variance
from common.rl.episode import Episode
from common.rl.logprobs import Forward
from common.rl.losses import clipped_surrogate
from common.run.checkpoint import Checkpoints
from common.run.export import export_model
from common.run.flags import (
    DataFlags,
    EvalFlags,
    GenerationFlags,
    LogFlags,
    ModelFlags,
    OutputFlags,
    Range,
    RewardFlags,
    ScaleFlags,
    TrainingFlags,
    parse_args,
)
from common.run.logs import RunLog, first_of_each_kind
from common.run.process import GracefulStop, end_processes
from common.run.setup import (
    load_training_policy,
    make_compiled,
    make_generator,
    make_optimizer,
    make_task,
    packed_row_tokens,
    prepare_training,
    sampling_configs,
    shard_models,
    start_run,
)
from common.run.step_metrics import rollout_sums
from common.run.summary import run_summary
from common.tasks.evaluation import (
    evaluate_policy,
    evaluate_train_prompts,
    pass_metrics,
    train_prompt_sample,
)
from common.tasks.loading import PromptEncoder, PromptSampler
from common.tasks.scoring import Scored

CATEGORIES = ("hard", "easy")  # [PS] too-hard tasks replay a success, too-easy tasks a failure
ROUTES = ("all_fail", "all_pass", "normal", "too_hard", "too_easy")


@dataclass
class Args(
    ModelFlags,
    DataFlags,
    RewardFlags,
    GenerationFlags,
    TrainingFlags,
    EvalFlags,
    ScaleFlags,
    OutputFlags,
    LogFlags,
):
    # TRL's names for what this file does: the loss divides by the batch's completion tokens
    trl_equivalents: ClassVar[dict] = {"loss_type": "dapo"}
    # the step's hyperparameters (the same names in every script): its length, batch and update
    max_steps: Annotated[int, Range(1)] = 150
    """number of policy updates (one batch of tasks each)"""
    prompts_per_step: Annotated[int, Range(1)] = 32
    """prompts per step across all processes (every rank takes every world-th one; with fewer
    prompts than processes the ranks without one idle through the step)"""
    max_completion_length: Annotated[int, Range(1)] = 48
    """maximum completion length; a completion cut by it gets reward 0 from the built-in rewards
    (never a success), its functions' total from --reward_funcs"""
    mask_truncated_completions: bool = False
    """completions cut by the length limit get no gradient (TRL's flag); `clipped_ratio` is logged
    either way"""
    vllm_importance_sampling_correction: Optional[bool] = None
    """reweight each sampled token by rho = pi_trainer / pi_sampler under the sampling weights
    (TRL's flag); asked for with HF generate, whose log-probs come from its own cached decode, rho
    is about 1 in fp32 (a check rather than a correction; under --dtype bfloat16 the two passes
    differ by up to a few hundredths of a nat) (default: on with --use_vllm, as TRL, off with HF
    generate)"""
    vllm_importance_sampling_mode: Literal[
        "sequence_mask", "sequence_truncate", "token_mask", "token_truncate"
    ] = "sequence_mask"
    """how the ratio enters the policy-gradient term (TRL's modes): per `token` or one per
    `sequence` (the product over its sampled tokens); ratios outside [clip_min, clip_max] are
    zeroed (`mask`) or clipped to the range (`truncate`)"""
    vllm_importance_sampling_clip_max: Annotated[Optional[float], Range(0, lo_open=True)] = 3.0
    """upper bound C_max of the ratio (null in a --config file: none)"""
    vllm_importance_sampling_clip_min: Annotated[Optional[float], Range(0)] = None
    """lower bound C_min of the ratio, below --vllm_importance_sampling_clip_max (default: none)"""
    micro_batch_size: Annotated[int, Range(1)] = 64
    """sequences per forward/backward pass (gradients are accumulated over the step's batch)"""
    max_tokens_per_microbatch: Annotated[int, Range(0, zero="off")] = 0
    """if > 0, micro-batches are cut by this many prompt + completion tokens instead of
    --micro_batch_size sequences, so long and short completions cost what they are"""
    max_grad_norm: Annotated[float, Range(0, lo_open=True)] = 1.0
    """gradient clipping norm"""
    num_generations: Annotated[int, Range(2)] = 8
    """rollouts per task (N); the group for GRPO advantages and for the pass rate k/N"""
    epsilon: Annotated[float, Range(0, 1, hi_open=True)] = 0.2
    """clipped surrogate: lower clip range (ratio >= 1 - epsilon)"""
    epsilon_high: Annotated[float, Range(0)] = 0.28
    """clipped surrogate: upper clip range (ratio <= 1 + epsilon_high; DAPO clip-higher)"""
    scale_rewards: bool = False
    """GRPO advantages: false = r - mean (the paper's appendix: a group's Var(A) = p(1-p), the
    signal PS raises); true = (r - mean) / std (original GRPO, DeepSeekMath: every mixed group gets
    Var(A) = 1)"""
    mode: Literal["auto", "multiturn", "text"] = "auto"
    """`multiturn`: an environment, a step per turn (--environment's, else Countdown's); `text`: a
    line per step; `auto`: multiturn with --environment or for --dataset_name countdown"""
    environment: Optional[str] = None
    """[multiturn] your environment class, `path/to/file.py:ClassName` or `package.module:ClassName`
    (docs/custom_env.md): one instance per episode, `reset(**row)` with --dataset_name's rows, else
    `reset(seed=i)` for task i of --prompt_pool tasks (1024 when 0); held out: the rows a text task
    holds out (a one-file dataset's last rows), else the seeds after the pool; checked, and its
    convention and split stated, before the model loads (default: none, Countdown's environment)"""
    env_numbers: Annotated[
        int, Range(2, zero="the embedded task's level mix of 2, 3 and 5 numbers")
    ] = 0
    """[multiturn] numbers per Countdown problem (an episode takes env_numbers - 1 steps; the level
    mix: 1, 2 and 4 steps)"""
    env_max_number: Annotated[int, Range(2)] = 10
    """[multiturn] with --env_numbers > 0, problem numbers are drawn from 1..env_max_number"""
    max_turns: Annotated[int, Range(1)] = 4
    """[multiturn] turn budget of an episode (it also ends when the environment says done:
    Countdown's at one number left, an invalid action or a stop)"""
    env_invalid: Literal["end", "retry"] = "end"
    """[multiturn] an invalid action: `end` the episode (reward 0), or `retry` (answered with an
    error + the state)"""
    max_action_tokens: Annotated[
        int, Range(1, zero="16 tokens for the text protocol, 256 for TRL's environment_factory")
    ] = 0
    """[multiturn] token cap of one action (a turn ends at EOS / end of turn, or at a newline
    without a chat template); by default 16 for the text protocol (Countdown's steps) and 256 in
    TRL's environment_factory convention, where an action is a whole tool call; text mode:
    --max_completion_length"""
    mt_sft_steps: Annotated[int, Range(0, zero="none")] = 400
    """[multiturn] embedded model: SFT steps on solver-built episodes before RL (built once,
    cached)"""
    prefix_sampling: bool = True
    """[PS] route skewed tasks to Prefix & Mask and inject prefix tasks into the next batch; false =
    the baseline"""
    low: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = 0.3
    """[PS] pass rate below this (with at least one success) is too-hard"""
    high: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = 0.7
    """[PS] pass rate above this (with at least one failure) is too-easy"""
    remaining_ratio: Annotated[float, Range(0, 1)] = 0.25
    """[PS] too-hard: replay T - min(int(T * remaining_ratio), remaining_cap) steps of a success
    (--adaptive: start)"""
    remaining_cap: Annotated[int, Range(0)] = 1000
    """[PS] cap on the remaining steps of a too-hard prefix task"""
    prefix_ratio: Annotated[float, Range(0, 1)] = 0.25
    """[PS] too-easy: replay min(int(T * prefix_ratio), prefix_cap) steps of a failure (--adaptive:
    start value)"""
    prefix_cap: Annotated[int, Range(0)] = 1000
    """[PS] cap on the replayed steps of a too-easy prefix task"""
    max_prefix_frac: Annotated[float, Range(0, 1)] = 0.5
    """[PS] at most this fraction of the batch's tasks are prefix tasks (the rest fresh; those over
    it: dropped)"""
    adaptive: bool = False
    """[PS] adaptive prefix control: move each category's ratio toward a prefix-task pass rate of
    0.5"""
    ema_alpha: Annotated[float, Range(0, 1, lo_open=True)] = 0.05
    """[PS] adaptive: EMA coefficient of the per-category pass rate of prefix tasks built with the
    current ratio"""
    deadzone_low: Annotated[float, Range(0, 1)] = 0.47
    """[PS] adaptive: no adjustment while the EMA is within [deadzone_low, deadzone_high]"""
    deadzone_high: Annotated[float, Range(0, 1)] = 0.53
    """[PS] adaptive: upper edge of the deadzone"""
    ratio_step: Annotated[float, Range(0, 1, lo_open=True)] = 0.05
    """[PS] adaptive: size of one ratio adjustment"""
    cooldown: Annotated[int, Range(0)] = 5
    """[PS] adaptive: steps (with prefix tasks built with the current ratio) between two moves of a
    category's ratio"""
    ratio_min: Annotated[float, Range(0, 1)] = 0.05
    """[PS] adaptive: lower clamp of both ratios"""
    ratio_max: Annotated[float, Range(0, 1)] = 0.95
    """[PS] adaptive: upper clamp of both ratios"""
    ema_reset: bool = False
    """[PS] adaptive: restart the EMA after each move (our variant); false = one EMA throughout, the
    paper's"""

    def validate(self) -> None:
        """The flags' combinations (single values: their declarations, common/run/flags.py)."""
        problems = []
        pairs = (("low", "high"), ("ratio_min", "ratio_max"), ("deadzone_low", "deadzone_high"))
        for lo, hi in pairs:
            if getattr(self, lo) > getattr(self, hi):
                problems.append(
                    f"--{lo} {getattr(self, lo)} --{hi} {getattr(self, hi)}: need {lo} <= {hi}"
                )
        # 10: the default, unused unless drawing numbers
        if self.env_max_number != 10 and not (self.multiturn and self.env_numbers):
            problems.append(
                f"--env_max_number {self.env_max_number}: applies to multiturn with "
                "--env_numbers > 0"
            )
        if not self.environment and self.max_turns < (self.env_numbers or 5) - 1:
            problems.append(
                f"--max_turns {self.max_turns}: {self.env_numbers} numbers need more turns"
            )
        if self.environment:
            if self.mode == "text":
                problems.append(f"--environment {self.environment}: not with --mode text")
            if self.env_numbers or self.env_invalid != "end":
                problems.append("--env_numbers / --env_invalid: the embedded environment's only")
            if self.eval_reward_funcs:
                problems.append(
                    "--eval_reward_funcs: with --environment the evaluation scores as training does"
                )
        elif self.multiturn:
            if self.dataset_name != "countdown":
                problems.append(
                    f"--mode multiturn needs --dataset_name countdown, got {self.dataset_name}: "
                    "use --mode text, or --environment for your own environment"
                )
            # they apply to --mode text
            if self.reward not in ("auto", "binary") or self.reward_funcs or self.eval_reward_funcs:
                problems.append(
                    f"--reward {self.reward} / --reward_funcs: multi-turn keeps its binary reward"
                )
        elif self.env_numbers:
            problems.append(f"--env_numbers {self.env_numbers}: applies to --mode multiturn only")
        if problems:
            raise SystemExit("\n".join(problems))

    @property
    def multiturn(self) -> bool:
        if self.mode == "auto":
            return self.dataset_name == "countdown" or self.environment is not None
        return self.mode == "multiturn"


# ----------------------------------------------------------------------------------------------
# The batch's tasks, and [PS] routing, prefix selection and adaptive prefix control
# ----------------------------------------------------------------------------------------------


@dataclass
class BatchTask:
    """One task of a step's batch: a fresh task from the pool (`category` None, nothing to replay),
    or [PS] a prefix task, the first K steps of one of a skewed task's trajectories, replayed before
    the policy generates the rest."""

    prompt_id: int
    category: str | None = None  # [PS] "hard" (a success's prefix) or "easy" (a failure's)
    steps: list = field(default_factory=list)  # [PS] the K (action ids, observation ids) replayed
    source_steps: int = 0  # [PS] T, the length of the trajectory the prefix was cut from
    ratio: float | None = None  # [PS] the category's ratio that built it (`attributed`)
    prompt: list = field(default_factory=list)  # [PS] the first observation's tokens, checked
    snapshot: object = None  # [PS] the environment's snapshot() at step K (never checkpointed)
    chat: list = field(default_factory=list)  # [PS] with the snapshot: its turns' chat messages

    @property
    def kind(self) -> str:
        """`fresh`, `prefix_hard` or `prefix_easy` (samples.jsonl's kinds)."""
        if self.category is None:
            return "fresh"
        return f"prefix_{self.category}"


def route(k: int, n: int, low: float, high: float) -> str:
    """[PS] (also in GRPO: counted in `ps_route_*`) The paper's five paths for k of n rollouts
    passing (Figure 2); n counts the rollouts the environment did not fail ("none" when it failed
    every one: the task takes no path)."""
    if n == 0:
        return "none"
    # discarded: no success (all_fail) / no failure (all_pass) to build a prefix from
    if k == 0:
        return "all_fail"
    if k == n:
        return "all_pass"
    if k / n < low:
        return "too_hard"
    if k / n > high:
        return "too_easy"
    return "normal"


def prefix_steps(total: int, mode: str, ratio: float, cap: int) -> int | None:
    """[PS] Prefix length K (section "Prefix Selection"), or None when no useful prefix exists.

    remaining mode (too-hard): remaining = min(int(T * ratio), cap), K = T - remaining; prefix mode
    (too-easy): K = min(int(T * ratio), cap). K is then clamped to [1, T - 1]: K = 0 would replay
    nothing (the same fresh task again, no change of difficulty) and K = T would replay the whole
    trajectory, leaving nothing to generate (its outcome is already decided). So a 1-step trajectory
    (T < 2) yields no prefix task.
    """
    if mode not in ("remaining", "prefix"):
        raise ValueError(f"mode must be 'remaining' or 'prefix', got {mode!r}")
    if total < 2:
        return None
    # prefix mode: K; remaining mode: the steps left to generate
    k = min(int(total * ratio), cap)
    if mode == "remaining":
        k = total - k
    return min(max(k, 1), total - 1)


def make_prefix_task(
    task: BatchTask, category: str, group: list[Episode], passed: list[bool], ratio: float, args
) -> BatchTask | None:
    """[PS] Prefix & Mask (Figure 2) for a skewed fresh task: one of its trajectories, drawn at
    random, cut to its first K steps at the category's current `ratio` (`prefix_steps`), as a task
    for the next batch; None when that trajectory has no proper prefix (or none fits). Too-hard: a
    success, K by the steps left (--remaining_ratio, --remaining_cap); too-easy: a failure, K
    replayed (--prefix_ratio, --prefix_cap). An unscored rollout is not a success; an episode the
    environment failed (`Episode.env_error`) is neither: never a prefix. The snapshot is the one
    taken after turn K (`Episode.snapshots[K - 1]`)."""
    want_success = category == "hard"
    sources = [
        episode
        for episode, ok in zip(group, passed)
        if ok == want_success and not episode.env_error
    ]
    if not sources:
        return None
    source = random.choice(sources)
    total = len(source.steps)
    if category == "hard":
        steps = prefix_steps(total, "remaining", ratio, args.remaining_cap)
    else:
        steps = prefix_steps(total, "prefix", ratio, args.prefix_cap)
    if steps is None:
        return None
    # an environment with snapshot() / restore(): its state after step K, restored on replay
    snapshot = source.snapshots[steps - 1] if len(source.snapshots) >= steps else None
    prefix = source.steps[:steps]
    # TRL's convention: the stored turns' chat messages, for the reward functions
    chat = source.chat[: steps + 1] if snapshot is not None else []
    return BatchTask(task.prompt_id, category, prefix, total, ratio, source.prompt, snapshot, chat)


@dataclass
class PrefixController:
    """[PS] (also in GRPO: built, never moved) Adaptive prefix control for one category (section
    "Adaptive Prefix").

    EMA (alpha) of the category's prefix-task pass rate; when it leaves [lo, hi] the ratio moves by
    +-step toward a 50% pass rate, then `cooldown` observations pass before the next move. Both
    ratios move *up* when prefix tasks pass too often: too-hard's remaining_ratio up = fewer
    replayed success steps = harder, too-easy's prefix_ratio up = more replayed failure steps =
    harder (and down when they fail too often). The EMA is bias-corrected (its first value is the
    first observation) and kept through the moves (the paper); with `reset` (our variant) it
    restarts after every move, so it only averages pass rates measured at the current ratio: a
    never-restarted EMA keeps reporting the old ratio for ~1/alpha steps and the controller
    overshoots (see tests). The caller feeds only prefix tasks built with the current ratio
    (`attributed`): those run one step after they were built, so the first batch after a move still
    measures the old ratio.
    """

    ratio: float
    raw: float = 0.0  # EMA accumulator, bias-corrected by 1 - (1 - alpha)^observations
    observations: int = 0  # pass rates in the accumulator
    wait: int = 0  # observations left before the next move is allowed
    moves: int = 0

    def ema(self, alpha: float) -> float | None:
        if not self.observations:
            return None
        return self.raw / (1 - (1 - alpha) ** self.observations)

    def update(
        self,
        pass_rate: float | None,
        alpha: float,
        lo: float,
        hi: float,
        step: float,
        cooldown: int,
        rmin: float,
        rmax: float,
        reset: bool = False,
    ) -> float:
        """Feed one step's prefix-task pass rate (None: no prefix task of this category); returns
        the move."""
        if pass_rate is None:
            return 0.0
        self.raw = (1 - alpha) * self.raw + alpha * pass_rate
        self.observations += 1
        if self.wait > 0:
            self.wait -= 1
            return 0.0
        ema = self.ema(alpha)
        target = self.ratio
        if ema > hi:
            target = self.ratio + step
        elif ema < lo:
            target = self.ratio - step
        new = round(min(rmax, max(rmin, target)), 10)
        move = new - self.ratio
        if move != 0:
            self.ratio = new
            self.wait = cooldown
            self.moves += 1
            if reset:
                self.raw = 0.0
                self.observations = 0
        return move


def make_controllers(args: Args, saved: dict | None) -> dict[str, PrefixController]:
    """[PS] (also in GRPO: built, never moved) One controller per category at its starting ratio,
    its first move after --cooldown observations; a resume's as saved."""
    if saved is not None:
        return {category: PrefixController(**saved["ctrl"][category]) for category in CATEGORIES}
    start = {"hard": args.remaining_ratio, "easy": args.prefix_ratio}
    return {
        category: PrefixController(start[category], wait=args.cooldown) for category in CATEGORIES
    }


@dataclass
class Attributed:
    """[PS] (also in GRPO: all 0) A controller's input (`attributed`): its category's prefix tasks
    built with its current ratio, their passing rollouts, the stale ones built with an earlier
    ratio (counted, never fed), and the attributed tasks' rollouts the environment failed (out of
    the pass rate)."""

    tasks: float
    success: float
    stale: float
    failed: float = 0.0

    def pass_rate(self, n: int) -> float | None:
        """Passing rollouts per rollout of the attributed tasks, n each, less those the environment
        failed (None: no such task, or no rollout left)."""
        counted = self.tasks * n - self.failed
        if not self.tasks or counted <= 0:
            return None
        return self.success / counted


def attributed(
    tasks: list[BatchTask], passes: list[int], category: str, ratio: float, failed=None
) -> Attributed:
    """[PS] (also in GRPO: counts none) `category`'s prefix tasks built with `ratio`, its current
    one.

    A prefix task is built at step t with the ratio before the controller's update at the end of
    step t, and runs at step t + 1; after a move its pass rate measures the old ratio. Such stale
    tasks are counted but discarded, never attributed to the new ratio. `failed`: each task's
    rollouts the environment failed (None: none). This rank's counts; the caller sums them over
    ranks (`controller_input`).
    """
    mine = [group for group, task in enumerate(tasks) if task.category == category]
    current = [group for group in mine if tasks[group].ratio == ratio]
    success = sum(passes[group] for group in current)
    lost = sum(failed[group] for group in current) if failed is not None else 0
    return Attributed(len(current), success, len(mine) - len(current), lost)


def controller_counts(
    tasks: list[BatchTask], passes: list[int], controllers: dict, failed=None
) -> dict:
    """[PS] (also in GRPO: all 0) This rank's `attributed` counts of each category at its
    controller's current ratio, as named sums of the step."""
    counts = {}
    for category in CATEGORIES:
        mine = attributed(tasks, passes, category, controllers[category].ratio, failed)
        counts.update({f"ctrl_{category}_{name}": value for name, value in asdict(mine).items()})
    return counts


def env_failed(episodes: list[Episode], n: int) -> list[int]:
    """Each task's rollouts (n each) the environment failed (`Episode.env_error`): they have no
    reward and count in no pass rate."""
    return [sum(e.env_error for e in episodes[i : i + n]) for i in range(0, len(episodes), n)]


def ps_grpo_sums(
    tasks, episodes, rewards, success, truncated, routes, keep, trained_advantages, controllers
) -> dict:
    """The step's sums (`rewards`, `success`: [tasks, N]). reward_mean / _std, pass_rate and
    frac_zero_var_groups count fresh tasks only (the paper's training score, `rollout_sums`); the
    rest covers every rollout. [PS] (also in GRPO: all 0 but the routes) the prefix tasks' counts,
    the fresh tasks' routes, the trained groups and their A^2 (the appendix's signal strength), and
    the controllers' input (`controller_counts`). clip_sum starts at 0: the update adds it, and a
    rank with no trained row runs no micro-batch. A rollout the environment failed
    (`Episode.env_error`) counts in no pass rate."""
    n = rewards.shape[1]
    passes = success.sum(-1).tolist()
    failed = env_failed(episodes, n)
    fresh = [group for group, task in enumerate(tasks) if task.category is None]
    zero_var = zero_variance(rewards[fresh]).sum()
    sums = rollout_sums(
        len(fresh), rewards[fresh], success[fresh].sum(), zero_var, sum(truncated), []
    )
    sums |= {
        # every rollout, prefix tasks' too; generated tokens only (a replayed prefix costs none)
        "rollouts": len(episodes),
        "gen_tokens": sum(episode.generated_tokens for episode in episodes),
        "ps_replayed_tokens": sum(episode.replayed_tokens for episode in episodes),
        # [PS] (also in GRPO) every task of the batch, prefix tasks too
        "ps_solve_partial": sum(0 < k < n - lost for k, lost in zip(passes, failed)),
        "trained_groups": keep.sum(),
        "adv_sq_sum": (trained_advantages**2).sum(),
        "clip_sum": 0.0,
    }
    for category in CATEGORIES:
        groups = [group for group, task in enumerate(tasks) if task.category == category]
        sums[f"prefix_{category}_tasks"] = len(groups)
        sums[f"prefix_{category}_success"] = success[groups].sum()
        sums[f"prefix_{category}_steps"] = sum(len(tasks[group].steps) for group in groups)
        sums[f"prefix_{category}_failed"] = sum(failed[group] for group in groups)
    sums |= {f"ps_route_{name}": sum(routes[group] == name for group in fresh) for name in ROUTES}
    return sums | controller_counts(tasks, passes, controllers, failed)


def controller_input(totals: dict) -> dict[str, Attributed]:
    """[PS] (also in GRPO: all 0) Each category's `controller_counts` summed over ranks (the step's
    totals: the same on every rank)."""
    return {
        category: Attributed(
            *(totals[f"ctrl_{category}_{name}"] for name in ("tasks", "success", "stale", "failed"))
        )
        for category in CATEGORIES
    }


# ----------------------------------------------------------------------------------------------
# Rollouts: fresh tasks start from the reset state, prefix tasks from a replayed one
# ----------------------------------------------------------------------------------------------


def env_rollouts(
    env, generator, tasks: list, n: int, cfg
) -> tuple[list[Episode], list[bool], list]:
    """n episodes per task in an `AgentEnv`, played turn by turn (common/envs/rollout.py).

    [PS] Prefix replay: each episode of a prefix task starts on a fresh instance restored to the
    stored trajectory's step K (`restore(snapshot)`, else `reset` and the first K actions executed
    again, each observation checked); those tokens are context with mask 0 and cost no generation.
    A prefix task whose replay diverged is dropped. Returns (episodes, clipped, the kept tasks)."""
    from common.envs.rollout import Prefix

    rows = [env.train[task.prompt_id].row for task in tasks]
    prefixes = [Prefix(task.steps, task.prompt, task.snapshot, task.chat) for task in tasks]
    out = env.runner.play(generator, rows, prefixes, n, cfg)
    env.counts = {
        "env_errors": out.errors,
        "replay_tasks": out.replayed,
        "replay_mismatch": out.mismatched,
        "actions": out.actions,
        "actions_cut": out.actions_cut,
        "tool_calls": out.tool_calls,
        "tool_failures": out.tool_failures,
    }
    return out.episodes, out.truncated, [tasks[task] for task in out.kept]


def split_lines(ids: list[int], is_break) -> list[list[int]]:
    """Token ids cut into lines: a line ends after a token whose text holds a newline (text-mode
    steps)."""
    lines, current = [], []
    for token in ids:
        current.append(token)
        if is_break(token):
            lines.append(current)
            current = []
    if current:
        lines.append(current)
    return lines


def line_breaks(tokenizer):
    """Text mode: `is_break(token)`, whether a token's text holds a newline (ends a step);
    cached."""

    @functools.cache
    def is_break(token: int) -> bool:
        return "\n" in tokenizer.decode([token])

    return is_break


def rollout_text(
    generator,
    tokenizer,
    prompts: list[list[int]],
    prefixes: list[list],
    n: int,
    cfg: SamplingConfig,
    is_break,
) -> tuple[list[Episode], list[bool]]:
    """n single-turn completions per task. [PS] A prefix task's context is prompt + its first K
    lines (mask 0); the continuation gets the rest of the max_new_tokens budget; the caller's reward
    scores the whole text. Returns (episodes, clipped): clipped[i] is True when completion i was cut
    by max_new_tokens or the budget."""
    contexts = []
    for prompt, prefix in zip(prompts, prefixes):
        replayed = [token for action, _ in prefix for token in action]
        contexts.append(prompt + replayed)
    gens = generator.generate(contexts, n, cfg)
    episodes, clipped = [], []
    for i, (ids, logprobs) in enumerate(zip(gens.completion_ids, gens.logprobs)):
        group = i // n
        episode = Episode(group)
        for action, _ in prefixes[group]:
            # [PS] a replayed line, mask 0
            episode.add_turn(action, [])
        budget = max(0, cfg.max_new_tokens - len(episode.ids))
        clipped.append(gens.finish_reasons[i] == "length" or len(ids) > budget)
        ids = ids[:budget]
        logprobs = logprobs[:budget]
        lines = split_lines(ids, is_break)
        if len(lines) > 1 and not tokenizer.decode(lines[-1], skip_special_tokens=True).strip():
            # a tail with no text (the stop token after the last newline) is not a step of its own:
            # otherwise "all but the last step" would replay the whole answer and leave only the
            # stop token to generate
            lines[-2:] = [lines[-2] + lines[-1]]
        position = 0
        for line in lines:
            episode.add_turn(line, [], logprobs[position : position + len(line)])
            position += len(line)
        episodes.append(episode)
    return episodes, clipped


# --max_action_tokens 0: an action's cap by convention (a tool call needs far more than a line)
ACTION_TOKENS = {"text": 16, "tools": 256}


def turn_config(
    tokenizer, args: Args, temperature: float, lines: bool = True, tools: bool = False
) -> SamplingConfig:
    """Sampling for one turn at `temperature`: an action ends at an end token (EOS, end of turn),
    at the end of its line with `lines` (raw text: one action per line), or at max_action_tokens
    (0: ACTION_TOKENS of the convention, `tools`: TRL's environment_factory)."""
    stops = [tokenizer("\n", add_special_tokens=False).input_ids[-1]] if lines else []
    cap = args.max_action_tokens or ACTION_TOKENS["tools" if tools else "text"]
    return SamplingConfig(max_new_tokens=cap, temperature=temperature, stop_token_ids=stops)


def multiturn_warm_up(args: Args, accelerator, log) -> str | None:
    """[multiturn] The embedded model warmed up on solver-built episodes of the environment (built
    once by rank 0, cached: the others find it); None when the run loads --model_name_or_path as it
    is."""
    countdown = args.multiturn and not args.environment
    if args.model_name_or_path != "embedded" or not countdown or args.mt_sft_steps <= 0:
        return None
    from common.demo.countdown_env import MultiTurnRecipe, ensure_multiturn_policy
    from common.demo.tiny_model import ensure_embedded_base

    recipe = MultiTurnRecipe(args.env_numbers, args.env_max_number, args.mt_sft_steps)
    with accelerator.main_process_first():
        base = str(ensure_embedded_base(log=log))
        return str(ensure_multiturn_policy(base, recipe, log=log))


def fixed_scored(rewards: list[float], truncated: list[bool], success_reward: float) -> Scored:
    """The environment's rewards as a batch's `Scored`: a cut episode has no final answer: 0, never
    a success."""
    total = [0.0 if cut else float(reward) for reward, cut in zip(rewards, truncated)]
    success = [not cut and value >= success_reward for value, cut in zip(total, truncated)]
    return Scored(total, {}, 0.0, success)


def without_failed(scored: Scored, failed: list[bool]) -> Scored:
    """`scored` less the rewards of the episodes the environment failed: a NaN total, as a
    completion no function scored (advantage 0, out of its group's mean and std), no function's
    value, never a success."""
    if not any(failed):
        return scored
    scored.total = [math.nan if bad else total for total, bad in zip(scored.total, failed)]
    scored.values = {
        name: [None if bad else value for value, bad in zip(values, failed)]
        for name, values in scored.values.items()
    }
    scored.success = [ok and not bad for ok, bad in zip(scored.success, failed)]
    return scored


def evaluate_episodes(
    env, generator, tasks: list, args: Args, accelerator, cfg, what="held-out evaluation (eval_*)"
) -> dict:
    """Held-out pass@1 / pass@k (every power of two k <= --eval_samples) of whole episodes in the
    environment `env`, turns sampled with `cfg` (tasks split across ranks). An evaluation (`what`)
    whose every episode the environment failed measured nothing: its metrics are NaN, said in one
    line quoting its first fault, and the run goes on (a training batch's would stop it)."""
    samples = args.eval_samples
    mine = tasks[accelerator.process_index :: accelerator.num_processes]
    counts = []
    if mine:
        rows = [task.row for task in mine]
        out = env.play(generator, rows, samples, cfg)
        passed = env.score(out.episodes, mine, out.truncated, None).success
        for i, task in enumerate(mine):
            episodes = out.episodes[i * samples : (i + 1) * samples]
            failed = sum(episode.env_error for episode in episodes)
            fault = out.faults[0] if out.faults else ""
            counts.append((sum(passed[i * samples : (i + 1) * samples]), task.tag, failed, fault))
    counts = gather_list(accelerator, counts)
    metrics = pass_metrics([c[0] for c in counts], samples, [c[1] for c in counts])
    if counts and sum(c[2] for c in counts) == len(counts) * samples:
        fault = next(c[3] for c in counts if c[3])
        env.warn(
            f"the {what}: environment {env.env.name} failed in all {len(counts) * samples} "
            f"episodes, so it is recorded as NaN this time and the run goes on; its first fault: "
            f"{fault}"
        )
        metrics = {name: math.nan for name in metrics}
    return metrics


# ----------------------------------------------------------------------------------------------
# The environment, chosen once: its tasks, rollouts, rewards and evaluation
# ----------------------------------------------------------------------------------------------


class AgentEnv:
    """--mode multiturn: an environment played a turn at a time (common/envs), yours
    (--environment, docs/custom_env.md) or the embedded Countdown one; the environment's reward
    (plus --reward_funcs' on the whole conversation), an episode succeeds at >= --success_reward
    (default 1); the evaluation plays whole episodes."""

    def __init__(self, args: Args, tokenizer, log, opened=None):
        from common.envs.protocol import Environment
        from common.envs.rollout import EnvRunner, Renderer
        from common.envs.tasks import reward_funcs

        self.args, self.tokenizer = args, tokenizer
        if args.environment:
            # (environment, train, held out): `open_environment`'s, before the model loaded
            if opened is None:
                from common.envs.startup import open_environment

                opened = open_environment(args, log)
            self.env, self.train, self.held_out = opened
        else:
            from common.demo.countdown_env import CountdownGame

            factory = functools.partial(CountdownGame, args.max_turns, args.env_invalid)
            self.train, self.held_out = countdown_tasks(args)
            self.env = Environment(factory)
        # [multiturn] observations through the chat template when the tokenizer has one
        chat = args.use_chat_template != "no" and getattr(tokenizer, "chat_template", None)
        self.runner = EnvRunner(self.env, Renderer(tokenizer, bool(chat)), args.max_turns, log)
        self.success_reward = 1.0 if args.success_reward is None else args.success_reward
        # the environment's reward under its class's name (TRL's), with --reward_funcs' own
        self.name = self.env.name if args.environment else None
        # --reward_funcs: scored on the whole conversation, added to the environment's reward
        self.funcs = reward_funcs(args, len(self.train), log) if args.reward_funcs else None
        # one action per generate call (raw text: a line); TRL's convention: a tool call
        tools = not self.env.text
        self.sampling = turn_config(tokenizer, args, args.temperature, not chat, tools)
        eval_temperature = sampling_configs(args)[1].temperature
        self.eval_sampling = turn_config(tokenizer, args, eval_temperature, not chat, tools)
        self.counts = {}
        self.warned_cut = False

    def play(self, generator, rows, n, cfg):
        """n fresh episodes per row of an evaluation: their `Rollouts` (every one failed does not
        stop the run: `evaluate_episodes` says so)."""
        from common.envs.rollout import Prefix

        return self.runner.play(generator, rows, [Prefix() for _ in rows], n, cfg, evaluation=True)

    def rollout_batch(self, generator, tasks, n):
        """n episodes per task (`env_rollouts`): (episodes, truncated, the kept tasks)."""
        return env_rollouts(self, generator, tasks, n, self.sampling)

    def score(self, episodes, tasks, truncated, step) -> Scored:
        """The environment's rewards (`fixed_scored`), plus --reward_funcs' on the conversations;
        none for an episode the environment failed (`without_failed`)."""
        failed = [episode.env_error for episode in episodes]
        return without_failed(self._score(episodes, tasks, truncated, step), failed)

    def _score(self, episodes, tasks, truncated, step) -> Scored:
        from common.envs.tasks import conversation_rewards

        rewards = [episode.reward for episode in episodes]
        if self.name is None and self.funcs is None:
            return fixed_scored(rewards, truncated, self.success_reward)
        total = [0.0 if cut else reward for reward, cut in zip(rewards, truncated)]
        values = {self.name: total} if self.name else {}
        seconds = 0.0
        if self.funcs is not None:
            started = time.perf_counter()
            # training's tasks are `BatchTask`s (a row of the pool by its index), evaluation's rows
            own = [tasks[episode.group] for episode in episodes]
            rows = [t.row if hasattr(t, "row") else self.train[t.prompt_id].row for t in own]
            funcs_total, funcs_values = conversation_rewards(
                self.funcs, self.tokenizer, episodes, rows, step
            )
            # a NaN total: no function scored it, the environment's reward alone
            total = [t + f if f == f else t for t, f in zip(total, funcs_total)]
            values.update(funcs_values)
            seconds = time.perf_counter() - started
        success = [not cut and t >= self.success_reward for t, cut in zip(total, truncated)]
        return Scored(total, values, seconds, success)

    def evaluate(self, generator, accelerator) -> dict:
        """eval_* on the held-out tasks and eval_train_* on a fixed sample of the training pool, of
        whole episodes."""
        args = self.args

        def score(tasks, what="training-pool evaluation (eval_train_*)"):
            cfg = self.eval_sampling
            return evaluate_episodes(self, generator, tasks, args, accelerator, cfg, what)

        # the training-pool sample first: it runs on a copy of the random state, so both draw from
        # the same state (`evaluate_policy`'s train_prompts_first)
        sample = train_prompt_sample(self.train, args.eval_train_prompts)
        train_fit = evaluate_train_prompts(score, sample)
        # no held-out task (said at start-up): no held-out evaluation
        out = score(self.held_out, "held-out evaluation (eval_*)") if self.held_out else {}
        out.update(train_fit)
        return out

    def metrics(self, totals: dict) -> dict:
        """With --environment: env_errors and ps_replay_mismatch_frac (0 with no prefix task); TRL's
        convention: tools/call_frequency (tool calls per rollout) and tools/failure_frequency (of
        those calls, answered with an error; 0 without a call), TRL's. Says once a run when every
        action of a step hit the token cap."""
        cut, actions = totals["actions_cut"], totals["actions"]
        if actions and cut == actions and not self.warned_cut:
            self.warned_cut = True
            self.warn(
                f"warning: every action of this step hit --max_action_tokens "
                f"{self.sampling.max_new_tokens} (clipped_ratio 1.0): no turn ended by itself"
                + ("" if self.env.text else ", so no tool call could parse")
                + "; raise --max_action_tokens"
            )
        if self.name is None:
            return {}
        replayed = totals["replay_tasks"]
        out = {
            "env_errors": totals["env_errors"],
            "ps_replay_mismatch_frac": totals["replay_mismatch"] / replayed if replayed else 0.0,
        }
        if not self.env.text:
            calls = totals["tool_calls"]
            out["tools/call_frequency"] = calls / max(1.0, totals["rollouts"])
            out["tools/failure_frequency"] = totals["tool_failures"] / calls if calls else 0.0
        return out

    @staticmethod
    def warn(line: str) -> None:
        """A warning on the main process, on stderr: a line of its own, never glued to the progress
        bar's (common/run/logs.py's BarLine)."""
        from accelerate import PartialState

        if PartialState().is_main_process:
            print(line, file=sys.stderr, flush=True)


def countdown_tasks(args: Args) -> tuple[list, list]:
    """[multiturn] The embedded environment's (train, held-out) tasks: rows of its problems, tagged
    by level."""
    from common.demo.countdown_env import make_env_task
    from common.envs.tasks import EnvTask

    train, held_out = make_env_task(
        args.env_numbers, args.env_max_number, args.eval_prompts, args.prompt_pool
    )

    def task(example):
        return EnvTask(
            {"nums": list(example.answer.nums), "target": example.answer.target}, example.tag
        )

    return [task(example) for example in train], [task(example) for example in held_out]


class TextEnv:
    """--mode text: Countdown's single-turn text form or a dataset (--reward_funcs: yours), a line
    of the completion per step; the task's reward scores the whole text."""

    def __init__(self, args: Args, tokenizer, log):
        self.args, self.tokenizer = args, tokenizer
        self.task = make_task(args, tokenizer, log)
        self.train = self.task.train
        self.encode = PromptEncoder(tokenizer, self.task.templated)
        # whole completions
        self.sampling, self.eval_sampling = sampling_configs(args)
        self.is_break = line_breaks(tokenizer)
        self.counts = {}

    def rollout_batch(self, generator, tasks, n):
        """n completions per task (`rollout_text`): (episodes, truncated, tasks)."""
        prompts = [self.encode(self.train[task.prompt_id].prompt) for task in tasks]
        prefixes = [task.steps for task in tasks]
        episodes, truncated = rollout_text(
            generator, self.tokenizer, prompts, prefixes, n, self.sampling, self.is_break
        )
        for episode in episodes:
            episode.prompt = prompts[episode.group]
        return episodes, truncated, tasks

    def score(self, episodes, tasks, truncated, step) -> Scored:
        """The task's rewards of the whole texts; a cut rollout gets 0 from the built-in rewards."""
        texts = [self.tokenizer.decode(ep.ids, skip_special_tokens=True) for ep in episodes]
        rollout_examples = [self.train[tasks[episode.group].prompt_id] for episode in episodes]
        completions = [episode.ids for episode in episodes]
        return self.task.score(texts, rollout_examples, completions, truncated, step)

    def evaluate(self, generator, accelerator) -> dict:
        """The task's evaluation (`evaluate_policy`), training prompts first."""
        return evaluate_policy(
            generator,
            self.tokenizer,
            self.task,
            self.encode,
            self.eval_sampling,
            self.args,
            accelerator,
            train_prompts_first=True,
        )

    def metrics(self, totals: dict) -> dict:
        return {}


def batch_order(built: list[tuple[int, int, BatchTask]], world: int) -> list[BatchTask]:
    """[PS] (also in GRPO: no task) Every rank's (rank, group, task) in the order of their groups'
    places in the whole batch: `my_slice` dealt rank r its g-th group from place g x world + r. The
    queue is then the same on any number of ranks, in the order one process would build it."""
    return [task for _, task in sorted((group * world + rank, task) for rank, group, task in built)]


def prefix_tasks(
    tasks: list[BatchTask],
    routes: list[str],
    episodes: list[Episode],
    success: torch.Tensor,
    controllers: dict[str, PrefixController],
    args,
) -> list[tuple[int, BatchTask]]:
    """[PS] (also in GRPO: none) Prefix & Mask for each skewed fresh task (prefix tasks are not
    routed again): one of its trajectories, cut to a prefix at its category's current ratio
    (`make_prefix_task`), makes a task of the next batch. Returns (group, prefix task) pairs."""
    n = success.shape[1]
    built = []
    for group, task in enumerate(tasks):
        skewed = task.category is None and routes[group] in ("too_hard", "too_easy")
        if not (args.prefix_sampling and skewed):
            continue
        category = "hard" if routes[group] == "too_hard" else "easy"
        group_episodes = episodes[group * n : (group + 1) * n]
        ratio = controllers[category].ratio
        prefix_task = make_prefix_task(
            task, category, group_episodes, success[group].tolist(), ratio, args
        )
        if prefix_task is not None:
            built.append((group, prefix_task))
    return built


def assemble_batch(
    queue: list[BatchTask], next_ids, prompts_per_step: int, max_prefix_frac: float
) -> tuple[list[BatchTask], int]:
    """[PS] (also in GRPO: all fresh) The step's batch: the queued prefix tasks, at most
    --max_prefix_frac of it, then fresh tasks from `next_ids(count)`; and how many queued tasks
    were over the cap (dynamic on-policy: dropped, never carried over)."""
    n_prefix = min(len(queue), int(max_prefix_frac * prompts_per_step))
    fresh_ids = next_ids(prompts_per_step - n_prefix)
    batch = queue[:n_prefix] + [BatchTask(prompt_id) for prompt_id in fresh_ids]
    return batch, len(queue) - n_prefix


def kept_advantages(rewards: torch.Tensor, scale: bool) -> tuple[torch.Tensor, torch.Tensor, list]:
    """GRPO advantages r - mean (appendix, Perspective 2; `scale`: / std) with rejection sampling
    (the DeepSWE baseline): groups whose rollouts all fail or all pass are dropped. Returns the
    kept groups [tasks], the advantages [tasks, N] and the kept rollouts' indices (one host list,
    no tensor read element by element)."""
    keep = ~zero_variance(rewards)
    advantages = grpo_advantages(rewards, scale=scale)
    trained_ids = keep.repeat_interleave(rewards.shape[1]).nonzero().flatten().tolist()
    return keep, advantages, trained_ids


def ps_normaliser(masks: list[list[int]], accelerator) -> float:
    """The DAPO token mean's divisor on each rank: the batch's trained (mask 1) tokens, their mean
    over ranks (DDP and FSDP average the ranks' gradients)."""
    return rank_mean(accelerator, sum(map(sum, masks)))


def ps_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    n_tok: float,
    eps_low: float,
    eps_high: float,
    sampler_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GRPO clipped surrogate over tokens with mask 1 (DAPO token mean: n_tok, the
    batch's tokens per rank), and the number of clipped tokens. [PS] Prefix masking: replayed prefix
    tokens (and observations) have mask 0, so they get no gradient. `sampler_weight`: the sampler
    correction's rho per token (TRL's rule: it multiplies the clipped surrogate)."""
    per_token, clipped = clipped_surrogate(logp, old_logp, adv[:, None], eps_low, eps_high)
    if sampler_weight is not None:
        per_token = per_token * sampler_weight  # sampler correction
    return (per_token * mask).sum() / (n_tok or 1), (clipped * mask).sum()


def sample_rows(
    tasks, episodes, advantages, keep, truncated, scored, n, tokenizer, args
) -> list[dict]:
    """samples.jsonl rows of the first --log_samples_per_kind rollouts of each kind (fresh, prefix);
    advantage 0 and trained False: a group dropped by rejection sampling; env_error true: an
    episode the environment failed (reward null, advantage 0, prompt_id its task)."""
    kinds = [task.kind for task in tasks for _ in range(n)]
    rows = []
    for i in first_of_each_kind(kinds, args.log_samples_per_kind):
        task = tasks[i // n]
        trained = bool(keep[i // n])
        row = {
            "kind": task.kind,
            "prompt": tokenizer.decode(episodes[i].prompt),
            "completion": tokenizer.decode(episodes[i].ids),
            "reward": episodes[i].reward,
            "advantage": advantages.flatten()[i].item() if trained else 0.0,
            "trained": trained,
            "truncated": truncated[i],
            "ps_prefix_steps": len(task.steps),
        }
        if episodes[i].env_error:  # the environment failed: no reward, advantage 0
            # which task: its index in the training pool (its row's; without a dataset, its seed)
            row.update(reward=None, env_error=True, prompt_id=task.prompt_id)
        if task.category is not None:
            row["ps_ratio"] = task.ratio
        row.update(scored.columns(i))
        rows.append(row)
    return rows


def share(part: float, whole: float) -> float | None:
    """part / whole, None when whole is 0 (nothing to measure this step)."""
    return part / whole if whole else None


def ps_grpo_metrics(totals: dict, n: int, control, controllers, ema_alpha, queued, dropped) -> dict:
    """[PS] (also in GRPO, as its reference) the mechanism's figures from the step's sums over
    ranks (docs/ps_grpo.md); `control`: the controllers' input (`controller_input`)."""
    tasks = {c: totals[f"prefix_{c}_tasks"] for c in CATEGORIES}
    success = {c: totals[f"prefix_{c}_success"] for c in CATEGORIES}
    # a prefix task's rollouts, less those the environment failed
    counted = {c: tasks[c] * n - totals[f"prefix_{c}_failed"] for c in CATEGORIES}
    return {
        "ps_solve_partial": totals["ps_solve_partial"],
        "ps_prefix_tasks": tasks["hard"] + tasks["easy"],
        "ps_prefix_pass_rate": share(success["hard"] + success["easy"], sum(counted.values())),
        **{f"ps_prefix_pass_rate_{c}": share(success[c], counted[c]) for c in CATEGORIES},
        # the controllers' input: prefix tasks built with the ratio they ran at
        **{f"ps_ctrl_pass_rate_{c}": control[c].pass_rate(n) for c in CATEGORIES},
        **{f"ps_ctrl_stale_{c}": control[c].stale for c in CATEGORIES},
        # mean K
        **{
            f"ps_prefix_steps_{c}": share(totals[f"prefix_{c}_steps"], tasks[c]) for c in CATEGORIES
        },
        # after this step's update: the ratios the next prefix tasks are built with
        **{f"ps_ratio_{c}": controllers[c].ratio for c in CATEGORIES},
        **{f"ps_ema_{c}": controllers[c].ema(ema_alpha) for c in CATEGORIES},
        "ps_replayed_tokens": totals["ps_replayed_tokens"],
        "ps_generated_tokens": totals["gen_tokens"],
        "ps_fresh_pass_rate": totals["success"] / max(1.0, totals["reward_n"]),
        "ps_trained_groups": totals["trained_groups"],
        "ps_clip_frac": totals["clip_sum"] / max(1.0, totals["tok"]),
        # mean A^2 of trained rollouts: a group's p(1-p) with A = r - mean (appendix,
        # Perspective 2); 1 with / std
        "ps_signal_strength": share(totals["adv_sq_sum"], n * totals["trained_groups"]),
        "ps_queued": queued,
        "ps_dropped": dropped,
        # fresh tasks
        **{f"ps_route_{name}": totals[f"ps_route_{name}"] for name in ROUTES},
    }


def main(args: Args) -> None:
    # ---------------- set-up: the launch, policy, optimizer (no KL term: no reference), generator
    accelerator, cpu_threads, log = start_run(args, "ps_grpo")
    device = accelerator.device
    world = accelerator.num_processes
    # --environment: your class, its convention and its tasks, checked and stated before the model
    # loads (common/envs/startup.py)
    opened = None
    if args.environment:
        from common.envs.startup import open_environment

        opened = open_environment(args, log)
    # [multiturn] the embedded model starts from its warm-up on the environment's episodes
    warmed_up = multiturn_warm_up(args, accelerator, log)
    policy, tokenizer, model_path = load_training_policy(args, accelerator, log, warmed_up)
    # --fsdp: FSDP2 shards of the policy (else the policy as it is)
    (policy,) = shard_models(args, policy)
    optimizer, scheduler = make_optimizer(policy, args)
    # `model`: DDP-wrapped for the backward pass
    model, optimizer = prepare_training(accelerator, policy, optimizer, args.fsdp)
    # the one place the task is chosen: its prompts, rollouts, rewards and evaluation
    env = (
        AgentEnv(args, tokenizer, log, opened) if args.multiturn else TextEnv(args, tokenizer, log)
    )
    sampler = PromptSampler(len(env.train), args.seed)
    compiled = make_compiled(args, log)
    generator = make_generator(args, model_path, policy, tokenizer, accelerator, compiled, log)
    # the generator scores greedy samples at T = 1
    temperature = args.temperature if args.temperature > 0 else 1.0
    pack = packed_row_tokens(args, device)

    def run_eval() -> dict:
        # fit the free cores
        torch.set_num_threads(cpu_threads.count(torch.get_num_threads()))
        # FSDP + HF generate: whole weights (else a no-op)
        with gathered(policy, enabled=generator.reads_policy):
            return env.evaluate(generator, accelerator)

    # ---------------- resume, prefix-task queue and controllers, logs, step-0 evaluation ----------
    checkpoints = Checkpoints(args, accelerator, model, tokenizer, optimizer, scheduler, log)
    start_step, saved = checkpoints.resume(sampler, generator, policy)
    counters = saved["counters"] if saved else {"rollouts": 0, "gen_tokens": 0}
    saved_method = saved["method"] if saved else None
    # [PS] (also in GRPO: empty) prefix tasks for the next batch, the same on every rank
    queue = [BatchTask(**queued) for queued in saved_method["queue"]] if saved else []
    # [PS] (also in GRPO: built, never moved) one prefix controller per category
    controllers = make_controllers(args, saved_method)
    run_log = RunLog(args, accelerator, "ps_grpo", start_step, saved is not None, log)
    # Ctrl-C / SIGTERM from here on: the run stops after its step, with a checkpoint
    stop = GracefulStop(log)
    if start_step == 0:
        run_log.first_row(run_eval(), compiled)
    n = args.num_generations
    forward = Forward(tokenizer.pad_token_id, device, args.dtype, temperature, pack, compiled)

    # sampler correction (TRL's vllm_importance_sampling_*, on by default with vLLM): (trainer
    # log-probs, sampler log-probs, known tokens) -> (weights, sums); the module loads only then
    correct_sampler = None
    if args.vllm_importance_sampling_correction:
        from common.rl.sampler_correction import sampler_is_weights

        correct_sampler = functools.partial(
            sampler_is_weights,
            mode=args.vllm_importance_sampling_mode,
            clip_min=args.vllm_importance_sampling_clip_min,
            clip_max=args.vllm_importance_sampling_clip_max,
        )

    for step in range(start_step + 1, args.max_steps + 1):
        # a shared CPU: torch's threads fit the cores other processes leave free (--num_threads)
        run_log.start_step(cpu_threads)

        # ================ sample: N rollouts per task (a prefix task replays its prefix, then
        #                  generates the rest)
        with run_log.timing("gen"):
            # [PS] (also in GRPO: all fresh) the batch: prefix tasks (at most --max_prefix_frac of
            # it), then fresh tasks
            batch_tasks, dropped = assemble_batch(
                queue, sampler.next_ids, args.prompts_per_step, args.max_prefix_frac
            )
            # strided: every rank gets prefix and fresh tasks
            tasks = my_slice(batch_tasks, accelerator)
            # FSDP + HF generate: whole weights (else a no-op); a prefix task whose replay diverged
            # from its stored trajectory is dropped from `tasks`
            with gathered(policy, enabled=generator.reads_policy):
                episodes, truncated, tasks = env.rollout_batch(generator, tasks, n)
            # vLLM on a GPU: its memory goes to training; the push brings the weights back
            generator.sleep()

        # ================ verify: the environment's or the task's reward of the whole text; a cut
        #                  rollout gets 0 from the built-in rewards
        with run_log.timing("reward"):
            scored = env.score(episodes, tasks, truncated, step)
        # NaN: no function scored it, or the environment failed (advantage 0, out of the baseline)
        for episode, total in zip(episodes, scored.total):
            episode.reward = total
        rewards = torch.tensor([episode.reward for episode in episodes]).view(-1, n).float()
        success = torch.tensor(scored.success, dtype=torch.bool).view(-1, n)  # [tasks, N]
        # k of N, per task; N less the rollouts the environment failed (they count nowhere)
        passes = success.sum(-1).tolist()
        counted = [n - failed for failed in env_failed(episodes, n)]

        # ================ [PS] (also in GRPO: skips all) route fresh tasks; too-hard / too-easy ->
        #                  Prefix & Mask, queued for the next batch
        routes = [route(k, m, args.low, args.high) for k, m in zip(passes, counted)]
        built = [
            (accelerator.process_index, group, prefix_task)
            for group, prefix_task in prefix_tasks(
                tasks, routes, episodes, success, controllers, args
            )
        ]
        # every rank's, by place in the batch: the same queue on every rank
        queue = batch_order(gather_list(accelerator, built), world)

        # ================ advantages: GRPO r - mean (appendix, Perspective 2; --scale_rewards: /
        #                  std); rejection sampling drops groups whose rollouts all fail or all pass
        #                  (the DeepSWE baseline)
        keep, advantages, trained_ids = kept_advantages(rewards, args.scale_rewards)
        trained_advantages = advantages.flatten()[trained_ids].to(device)
        trained = [episodes[i] for i in trained_ids]
        # --mask_truncated_completions: rollouts cut by a length limit get no gradient
        cut = [args.mask_truncated_completions and truncated[i] for i in trained_ids]
        masks = [[0] * len(e.mask) if no else e.mask for e, no in zip(trained, cut)]
        # the DAPO token mean over the whole batch
        n_tokens = ps_normaliser(masks, accelerator)

        # ================ update: clipped surrogate on generated tokens only (replayed: mask 0)
        with run_log.timing("update"):
            prompts, completions = [e.prompt for e in trained], [e.ids for e in trained]
            # the generator's log-probs: the old policy of the ratio
            old_logprobs = [e.old_logp for e in trained]
            lengths = [len(prompt) + len(ids) for prompt, ids in zip(prompts, completions)]
            max_rows, max_tokens = args.micro_batch_size, args.max_tokens_per_microbatch
            micro = micro_batches(
                len(trained), max_rows, accelerator, model, (), lengths, max_tokens
            )
            update_sums = []
            for rows in micro:
                mb = forward.rows_at(rows, prompts, completions, old_logprobs, masks)
                logp, entropy = forward(model, mb)
                mask, adv = mb.loss_mask, trained_advantages[rows]
                eps = args.epsilon, args.epsilon_high
                # sampler correction: pi_old is this first pass (the weights that sampled) and
                # rho = pi_trainer / pi_sampler weighs the sampled tokens; replayed prefix tokens
                # (mask 0) are conditioning, out of the ratio and the gradient
                old_logp, sampler_weight, is_sums = mb.sampler_logp, None, {}
                if correct_sampler:
                    old_logp = logp.detach()
                    sampler_weight, is_sums = correct_sampler(logp, mb.sampler_logp, mask)
                loss, clipped = ps_loss(logp, old_logp, adv, mask, n_tokens, *eps, sampler_weight)
                accelerator.backward(loss)
                # back to a sum: the row divides it by the ranks' trained tokens
                loss_sum = loss.detach().double() * (n_tokens or 1)
                # sampler vs the first training pass
                gap = (logp.detach() - mb.sampler_logp).abs() * mask
                mb_sums = dict(loss_sum=loss_sum, ent_sum=(entropy * mask).sum(), tok=mask.sum())
                update_sums.append(
                    mb_sums
                    | dict(clip_sum=clipped, gap_sum=gap.sum(), gap_tok=mask.sum())
                    | is_sums
                )
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

        # ================ push the new weights to the generator (a no-op for HF generate) ========
        generator.sync_weights(policy)

        # ================ metrics: the step's sums over ranks, the shared keys, the method's ======
        outcome = tasks, episodes, rewards, success, truncated, routes, keep, trained_advantages
        # --environment: the rollouts' env_errors and replay counts
        sums = ps_grpo_sums(*outcome, controllers) | env.counts
        lr, norms = scheduler.get_last_lr()[0], [grad_norm]
        row, totals = run_log.step_metrics(
            step, counters, scored, sums, update_sums, norms, lr, loss_per="tok"
        )
        # [PS] (also in GRPO: no pass rate, never moved) each controller's input: the prefix tasks
        # built with its current ratio, summed over ranks
        control = controller_input(totals)
        # [PS] --adaptive: each controller moves its category's ratio toward a 50% pass rate
        if args.prefix_sampling and args.adaptive:
            for category in CATEGORIES:
                controllers[category].update(
                    control[category].pass_rate(n),
                    args.ema_alpha,
                    args.deadzone_low,
                    args.deadzone_high,
                    args.ratio_step,
                    args.cooldown,
                    args.ratio_min,
                    args.ratio_max,
                    args.ema_reset,
                )

        row |= ps_grpo_metrics(totals, n, control, controllers, args.ema_alpha, len(queue), dropped)
        # --environment: env_errors, ps_replay_mismatch_frac
        row |= env.metrics(totals)

        # ================ evaluation, sample log, the row, checkpoint, stop ================
        if run_log.evaluation_due(step):
            with run_log.timing("eval"):
                row.update(run_eval())
        # a few fresh and (with PS) prefix-task rollouts
        if run_log.samples_due(step):
            rollouts = tasks, episodes, advantages, keep, truncated, scored
            run_log.write_samples(step, sample_rows(*rollouts, n, tokenizer, args))
        run_log.write_row(row, compiled)
        stopping = stop.any_rank_signalled(accelerator)
        if checkpoints.due(step, stopping):
            # [PS] (also in GRPO: an empty queue, unmoved controllers) as plain data; a snapshot is
            # the environment's own object: a resumed prefix task re-executes its actions
            queued = [replace(task, snapshot=None, chat=[]) for task in queue]
            method_state = {"queue": queued, "ctrl": controllers}
            state = {"sampler": sampler.state_dict(), "counters": counters, "method": method_state}
            checkpoints.save(step, state, stopping)
        if stopping:
            break
    run_log.close()
    export_model(args, accelerator, policy, tokenizer, generator.end_ids, "ps_grpo", __doc__)
    # trackers finish and the process group ends now, not at exit: no hang
    end_processes(accelerator)
    stop.close()
    summary_keys = ["ps_prefix_pass_rate", "ps_trained_groups", "ps_ratio_hard", "ps_ratio_easy"]
    log(run_summary(args.output_dir, summary_keys))


if __name__ == "__main__":
    raise SystemExit(
        main(parse_args(Args, description=__doc__.split("\n\n")[0])) or GracefulStop.exit_status()
    )
