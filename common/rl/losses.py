"""Per-token loss terms the scripts share; all take [B, R] tensors over the completion region."""

from __future__ import annotations

import torch


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate exp(d) - d - 1 with d = log ref - log pi (Schulman's k3): >=
    0, unbiased."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO/GRPO clipped objective per token, as a loss (to minimise), and a clipped-token indicator.

    -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A); eps_high > eps_low is DAPO's
    clip-higher. `adv` broadcasts: [B, 1] for sequence-level advantages, [B, R] for token-level
    (GAE).
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    return -torch.min(unclipped, clipped), (clipped < unclipped).float()
