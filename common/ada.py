"""Pieces both Reinforce-Ada scripts share (ada_seq.py, ada_est.py): counting positives, and the
sequence-level clipped surrogate over ragged per-sample sampling log-probs.

Both scripts train on groups of varying size with the GRPO-style clipped objective, where the "old"
policy is the one that sampled (its per-token log-probs come from the generator, `Generations.logprobs`).
"""
from __future__ import annotations

import torch

from common.losses import clipped_surrogate


def count_positive(rewards: list[float], threshold: float) -> int:
    """Responses counting as positive: reward > threshold (strict, so shaped partial credit can stay negative)."""
    return sum(1 for r in rewards if r > threshold)


def right_align(rows: list[list[float]], width: int) -> torch.Tensor:
    """[B, width] tensor with row i's values in its last len(rows[i]) columns, zeros elsewhere.

    Matches `common.masking.pad_sequences`: completions sit at the right edge of the completion region.
    """
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"row {i} has {len(r)} values, wider than {width}")
        if r:
            out[i, width - len(r):] = torch.tensor(r, dtype=torch.float32)
    return out


def surrogate_sum(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed per-token clipped-surrogate loss over unmasked tokens, and the number of clipped tokens.

    logp / old_logp / mask: [B, R]; adv: [B] sequence-level advantages broadcast to every token of the
    sequence (GRPO). The caller divides by its own constant normaliser.
    """
    per_tok, clipped = clipped_surrogate(logp, old_logp, adv[:, None], eps_low, eps_high)
    return (per_tok * mask).sum(), (clipped * mask).sum()
