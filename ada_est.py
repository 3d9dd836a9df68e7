"""Reinforce-Ada-Est: per-prompt pass-rate estimates decide how many responses each prompt gets. One file.

Paper: "Reinforce-Ada: An Adaptive Sampling Framework for Reinforce-Style LLM Training"
(../shared/papers/002_e5c7c1102339dcac.txt), Section 3.1 and Algorithm 1.

Optimising the log-objective E_x[log p(x)] weights each prompt's gradient by 1/p(x) (Sec. 2.2). The hybrid
realisation puts 1/sqrt(p) into the sampling budget and the other 1/sqrt(p) into the advantage:
  1. before sampling, every prompt of the batch gets N_x responses, N_x ∝ w(p_hat_x), clipped to
     [n_min, n_max], summing exactly to `total_budget` (Alg. 1 line 5); p_hat_x is a discounted Beta-prior
     estimate from the prompt's earlier visits (stable prompt ids across steps and epochs);
  2. all N_x responses are trained on, with A_i = (r_i - mean_x) * alpha_x, alpha_x = 1/sqrt(mean_x + eps)
     (Alg. 1 lines 14-16), in a GRPO-style clipped policy gradient;
  3. after the step the estimator absorbs the new counts: N_total <- lam*N_total + n_t, N_pos <- lam*N_pos + k_t.
The estimator only helps when prompts recur, so the default trains on a fixed pool of `prompt_pool`
prompts for several epochs. Lines marked [EST] are what the paper adds to plain GRPO.

Choices made here: the allocation is computed for the whole global batch on every rank (the estimator
state is identical everywhere), then each rank samples its slice; integer budgets come from bisection on
the proportionality constant plus largest-remainder rounding (see `allocate_budget`). Token losses are
summed over ALL responses and divided by a constant (total_budget x max_new_tokens), so a prompt's weight
in the update grows with its N_x (the sampling half of the weight). k_t counts responses with reward >
positive_threshold. pi_old is the sampling policy; one optimizer step per batch by default.

    python ada_est.py                                  # hybrid 1/sqrt(p) on 2048 recurring Countdown prompts
    python ada_est.py --weighting implicit             # N_x ∝ 1/p, no residual weight (App. C.2 ablation)
    accelerate launch ada_est.py --model_name_or_path Qwen/Qwen2.5-Math-1.5B --dataset openai/gsm8k \
        --dataset_config main --prompt_pool 2048 --use_vllm --dtype bfloat16 --learning_rate 1e-6
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Literal, Optional

import torch
from accelerate.utils import gather_object

from common.ada import clipped_update, count_positive, sampler_logprobs_needed
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
    prompt_pool: int = 2048
    """[EST] train on only the first N prompts so that they recur and the estimates have history (0 = all); 2048 at 32 prompts per step: a prompt returns every 64 steps, ~4.7 epochs in the default 300 steps (256 prompts were memorised: train reward 0.94, held-out pass@1 flat)"""
    total_budget: int = 0
    """[EST] responses per step over the whole batch, N_total of Alg. 1 (0 = 8 x prompts_per_step, the paper's setting, comparable with GRPO-n8)"""
    n_min: int = 2
    """[EST] fewest responses any prompt gets (2: a single response has no group baseline)"""
    n_max: int = 32
    """[EST] most responses any prompt gets (the paper's N_max for its sequential variant)"""
    weighting: Literal["hybrid", "implicit"] = "hybrid"
    """[EST] `hybrid`: N_x ∝ 1/sqrt(p_hat+eps) and residual weight 1/sqrt(mean_x+eps) (the paper's main choice); `implicit`: N_x ∝ 1/(p_hat+eps), no residual weight"""
    lam: float = 0.9
    """[EST] discount lambda of the per-prompt counts at every visit (the public code's 0.9)"""
    prior_alpha: float = 1.0
    """[EST] Beta prior alpha: p_hat = (N_pos + alpha) / (N_total + alpha + beta) (public code: 1)"""
    prior_beta: float = 16.0
    """[EST] Beta prior beta (public code: 16; an unseen prompt starts at p_hat = 1/17, i.e. treated as hard)"""
    eps: float = 0.01
    """[EST] epsilon in w(p_hat) and in the residual weight 1/sqrt(mean_x + eps) (bounds the weight of all-fail groups)"""
    positive_threshold: float = 0.7
    """[EST] a response counts as a success k_t for the estimator when its training reward > this"""
    eps_low: float = 0.2
    """lower clip range of the ratio pi_theta/pi_old (clip-higher setup of the paper: [0.2, 0.28])"""
    eps_high: float = 0.28
    """upper clip range of the ratio pi_theta/pi_old"""
    ppo_epochs: int = 1
    """optimizer steps per batch (each a full pass over all responses); with 1 the ratio is 1 and clipping is inactive"""
    beta: float = 0.0
    """KL coefficient to the reference (initial) policy, per-token k3 estimator; the paper uses none"""

    def budget(self) -> int:
        return self.total_budget or 8 * self.prompts_per_step

    def validate(self) -> None:
        p, b = self.prompts_per_step, self.budget()
        if not 1 <= self.n_min <= self.n_max:
            raise SystemExit(f"--n_min {self.n_min} / --n_max {self.n_max}: need 1 <= n_min <= n_max")
        if not self.n_min * p <= b <= self.n_max * p:
            raise SystemExit(f"--total_budget {b}: must lie in [n_min * prompts_per_step, n_max * prompts_per_step]"
                             f" = [{self.n_min * p}, {self.n_max * p}]")
        if not 0 < self.lam <= 1:
            raise SystemExit(f"--lam {self.lam}: must be in (0, 1]")
        if self.prior_alpha <= 0 or self.prior_beta < 0 or self.eps <= 0:
            raise SystemExit("--prior_alpha and --eps must be > 0, --prior_beta >= 0")
        if not 0 <= self.eps_low < 1 or self.eps_high < 0:
            raise SystemExit(f"--eps_low {self.eps_low} / --eps_high {self.eps_high}: need 0 <= eps_low < 1, eps_high >= 0")
        if self.ppo_epochs < 1 or self.beta < 0:
            raise SystemExit(f"--ppo_epochs {self.ppo_epochs} / --beta {self.beta}: need ppo_epochs >= 1, beta >= 0")


def estimate(counts: Optional[tuple[float, float]], alpha: float, beta: float) -> float:
    """[EST] p_hat = (N_pos + alpha) / (N_total + alpha + beta) (Sec. 3.1); no history -> the prior mean."""
    n_total, n_pos = counts or (0.0, 0.0)
    return (n_pos + alpha) / (n_total + alpha + beta)


def update_counts(counts: Optional[tuple[float, float]], n_t: int, k_t: int, lam: float) -> tuple[float, float]:
    """[EST] N_total <- lam*N_total + n_t, N_pos <- lam*N_pos + k_t (Sec. 3.1): stale visits fade out."""
    n_total, n_pos = counts or (0.0, 0.0)
    return lam * n_total + n_t, lam * n_pos + k_t


def allocation_weights(p_hats: list[float], mode: str, eps: float) -> list[float]:
    """[EST] w(p_hat): 1/sqrt(p_hat + eps) (hybrid, Alg. 1 line 5) or 1/(p_hat + eps) (implicit, Sec. 2.2)."""
    if mode == "hybrid":
        return [1.0 / math.sqrt(p + eps) for p in p_hats]
    return [1.0 / (p + eps) for p in p_hats]


def allocate_budget(weights: list[float], total: int, n_min: int, n_max: int) -> list[int]:
    """[EST] Integer N_x ∝ weights, each in [n_min, n_max], summing exactly to `total` (Alg. 1 line 5).

    The real-valued allocation clip(c * w_x, n_min, n_max) is found by bisection on the scale c (its sum
    grows continuously in c); it is then floored, and the missing units go one each to the prompts with the
    largest fractional parts (largest-remainder rounding; ties to the earlier prompt), never above n_max.
    """
    k = len(weights)
    if k == 0:
        return []
    if not n_min * k <= total <= n_max * k:
        raise ValueError(f"budget {total} cannot be split over {k} prompts within [{n_min}, {n_max}]")
    if min(weights) <= 0:
        raise ValueError("allocation weights must be positive")

    def clipped(c: float) -> list[float]:
        return [min(float(n_max), max(float(n_min), c * w)) for w in weights]

    lo, hi = 0.0, n_max / min(weights)  # at hi every prompt is at n_max
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(clipped(mid)) < total else (lo, mid)
    real = clipped(hi)
    alloc = [min(n_max, math.floor(x + 1e-9)) for x in real]
    order = sorted(range(k), key=lambda i: (-(real[i] - alloc[i]), i))
    while sum(alloc) < total:
        for i in order:
            if sum(alloc) < total and alloc[i] < n_max:
                alloc[i] += 1
    while sum(alloc) > total:  # only from float slack; take back from the smallest remainders
        for i in reversed(order):
            if sum(alloc) > total and alloc[i] > n_min:
                alloc[i] -= 1
    return alloc


def est_advantages(rewards: list[float], mode: str, eps: float) -> tuple[list[float], float]:
    """[EST] A_i = (r_i - mean_x) * alpha_x over all of the prompt's responses this step (Alg. 1 lines 14-16);
    alpha_x = 1/sqrt(mean_x + eps) (hybrid: the residual half of the 1/p weight) or 1 (implicit)."""
    mean = sum(rewards) / len(rewards)
    alpha = 1.0 / math.sqrt(mean + eps) if mode == "hybrid" else 1.0
    return [(r - mean) * alpha for r in rewards], alpha


def main(args: Args) -> None:
    run = start_run(args, "ada_est", need_ref=args.beta > 0)
    # pi_old: the sampler's log-probs only when they differ from the update's own pass (common/ada.py)
    sampling = replace(run.sampling, logprobs=sampler_logprobs_needed(args))
    acc, tokenizer, task = run.acc, run.tokenizer, run.task
    thr, total = args.positive_threshold, args.budget()
    temperature = args.temperature if args.temperature > 0 else 1.0  # the generator scores greedy samples at T=1
    # [EST] prompt id (Example.id) -> discounted (N_total, N_pos); identical on every rank, checkpointed
    counts: dict[int, tuple[float, float]] = {pid: tuple(v) for pid, v in run.method_state.get("counts", {}).items()}
    norm = total / acc.num_processes * args.max_new_tokens  # global sample count / world (DDP averages) x max length

    for step in range(run.start_step + 1, args.max_steps + 1):
        t0 = time.time()
        ids = run.sampler.next_ids(args.prompts_per_step)  # the global batch: every rank allocates all of it

        # ---- [EST] allocate the budget from the estimates made before this step (Alg. 1 lines 4-5) ----
        p_hats = [estimate(counts.get(pid), args.prior_alpha, args.prior_beta) for pid in ids]
        alloc = allocate_budget(allocation_weights(p_hats, args.weighting, args.eps), total, args.n_min, args.n_max)
        mine = my_slice(list(range(len(ids))), acc)
        examples = [task.train[ids[j]] for j in mine]
        sizes = [alloc[j] for j in mine]
        prompts = [run.encode(ex.prompt) for ex in examples]

        # ---- sample N_x responses per prompt (one generate call: each prompt repeated N_x times) ----
        flat_prompts = [p for p, k in zip(prompts, sizes) for _ in range(k)]
        owner = [i for i, k in enumerate(sizes) for _ in range(k)]
        gens = run.generator.generate(flat_prompts, 1, sampling)
        t_gen = time.time() - t0
        completions = [list(c) for c in gens.completion_ids]
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        rewards = [task.reward_fn(t, examples[owner[g]]) for g, t in enumerate(texts)]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        groups = [rewards[s:s + k] for s, k in zip(starts, sizes)]

        # ---- [EST] advantages from each prompt's own step mean, times the residual weight alpha_x ----
        adv_list, alphas = [], []
        for g in groups:
            a, alpha = est_advantages(g, args.weighting, args.eps)
            adv_list += a
            alphas.append(alpha)
        adv = torch.tensor(adv_list, dtype=torch.float32, device=acc.device)

        # ---- update: GRPO-style clipped surrogate on ALL responses; pi_old = the sampling policy ----
        t1 = time.time()
        sums = clipped_update(run, flat_prompts, completions, gens.logprobs if sampling.logprobs else None, adv,
                              norm, temperature)
        t_train = time.time() - t1

        # ---- [EST] update the estimator with this step's counts (Alg. 1 line 19), gathered over ranks ----
        records = [(ex.id, len(g), count_positive(g, thr)) for ex, g in zip(examples, groups)]
        if acc.num_processes > 1:
            records = gather_object(records)
        had_history = [pid in counts for pid in ids]
        calib = [abs(p - k_t / n_t) for (_, n_t, k_t), p, h in zip(records, p_hats, had_history) if h]
        for pid, n_t, k_t in records:  # in global batch order, so every rank applies the same updates
            counts[pid] = update_counts(counts.get(pid), n_t, k_t, args.lam)

        # ---- log ----
        zero_var = sum(max(g) - min(g) <= 1e-9 for g in groups)
        row, x = core_metrics(run, step, {
            "groups": len(groups), "rollouts": len(completions), "gen_tokens": sum(map(len, completions)),
            "reward_sum": float(sum(rewards)), "rewarded": len(rewards),
            "success": float(count_positive(rewards, thr)), "zero_var": float(zero_var),
            "loss_sum": sums.get("loss_sum", 0.0), "seqs": len(completions), "kl_sum": sums.get("kl_sum", 0.0),
            "ent_sum": sums.get("ent_sum", 0.0), "tok": sums.get("tok", 0.0), "t_gen": t_gen, "t_train": t_train,
        }, extra={"clip_sum": sums.get("clip_sum", 0.0), "alpha_sum": sum(alphas)})
        row.update({  # [EST] mechanism metrics (alloc, p_hat, history: the global batch, same on every rank)
            "est_p_hat_mean": sum(p_hats) / len(p_hats),
            "est_calibration_error": sum(calib) / len(calib) if calib else None,
            "est_frac_prompts_with_history": sum(had_history) / len(ids),
            "est_alloc_min": min(alloc), "est_alloc_mean": sum(alloc) / len(alloc), "est_alloc_max": max(alloc),
            "est_samples_step": sum(alloc),
            "est_residual_weight_mean": x["alpha_sum"] / max(1, x["groups"]),
            "est_prompts_tracked": len(counts),
            "est_clip_frac": x["clip_sum"] / max(1.0, x["tok"]),
        })
        finish_step(run, step, row, t0, {"counts": dict(counts)})


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
