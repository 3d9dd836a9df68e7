"""Pieces both Reinforce-Ada scripts share (ada_seq.py, ada_est.py): counting positives, the
sequence-level clipped surrogate over ragged per-sample sampling log-probs, and the update built on it.

Both scripts train on groups of varying size with the GRPO-style clipped objective, where the "old"
policy is the one that sampled (its per-token log-probs come from the generator, `Generations.logprobs`).
"""
from __future__ import annotations

import torch

from common.logprobs import token_logprobs
from common.losses import clipped_surrogate, kl_k3
from common.masking import right_align
from common.runtime import accumulate_gradients, optimizer_step


def count_positive(rewards: list[float], threshold: float) -> int:
    """Responses counting as positive: reward > threshold (strict, so shaped partial credit can stay negative)."""
    return sum(1 for r in rewards if r > threshold)


def surrogate_sum(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed per-token clipped-surrogate loss over unmasked tokens, and the number of clipped tokens.

    logp / old_logp / mask: [B, R]; adv: [B] sequence-level advantages broadcast to every token of the
    sequence (GRPO). The caller divides by its own constant normaliser.
    """
    per_tok, clipped = clipped_surrogate(logp, old_logp, adv[:, None], eps_low, eps_high)
    return (per_tok * mask).sum(), (clipped * mask).sum()


def sampler_logprobs_needed(args) -> bool:
    """Whether pi_old must come from the sampler (`SamplingConfig.logprobs`).

    With the HF backend and one optimizer step per batch, the weights that sampled are the weights the update
    starts from, so pi_old's log-probs equal the update's own forward pass (detached): the generator's extra
    scoring pass (~15% of a GRPO step here, benchmarks/results/floor.md) can be skipped. vLLM returns them at
    no cost and its numerics differ from the trainer's, and a second epoch needs the pre-update values.
    """
    return bool(args.use_vllm) or args.ppo_epochs > 1


def clipped_update(run, prompts: list[list[int]], completions: list[list[int]], old_logps: list[list[float]] | None,
                   adv: torch.Tensor, norm: float, temperature: float) -> dict:
    """`ppo_epochs` optimizer steps of the clipped surrogate on every (prompt, completion), pi_old = the sampler.

    old_logps=None (allowed with one epoch only, see `sampler_logprobs_needed`): pi_old = the current policy,
    read from the update's own forward pass without gradient (ratio 1, the plain policy gradient).

    Loss = sum over responses and tokens / `norm` (the caller's constant: global samples / world x max length,
    so a prompt with more responses weighs more), plus beta x the k3 KL to `run.ref` per token (when a
    reference model is loaded). Returns the summed metrics of the first (on-policy) epoch: loss_sum (per
    max_new_tokens), ent_sum, tok, clip_sum, kl_sum.
    """
    args = run.args
    if old_logps is None and args.ppo_epochs > 1:
        raise ValueError("clipped_update: old_logps=None needs ppo_epochs == 1 (later epochs need pi_old's values)")
    n_tokens = sum(len(c) for c in completions)

    def loss_fn(batch, logp, ent, rows):
        mask = batch.loss_mask
        old = logp.detach() if old_logps is None else \
            right_align([old_logps[r] for r in rows], batch.completion_width).to(logp.device)
        loss_sum, clipped = surrogate_sum(logp, old, adv[rows], mask, args.eps_low, args.eps_high)
        loss = loss_sum / norm
        metrics = {"loss_sum": loss_sum.item() / args.max_new_tokens, "ent_sum": (ent * mask).sum().item(),
                   "tok": mask.sum().item(), "clip_sum": clipped.item()}
        if run.ref is not None:
            with torch.no_grad():
                ref_lp, _ = token_logprobs(run.ref, batch, temperature)
            kl = kl_k3(logp, ref_lp) * mask
            loss = loss + args.beta * kl.sum() / max(1, n_tokens)
            metrics["kl_sum"] = kl.sum().item()
        return loss, metrics

    sums: dict = {}
    for epoch in range(args.ppo_epochs):
        s = accumulate_gradients(run.model, run.acc, prompts, completions, run.tokenizer.pad_token_id,
                                 args.micro_batch_size, loss_fn, temperature=temperature)
        optimizer_step(run)
        if epoch == 0:
            sums = s
    return sums
