"""Group-relative advantages. `rewards` is [num_groups, group_size] (one row per prompt)."""

from __future__ import annotations

import torch


def grpo_advantages(rewards: torch.Tensor, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (R_i - mean R) / (std R + eps) when `scale`, else R_i - mean R (Dr. GRPO).

    std is the group's population std (divided by k). TRL 1.16's GRPOTrainer
    (`scale_rewards='group'`: its `nanstd`, Bessel-corrected, + 1e-4) and verl's
    `compute_grpo_outcome_advantage` (`torch.std`, + 1e-6) take the sample std (k - 1), so a mixed
    group's advantages here are sqrt(k / (k - 1)) times theirs: 1.155x at k = 4. The benchmark's
    GRPO runs (`pros_ppo.py --adv grpo`) were made with this std; docs/pros_ppo.md and
    docs/ps_grpo.md say so.
    """
    # NaN: no reward; left out of the group's mean and std, advantage 0 (as TRL)
    if torch.isnan(rewards).any():
        mean = rewards.nanmean(-1, keepdim=True)
        centred = rewards - mean
        if scale:
            centred = centred / ((centred**2).nanmean(-1, keepdim=True).sqrt() + eps)
        return torch.nan_to_num(centred, nan=0.0)
    centred = rewards - rewards.mean(-1, keepdim=True)
    if not scale:
        return centred
    return centred / (rewards.std(-1, unbiased=False, keepdim=True) + eps)


def zero_variance(rewards: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """[num_groups] bool: every sample of the group got the same reward (so every advantage is 0);
    NaN rewards (none) are left out."""
    if torch.isnan(rewards).any():
        high = torch.nan_to_num(rewards, nan=-torch.inf).max(-1).values
        low = torch.nan_to_num(rewards, nan=torch.inf).min(-1).values
        return ~(high - low > tol)  # a group with at most one reward has no spread either
    return (rewards.max(-1).values - rewards.min(-1).values) <= tol
