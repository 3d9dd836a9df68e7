"""Reinforce-Ada-Seq: adaptive multi-round sampling, downsampled to a static GRPO batch. One file.

Paper: "Reinforce-Ada: An Adaptive Sampling Framework for Reinforce-Style LLM Training"
(../shared/papers/002_e5c7c1102339dcac.txt), Section 3.2 and Algorithm 2.

GRPO with a small group (n = 4) often sees a prompt's rollouts all fail (or all pass): every advantage is
0 and the prompt teaches nothing. Reinforce-Ada-Seq keeps sampling the prompts that lack signal:
  phase 1: every prompt of the batch starts active; each round draws M (`round_repeat`) responses for each
           active prompt; a prompt leaves the active set once its pool meets the exit condition
           (`positive`: >= K_pos positives; `balanced`: >= K_pos positives and >= K_neg negatives);
           at most `max_rounds` rounds (N_max = M * max_rounds responses per prompt).
  phase 2: each pool is downsampled to exactly n responses (up to n//2 positives, the rest negatives,
           topping up from the other side), and advantages use the *whole pool's* statistics:
           A_i = r_i - mean(pool) (Alg. 2 lines 17-19), optionally / std(pool), optionally x w(p_hat).
The update is a GRPO-style clipped policy gradient on n responses per prompt, so the backward cost is
that of GRPO-n; only inference grows. Lines marked [ADA] are what the paper adds to plain GRPO.

Choices made here (the paper leaves them open):
- Downsampling draws the kept positives/negatives uniformly with Python's global `random` (seeded per
  rank, saved in every checkpoint, so a resumed run draws the same).
- The baseline is the pool's mean reward (Alg. 2 line 17), which is p_hat = N_pos/N for 0/1 rewards; with
  shaped rewards it stays the unbiased baseline, and N_pos/N (reward > positive_threshold) is used only
  for the optional weight.
- `--prompt_weight none` is the default, as in the authors' public code: its advantage is r - mean(pool)
  with no 1/p_hat factor. `inv_p` re-introduces the Sec. 3.2 weight, which can scale a hard prompt's
  gradient by up to N_max (the learning rate may need lowering).
- pi_old is the sampling policy; one optimizer step per batch by default, so the clipped surrogate equals
  the policy gradient unless `--ppo_epochs` > 1 or the backends disagree. With the HF backend and one epoch
  pi_old's log-probs are read from the update's own forward pass (no extra scoring pass after sampling);
  with vLLM or more epochs they are the sampler's (`common/ada.py: sampler_logprobs_needed`).
  Token losses are summed and divided by a constant (kept responses x max_new_tokens): no length bias.
- Metrics: `rollouts` / `gen_tokens` count every generated response of every round (inference cost);
  `frac_zero_var_groups` is measured on each prompt's first n responses (what GRPO-n would have trained
  on), `ada_frac_zero_var_groups_post` on the kept groups; `ada_active_after_round_r` is a fraction.

    python ada_seq.py                                         # SEQ-BALANCE on the embedded Countdown task
    python ada_seq.py --exit_condition positive               # SEQ-POS
    python ada_seq.py --max_rounds 1 --round_repeat 4         # GRPO-n4 (one round of n: nothing adaptive)
    python ada_seq.py --max_rounds 1 --round_repeat 8 --final_keep_per_prompt 8   # GRPO-n8 (n16 likewise)
    accelerate launch ada_seq.py --model_name_or_path Qwen/Qwen2.5-Math-1.5B --dataset openai/gsm8k \
        --dataset_config main --use_vllm --dtype bfloat16 --learning_rate 1e-6
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace
from typing import Callable, Literal, Optional

import torch
from accelerate.utils import gather_object

from common.ada import clipped_update, count_positive, sampler_logprobs_needed
from common.advantages import zero_variance
from common.args import BaseArgs
from common.cli import parse_args
from common.runtime import (
    core_metrics,
    finish_step,
    my_slice,
    start_run,
)


@dataclass
class Args(BaseArgs):
    final_keep_per_prompt: int = 4
    """[ADA] update group size n: each prompt's pool is downsampled to exactly n responses (backward cost = GRPO-n)"""
    round_repeat: int = 8
    """[ADA] M, responses drawn per active prompt in each round (Alg. 2 requires M >= n)"""
    max_rounds: int = 4
    """[ADA] maximum sampling rounds; N_max = max_rounds * round_repeat responses per prompt. `--max_rounds 1 --round_repeat n` is GRPO-n"""
    exit_condition: Literal["balanced", "positive"] = "balanced"
    """[ADA] when a prompt leaves the active set: `positive` (SEQ-POS: >= k_pos positives) or `balanced` (SEQ-BALANCE: >= k_pos positives and >= k_neg negatives)"""
    k_pos: Optional[int] = None
    """[ADA] K_pos, positives needed to exit (default n//2)"""
    k_neg: Optional[int] = None
    """[ADA] K_neg, negatives needed to exit under `balanced` (default n - n//2)"""
    positive_threshold: float = 0.7
    """[ADA] a response is positive when its training reward > this (rewards may be shaped)"""
    adv_std_norm: bool = False
    """[ADA] divide advantages by the std of the prompt's full pool (GRPO-style scaling with global statistics); off as in Alg. 2"""
    prompt_weight: Literal["none", "inv_p", "inv_sqrt_p"] = "none"
    """[ADA] explicit per-prompt gradient weight w(p_hat), p_hat = N_pos/N of the full pool: `none` (the public code's default), `inv_p` (the re-introduced 1/p_hat of Sec. 3.2), `inv_sqrt_p`"""
    eps_low: float = 0.2
    """lower clip range of the ratio pi_theta/pi_old (clip-higher setup of the paper: [0.2, 0.28])"""
    eps_high: float = 0.28
    """upper clip range of the ratio pi_theta/pi_old"""
    ppo_epochs: int = 1
    """optimizer steps per batch (each a full pass over the kept responses); with 1 the ratio is 1 and clipping is inactive"""
    beta: float = 0.0
    """KL coefficient to the reference (initial) policy, per-token k3 estimator; the paper uses none"""

    def quotas(self) -> tuple[int, int]:
        """(K_pos, K_neg) with the n-derived defaults filled in."""
        n = self.final_keep_per_prompt
        return (n // 2 if self.k_pos is None else self.k_pos), (n - n // 2 if self.k_neg is None else self.k_neg)

    def validate(self) -> None:
        n = self.final_keep_per_prompt
        if n < 2:
            raise SystemExit(f"--final_keep_per_prompt {n}: a group needs at least 2 responses")
        if self.round_repeat < n:
            raise SystemExit(f"--round_repeat {self.round_repeat}: must be >= --final_keep_per_prompt {n} (Alg. 2: M >= n)")
        if self.max_rounds < 1:
            raise SystemExit(f"--max_rounds {self.max_rounds}: must be >= 1")
        k_pos, k_neg = self.quotas()
        if k_pos < 0 or k_neg < 0:
            raise SystemExit(f"--k_pos {k_pos} / --k_neg {k_neg}: must be >= 0")
        if not 0 <= self.eps_low < 1 or self.eps_high < 0:
            raise SystemExit(f"--eps_low {self.eps_low} / --eps_high {self.eps_high}: need 0 <= eps_low < 1, eps_high >= 0")
        if self.ppo_epochs < 1 or self.beta < 0:
            raise SystemExit(f"--ppo_epochs {self.ppo_epochs} / --beta {self.beta}: need ppo_epochs >= 1, beta >= 0")


def exit_reached(rewards: list[float], rule: str, k_pos: int, k_neg: int, threshold: float) -> bool:
    """[ADA] ExitCondition(S_x) of Alg. 2 (Sec. 3.2, "Exit condition")."""
    pos = count_positive(rewards, threshold)
    if rule == "positive":
        return pos >= k_pos
    return pos >= k_pos and len(rewards) - pos >= k_neg


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


def downsample(rewards: list[float], n: int, threshold: float, rng) -> list[int]:
    """[ADA] Alg. 2 line 18: indices (ascending) of the n pool responses kept for the update.

    Up to n//2 positives, the rest negatives; when one side runs short the other tops up. Which positives
    (negatives) are kept is a uniform draw with `rng` (the script passes the global `random`, checkpointed
    per rank). Unfinished prompts use the same rule. Responses of one prompt are i.i.d. given their reward,
    so the draw only guards against backends that return samples in a non-random order.
    """
    if len(rewards) < n:
        raise ValueError(f"pool of {len(rewards)} responses cannot be downsampled to {n}")
    pos = [j for j, r in enumerate(rewards) if r > threshold]
    neg = [j for j, r in enumerate(rewards) if r <= threshold]
    n_pos = min(len(pos), n // 2)
    n_neg = min(len(neg), n - n_pos)
    n_pos = min(len(pos), n - n_neg)  # negatives ran short: top up with positives
    return sorted(rng.sample(pos, n_pos) + rng.sample(neg, n_neg))


def global_advantages(kept: list[float], pool: list[float], threshold: float, std_norm: bool, weight: str,
                      eps: float = 1e-6) -> list[float]:
    """[ADA] Advantages of the kept responses against the whole pool's statistics (Sec. 3.2).

    A_i = r_i - mean(pool) (Alg. 2 lines 17-19; for 0/1 rewards mean(pool) = p_hat = N_pos/N);
    optionally / (std(pool) + eps); optionally x w(p_hat) with p_hat = N_pos/N floored at 1/N
    (`inv_p`: the re-introduced explicit weight 1/p_hat of the Sec. 3.2 estimator; `inv_sqrt_p`: 1/sqrt(p_hat)).
    """
    mean = sum(pool) / len(pool)
    adv = [r - mean for r in kept]
    if std_norm:
        std = math.sqrt(sum((r - mean) ** 2 for r in pool) / len(pool))
        adv = [a / (std + eps) for a in adv]
    p_hat = max(count_positive(pool, threshold), 1) / len(pool)
    w = {"none": 1.0, "inv_p": 1.0 / p_hat, "inv_sqrt_p": 1.0 / math.sqrt(p_hat)}[weight]
    return [w * a for a in adv]


def seq_metrics(n_samples: list[int], exit_rounds: list[Optional[int]], kept_zero_var: list[bool], n: int,
                max_rounds: int) -> dict:
    """[ADA] Sampling-dynamics metrics of one step, from every prompt's record (all ranks)."""
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
    return row


def main(args: Args) -> None:
    run = start_run(args, "ada_seq", need_ref=args.beta > 0)
    # pi_old: the sampler's log-probs only when they differ from the update's own pass (common/ada.py)
    sampling = replace(run.sampling, logprobs=sampler_logprobs_needed(args))
    acc, tokenizer, task = run.acc, run.tokenizer, run.task
    n, m, thr = args.final_keep_per_prompt, args.round_repeat, args.positive_threshold
    k_pos, k_neg = args.quotas()
    temperature = args.temperature if args.temperature > 0 else 1.0  # the generator scores greedy samples at T=1
    # constant normaliser: every rank divides by the global kept count / world (DDP averages), times max length
    norm = args.prompts_per_step * n / acc.num_processes * args.max_new_tokens

    for step in range(run.start_step + 1, args.max_steps + 1):
        t0 = time.time()
        examples = [task.train[i] for i in my_slice(run.sampler.next_ids(args.prompts_per_step), acc)]
        prompts = [run.encode(ex.prompt) for ex in examples]

        # ---- [ADA] phase 1: rounds of M samples for the prompts still active (Alg. 2 lines 3-12) ----
        responses: list[list[tuple[list[int], list[float]]]] = [[] for _ in examples]  # (ids, sampling logprobs)

        def sample_round(active: list[int], k: int) -> list[list[float]]:
            gens = run.generator.generate([prompts[i] for i in active], k, sampling)
            texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
            out = []
            for j, i in enumerate(active):
                rows = range(j * k, (j + 1) * k)
                responses[i].extend((list(gens.completion_ids[g]), list(gens.logprobs[g])) for g in rows)
                out.append([task.reward_fn(texts[g], examples[i]) for g in rows])
            return out

        pools, exit_rounds = multi_round_sampling(
            len(examples), sample_round, lambda rs: exit_reached(rs, args.exit_condition, k_pos, k_neg, thr),
            args.max_rounds, m)
        t_gen = time.time() - t0

        # ---- [ADA] phase 2: downsample every pool to n, advantages from the whole pool (Alg. 2 lines 14-20) ----
        flat_prompts, completions, old_lps, adv_list, kept_rewards = [], [], [], [], []
        for i, pool in enumerate(pools):
            keep = downsample(pool, n, thr, random)
            kept = [pool[j] for j in keep]
            adv_list += global_advantages(kept, pool, thr, args.adv_std_norm, args.prompt_weight)
            kept_rewards.append(kept)
            for j in keep:
                flat_prompts.append(prompts[i])
                completions.append(responses[i][j][0])
                old_lps.append(responses[i][j][1])
        adv = torch.tensor(adv_list, dtype=torch.float32, device=acc.device)
        kept_zero_var = zero_variance(torch.tensor(kept_rewards).view(-1, n)).tolist() if kept_rewards else []
        # the GRPO-n counterfactual: would the first n responses alone have had any signal?
        first_n = torch.tensor([pool[:n] for pool in pools]).view(-1, n)

        # ---- update: GRPO-style clipped surrogate on the kept responses; pi_old = the sampling policy ----
        t1 = time.time()
        sums = clipped_update(run, flat_prompts, completions, old_lps if sampling.logprobs else None, adv, norm,
                              temperature)
        t_train = time.time() - t1

        # ---- log ----
        all_rewards = [r for pool in pools for r in pool]
        row, x = core_metrics(run, step, {
            "groups": len(examples), "rollouts": len(all_rewards),
            "gen_tokens": sum(len(ids) for rs in responses for ids, _ in rs),
            "reward_sum": float(sum(all_rewards)), "rewarded": len(all_rewards),
            "success": float(count_positive(all_rewards, thr)), "zero_var": float(zero_variance(first_n).sum()),
            "loss_sum": sums.get("loss_sum", 0.0), "seqs": len(completions), "kl_sum": sums.get("kl_sum", 0.0),
            "ent_sum": sums.get("ent_sum", 0.0), "tok": sums.get("tok", 0.0), "t_gen": t_gen, "t_train": t_train,
        }, extra={"clip_sum": sums.get("clip_sum", 0.0)})
        records = [(len(pool), e, z) for pool, e, z in zip(pools, exit_rounds, kept_zero_var)]
        if acc.num_processes > 1:
            records = gather_object(records)
        row.update(seq_metrics([r[0] for r in records], [r[1] for r in records], [r[2] for r in records],
                               n, args.max_rounds))
        row["ada_clip_frac"] = x["clip_sum"] / max(1.0, x["tok"])
        finish_step(run, step, row, t0, {})  # all sampling state is the checkpointed RNGs and prompt sampler


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
