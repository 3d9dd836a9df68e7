"""Group-relative advantages. `rewards` is [num_groups, group_size] (one row per prompt)."""
from __future__ import annotations

import math

import torch


def grpo_advantages(rewards: torch.Tensor, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (R_i - mean R) / (std R + eps) when `scale`, else R_i - mean R (Dr. GRPO).

    std is the group's population std (divided by k). TRL 1.16's GRPOTrainer (`scale_rewards='group'`: its `nanstd`,
    Bessel-corrected, + 1e-4) and verl's `compute_grpo_outcome_advantage` (`torch.std`, + 1e-6) take the sample std
    (k - 1), so a mixed group's advantages here are sqrt(k / (k - 1)) times theirs: 1.155x at k = 4. The benchmark's
    GRPO runs (`pros_ppo.py --adv grpo`) were made with this std; docs/pros_ppo.md and docs/ps_grpo.md say so.
    """
    if torch.isnan(rewards).any():  # NaN: no reward; left out of the group's mean and std, advantage 0 (as TRL)
        mean = rewards.nanmean(-1, keepdim=True)
        centred = rewards - mean
        if scale:
            centred = centred / ((centred ** 2).nanmean(-1, keepdim=True).sqrt() + eps)
        return torch.nan_to_num(centred, nan=0.0)
    centred = rewards - rewards.mean(-1, keepdim=True)
    if not scale:
        return centred
    return centred / (rewards.std(-1, unbiased=False, keepdim=True) + eps)


def zero_variance(rewards: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """[num_groups] bool: every sample of the group got the same reward (so every advantage is 0); NaN rewards (none)
    are left out."""
    if torch.isnan(rewards).any():
        high = torch.nan_to_num(rewards, nan=-torch.inf).max(-1).values
        low = torch.nan_to_num(rewards, nan=torch.inf).min(-1).values
        return ~(high - low > tol)  # a group with at most one reward has no spread either
    return (rewards.max(-1).values - rewards.min(-1).values) <= tol


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                   lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE (Schulman et al., 2016) over [B, R] tensors: (advantages, returns = advantages + values).

    δ_t = r_t + γ V_{t+1} - V_t,  A_t = δ_t + γλ A_{t+1}; the state after a row's last valid token is terminal
    (V = 0). Positions with mask 0 (padding, masked tokens) are skipped: they are not actions, carry nothing
    through, and get A = R = 0. Put rewards on valid positions (outcome reward: the last valid token).
    """
    b, r = rewards.shape
    adv = torch.zeros_like(rewards)
    last_adv = rewards.new_zeros(b)
    next_value = rewards.new_zeros(b)
    for t in reversed(range(r)):
        valid = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * last_adv
        adv[:, t] = torch.where(valid, a, torch.zeros_like(a))
        last_adv = torch.where(valid, a, last_adv)
        next_value = torch.where(valid, values[:, t], next_value)
    return adv, (adv + values) * (mask > 0)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, accelerator=None, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit std over the masked entries; masked-out entries become 0. With `accelerator` the mean and std
    are those of the whole batch, every process's rows (its sums reduced over ranks), as one process computes them."""
    from common.distributed.ranks import reduce_sums

    reduce = (lambda sums: reduce_sums(accelerator, sums)) if accelerator is not None else (lambda sums: sums)
    sums = reduce({"sum": float((values * mask).sum()), "count": float(mask.sum())})
    count = max(1.0, sums["count"])
    mean = sums["sum"] / count
    var = reduce({"sq": float((((values - mean) * mask) ** 2).sum())})["sq"] / count
    return (values - mean) / (math.sqrt(var) + eps) * mask

