"""Reinforce-Ada-Seq: adaptive multi-round sampling, downsampled to a static GRPO batch. One file.

Paper: Xiong, Ye, Liao, Dong, Xu, Monz, Bian, Jiang, Zhang, "Reinforce-Ada: An Adaptive Sampling
Framework under Non-linear RL Objectives" (preprint; code: RLHFlow/Reinforce-Ada), Sec. 3.2 and Alg.
2. Docs: docs/ada_seq.md.

GRPO with a small group (n = 4) often sees a prompt's rollouts all fail (or all pass): every
advantage is 0 and the prompt teaches nothing. Reinforce-Ada-Seq keeps sampling the prompts that
lack signal:
  phase 1: every prompt of the batch starts active; each round draws M (`round_repeat`) responses
           for each active prompt; a prompt leaves the active set once its pool meets the exit
           condition (`positive`: >= K_pos positives; `balanced`: >= K_pos positives and >= K_neg
           negatives); at most `max_rounds` rounds (N_max = M * max_rounds responses per prompt).
  phase 2: each pool is downsampled to exactly n responses (up to n//2 positives, the rest
           negatives, topping up from the other side), and advantages use the *whole pool's*
           statistics: A_i = r_i - mean(pool) (Alg. 2 line 19; `--scale_rewards true` divides by
           std(pool)), optionally x w(p_hat).
The update is a GRPO-style clipped policy gradient on n responses per prompt (plus the paper's
entropy bonus), so the backward cost is that of GRPO-n; only inference grows. Lines marked [ADA] are
what the paper adds to GRPO; GRPO-n runs them too, with one round of n (the pool is the group,
nothing is downsampled, no prompt exits early).

The baseline, GRPO-n, is this file with one round of n (`--max_rounds 1 --round_repeat n`): the pool
is the group, and the advantage is the paper's eq. (2), (r - mean) / std over the group.
`--scale_rewards false` turns either into its Dr. GRPO variant, A = r - mean (named "Dr. GRPO-n" in
the docs and benchmark tables).

The paper's other baseline (Sec. 3.3, Table 2), DAPO's dynamic sampling (Yu et al., 2025), is GRPO-n
plus `--dynamic_sampling` (lines marked [DAPO]; without the flag they never run, except one marked
"[DAPO] (also in GRPO-n: ...)", which changes nothing there): groups whose n rewards are all equal
are dropped, and groups for new prompts from the sampler are drawn (a whole batch of
`prompts_per_step` per extra round) until the batch is full again or `--max_dynamic_rounds` extra
rounds were made. The count that decides is global (every rank runs the same rounds), and each
rank's kept groups count only up to its share of the batch (`my_slice`, the first ones kept in
sampling order): so the batch never exceeds `prompts_per_step` groups, and a full batch has every
rank's share (the loss normaliser stays that of a full batch). A batch still short after the last
extra round is trained as it is, with that full batch's normaliser, so its step is `dapo_batch_fill`
(trained groups / prompts_per_step, logged every step) of a full one; verl's DAPO recipe instead
keeps generating until the batch is full (up to its generation-batch limit). Advantages are GRPO-n's
(eq. 2 over the group).

Where this file follows the authors' public code rather than the paper's text (both are flags):
- Advantage of Reinforce-Ada (`--max_rounds` > 1): A = r - mean(pool), no std: Alg. 2 line 19 and
  Sec. 3.2's estimator, and the authors' run script (RLHFlow/Reinforce-Ada
  `scripts/run_reinforce_ada.sh` at 6895ad3 sets `norm_adv_by_std_in_grpo=False`; the line came with
  the commit "correct training script error", 2025-10-07). Their GRPO script (`scripts/run_grpo.sh`
  at 05be605) leaves verl's std on, eq. (2): so GRPO-n (`--max_rounds 1`) divides by the group's std
  by default. `--scale_rewards true/false` overrides both. With the std, a kept positive of a pool
  with 1 success in 32 would get A = 5.6 instead of 0.97: the update tilts toward rare wins.
- Warm-up: 10 steps (the paper's set-up, Sec. 4; `run_reinforce_ada.sh`: `lr_warmup_steps=10`).
- Loss aggregation: the authors' script uses verl's `token-mean` (the surrogate averaged over the
batch's generated tokens); this file divides the token sum by the constant kept responses x
max_completion_length (no length bias), so its step is that of token-mean x (mean completion length
/ max_completion_length): about 0.37x on the embedded task (docs/ada_seq.md).
- Exit quotas: `positive` exits after K_pos = 1 positive (the public code); the text's example is
  K_pos = 16 at N_max = 128 (`--k_pos 16`). `balanced` needs n//2 positives and n - n//2 negatives
  in both.
- Entropy bonus: the paper's set-up (Sec. 4) uses coefficient 1e-4, the default here; the public run
  script sets 0 (`--entropy_coef 0`).
- Unfinished prompts (no exit after the last round) are downsampled with the same balanced rule
  (Alg. 2 line 18); the public code's positive-focused fallback keeps the pool's pass ratio instead
  (`--unfinished_downsample pass_ratio`).

Choices made here (the paper leaves them open):
- Downsampling draws the kept positives/negatives uniformly with Python's global `random` (seeded
  per rank, saved in every checkpoint, so a resumed run draws the same).
- The baseline is the pool's mean reward (Alg. 2 line 17), which is p_hat = N_pos/N for 0/1 rewards;
  with shaped rewards it stays the unbiased baseline, and N_pos/N (reward > positive_threshold) is
  used only for the optional weight. The std is the population std of the pool's rewards (eq. 2
  leaves it open).
- `--prompt_weight none` is the default, as in the authors' public code: its advantage is r -
  mean(pool) with no 1/p_hat factor. `inv_p` re-introduces the Sec. 3.2 weight, which can scale a
  hard prompt's gradient by up to N_max (the learning rate may need lowering).
- pi_old is the sampling policy; one optimizer step per batch by default, so the clipped surrogate
  equals the policy gradient unless `--num_iterations` > 1 or the backends disagree. With the HF
  backend and one epoch pi_old's log-probs are read from the update's own forward pass (no extra
  scoring pass after sampling); with vLLM or more epochs they are the sampler's (`--old_logprobs`),
  unless the sampler correction is on (the default with vLLM): then pi_old is the trainer's
  epoch-0 pass and rho = pi_old / pi_sampler weights each token (docs/ada_seq.md).
- Logged `loss`: the clipped surrogate summed over tokens and divided by (kept responses x
max_completion_length), the constant the optimised loss uses too (no length bias). The entropy
bonus, entropy_coef x the token entropies summed and divided by the same constant, is subtracted in
the optimised loss but not in `loss`; with `--beta` > 0, beta x the k3 KL summed over the same
tokens is added over the same constant too (one normaliser for every term); `kl` logs the KL per
trained token.
- Metrics: `rollouts` / `gen_tokens` count every generated response of every round (inference cost);
  `frac_zero_var_groups` is measured on each prompt's first n responses (what GRPO-n would have
  trained on), `ada_frac_zero_var_groups_post` on the kept groups; `ada_active_after_round_r` is a
  fraction. [DAPO] `dapo_rounds` (extra rounds), `dapo_sampled_groups`, `dapo_kept_groups`,
  `dapo_batch_fill` (kept groups / prompts_per_step); `ada_inference_cost_rel` is then generated /
  (prompts_per_step x n).
- A completion cut by `--max_completion_length` gets reward 0 (never a success);
  `--mask_truncated_completions` also takes the kept ones out of the loss. `sampler_logp_diff` (when
  the generator returns log-probs) is the mean |sampler - trainer| log-prob of the kept tokens in
  the first pass; samples.jsonl holds a few kept rollouts (kind `fresh`, [DAPO] `dynamic_refill`)
  with their pool size and exit round.

    python ada_seq.py                                  # SEQ-BALANCE on the embedded Countdown task
    python ada_seq.py --exit_condition positive        # SEQ-POS
    python ada_seq.py --max_rounds 1 --round_repeat 4  # GRPO-n4 (one round of n: nothing adaptive)
    python ada_seq.py --max_rounds 1 --round_repeat 4 --scale_rewards false  # Dr. GRPO-n4
    python ada_seq.py --max_rounds 1 --round_repeat 8 --num_generations 8   # GRPO-n8 (n16 likewise)
    python ada_seq.py --max_rounds 1 --round_repeat 4 --dynamic_sampling   # DAPO's dynamic sampling
    accelerate launch ada_seq.py --model_name_or_path Qwen/Qwen2.5-Math-1.5B \
        --dataset_name openai/gsm8k --dataset_config main --use_vllm --dtype bfloat16 \
        --learning_rate 1e-6
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Callable, ClassVar, Literal, Optional

import numpy as np
import torch

from common.distributed.ranks import (
    gather_list,
    gathered,
    micro_batches,
    my_slice,
    reduce_sums,
)
from common.rl.ada import (
    count_positive,
    success_threshold,
    trained_advantage_metrics,
    uses_sampler_logprobs,
)
from common.rl.advantages import zero_variance
from common.rl.logprobs import Forward
from common.rl.losses import clipped_surrogate, kl_k3
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
    make_reference,
    make_task,
    packed_row_tokens,
    prepare_training,
    sampling_configs,
    shard_models,
    start_run,
)
from common.run.step_metrics import rollout_sums
from common.run.summary import run_summary
from common.tasks.evaluation import evaluate_policy
from common.tasks.loading import PromptEncoder, PromptSampler
from common.tasks.scoring import Scored


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
    # TRL's names for what this file does: a constant normaliser (samples x max tokens)
    trl_equivalents: ClassVar[dict] = {"loss_type": "dr_grpo"}
    # the step's hyperparameters (the same names in every script): its length, batch and update
    max_steps: Annotated[int, Range(1)] = 300
    """number of policy updates (one batch of prompts each)"""
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
    num_generations: Annotated[int, Range(2)] = 4
    """[ADA] update group size n: each prompt's pool is downsampled to exactly n responses (backward
    cost = GRPO-n)"""
    round_repeat: Annotated[int, Range(2)] = 8
    """[ADA] M, responses drawn per active prompt in each round (Alg. 2 requires M >= n)"""
    max_rounds: Annotated[int, Range(1)] = 4
    """[ADA] maximum sampling rounds; N_max = max_rounds * round_repeat responses per prompt.
    `--max_rounds 1 --round_repeat n` is GRPO-n"""
    exit_condition: Literal["balanced", "positive"] = "balanced"
    """[ADA] when a prompt leaves the active set: `positive` (SEQ-POS: >= k_pos positives) or
    `balanced` (SEQ-BALANCE: >= k_pos positives and >= k_neg negatives)"""
    k_pos: Annotated[Optional[int], Range(0)] = None
    """[ADA] K_pos, positives needed to exit (default: 1 under `positive`, as the authors' code;
    n//2 under `balanced`)"""
    k_neg: Annotated[Optional[int], Range(0)] = None
    """[ADA] K_neg, negatives needed to exit under `balanced` (default: n - n//2)"""
    positive_threshold: Annotated[float, Range(None, 1, hi_open=True)] = 0.7
    """[ADA] a response is positive when its training reward (in [0, 1], may be shaped) > this; < 0:
    every response"""
    scale_rewards: Optional[bool] = None
    """divide advantages by the std of the prompt's pool (eq. 2); the value used is written to
    args.json (default: true for GRPO-n (`--max_rounds 1`, eq. 2; false there = Dr. GRPO-n), false
    for Reinforce-Ada (`--max_rounds` > 1: A = r - mean(pool), Alg. 2 line 19, as the authors' run
    script))"""
    unfinished_downsample: Literal["balanced", "pass_ratio"] = "balanced"
    """[ADA] prompts still active after the last round: the balanced rule of Alg. 2 line 18 (as
    finished ones), or `pass_ratio`: about n x the pool's pass ratio positives (at least 1 if any),
    the public code's fallback"""
    prompt_weight: Literal["none", "inv_p", "inv_sqrt_p"] = "none"
    """[ADA] explicit per-prompt gradient weight w(p_hat), p_hat = N_pos/N of the full pool: `none`
    (the public code's default), `inv_p` (the re-introduced 1/p_hat of Sec. 3.2), `inv_sqrt_p`"""
    epsilon: Annotated[float, Range(0, 1, hi_open=True)] = 0.2
    """lower clip range of the ratio pi_theta/pi_old (clip-higher setup of the paper:
    [0.2, 0.28])"""
    epsilon_high: Annotated[float, Range(0)] = 0.28
    """upper clip range of the ratio pi_theta/pi_old"""
    num_iterations: Annotated[int, Range(1)] = 1
    """optimizer steps per batch (each a full pass over the kept responses); with 1 the ratio is 1
    and clipping is inactive"""
    beta: Annotated[float, Range(0, zero="off, no reference model")] = 0.0
    """KL coefficient to the reference (initial) policy: the k3 estimator summed over the trained
    tokens, divided by the policy gradient's constant (responses x max_completion_length); the paper
    uses none"""
    entropy_coef: Annotated[float, Range(0, zero="off")] = 1e-4
    """entropy bonus: entropy_coef x token entropy is subtracted from the loss (the paper's set-up:
    1e-4)"""
    old_logprobs: Literal["auto", "sampler"] = "auto"
    """where pi_old's log-probs come from: `auto` = the update's own first forward pass when that is
    exact (HF backend, one epoch: the weights that sampled are the weights being updated), else the
    sampler; `sampler` = always the generator's log-probs (an extra scoring pass with the HF
    backend). With the sampler correction on (--vllm_importance_sampling_correction, the default
    with vLLM) pi_old is the trainer's epoch-0 pass and the sampler's log-probs enter through its
    ratio"""
    warmup_steps: Annotated[int, Range(0)] = 10
    """linear warm-up steps, then constant (the paper's set-up, Sec. 4: a 10-step warm-up)"""
    dynamic_sampling: bool = False
    """[DAPO] the DAPO dynamic-sampling baseline (needs `--max_rounds 1`): drop groups whose rewards
    are all equal and refill the batch with groups for new prompts, up to `max_dynamic_rounds` extra
    rounds"""
    max_dynamic_rounds: Annotated[int, Range(0)] = 4
    """[DAPO] cap on the extra generation rounds (each a new batch of prompts_per_step prompts) per
    step"""

    def quotas(self) -> tuple[int, int]:
        """(K_pos, K_neg) with the n-derived defaults filled in."""
        n = self.num_generations
        k_pos = self.k_pos
        if k_pos is None:
            k_pos = 1 if self.exit_condition == "positive" else n // 2
        k_neg = n - n // 2 if self.k_neg is None else self.k_neg
        return k_pos, k_neg

    def __post_init__(self) -> None:
        # [ADA] Reinforce-Ada: r - mean(pool) (Alg. 2 line 19); GRPO-n: eq. (2)
        if self.scale_rewards is None:
            self.scale_rewards = self.max_rounds == 1

    def validate(self) -> None:
        """Combinations of flags (single values: their declarations, common/run/flags.py)."""
        problems = []
        n = self.num_generations
        if self.round_repeat < n:
            problems.append(
                f"--round_repeat {self.round_repeat}: must be >= --num_generations {n} "
                "(Alg. 2: M >= n)"
            )
        # [DAPO] a fixed group size: GRPO-n's one round
        if self.dynamic_sampling and self.max_rounds != 1:
            problems.append(
                "--dynamic_sampling samples one round of --round_repeat responses per prompt "
                f"(DAPO); it needs --max_rounds 1, got --max_rounds {self.max_rounds}"
            )
        if problems:
            raise SystemExit("\n".join(problems))


def exit_reached(rewards: list[float], rule: str, k_pos: int, k_neg: int, threshold: float) -> bool:
    """[ADA] ExitCondition(S_x) of Alg. 2 (Sec. 3.2, "Exit condition")."""
    pos = count_positive(rewards, threshold)
    if rule == "positive":
        return pos >= k_pos
    # NaN (no reward): neither positive nor negative
    neg = sum(1 for reward in rewards if reward <= threshold)
    return pos >= k_pos and neg >= k_neg


def multi_round_sampling(
    num_prompts: int,
    sample_round: Callable[[list[int], int], list[list[float]]],
    done: Callable[[list[float]], bool],
    max_rounds: int,
    m: int,
):
    """[ADA] Phase 1 of Alg. 2 (lines 3-12): rounds of M samples for the still-active prompts.

    `sample_round(active, m)` draws m responses for each prompt index in `active` and returns their
    rewards (one list per active prompt, same order); the caller keeps the responses themselves in
    the same order. Returns (pools, exit_rounds): every prompt's rewards in generation order, and
    the 1-based round after which it met the exit condition (None: still unfinished after the last
    round).
    """
    pools: list[list[float]] = [[] for _ in range(num_prompts)]
    exit_rounds: list[Optional[int]] = [None] * num_prompts
    active = list(range(num_prompts))
    for r in range(1, max_rounds + 1):
        if not active:
            break
        new = sample_round(active, m)
        if len(new) != len(active):
            raise ValueError(
                f"sample_round returned {len(new)} groups for {len(active)} active prompts"
            )
        for i, rewards in zip(active, new):
            pools[i].extend(rewards)
            if done(pools[i]):
                exit_rounds[i] = r
        active = [i for i in active if exit_rounds[i] is None]
    return pools, exit_rounds


def downsample(
    rewards: list[float], n: int, threshold: float, rng, rule: str = "balanced"
) -> list[int]:
    """[ADA] Alg. 2 line 18: indices (ascending) of the n pool responses kept for the update.

    `balanced`: up to n//2 positives, the rest negatives; when one side runs short the other tops
    up. `pass_ratio` (the public code's fallback for unfinished prompts): floor(n x N_pos/N)
    positives, at least 1 when the pool has one, the rest negatives (topped up the same way). Which
    positives (negatives) are kept is a uniform draw with `rng` (the script passes the global
    `random`, checkpointed per rank). Responses of one prompt are i.i.d. given their reward, so the
    draw only guards against backends returning a non-random order.
    """
    if len(rewards) < n:
        raise ValueError(f"pool of {len(rewards)} responses cannot be downsampled to {n}")
    pos = [j for j, r in enumerate(rewards) if r > threshold]
    neg = [j for j, r in enumerate(rewards) if r <= threshold]
    # no function scored them: kept only to fill up
    unrated = [j for j, r in enumerate(rewards) if math.isnan(r)]
    want_pos = n // 2 if rule == "balanced" else max(1, len(pos) * n // max(1, len(pos) + len(neg)))
    n_pos = min(len(pos), want_pos)
    n_neg = min(len(neg), n - n_pos)
    n_pos = min(len(pos), n - n_neg)  # negatives ran short: top up with positives
    kept = rng.sample(pos, n_pos) + rng.sample(neg, n_neg) + rng.sample(unrated, n - n_pos - n_neg)
    return sorted(kept)


def global_advantages(
    kept: list[float],
    pool: list[float],
    threshold: float,
    std_norm: bool,
    weight: str,
    eps: float = 1e-6,
) -> list[float]:
    """[ADA] Advantages of the kept responses against the whole pool's statistics (Sec. 3.2).

    A_i = r_i - mean(pool) (Alg. 2 lines 17-19; for 0/1 rewards mean(pool) = p_hat = N_pos/N); with
    `std_norm` / (std(pool) + eps) (eq. 2 on the pool, the script's default); optionally x w(p_hat)
    with p_hat = N_pos/N floored at 1/N (`inv_p`: the re-introduced explicit weight 1/p_hat of the
    Sec. 3.2 estimator; `inv_sqrt_p`: 1/sqrt(p_hat)).
    """
    # NaN: no reward, out of the pool's statistics, and advantage 0
    pool = [r for r in pool if not math.isnan(r)] or [0.0]
    mean = sum(pool) / len(pool)
    adv = [0.0 if math.isnan(r) else r - mean for r in kept]
    if std_norm:
        std = math.sqrt(sum((r - mean) ** 2 for r in pool) / len(pool))
        adv = [a / (std + eps) for a in adv]
    p_hat = max(count_positive(pool, threshold), 1) / len(pool)
    w = {"none": 1.0, "inv_p": 1.0 / p_hat, "inv_sqrt_p": 1.0 / math.sqrt(p_hat)}[weight]
    return [w * a for a in adv]


def pool_advantages(
    train_ids: list[int], pools: list[list[float]], exit_rounds, n: int, threshold: float, args
) -> tuple[list[list[int]], list[list[float]], list[float]]:
    """[ADA] Alg. 2 l. 14-20 for each trained group: its pool `downsample`d to n (balanced once it
    met the exit condition, --unfinished_downsample otherwise) and the kept responses'
    `global_advantages` from the whole pool. Returns per group the kept indices and rewards, and
    the advantages of all kept responses in order."""
    keeps, kept_rewards, advantages = [], [], []
    for i in train_ids:
        rule = "balanced" if exit_rounds[i] is not None else args.unfinished_downsample
        keep = downsample(pools[i], n, threshold, random, rule)
        kept = [pools[i][j] for j in keep]
        advantages += global_advantages(
            kept, pools[i], threshold, args.scale_rewards, args.prompt_weight
        )
        keeps.append(keep)
        kept_rewards.append(kept)
    return keeps, kept_rewards, advantages


def seq_normaliser(prompts_per_step: int, n: int, world: int, max_completion_length: int) -> float:
    """The loss's one constant on each rank: a full batch's responses (prompts x n) / world (DDP
    and FSDP average the ranks' gradients) x max_completion_length, so no length bias."""
    return prompts_per_step * n / world * max_completion_length


def seq_loss(
    surrogate_sum: torch.Tensor,
    entropy_sum: torch.Tensor,
    kl_sum: torch.Tensor | float,
    entropy_coef: float,
    beta: float,
    normaliser: float,
) -> torch.Tensor:
    """The optimised loss: the clipped surrogate's sum less entropy_coef x the entropy's, plus beta
    x the k3 KL's, all over the same tokens and divided by one constant (`seq_normaliser`)."""
    loss = (surrogate_sum - entropy_coef * entropy_sum) / normaliser
    return loss + beta * kl_sum / normaliser


def seq_metrics(
    n_samples: list[int],
    exit_rounds: list[Optional[int]],
    kept_zero_var: list[bool],
    n: int,
    max_rounds: int,
    tags: Optional[list[str]] = None,
) -> dict:
    """[ADA] Sampling-dynamics metrics of one step, from every prompt's record (all ranks); with
    difficulty tags (the embedded task's levels) also the samples spent per prompt of each level."""
    p = max(1, len(n_samples))
    last = [max_rounds if e is None else e for e in exit_rounds]
    row = {
        "ada_samples_step": sum(n_samples),
        "ada_samples_per_prompt_mean": sum(n_samples) / p,
        "ada_samples_per_prompt_max": max(n_samples, default=0),
        "ada_inference_cost_rel": sum(n_samples) / (p * n),  # generated / what GRPO-n generates
        "ada_rounds_used": max(last, default=0),
        "ada_frac_unfinished": sum(e is None for e in exit_rounds) / p,
        "ada_frac_zero_var_groups_post": sum(kept_zero_var) / p,
    }
    for r in range(1, max_rounds + 1):  # fraction of the batch still active after round r
        row[f"ada_active_after_round_{r}"] = sum(e is None or e > r for e in exit_rounds) / p
    for tag in sorted(set(tags or []) - {""}):
        spent = [k for k, t in zip(n_samples, tags) if t == tag]
        row[f"ada_samples_per_prompt_{tag}"] = float(np.mean(spent))
    return row


@dataclass
class Response:
    """One response of a prompt's pool: its tokens, the sampler's log-probs (empty unless pi_old
    reads them), whether --max_completion_length cut it, and its reward functions' values (its
    samples.jsonl columns)."""

    ids: list[int]
    logprobs: list[float]
    truncated: bool
    columns: dict


class RoundSampler:
    """[ADA] (also in GRPO-n: its one round) `sample_round` of `multi_round_sampling`: m responses
    for each active prompt, scored, each kept in its prompt's pool (`responses`) and each round's
    `Scored` in `scored`. `add` brings the step's prompts in (and [DAPO] each refill's)."""

    def __init__(self, generator, tokenizer, task, encode, sampling, step: int, run_log):
        self.generator = generator
        self.tokenizer = tokenizer
        self.task = task
        self.encode = encode
        self.sampling = sampling
        self.step = step
        # each round's generation and scoring timed as they happen
        self.run_log = run_log
        self.examples = []
        self.prompts: list[list[int]] = []
        self.responses: list[list[Response]] = []
        # an empty batch first: every rank logs the same reward names, whatever it sampled
        self.scored: list[Scored] = [task.score([], [], [], [], step)]

    def add(self, examples: list) -> list[int]:
        """New prompts for this step; returns their indices."""
        first = len(self.examples)
        self.examples += examples
        self.prompts += [self.encode(example.prompt) for example in examples]
        self.responses += [[] for _ in examples]
        return list(range(first, len(self.examples)))

    def __call__(self, active: list[int], m: int) -> list[list[float]]:
        with self.run_log.timing("gen"):
            gens = self.generator.generate([self.prompts[i] for i in active], m, self.sampling)
        truncated = [reason == "length" for reason in gens.finish_reasons]
        with self.run_log.timing("reward"):
            texts = [
                self.tokenizer.decode(ids, skip_special_tokens=True) for ids in gens.completion_ids
            ]
            prompt_of = [self.examples[i] for i in active for _ in range(m)]
            # a cut completion scores 0 under the built-in rewards, its functions' total under
            # --reward_funcs
            scored = self.task.score(texts, prompt_of, gens.completion_ids, truncated, self.step)
        self.scored.append(scored)
        rewards = []
        for j, i in enumerate(active):
            rows = range(j * m, (j + 1) * m)
            for g in rows:
                ids = list(gens.completion_ids[g])
                logprobs = list(gens.logprobs[g])
                self.responses[i].append(Response(ids, logprobs, truncated[g], scored.columns(g)))
            rewards.append([scored.total[g] for g in rows])
        return rewards


def dynamic_sampling(rounds, pools, exit_rounds, sampler, done, args, accelerator):
    """[DAPO] Keep the groups with signal and refill with new prompts, n responses each, until the
    global batch is full or --max_dynamic_rounds extra rounds ran; `pools` and `exit_rounds` grow by
    the refills. Returns the groups to train on (at most this rank's share, the first sampled
    first), each group's extra round (0: the step's batch) and the extra rounds run."""
    origin = [0] * len(pools)
    dapo_rounds = 0
    # this rank's part of the batch
    share = len(my_slice(range(args.prompts_per_step), accelerator))
    while True:
        train_ids = [
            i for i, pool in enumerate(pools) if not zero_variance(torch.tensor([pool])).item()
        ]
        # the count that decides is global: every rank runs the same rounds
        global_kept = reduce_sums(accelerator, {"kept": min(len(train_ids), share)})["kept"]
        if global_kept >= args.prompts_per_step or dapo_rounds == args.max_dynamic_rounds:
            break
        # one extra round: a new batch of prompts, n responses each
        dapo_rounds += 1
        new_ids = my_slice(sampler.next_ids(args.prompts_per_step), accelerator)
        new = rounds.add([rounds.task.train[i] for i in new_ids])
        origin += [dapo_rounds] * len(new)
        refill = rounds(new, args.round_repeat)
        pools += refill
        exit_rounds += [1 if done(pool) else None for pool in refill]
    return train_ids[:share], origin, dapo_rounds


def ada_seq_sums(pools, rounds, train_ids, seqs: int, threshold: float, n: int) -> dict:
    """The step's sums: every generated response of every round (`rollout_sums`; NaN: no function
    scored it, out of reward_mean / _std), with zero_var the GRPO-n counterfactual (would the first
    n responses alone have had signal?), the groups and responses trained on (`seqs`, the loss's
    divisor); the clip count starts at 0 (the update adds it)."""
    rewards = [reward for pool in pools for reward in pool]
    responses = [response for pool in rounds.responses for response in pool]
    zero_var = zero_variance(torch.tensor([pool[:n] for pool in pools]).view(-1, n)).sum()
    success, cut = count_positive(rewards, threshold), sum(r.truncated for r in responses)
    sums = rollout_sums(len(pools), rewards, success, zero_var, cut, [r.ids for r in responses])
    return sums | {"kept_groups": len(train_ids), "seqs": seqs, "clip_sum": 0.0}


def ada_pool_records(pools, exit_rounds, train_ids, kept_rewards, rounds, n: int) -> list[tuple]:
    """[ADA] Every pool's record: its size, exit round, whether its kept group has no spread
    (groups not trained on, which DAPO drops, count as False) and its prompt's tag."""
    kept_zero_var = []
    if kept_rewards:
        kept_zero_var = zero_variance(torch.tensor(kept_rewards).view(-1, n)).tolist()
    post_zero_var = dict(zip(train_ids, kept_zero_var))
    return [
        (len(pool), exit_rounds[i], post_zero_var.get(i, False), rounds.examples[i].tag)
        for i, pool in enumerate(pools)
    ]


def partial_batch_note(step: int, row: dict, args) -> str:
    """[DAPO] The note for a step that trained on fewer groups than a full batch."""
    return (
        f"note: step {step} trained on {row['dapo_kept_groups']} of "
        f"{args.prompts_per_step} groups: --max_dynamic_rounds {args.max_dynamic_rounds} "
        "extra rounds did not fill the batch; the loss keeps a full batch's normaliser, so "
        "such a step is `dapo_batch_fill` of a full one"
    )


def sample_rows(
    tokenizer, rounds, pools, exit_rounds, trained, group_of, kept_rewards, adv_list, kinds, args
) -> list[dict]:
    """samples.jsonl rows of the first --log_samples_per_kind kept responses of each kind, with
    their pool's size and exit round."""
    flat_rewards = [reward for kept in kept_rewards for reward in kept]
    rows = []
    for k in first_of_each_kind(kinds, args.log_samples_per_kind):
        group = group_of[k]
        row = {
            "kind": kinds[k],
            "prompt": tokenizer.decode(rounds.prompts[group]),
            "completion": tokenizer.decode(trained[k].ids),
            "reward": flat_rewards[k],
            "advantage": adv_list[k],
            "truncated": trained[k].truncated,
            "ada_pool_size": len(pools[group]),
            "ada_exit_round": exit_rounds[group],
            **trained[k].columns,
        }
        rows.append(row)
    return rows


def ada_seq_metrics(
    totals: dict, accelerator, pool_records: list, trained_records: list, args, dapo_rounds: int
) -> dict:
    """[ADA] the mechanism's figures, from the step's sums over ranks and every prompt's record
    (size of its pool, exit round, whether its kept group has no spread, tag), gathered from all
    ranks (names: docs/ada_seq.md)."""
    n = args.num_generations
    # one gather of both record lists: every rank's, in rank order
    ranks = gather_list(accelerator, [(pool_records, trained_records)])
    records = [record for pools, _ in ranks for record in pools]
    row = {
        "ada_clip_frac": totals["clip_sum"] / max(1.0, totals["tok"]),
        # [ADA] sampling dynamics
        **seq_metrics(
            [record[0] for record in records],
            [record[1] for record in records],
            [record[2] for record in records],
            n,
            args.max_rounds,
            [record[3] for record in records],
        ),
        # [ADA] how many responses trained, their mean advantage per level
        **trained_advantage_metrics([record for _, trained in ranks for record in trained]),
    }
    # [DAPO] the dynamic-sampling baseline's cost and yield
    if args.dynamic_sampling:
        row["dapo_rounds"] = dapo_rounds
        row["dapo_sampled_groups"] = int(totals["groups"])
        row["dapo_kept_groups"] = int(totals["kept_groups"])
        # trained groups / a full batch: under a full batch's normaliser, the step's size against
        # a full one
        row["dapo_batch_fill"] = totals["kept_groups"] / args.prompts_per_step
        row["ada_inference_cost_rel"] = totals["rollouts"] / (args.prompts_per_step * n)

    return row


def main(args: Args) -> None:
    # ---------------- set-up: the launch, policy, reference, optimizer, generator ----------------
    accelerator, cpu_threads, log = start_run(args, "ada_seq")
    device = accelerator.device
    policy, tokenizer, model_path = load_training_policy(args, accelerator, log)
    # Countdown or a dataset; --reward_funcs: yours (docs/custom_task.md)
    # [ADA] a success: a reward above --positive_threshold (unless --success_reward)
    task = make_task(args, tokenizer, log, args.positive_threshold)
    ref_model = make_reference(policy, args)
    policy, ref_model = shard_models(args, policy, ref_model)
    optimizer, scheduler = make_optimizer(policy, args)
    # `model`: DDP-wrapped for the backward pass
    model, optimizer = prepare_training(accelerator, policy, optimizer, args.fsdp)
    encode = PromptEncoder(tokenizer, task.templated)
    sampler = PromptSampler(len(task.train), args.seed)
    compiled = make_compiled(args, log)
    generator = make_generator(args, model_path, policy, tokenizer, accelerator, compiled, log)
    # pi_old's log-probs from the sampler only where the update's own first pass differs
    # the sampler correction reads the generator's log-probs (with HF generate too, when asked)
    sampler_logprobs = uses_sampler_logprobs(args) or args.vllm_importance_sampling_correction
    sampling, eval_sampling = sampling_configs(args, logprobs=sampler_logprobs)
    # greedy samples are scored at T = 1
    temperature = args.temperature if args.temperature > 0 else 1.0
    pack = packed_row_tokens(args, device)

    def run_eval() -> dict:
        # a shared CPU: fit the free cores; FSDP + HF generate: whole weights
        torch.set_num_threads(cpu_threads.count(torch.get_num_threads()))
        with gathered(policy, enabled=generator.reads_policy):
            return evaluate_policy(
                generator,
                tokenizer,
                task,
                encode,
                eval_sampling,
                args,
                accelerator,
                train_prompts_first=True,
            )

    # ---------------- resume, logs, step-0 evaluation ----------------
    checkpoints = Checkpoints(args, accelerator, model, tokenizer, optimizer, scheduler, log)
    start_step, saved = checkpoints.resume(sampler, generator, policy)
    counters = saved["counters"] if saved else {"rollouts": 0, "gen_tokens": 0}
    run_log = RunLog(args, accelerator, "ada_seq", start_step, saved is not None, log)
    # Ctrl-C / SIGTERM from here on: the run stops after its step, with a checkpoint
    stop = GracefulStop(log)
    if start_step == 0:
        run_log.first_row(run_eval(), compiled)
    n = args.num_generations
    threshold = success_threshold(args)
    k_pos, k_neg = args.quotas()
    done = partial(
        exit_reached, rule=args.exit_condition, k_pos=k_pos, k_neg=k_neg, threshold=threshold
    )
    # one constant normaliser, the global kept count / world (DDP averages) x
    # --max_completion_length: no length bias
    normaliser = seq_normaliser(
        args.prompts_per_step, n, accelerator.num_processes, args.max_completion_length
    )
    warned_partial = False

    forward = Forward(tokenizer.pad_token_id, device, args.dtype, temperature, pack, compiled)

    # sampler correction (TRL's vllm_importance_sampling_*, on by default with vLLM): (trainer
    # log-probs, sampler log-probs, known tokens) -> (weights, sums); the module loads only then
    correct_sampler = None
    if args.vllm_importance_sampling_correction:
        from common.rl.sampler_correction import sampler_is_weights

        correct_sampler = partial(
            sampler_is_weights,
            mode=args.vllm_importance_sampling_mode,
            clip_min=args.vllm_importance_sampling_clip_min,
            clip_max=args.vllm_importance_sampling_clip_max,
        )

    for step in range(start_step + 1, args.max_steps + 1):
        # a shared CPU: torch's threads fit the cores other processes leave free (--num_threads)
        run_log.start_step(cpu_threads)

        # ======== sample + verify: [ADA] rounds of M for the still-active prompts (Alg. 2 l. 3-12)
        batch_ids = my_slice(sampler.next_ids(args.prompts_per_step), accelerator)
        rounds = RoundSampler(generator, tokenizer, task, encode, sampling, step, run_log)
        first_batch = rounds.add([task.train[i] for i in batch_ids])
        # FSDP + HF generate: whole weights, as ranks run different numbers of rounds (vLLM: its
        # own copy)
        with gathered(policy, enabled=generator.reads_policy):
            pools, exit_rounds = multi_round_sampling(
                len(first_batch), rounds, done, args.max_rounds, args.round_repeat
            )
            # [DAPO] (also in GRPO-n: every group trained, from the step's batch, no extra round)
            train_ids, origin, dapo_rounds = list(range(len(first_batch))), [0] * len(pools), 0
            # [DAPO] dynamic sampling baseline (Yu et al., 2025; Reinforce-Ada Table 2)
            if args.dynamic_sampling:
                refill = dynamic_sampling(
                    rounds, pools, exit_rounds, sampler, done, args, accelerator
                )
                train_ids, origin, dapo_rounds = refill
        with run_log.timing("gen"):
            # vLLM on a GPU: its memory goes to training; the push brings the weights back
            generator.sleep()

        # ===== [ADA] downsample every pool to n; advantages from the whole pool (Alg. 2 l. 14-20)
        # per trained group: its n kept rewards; per kept response: its advantage, the response, its
        # prompt's index
        keeps, kept_rewards, adv_list = pool_advantages(
            train_ids, pools, exit_rounds, n, threshold, args
        )
        trained = [rounds.responses[i][j] for i, keep in zip(train_ids, keeps) for j in keep]
        group_of = [i for i, keep in zip(train_ids, keeps) for _ in keep]
        flat_prompts = [rounds.prompts[i] for i in group_of]
        completions = [response.ids for response in trained]
        advantages = torch.tensor(adv_list, dtype=torch.float32, device=device)
        # --mask_truncated_completions: kept responses cut by the length limit get no gradient
        masked = [response.truncated and args.mask_truncated_completions for response in trained]
        unmasked = torch.tensor([not cut for cut in masked], dtype=torch.bool, device=device)

        # ======== update: GRPO-style clipped surrogate on the kept responses; pi_old = the sampler
        with run_log.timing("update"):
            lengths = [len(prompt) + len(ids) for prompt, ids in zip(flat_prompts, completions)]
            old_logprobs = [response.logprobs for response in trained] if sampler_logprobs else None
            max_rows, max_tokens = args.micro_batch_size, args.max_tokens_per_microbatch
            update_sums, grad_norms = [], []
            # sampler correction: each micro-batch's (pi_old, rho, sums) from epoch 0, by first row
            epoch0 = {}
            for epoch in range(args.num_iterations):
                micro = micro_batches(
                    len(completions),
                    max_rows,
                    accelerator,
                    model,
                    (ref_model,),
                    lengths,
                    max_tokens,
                )
                for rows in micro:
                    mb = forward.rows_at(rows, flat_prompts, completions, old_logprobs)
                    # the entropy bonus of the paper's set-up (Sec. 4) needs its gradient
                    logp, entropy = forward(model, mb, entropy_grad=args.entropy_coef > 0)
                    mask = mb.loss_mask * unmasked[rows][:, None]
                    # one epoch with the HF weights: pi_old is this very pass (exact, ratio 1)
                    old_logp = mb.sampler_logp if sampler_logprobs else logp.detach()
                    # sampler correction: pi_old is the trainer's epoch-0 pass (the weights that
                    # sampled), kept for later epochs with rho = pi_old / pi_sampler per token;
                    # TRL's rule: rho multiplies the clipped surrogate
                    if correct_sampler and epoch == 0:
                        weights_and_sums = correct_sampler(logp, mb.sampler_logp, mask)
                        epoch0[rows[0]] = (logp.detach(), *weights_and_sums)
                    old_logp, sampler_weight, is_sums = epoch0.get(rows[0], (old_logp, 1.0, {}))
                    per_token, clipped = clipped_surrogate(
                        logp, old_logp, advantages[rows, None], args.epsilon, args.epsilon_high
                    )
                    surrogate_sum = (per_token * sampler_weight * mask).sum()
                    entropy_sum = (entropy * mask).sum()
                    kl_sum = 0.0
                    if ref_model is not None:
                        ref_logp, _ = forward(ref_model, mb, grad=False)
                        kl_sum = (kl_k3(logp, ref_logp) * mask).sum()
                    # one constant for the policy gradient, the entropy and the KL
                    loss = seq_loss(
                        surrogate_sum, entropy_sum, kl_sum, args.entropy_coef, args.beta, normaliser
                    )
                    accelerator.backward(loss)
                    # the on-policy epoch's numbers are the ones logged; `loss`: the surrogate /
                    # (kept responses x max_completion_length), in float64 as the sum is kept
                    if epoch == 0:
                        loss_sum = surrogate_sum.detach().double() / args.max_completion_length
                        mb_sums = dict(loss_sum=loss_sum, ent_sum=entropy_sum, tok=mask.sum())
                        mb_sums |= dict(clip_sum=(clipped * mask).sum(), kl_sum=kl_sum)
                        # sampler/trainer agreement, before any update (this pass is the first)
                        if sampler_logprobs:
                            gap = (logp.detach() - mb.sampler_logp).abs() * mb.loss_mask
                            mb_sums |= dict(gap_sum=gap.sum(), gap_tok=mb.loss_mask.sum())
                        update_sums.append(mb_sums | is_sums)
                grad_norms.append(
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                )
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)

        # ======== push the new weights to the generator, once per update phase (no-op for HF) =====
        generator.sync_weights(policy)

        # ================ metrics: the step's sums over ranks, the shared keys, the method's ======
        sums = ada_seq_sums(pools, rounds, train_ids, len(adv_list), threshold, n)
        lr, scored = scheduler.get_last_lr()[0], Scored.join(rounds.scored)
        row, totals = run_log.step_metrics(
            step, counters, scored, sums, update_sums, grad_norms, lr, loss_per="seqs"
        )
        # [ADA] every pool's record (size, exit round, whether its kept group has no spread, tag)
        # and every trained response's (advantage, tag)
        pool_records = ada_pool_records(pools, exit_rounds, train_ids, kept_rewards, rounds, n)
        trained_records = [(adv, rounds.examples[i].tag) for adv, i in zip(adv_list, group_of)]
        row |= ada_seq_metrics(
            totals, accelerator, pool_records, trained_records, args, dapo_rounds
        )
        # [DAPO] once a run: a step trained on fewer groups than a full batch
        if args.dynamic_sampling and not warned_partial and row["dapo_batch_fill"] < 1:
            warned_partial = True
            log(partial_batch_note(step, row, args))

        # ================ evaluation, sample log, the row, checkpoint, stop ================
        if run_log.evaluation_due(step):
            with run_log.timing("eval"):
                row.update(run_eval())
        # a few kept rollouts (DAPO's refills apart)
        if run_log.samples_due(step):
            kinds = ["dynamic_refill" if origin[group] else "fresh" for group in group_of]
            kept = trained, group_of, kept_rewards, adv_list, kinds
            picked = sample_rows(tokenizer, rounds, pools, exit_rounds, *kept, args)
            run_log.write_samples(step, picked)
        run_log.write_row(row, compiled)
        stopping = stop.any_rank_signalled(accelerator)
        if checkpoints.due(step, stopping):
            state = {"sampler": sampler.state_dict(), "counters": counters, "method": {}}
            checkpoints.save(step, state, stopping)
        if stopping:
            break
    run_log.close()
    export_model(args, accelerator, policy, tokenizer, generator.end_ids, "ada_seq", __doc__)
    # trackers finish and the process group ends now, not at exit: no hang, no abort
    end_processes(accelerator)
    stop.close()
    summary = ["ada_samples_per_prompt_mean", "ada_inference_cost_rel", "ada_adv_mean_trained"]
    log(run_summary(args.output_dir, summary))


if __name__ == "__main__":
    raise SystemExit(
        main(parse_args(Args, description=__doc__.split("\n\n")[0])) or GracefulStop.exit_status()
    )
