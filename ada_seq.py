"""Reinforce-Ada-Seq: adaptive multi-round sampling, downsampled to a static GRPO batch. One file.

Paper: Xiong, Ye, Liao, Dong, Xu, Monz, Bian, Jiang, Zhang, "Reinforce-Ada: An Adaptive Sampling Framework under
Non-linear RL Objectives" (preprint; code: RLHFlow/Reinforce-Ada), Sec. 3.2 and Alg. 2. Docs: docs/ada_seq.md.

GRPO with a small group (n = 4) often sees a prompt's rollouts all fail (or all pass): every advantage is
0 and the prompt teaches nothing. Reinforce-Ada-Seq keeps sampling the prompts that lack signal:
  phase 1: every prompt of the batch starts active; each round draws M (`round_repeat`) responses for each
           active prompt; a prompt leaves the active set once its pool meets the exit condition
           (`positive`: >= K_pos positives; `balanced`: >= K_pos positives and >= K_neg negatives);
           at most `max_rounds` rounds (N_max = M * max_rounds responses per prompt).
  phase 2: each pool is downsampled to exactly n responses (up to n//2 positives, the rest negatives,
           topping up from the other side), and advantages use the *whole pool's* statistics:
           A_i = r_i - mean(pool) (Alg. 2 line 19; `--scale_rewards true` divides by std(pool)), optionally
           x w(p_hat).
The update is a GRPO-style clipped policy gradient on n responses per prompt (plus the paper's entropy bonus),
so the backward cost is that of GRPO-n; only inference grows. Lines marked [ADA] are what the paper adds to GRPO;
GRPO-n runs them too, with one round of n (the pool is the group, nothing is downsampled, no prompt exits early).

The baseline, GRPO-n, is this file with one round of n (`--max_rounds 1 --round_repeat n`): the pool is the
group, and the advantage is the paper's eq. (2), (r - mean) / std over the group. `--scale_rewards false` turns
either into its Dr. GRPO variant, A = r - mean (named "Dr. GRPO-n" in the docs and benchmark tables).

The paper's other baseline (Sec. 3.3, Table 2), DAPO's dynamic sampling (Yu et al., 2025), is GRPO-n plus
`--dynamic_sampling` (lines marked [DAPO]; without the flag they never run, except one marked "[DAPO] (also in
GRPO-n: ...)", which changes nothing there): groups whose n rewards are all equal are dropped, and groups for new
prompts from the sampler are drawn (a whole batch of `prompts_per_step` per extra round) until the batch is full
again or `--max_dynamic_rounds` extra rounds were made. The count that decides is global (every rank runs the
same rounds), and each rank's kept groups count only up to its share of the batch (`my_slice`, the first ones
kept in sampling order): so the batch never exceeds `prompts_per_step` groups, and a full batch has every rank's
share (the loss normaliser stays that of a full batch). A batch still short after the last extra round is trained
as it is, with that full batch's normaliser, so its step is `dapo_batch_fill` (trained groups / prompts_per_step,
logged every step) of a full one; verl's DAPO recipe instead keeps generating until the batch is full (up to its
generation-batch limit). Advantages are GRPO-n's (eq. 2 over the group).

Where this file follows the authors' public code rather than the paper's text (both are flags):
- Advantage of Reinforce-Ada (`--max_rounds` > 1): A = r - mean(pool), no std: Alg. 2 line 19 and Sec. 3.2's
  estimator, and the authors' run script (RLHFlow/Reinforce-Ada `scripts/run_reinforce_ada.sh` at 6895ad3 sets
  `norm_adv_by_std_in_grpo=False`; the line came with the commit "correct training script error", 2025-10-07).
  Their GRPO script (`scripts/run_grpo.sh` at 05be605) leaves verl's std on, eq. (2): so GRPO-n (`--max_rounds 1`)
  divides by the group's std by default. `--scale_rewards true/false` overrides both. With the std, a kept
  positive of a pool with 1 success in 32 would get A = 5.6 instead of 0.97: the update tilts toward rare wins.
- Warm-up: 10 steps (the paper's set-up, Sec. 4; `run_reinforce_ada.sh`: `lr_warmup_steps=10`).
- Loss aggregation: the authors' script uses verl's `token-mean` (the surrogate averaged over the batch's
  generated tokens); this file divides the token sum by the constant kept responses x max_new_tokens (no length
  bias), so its step is that of token-mean x (mean completion length / max_new_tokens): about 0.37x on the
  embedded task (docs/ada_seq.md).
- Exit quotas: `positive` exits after K_pos = 1 positive (the public code); the text's example is K_pos = 16 at
  N_max = 128 (`--k_pos 16`). `balanced` needs n//2 positives and n - n//2 negatives in both.
- Entropy bonus: the paper's set-up (Sec. 4) uses coefficient 1e-4, the default here; the public run script sets
  0 (`--entropy_coef 0`).
- Unfinished prompts (no exit after the last round) are downsampled with the same balanced rule (Alg. 2 line
  18); the public code's positive-focused fallback keeps the pool's pass ratio instead (`--unfinished_downsample
  pass_ratio`).

Choices made here (the paper leaves them open):
- Downsampling draws the kept positives/negatives uniformly with Python's global `random` (seeded per
  rank, saved in every checkpoint, so a resumed run draws the same).
- The baseline is the pool's mean reward (Alg. 2 line 17), which is p_hat = N_pos/N for 0/1 rewards; with
  shaped rewards it stays the unbiased baseline, and N_pos/N (reward > positive_threshold) is used only
  for the optional weight. The std is the population std of the pool's rewards (eq. 2 leaves it open).
- `--prompt_weight none` is the default, as in the authors' public code: its advantage is r - mean(pool)
  with no 1/p_hat factor. `inv_p` re-introduces the Sec. 3.2 weight, which can scale a hard prompt's
  gradient by up to N_max (the learning rate may need lowering).
- pi_old is the sampling policy; one optimizer step per batch by default, so the clipped surrogate equals
  the policy gradient unless `--num_iterations` > 1 or the backends disagree. With the HF backend and one epoch
  pi_old's log-probs are read from the update's own forward pass (no extra scoring pass after sampling);
  with vLLM or more epochs they are the sampler's (`--old_logprobs`).
- Logged `loss`: the clipped surrogate summed over tokens and divided by (kept responses x max_new_tokens),
  the constant the optimised loss uses too (no length bias). The entropy bonus, entropy_coef x the token
  entropies summed and divided by the same constant, is subtracted in the optimised loss but not in `loss`;
  with `--beta` > 0, beta x the k3 KL summed over the same tokens is added over the same constant too (one
  normaliser for every term); `kl` logs the KL per trained token.
- Metrics: `rollouts` / `gen_tokens` count every generated response of every round (inference cost);
  `frac_zero_var_groups` is measured on each prompt's first n responses (what GRPO-n would have trained
  on), `ada_frac_zero_var_groups_post` on the kept groups; `ada_active_after_round_r` is a fraction.
  [DAPO] `dapo_rounds` (extra rounds), `dapo_sampled_groups`, `dapo_kept_groups`, `dapo_batch_fill` (kept groups
  / prompts_per_step); `ada_inference_cost_rel`
  is then generated / (prompts_per_step x n).
- A completion cut by `max_new_tokens` gets reward 0 (never a success); `--mask_truncated_completions` also
  takes the kept ones out of the loss. `sampler_logp_diff` (when the generator returns log-probs) is the mean
  |sampler - trainer| log-prob of the kept tokens in the first pass; samples.jsonl holds a few kept rollouts
  (kind `fresh`, [DAPO] `dynamic_refill`) with their pool size and exit round.

    python ada_seq.py                                         # SEQ-BALANCE on the embedded Countdown task
    python ada_seq.py --exit_condition positive               # SEQ-POS
    python ada_seq.py --max_rounds 1 --round_repeat 4         # GRPO-n4 (one round of n: nothing adaptive)
    python ada_seq.py --max_rounds 1 --round_repeat 4 --scale_rewards false   # Dr. GRPO-n4 (A = r - mean)
    python ada_seq.py --max_rounds 1 --round_repeat 8 --num_generations 8   # GRPO-n8 (n16 likewise)
    python ada_seq.py --max_rounds 1 --round_repeat 4 --dynamic_sampling   # DAPO dynamic sampling on GRPO-n4
    accelerate launch ada_seq.py --model_name_or_path Qwen/Qwen2.5-Math-1.5B --dataset_name openai/gsm8k \
        --dataset_config main --use_vllm --dtype bfloat16 --learning_rate 1e-6
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Annotated, Callable, Literal, Optional

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from common.run import checkpoint
from common.rl.advantages import zero_variance
from common.run.flags import BaseArgs, Range
from common.run.flags import parse_args
from common.tasks.loading import PromptEncoder, PromptSampler
from common.tasks.scoring import Scored, reward_moments, reward_sums
from common.distributed.ranks import GracefulStop, collective_timeout, end_processes, gather_list, gathered, micro_batches, my_slice, reduce_sums
from common.generation.hf import HFGenerator, SamplingConfig, end_token_ids
from common.run.launch import CpuThreads, resolve_accelerate_precision, resolve_accelerate_sharding
from common.rl.logprobs import token_logprobs
from common.rl.losses import clipped_surrogate, kl_k3
from common.rl.masking import pad_sequences, right_align
from common.run.logs import MetricsLogger, SampleLogger, check_tracker
from common.tasks.evaluation import evaluate, evaluate_train_prompts, train_prompt_sample
from common.rl.advantages import trained_advantage_metrics
from common.run.output_dir import claim_output_dir
from common.model.policy import autocast, frozen_reference, load_policy
from common.run.summary import run_summary
from common.tasks.loading import make_task


@dataclass
class Args(BaseArgs):
    num_generations: Annotated[int, Range(2)] = 4
    """[ADA] update group size n: each prompt's pool is downsampled to exactly n responses (backward cost = GRPO-n)"""
    round_repeat: Annotated[int, Range(2)] = 8
    """[ADA] M, responses drawn per active prompt in each round (Alg. 2 requires M >= n)"""
    max_rounds: Annotated[int, Range(1)] = 4
    """[ADA] maximum sampling rounds; N_max = max_rounds * round_repeat responses per prompt. `--max_rounds 1
    --round_repeat n` is GRPO-n"""
    exit_condition: Literal["balanced", "positive"] = "balanced"
    """[ADA] when a prompt leaves the active set: `positive` (SEQ-POS: >= k_pos positives) or `balanced` (SEQ-BALANCE:
    >= k_pos positives and >= k_neg negatives)"""
    k_pos: Annotated[Optional[int], Range(0)] = None
    """[ADA] K_pos, positives needed to exit (default: 1 under `positive`, as the authors' code; n//2 under
    `balanced`)"""
    k_neg: Annotated[Optional[int], Range(0)] = None
    """[ADA] K_neg, negatives needed to exit under `balanced` (default n - n//2)"""
    positive_threshold: Annotated[float, Range(None, 1, hi_open=True)] = 0.7
    """[ADA] a response is positive when its training reward (in [0, 1], may be shaped) > this; < 0: every response"""
    scale_rewards: Optional[bool] = None
    """divide advantages by the std of the prompt's pool (eq. 2). Default (unset): true for GRPO-n (`--max_rounds 1`,
    eq. 2; false there = Dr. GRPO-n), false for Reinforce-Ada (`--max_rounds` > 1: A = r - mean(pool), Alg. 2 line
    19, as the authors' run script); the value used is written to args.json"""
    unfinished_downsample: Literal["balanced", "pass_ratio"] = "balanced"
    """[ADA] prompts still active after the last round: the balanced rule of Alg. 2 line 18 (as finished ones), or
    `pass_ratio`: about n x the pool's pass ratio positives (at least 1 if any), the public code's fallback"""
    prompt_weight: Literal["none", "inv_p", "inv_sqrt_p"] = "none"
    """[ADA] explicit per-prompt gradient weight w(p_hat), p_hat = N_pos/N of the full pool: `none` (the public code's
    default), `inv_p` (the re-introduced 1/p_hat of Sec. 3.2), `inv_sqrt_p`"""
    epsilon: Annotated[float, Range(0, 1, hi_open=True)] = 0.2
    """lower clip range of the ratio pi_theta/pi_old (clip-higher setup of the paper: [0.2, 0.28])"""
    epsilon_high: Annotated[float, Range(0)] = 0.28
    """upper clip range of the ratio pi_theta/pi_old"""
    num_iterations: Annotated[int, Range(1)] = 1
    """optimizer steps per batch (each a full pass over the kept responses); with 1 the ratio is 1 and clipping is
    inactive"""
    beta: Annotated[float, Range(0, zero="off, no reference model")] = 0.0
    """KL coefficient to the reference (initial) policy: the k3 estimator summed over the trained tokens, divided by
    the policy gradient's constant (responses x max_new_tokens); the paper uses none"""
    entropy_coef: Annotated[float, Range(0, zero="off")] = 1e-4
    """entropy bonus: entropy_coef x token entropy is subtracted from the loss (the paper's set-up: 1e-4)"""
    old_logprobs: Literal["auto", "sampler"] = "auto"
    """where pi_old's log-probs come from: `auto` = the update's own first forward pass when that is exact (HF
    backend, one epoch: the weights that sampled are the weights being updated), else the sampler; `sampler` =
    always the generator's log-probs (an extra scoring pass with the HF backend)"""
    warmup_steps: Annotated[int, Range(0)] = 10
    """linear warm-up steps, then constant (the paper's set-up, Sec. 4: a 10-step warm-up)"""
    dynamic_sampling: bool = False
    """[DAPO] the DAPO dynamic-sampling baseline (needs `--max_rounds 1`): drop groups whose rewards are all equal
    and refill the batch with groups for new prompts, up to `max_dynamic_rounds` extra rounds"""
    max_dynamic_rounds: Annotated[int, Range(0)] = 4
    """[DAPO] cap on the extra generation rounds (each a new batch of prompts_per_step prompts) per step"""

    def quotas(self) -> tuple[int, int]:
        """(K_pos, K_neg) with the n-derived defaults filled in."""
        n = self.num_generations
        default_pos = 1 if self.exit_condition == "positive" else n // 2
        return (default_pos if self.k_pos is None else self.k_pos), (n - n // 2 if self.k_neg is None else self.k_neg)

    def __post_init__(self) -> None:
        if self.scale_rewards is None:  # [ADA] Reinforce-Ada: r - mean(pool) (Alg. 2 line 19); GRPO-n: eq. (2)
            self.scale_rewards = self.max_rounds == 1

    def validate(self) -> None:  # single values: their declarations (common/run/flags.py); here, combinations
        n = self.num_generations
        if self.round_repeat < n:
            raise SystemExit(f"--round_repeat {self.round_repeat}: must be >= --num_generations {n} "
                             "(Alg. 2: M >= n)")
        if self.dynamic_sampling and self.max_rounds != 1:  # [DAPO] a fixed group size: GRPO-n's one round
            raise SystemExit(f"--dynamic_sampling samples one round of --round_repeat responses per prompt (DAPO); "
                             f"it needs --max_rounds 1, got --max_rounds {self.max_rounds}")


def count_positive(rewards: list[float], threshold: float) -> int:
    """[ADA] Responses counting as positive: reward > threshold (strict, so shaped partial credit can stay negative)."""
    return sum(1 for reward in rewards if reward > threshold)


def exit_reached(rewards: list[float], rule: str, k_pos: int, k_neg: int, threshold: float) -> bool:
    """[ADA] ExitCondition(S_x) of Alg. 2 (Sec. 3.2, "Exit condition")."""
    pos = count_positive(rewards, threshold)
    if rule == "positive":
        return pos >= k_pos
    return pos >= k_pos and sum(1 for reward in rewards if reward <= threshold) >= k_neg  # NaN (no reward): neither


def multi_round_sampling(num_prompts: int, sample_round: Callable[[list[int], int], list[list[float]]],
                         done: Callable[[list[float]], bool], max_rounds: int, m: int):
    """[ADA] Phase 1 of Alg. 2 (lines 3-12): rounds of M samples for the still-active prompts.

    `sample_round(active, m)` draws m responses for each prompt index in `active` and returns their rewards
    (one list per active prompt, same order); the caller keeps the responses themselves in the same order.
    Returns (pools, exit_rounds): every prompt's rewards in generation order, and the 1-based round after
    which it met the exit condition (None: still unfinished after the last round).
    """
    pools: list[list[float]] = [[] for _ in range(num_prompts)]
    exit_rounds: list[Optional[int]] = [None] * num_prompts
    active = list(range(num_prompts))
    for r in range(1, max_rounds + 1):
        if not active:
            break
        new = sample_round(active, m)
        if len(new) != len(active):
            raise ValueError(f"sample_round returned {len(new)} groups for {len(active)} active prompts")
        for i, rewards in zip(active, new):
            pools[i].extend(rewards)
            if done(pools[i]):
                exit_rounds[i] = r
        active = [i for i in active if exit_rounds[i] is None]
    return pools, exit_rounds


def downsample(rewards: list[float], n: int, threshold: float, rng, rule: str = "balanced") -> list[int]:
    """[ADA] Alg. 2 line 18: indices (ascending) of the n pool responses kept for the update.

    `balanced`: up to n//2 positives, the rest negatives; when one side runs short the other tops up.
    `pass_ratio` (the public code's fallback for unfinished prompts): floor(n x N_pos/N) positives, at least 1
    when the pool has one, the rest negatives (topped up the same way). Which positives (negatives) are kept is a
    uniform draw with `rng` (the script passes the global `random`, checkpointed per rank). Responses of one
    prompt are i.i.d. given their reward, so the draw only guards against backends returning a non-random order.
    """
    if len(rewards) < n:
        raise ValueError(f"pool of {len(rewards)} responses cannot be downsampled to {n}")
    pos = [j for j, r in enumerate(rewards) if r > threshold]
    neg = [j for j, r in enumerate(rewards) if r <= threshold]
    unrated = [j for j, r in enumerate(rewards) if math.isnan(r)]  # no function scored them: kept only to fill up
    want_pos = n // 2 if rule == "balanced" else max(1, len(pos) * n // max(1, len(pos) + len(neg)))
    n_pos = min(len(pos), want_pos)
    n_neg = min(len(neg), n - n_pos)
    n_pos = min(len(pos), n - n_neg)  # negatives ran short: top up with positives
    return sorted(rng.sample(pos, n_pos) + rng.sample(neg, n_neg) + rng.sample(unrated, n - n_pos - n_neg))


def global_advantages(kept: list[float], pool: list[float], threshold: float, std_norm: bool, weight: str,
                      eps: float = 1e-6) -> list[float]:
    """[ADA] Advantages of the kept responses against the whole pool's statistics (Sec. 3.2).

    A_i = r_i - mean(pool) (Alg. 2 lines 17-19; for 0/1 rewards mean(pool) = p_hat = N_pos/N);
    with `std_norm` / (std(pool) + eps) (eq. 2 on the pool, the script's default); optionally x w(p_hat)
    with p_hat = N_pos/N floored at 1/N
    (`inv_p`: the re-introduced explicit weight 1/p_hat of the Sec. 3.2 estimator; `inv_sqrt_p`: 1/sqrt(p_hat)).
    """
    pool = [r for r in pool if not math.isnan(r)] or [0.0]  # NaN: no reward, out of the pool's statistics
    mean = sum(pool) / len(pool)
    adv = [0.0 if math.isnan(r) else r - mean for r in kept]  # and advantage 0
    if std_norm:
        std = math.sqrt(sum((r - mean) ** 2 for r in pool) / len(pool))
        adv = [a / (std + eps) for a in adv]
    p_hat = max(count_positive(pool, threshold), 1) / len(pool)
    w = {"none": 1.0, "inv_p": 1.0 / p_hat, "inv_sqrt_p": 1.0 / math.sqrt(p_hat)}[weight]
    return [w * a for a in adv]


def seq_metrics(n_samples: list[int], exit_rounds: list[Optional[int]], kept_zero_var: list[bool], n: int,
                max_rounds: int, tags: Optional[list[str]] = None) -> dict:
    """[ADA] Sampling-dynamics metrics of one step, from every prompt's record (all ranks); with difficulty tags
    (the embedded task's levels) also the samples spent per prompt of each level."""
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
        row[f"ada_samples_per_prompt_{tag}"] = float(np.mean([k for k, t in zip(n_samples, tags) if t == tag]))
    return row


def main(args: Args) -> None:
    # ---------------- set-up: accelerator, seeds, output dir ----------------
    args.fsdp, args.dtype = resolve_accelerate_sharding(args.fsdp), resolve_accelerate_precision(args.dtype)
    cpu_threads = CpuThreads(args.num_threads, hold=args.torch_compile)  # --num_threads, or free cores: launch.py
    torch.set_num_threads(cpu_threads.count(torch.get_num_threads(), settle=0.2))  # before any torch work
    check_tracker(args.report_to)
    args.output_dir = args.output_dir or f"runs/ada_seq-seed{args.seed}"
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), project_dir=args.output_dir,
                              log_with=None if args.report_to == "none" else args.report_to,
                              kwargs_handlers=collective_timeout(args.collective_timeout))  # one line on expiry
    device, world = accelerator.device, accelerator.num_processes
    log = lambda msg: print(msg, flush=True) if accelerator.is_main_process else None  # noqa: E731  (once a run)
    rank_seed = args.seed + accelerator.process_index  # ranks sample different rollouts
    random.seed(rank_seed)
    np.random.seed(rank_seed)
    torch.manual_seed(rank_seed)
    claim_output_dir(args, accelerator, log)  # before any model: refuses a used or unshared folder

    # ---------------- policy, frozen reference, optimizer ----------------
    model_path = args.model_name_or_path
    if model_path == "embedded":  # the tiny Countdown model: rank 0 builds it once, the others find it cached
        from common.demo.tiny_model import ensure_embedded_base

        with accelerator.main_process_first():
            model_path = str(ensure_embedded_base(log=log))
    policy, tokenizer = load_policy(model_path)  # fp32 master weights; --dtype is the compute dtype (autocast)
    policy.to(device).train()  # training mode: from_pretrained returns eval mode (checkpointing needs train)
    if args.gradient_checkpointing:  # activations recomputed in backward (training passes only; generate is eval)
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora_r:  # LoRA: only the adapters train (fp32); the frozen base is stored in the compute dtype
        from common.model.lora import AdaptersOff, add_lora

        policy = add_lora(policy, args.lora_r, args.lora_alpha, args.lora_target_modules, args.dtype)
    task = make_task(args, tokenizer, log)  # Countdown or a dataset; --reward_funcs: yours (docs/custom_task.md)
    ref_model = None
    if args.beta > 0:  # the KL reference: the initial weights, frozen
        ref_model = AdaptersOff(policy) if args.lora_r else \
            frozen_reference(policy, args.dtype, args.fsdp)  # computes as the policy at step 0
    if args.fsdp:  # FSDP2: each rank keeps 1/world of every weight (common/distributed/fsdp.py); the optimizer sees the shards
        from common.distributed.fsdp import shard

        policy, ref_model = shard(policy, args.dtype), None if ref_model is None else shard(ref_model, args.dtype)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=args.weight_decay)
    warmup = max(1, args.warmup_steps)  # linear warm-up, then constant
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    # `model`: DDP-wrapped for the backward pass (FSDP: the sharded policy is its own wrapper)
    model, optimizer = (policy, accelerator.prepare(optimizer)) if args.fsdp else accelerator.prepare(policy, optimizer)

    # ---------------- data and generator ----------------
    encode = PromptEncoder(tokenizer, task.templated)
    sampler = PromptSampler(len(task.train), args.seed)
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
    # pi_old from the sampler only where it differs from the update's own first pass (`--old_logprobs`)
    sampler_logprobs = args.old_logprobs == "sampler" or args.use_vllm or args.num_iterations > 1
    sampling = SamplingConfig(max_new_tokens=args.max_completion_length, temperature=args.temperature,
                              logprobs=sampler_logprobs)
    eval_temperature = args.temperature if args.eval_temperature is None else args.eval_temperature  # 0: greedy
    eval_sampling = SamplingConfig(max_new_tokens=args.max_completion_length, temperature=eval_temperature, logprobs=False)
    temperature = args.temperature if args.temperature > 0 else 1.0  # the generator scores greedy samples at T=1
    pack = (args.pack_row_tokens or (2048 if device.type == "cuda" else 128)) if args.padding_free else 0  # rows

    def run_eval() -> dict:
        torch.set_num_threads(cpu_threads.count(torch.get_num_threads()))  # fit the free cores
        with gathered(policy, enabled=generator.reads_policy):  # FSDP + HF generate: whole weights (else no-op)
            score = lambda examples: evaluate(generator, tokenizer, examples, encode, task.eval_success,  # noqa: E731
                                              eval_sampling, args.eval_samples, accelerator)
            train_fit = evaluate_train_prompts(score, train_prompt_sample(task.train, args.eval_train_prompts))
            return {**score(task.eval), **train_fit}  # eval_train_*: the pool's fit, to compare with held-out

    # ---------------- resume ----------------
    start_step, counters = 0, {"rollouts": 0, "gen_tokens": 0}
    resume_from = checkpoint.resolve_resume(args.resume_from_checkpoint, args.output_dir)
    if resume_from is not None:  # all sampling state is in the checkpointed RNGs and the prompt sampler
        start_step, state = checkpoint.load_checkpoint(resume_from, accelerator, model, optimizer, scheduler)
        sampler.load_state_dict(state["sampler"])
        counters = state["counters"]
        generator.sync_weights(policy)
        log(f"resumed from {resume_from} at step {start_step}")

    # ---------------- logging, step-0 evaluation, graceful stop ----------------
    logger = MetricsLogger(args.output_dir, accelerator, args.report_to, vars(args),
                           resume_step=start_step if resume_from is not None else None)
    sample_log = SampleLogger(args.output_dir, accelerator, args.log_samples_every, args.log_samples_per_kind,
                              resume_step=start_step if resume_from is not None else None)
    warned_logp_diff = warned_partial = False
    if start_step == 0:
        row = {"step": 0, **run_eval(), "num_threads": torch.get_num_threads(),
               **(compiled.metrics(accelerator) if compiled else {})}
        logger.log(row)
        log(f"step 0 (starting policy): {row}")
    stop = GracefulStop(log)
    progress = tqdm(range(start_step + 1, args.max_steps + 1), initial=start_step, total=args.max_steps,
                    desc="ada_seq", disable=not accelerator.is_main_process)
    n, threshold = args.num_generations, args.positive_threshold
    if args.success_reward is not None:  # reward >= success_reward: > the float just below it
        threshold = math.nextafter(args.success_reward, -math.inf)
    k_pos, k_neg = args.quotas()
    # constant normaliser: every rank divides by the global kept count / world (DDP averages), times max length
    normaliser = args.prompts_per_step * n / world * args.max_completion_length

    for step in range(start_step + 1, args.max_steps + 1):
        t_start = time.time()
        threads = cpu_threads.count(torch.get_num_threads())  # a shared CPU: fit the free cores
        torch.set_num_threads(threads)
        examples = [task.train[i] for i in my_slice(sampler.next_ids(args.prompts_per_step), accelerator)]
        prompts = [encode(example.prompt) for example in examples]

        # ================ sample + verify: [ADA] rounds of M for the still-active prompts (Alg. 2 lines 3-12) ====
        responses: list[list[tuple]] = [[] for _ in examples]  # per prompt: (ids, sampling logprobs, truncated)
        # each round's rewards (an empty batch first: every rank logs the same names); per-response function values
        round_scores, reward_columns = [task.score([], [], [], [], step)], [[] for _ in examples]

        def sample_round(active: list[int], m: int) -> list[list[float]]:
            gens = generator.generate([prompts[i] for i in active], m, sampling)
            texts = [tokenizer.decode(c, skip_special_tokens=True) for c in gens.completion_ids]
            scored = task.score(texts, [examples[i] for i in active for _ in range(m)], gens.completion_ids,
                                [reason == "length" for reason in gens.finish_reasons], step)  # a cut one scores 0
            round_scores.append(scored)
            out = []
            for j, i in enumerate(active):
                rows = range(j * m, (j + 1) * m)
                responses[i].extend((list(gens.completion_ids[g]), list(gens.logprobs[g]),
                                     gens.finish_reasons[g] == "length") for g in rows)
                out.append([scored.total[g] for g in rows])
                reward_columns[i].extend(scored.columns(g) for g in rows)
            return out

        done = lambda rs: exit_reached(rs, args.exit_condition, k_pos, k_neg, threshold)  # noqa: E731
        origin = [0] * len(examples)  # [DAPO] (also in GRPO-n: all 0) the extra round that sampled each group
        train_ids = list(range(len(examples)))  # the groups trained on: all of them, unless DAPO's filter drops some
        dapo_rounds = 0
        # FSDP + HF generate: whole weights, as ranks run different numbers of rounds (vLLM: its own copy)
        with gathered(policy, enabled=generator.reads_policy):
            pools, exit_rounds = multi_round_sampling(len(examples), sample_round, done, args.max_rounds,
                                                      args.round_repeat)
            if args.dynamic_sampling:  # [DAPO] dynamic sampling baseline (Yu et al., 2025; Reinforce-Ada Table 2)
                share = len(my_slice(range(args.prompts_per_step), accelerator))  # this rank's part of the batch
                while True:  # [DAPO] keep the groups with signal; refill with new prompts until the batch is full
                    train_ids = [i for i, pool in enumerate(pools) if not zero_variance(torch.tensor([pool])).item()]
                    full = reduce_sums(accelerator, {"kept": min(len(train_ids), share)})["kept"]  # global count
                    if full >= args.prompts_per_step or dapo_rounds == args.max_dynamic_rounds:
                        break
                    dapo_rounds += 1  # [DAPO] one extra round: a new batch of prompts, n responses each
                    new = [task.train[i] for i in my_slice(sampler.next_ids(args.prompts_per_step), accelerator)]
                    first = len(examples)
                    examples += new
                    prompts += [encode(example.prompt) for example in new]
                    responses += [[] for _ in new]
                    reward_columns += [[] for _ in new]
                    origin += [dapo_rounds] * len(new)
                    refill = sample_round(list(range(first, len(examples))), args.round_repeat)
                    pools += refill
                    exit_rounds += [1 if done(pool) else None for pool in refill]
                train_ids = train_ids[:share]  # [DAPO] trim: at most this rank's share, first sampled first kept
        generator.sleep()  # vLLM on a GPU: its memory goes to training; the push brings the weights back
        t_gen = time.time() - t_start

        # ================ [ADA] downsample every pool to n; advantages from the whole pool (Alg. 2 l. 14-20) =======
        flat_prompts, completions, old_logps, adv_list, kept_rewards = [], [], [], [], []
        truncs, group_of, kept_columns = [], [], []  # per kept response: cut; its prompt's index; function values
        for i in train_ids:
            pool = pools[i]
            rule = "balanced" if exit_rounds[i] is not None else args.unfinished_downsample
            keep = downsample(pool, n, threshold, random, rule)
            kept = [pool[j] for j in keep]
            adv_list += global_advantages(kept, pool, threshold, args.scale_rewards, args.prompt_weight)
            kept_rewards.append(kept)
            for j in keep:
                flat_prompts.append(prompts[i])
                completions.append(responses[i][j][0])
                old_logps.append(responses[i][j][1])
                truncs.append(responses[i][j][2])
                group_of.append(i)
                kept_columns.append(reward_columns[i][j])
        advantages = torch.tensor(adv_list, dtype=torch.float32, device=device)
        kept_zero_var = zero_variance(torch.tensor(kept_rewards).view(-1, n)).tolist() if kept_rewards else []
        # --mask_truncated_completions: kept responses cut by max_new_tokens get no gradient
        unmasked = torch.tensor([not (cut and args.mask_truncated_completions) for cut in truncs], dtype=torch.bool)
        # the GRPO-n counterfactual: would the first n responses alone have had any signal?
        first_n = torch.tensor([pool[:n] for pool in pools]).view(-1, n)

        # ================ update: GRPO-style clipped surrogate on the kept responses; pi_old = the sampler ========
        t_train_start = time.time()
        sums = {"loss_sum": 0.0, "kl_sum": 0.0, "ent_sum": 0.0, "tok": 0.0, "clip_sum": 0.0, "gap_sum": 0.0,
                "gap_tok": 0.0}
        grad_norms = []
        lengths = [len(p) + len(c) for p, c in zip(flat_prompts, completions)]  # --max_tokens_per_microbatch
        for epoch in range(args.num_iterations):
            for rows in micro_batches(len(completions), args.micro_batch_size, accelerator, model, peers=(ref_model,),
                                      lengths=lengths, max_tokens=args.max_tokens_per_microbatch):
                batch = pad_sequences([flat_prompts[r] for r in rows], [completions[r] for r in rows],
                                      tokenizer.pad_token_id, pack_tokens=pack).to(device)  # packed: --padding_free
                with autocast(device, args.dtype):  # bf16 compute over fp32 weights with --dtype bfloat16
                    logp, entropy = token_logprobs(model, batch, temperature, entropy_grad=args.entropy_coef > 0,
                                                   compiled=compiled)
                mask = batch.loss_mask * unmasked[rows].to(device)[:, None]
                # without sampler log-probs pi_old is this very pass (one epoch, HF weights: exact, ratio 1)
                old_logp = right_align([old_logps[r] for r in rows], batch.completion_width).to(device) \
                    if sampler_logprobs else logp.detach()
                per_token, clipped = clipped_surrogate(logp, old_logp, advantages[rows, None], args.epsilon,
                                                       args.epsilon_high)
                surrogate_sum = (per_token * mask).sum()
                entropy_sum = (entropy * mask).sum()
                loss = (surrogate_sum - args.entropy_coef * entropy_sum) / normaliser  # entropy bonus (Sec. 4 set-up)
                if ref_model is not None:
                    with torch.no_grad(), autocast(device, args.dtype):
                        ref_logp, _ = token_logprobs(ref_model, batch, temperature, compiled=compiled)
                    kl = kl_k3(logp, ref_logp) * mask
                    loss = loss + args.beta * kl.sum() / normaliser  # one constant for PG and KL
                accelerator.backward(loss)
                if epoch == 0:  # the on-policy epoch's numbers are the ones logged
                    sums["loss_sum"] += surrogate_sum.item() / args.max_completion_length
                    sums["ent_sum"] += entropy_sum.item()
                    sums["tok"] += mask.sum().item()
                    sums["clip_sum"] += (clipped * mask).sum().item()
                    if ref_model is not None:
                        sums["kl_sum"] += kl.sum().item()
                    if sampler_logprobs:  # sampler/trainer agreement, before any update (this pass is the first)
                        sums["gap_sum"] += ((logp.detach() - old_logp).abs() * batch.loss_mask).sum().item()
                        sums["gap_tok"] += batch.loss_mask.sum().item()
            grad_norms.append(float(accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        t_train = time.time() - t_train_start

        # ================ push the new weights to the generator, once per update phase (no-op for HF) ============
        generator.sync_weights(policy)

        # ================ metrics: one reduce of named sums over ranks, each ratio next to its name ================
        all_rewards = [r for pool in pools for r in pool]
        totals = reduce_sums(accelerator, {
            "groups": len(examples), "rollouts": len(all_rewards),
            "gen_tokens": sum(len(ids) for rs in responses for ids, _, _ in rs),
            **reward_sums(all_rewards),  # NaN (no function scored it): out of reward_mean / _std
            "success": count_positive(all_rewards, threshold), "zero_var": zero_variance(first_n).sum().item(),
            "truncated": sum(cut for rs in responses for _, _, cut in rs), "seqs": len(completions), **sums,
            "t_gen": t_gen, "t_train": t_train, "kept_groups": len(train_ids),
        })
        counters["rollouts"] += int(totals["rollouts"])
        counters["gen_tokens"] += int(totals["gen_tokens"])
        samples, tokens = max(1.0, totals["rollouts"]), max(1.0, totals["tok"])
        reward_mean, reward_std = reward_moments(totals, totals["rollouts"])  # over the completions given a reward
        row = {
            "step": step, "rollouts": counters["rollouts"], "gen_tokens": counters["gen_tokens"],
            "reward_mean": reward_mean, "reward_std": reward_std,  # every generated response of every round
            "pass_rate": totals["success"] / samples, **Scored.join(round_scores).metrics(accelerator),
            "frac_zero_var_groups": totals["zero_var"] / max(1.0, totals["groups"]),  # first n of each pool
            "completion_len_mean": totals["gen_tokens"] / samples,
            "clipped_ratio": totals["truncated"] / samples,  # responses cut by max_new_tokens
            "loss": totals["loss_sum"] / max(1.0, totals["seqs"]),  # surrogate / (kept x max_new_tokens)
            "kl": totals["kl_sum"] / tokens, "entropy": totals["ent_sum"] / tokens,
            "grad_norm": float(np.mean(grad_norms)), "lr": scheduler.get_last_lr()[0],
            "time_gen_s": totals["t_gen"] / world, "time_train_s": totals["t_train"] / world,
            "sampler_logp_diff": totals["gap_sum"] / totals["gap_tok"] if totals["gap_tok"] else None,
            "ada_clip_frac": totals["clip_sum"] / tokens,
        }
        post_zero_var = dict(zip(train_ids, kept_zero_var))  # groups not trained on (DAPO drops them) count as False
        records = gather_list(accelerator, [(len(pool), exit_rounds[i], post_zero_var.get(i, False), examples[i].tag)
                                            for i, pool in enumerate(pools)])
        row.update(seq_metrics(*[[r[k] for r in records] for k in range(3)], n, args.max_rounds,
                               [r[3] for r in records]))  # [ADA] sampling dynamics
        trained = gather_list(accelerator, [(adv, examples[i].tag) for adv, i in zip(adv_list, group_of)])
        row.update(trained_advantage_metrics(trained))  # [ADA] how many responses trained, their mean A per level
        if args.dynamic_sampling:  # [DAPO] the dynamic-sampling baseline's cost and yield
            row.update({"dapo_rounds": dapo_rounds, "dapo_sampled_groups": int(totals["groups"]),
                        "dapo_kept_groups": int(totals["kept_groups"]),
                        # trained / full batch: under the full batch's normaliser, this step's size against a full one
                        "dapo_batch_fill": totals["kept_groups"] / args.prompts_per_step,
                        "ada_inference_cost_rel": totals["rollouts"] / (args.prompts_per_step * n)})
            if not warned_partial and row["dapo_batch_fill"] < 1:
                warned_partial = True
                log(f"note: step {step} trained on {int(totals['kept_groups'])} of {args.prompts_per_step} groups: "
                    f"--max_dynamic_rounds {args.max_dynamic_rounds} extra rounds did not fill the batch; the loss "
                    "keeps a full batch's normaliser, so such a step is `dapo_batch_fill` of a full one")

        gap = row["sampler_logp_diff"]  # None: not measured this step
        if not warned_logp_diff and gap is not None and gap >= args.logp_diff_warn:
            warned_logp_diff = True
            log(f"warning: sampler_logp_diff {gap:.4f} >= --logp_diff_warn {args.logp_diff_warn}: "
                "the generator does not sample from the policy being trained (stale weights, dtype, temperature?)")

        # ================ sample log / evaluate / log / checkpoint / stop ================
        evaluating = (args.eval_steps and step % args.eval_steps == 0) or step == args.max_steps
        if sample_log.due(step, evaluating):  # a few kept rollouts (DAPO's refills apart) -> samples.jsonl
            kinds = ["dynamic_refill" if origin[g] else "fresh" for g in group_of]
            flat_rewards = [r for kept in kept_rewards for r in kept]
            sample_log.log(step, [{"kind": kinds[k], "prompt": tokenizer.decode(flat_prompts[k]),
                                   "completion": tokenizer.decode(completions[k]), "reward": flat_rewards[k],
                                   "advantage": adv_list[k], "truncated": truncs[k],
                                   "ada_pool_size": len(pools[g]), "ada_exit_round": exit_rounds[g], **kept_columns[k]}
                                  for k in sample_log.pick(kinds) for g in (group_of[k],)])
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
            state = {"sampler": sampler.state_dict(), "counters": counters, "method": {}}
            path = checkpoint.save_checkpoint(args.output_dir, step, accelerator, model, tokenizer, optimizer,
                                              scheduler, state, args.save_total_limit, args.lora_merged_export)
            if stopping:
                log(f"stopped at step {step}; continue with --resume_from_checkpoint auto (checkpoint {path})")
                break
    progress.close()
    end_processes(accelerator)  # trackers finish and the process group ends now, not at exit: no hang, no abort
    stop.close()
    log(run_summary(args.output_dir, ["ada_samples_per_prompt_mean", "ada_inference_cost_rel", "ada_adv_mean_trained"]))


if __name__ == "__main__":
    raise SystemExit(main(parse_args(Args, description=__doc__.split("\n\n")[0])) or GracefulStop.exit_status())
