"""Group-relative advantages. `rewards` is [num_groups, group_size] (one row per prompt)."""
from __future__ import annotations

import torch


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = R_i - mean_{j != i} R_j  (leave-one-out baseline; = K/(K-1) (R_i - mean R), RA-RLOO eq. 1)."""
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError("RLOO needs at least 2 samples per group")
    others = (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)
    return rewards - others


def grpo_advantages(rewards: torch.Tensor, scale: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (R_i - mean R) / (std R + eps) when `scale`, else R_i - mean R (Dr. GRPO)."""
    centred = rewards - rewards.mean(-1, keepdim=True)
    if not scale:
        return centred
    return centred / (rewards.std(-1, unbiased=False, keepdim=True) + eps)


def zero_variance(rewards: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """[num_groups] bool: every sample of the group got the same reward (so every advantage is 0)."""
    return (rewards.max(-1).values - rewards.min(-1).values) <= tol
