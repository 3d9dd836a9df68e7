"""Importance sampling for the gap between the sampler and the trainer (TRL GRPOConfig's
`vllm_importance_sampling_*` flags). Loaded only when the correction is on.

A rollout is sampled by the generator (vLLM, or HF generate) but trained as if the trainer's
policy under the same weights, pi_train_old, had sampled it. Where the two disagree the update is
off-policy; the per-token ratio rho_t = pi_train_old(y_t) / pi_sampler(y_t) reweights each sampled
token back onto the trainer's distribution. The ratio multiplies the policy-gradient term only (the
KL to the reference is added after, unweighted), in one of four modes:

- `token_truncate`: each token's rho_t, clipped to [clip_min, clip_max];
- `token_mask`: each token's rho_t, or 0 where it falls outside [clip_min, clip_max];
- `sequence_truncate`: one ratio per sequence, prod_t rho_t = exp(sum_t log rho_t) over the
  sequence's sampled tokens, clipped, on every token of the sequence;
- `sequence_mask`: that sequence ratio, or 0 for the whole sequence outside the bounds.

A bound that is None is no bound. A token whose sampler log-prob is unknown (NaN, or outside the
`known` mask: e.g. a replayed completion the sampler never produced this step) gets weight 1.
"""

from __future__ import annotations

import math

import torch

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# the per-micro-batch values reduced by max over micro-batches and ranks (a minimum is kept as
# the max of its negation), not summed
EXTREMES = ("is_ratio_max", "is_ratio_neg_min", "is_diff_max")
# the summed ones, on every rank (zeros where a rank trained no row: the same packing everywhere)
SUMS = ("is_n", "is_ratio_sum", "is_outside", "is_diff_sum", "is_diff_tok")


def sampler_is_weights(
    trainer_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    known: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> tuple[torch.Tensor, dict]:
    """The importance weight of every token ([B, T], no gradient) and the micro-batch's sums for
    the metrics, from the trainer's log-probs under the sampling weights and the sampler's
    ([B, T] each) over the tokens in `known` ([B, T], 1 where the token was sampled and its
    sampler log-prob is in the loss)."""
    if mode not in MODES:
        raise ValueError(f"vllm_importance_sampling_mode {mode!r}: one of {', '.join(MODES)}")
    trainer_logp = trainer_logp.detach().float()
    sampler_logp = sampler_logp.to(trainer_logp)
    known = (known > 0) & ~torch.isnan(sampler_logp)
    log_rho = torch.where(known, trainer_logp - sampler_logp, torch.zeros_like(trainer_logp))
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    sequence = mode.startswith("sequence")
    if sequence:
        # the sequence ratio prod_t rho_t, one per row; rows with no known token are not counted
        ratio = torch.exp(log_rho.sum(-1, keepdim=True))  # [B, 1]
        units = known.any(-1, keepdim=True)
    else:
        ratio = torch.exp(log_rho)  # [B, T]
        units = known
    outside = (ratio < low) | (ratio > high)
    if mode.endswith("truncate"):
        weight = ratio.clamp(min=low, max=high)
    else:
        weight = ratio.masked_fill(outside, 0.0)
    # unknown tokens (and rows with none known) keep weight 1
    weight = torch.where(units, weight, torch.ones_like(weight))
    token_weight = weight.expand_as(trainer_logp)
    counted = weight[units.expand_as(weight)]
    diff = (trainer_logp - sampler_logp).abs()[known]
    sums = {
        "is_n": units.sum(),
        "is_ratio_sum": counted.sum(),
        "is_outside": (outside & units).sum(),
        "is_diff_sum": diff.sum(),
        "is_diff_tok": known.sum(),
        "is_ratio_max": counted.max() if counted.numel() else torch.tensor(-math.inf),
        "is_ratio_neg_min": -counted.min() if counted.numel() else torch.tensor(-math.inf),
        "is_diff_max": diff.max() if diff.numel() else torch.tensor(-math.inf),
    }
    return token_weight, sums


def split_extremes(update: list[dict]) -> tuple[list[dict], dict]:
    """The update's per-micro-batch dicts without the extremes (and one of zero sums, so that a
    rank without rows packs the same names), and this rank's extremes (the max over its
    micro-batches; -inf where it has none)."""
    extremes = {name: -math.inf for name in EXTREMES}
    sums = [dict.fromkeys(SUMS, 0.0)]
    for values in update:
        for name in EXTREMES:
            if name in values:
                extremes[name] = max(extremes[name], float(values[name]))
        sums.append({name: value for name, value in values.items() if name not in EXTREMES})
    return sums, extremes


def correction_metrics(accelerator, totals: dict, extremes: dict) -> dict:
    """TRL's `sampling/*` keys and the share of ratios masked or clipped, from the step's totals
    over ranks and this rank's extremes (a max over ranks here: every rank calls it)."""
    values = torch.tensor([extremes[name] for name in EXTREMES], dtype=torch.float64)
    if accelerator.num_processes > 1:
        values = values.to(accelerator.device)
        torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
    ratio_max, ratio_neg_min, diff_max = values.tolist()
    units, tokens = totals.get("is_n", 0.0), totals.get("is_diff_tok", 0.0)
    ratio_sum, diff_sum = totals.get("is_ratio_sum", 0.0), totals.get("is_diff_sum", 0.0)
    return {
        "sampling/sampling_logp_difference/mean": (diff_sum / tokens if tokens else None),
        "sampling/sampling_logp_difference/max": diff_max if tokens else None,
        "sampling/importance_sampling_ratio/min": -ratio_neg_min if units else None,
        "sampling/importance_sampling_ratio/mean": ratio_sum / units if units else None,
        "sampling/importance_sampling_ratio/max": ratio_max if units else None,
        "sampling/importance_sampling_outside_frac": (
            totals.get("is_outside", 0.0) / units if units else None
        ),
    }
