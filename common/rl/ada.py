"""Reinforce-Ada's own pieces that both of its scripts use (ada_seq.py, ada_est.py): the success
rule (a positive), where pi_old's log-probs come from, and the trained responses' advantage
metrics."""

from __future__ import annotations

import math

import numpy as np


def success_threshold(args) -> float:
    """[ADA] The success rule as one strict threshold, a response being positive when its reward is
    above it: --positive_threshold, or, with --success_reward, the float just below that (so that
    reward >= --success_reward)."""
    if args.success_reward is None:
        return args.positive_threshold
    return math.nextafter(args.success_reward, -math.inf)


def count_positive(rewards: list[float], threshold: float) -> int:
    """[ADA] Responses counting as positive: reward > threshold (strict, so shaped partial credit
    can stay negative; NaN, no reward, is never positive)."""
    return sum(1 for reward in rewards if reward > threshold)


def uses_sampler_logprobs(args) -> bool:
    """Whether pi_old's log-probs must come from the sampler (`--old_logprobs`): with `auto`, only
    where they differ from the update's own first forward pass (vLLM's copy of the weights, or more
    than one epoch)."""
    return args.old_logprobs == "sampler" or args.use_vllm or args.num_iterations > 1


def trained_advantage_metrics(trained: list[tuple[float, str]], prefix: str = "ada") -> dict:
    """From (advantage, level tag) of every trained response (all ranks): <prefix>_trained_responses
    and the mean advantage of the trained responses, overall and per level. Group-centred advantages
    (GRPO-n) average 0 within each group; a pool-wide baseline applied to a downsampled group
    (Reinforce-Ada, Alg. 2 l. 18-19) need not, and its sign per level says which prompts the step
    pushes up on net."""
    advantages = [adv for adv, _ in trained]
    out = {
        f"{prefix}_trained_responses": len(trained),
        f"{prefix}_adv_mean_trained": float(np.mean(advantages)) if trained else None,
    }
    for tag in sorted({tag for _, tag in trained} - {""}):
        level = [adv for adv, t in trained if t == tag]
        out[f"{prefix}_adv_mean_trained_{tag}"] = float(np.mean(level))
    return out
