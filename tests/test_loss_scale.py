"""The scale of each script's optimised loss, pinned directly: the loss every rank backpropagates on
a fixed batch split over two ranks, averaged as DDP / FSDP average the ranks' gradients, against
the method's formula computed here over the whole batch. AdamW hides a loss's scale from every
later number, so the metrics of a run cannot tell a 0.1% change of a normaliser; these can
(ada_seq.py's and ada_est.py's constant is pinned through their main in test_ada_common.py)."""

from types import SimpleNamespace

import pytest
import torch

import pros_ppo
from common.distributed.ranks import rank_mean
from ps_grpo import ps_loss
from ra_rloo import rloo_advantages, rloo_loss, rloo_normaliser

WORLD = 2
REL = 1e-6  # float32 sums over a few dozen terms; a normaliser x 1.001 moves the loss by 1e-3


def _batch(rows: int, width: int, seed: int):
    """Per-token log-probs (the policy's, the sampler's, the reference's) and a loss mask with
    rows of different lengths (right-aligned completions, as pad_sequences gives)."""
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 3
    old = logp + (torch.rand(rows, width, generator=gen, dtype=torch.float64) - 0.5) * 0.8
    ref = logp + (torch.rand(rows, width, generator=gen, dtype=torch.float64) - 0.5) * 0.4
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width)[None, :] >= width - lengths[:, None]).double()
    return logp, old, ref, mask


def _ppo_token_loss(logp, old, adv, eps_low, eps_high):
    """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) per token, r = pi / pi_old (PPO, DAPO's
    clip-higher), written out independently of common.rl.losses."""
    out = torch.empty_like(logp)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            ratio = float(torch.exp(logp[i, t] - old[i, t]))
            a = float(adv[i, t])
            clipped = min(max(ratio, 1 - eps_low), 1 + eps_high)
            out[i, t] = -min(ratio * a, clipped * a)
    return out


def _ranks(rows: int) -> list[list[int]]:
    """Each rank's rows of a batch of `rows` (strided, as the scripts deal them)."""
    return [list(range(rank, rows, WORLD)) for rank in range(WORLD)]


def _two_ranks(global_sum: float, rank: int) -> SimpleNamespace:
    """An accelerator of rank `rank` in a world of two whose sum over ranks is `global_sum`."""
    return SimpleNamespace(
        num_processes=WORLD,
        process_index=rank,
        device=torch.device("cpu"),
        reduce=lambda packed, reduction: torch.full_like(packed, global_sum),
    )


def test_rloo_loss_is_the_batch_sum_over_samples_times_max_new_tokens():
    # RLOO (and RA-RLOO): sum_i [-A_i log pi(y_i|x) + beta sum_t KL_it] / (prompts x k x max_new
    # tokens) over the whole batch, A_i = r_i - the mean of its group's other rewards
    prompts, k, max_new, beta = 3, 4, 6, 0.05
    logp, _, ref, mask = _batch(prompts * k, max_new, seed=0)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = torch.tensor(
        [[(r[j] - (r.sum() - r[j]) / (k - 1)).item() for j in range(k)] for r in rewards]
    ).flatten()
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    by_hand = sum(
        -adv[i] * (logp[i] * mask[i]).sum() + beta * (kl[i] * mask[i]).sum()
        for i in range(prompts * k)
    ) / (prompts * k * max_new)

    advantages = rloo_advantages(rewards).flatten()
    normaliser = rloo_normaliser(prompts, k, WORLD, max_new)
    per_rank = []
    # the batch is dealt by prompt: a rank holds whole groups (prompt 1 on rank 1)
    for groups in ([0, 2], [1]):
        rows = [g * k + j for g in groups for j in range(k)]
        pg_sum = -(advantages[rows] * (logp[rows] * mask[rows]).sum(-1)).sum()
        kl_sum = (kl[rows] * mask[rows]).sum()
        per_rank.append(rloo_loss(pg_sum, kl_sum, beta, normaliser))
    assert float(sum(per_rank) / WORLD) == pytest.approx(float(by_hand), rel=REL)
    # one process: the same constant over the whole batch
    assert rloo_normaliser(prompts, k, 1, max_new) == prompts * k * max_new


def test_ps_loss_is_the_dapo_token_mean_of_the_whole_batch():
    # PS-GRPO: the clipped surrogate summed over every trained token of the batch, over the batch's
    # trained tokens (DAPO's token mean), whatever each rank's share of them
    rows, width, eps_low, eps_high = 7, 5, 0.2, 0.28
    logp, old, _, mask = _batch(rows, width, seed=1)
    adv = torch.linspace(-1.5, 1.5, rows, dtype=torch.float64)
    per_token = _ppo_token_loss(logp, old, adv[:, None].expand(rows, width), eps_low, eps_high)
    by_hand = (per_token * mask).sum() / mask.sum()

    per_rank = []
    for rank, mine in enumerate(_ranks(rows)):
        n_tok = rank_mean(_two_ranks(float(mask.sum()), rank), float(mask[mine].sum()))
        loss, _ = ps_loss(logp[mine], old[mine], adv[mine], mask[mine], n_tok, eps_low, eps_high)
        per_rank.append(loss)
    assert float(sum(per_rank) / WORLD) == pytest.approx(float(by_hand), rel=REL)


def test_pros_ppo_policy_loss_is_the_token_mean_of_the_minibatch():
    # PPO (and GRPO in pros_ppo.py): the clipped surrogate plus beta x KL, each a token mean over
    # the whole minibatch's policy tokens
    rows, width, eps_low, eps_high, beta = 6, 5, 0.2, 0.28, 0.05
    logp, old, ref, mask = _batch(rows, width, seed=2)
    adv = torch.linspace(-1.0, 2.0, rows * width, dtype=torch.float64).view(rows, width) * mask
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    per_token = _ppo_token_loss(logp, old, adv, eps_low, eps_high)
    by_hand = ((per_token + beta * kl) * mask).sum() / mask.sum()

    per_rank = []
    for mine in _ranks(rows):
        divisor = pros_ppo.token_divisor(float(mask.sum()), WORLD)
        loss_tokens, _ = pros_ppo.clipped_surrogate(
            logp[mine], old[mine], adv[mine], eps_low, eps_high
        )
        loss = (loss_tokens * mask[mine]).sum() / divisor
        loss = loss + beta * pros_ppo.kl_k3(logp[mine], ref[mine]).mul(mask[mine]).sum() / divisor
        per_rank.append(loss)
    assert float(sum(per_rank) / WORLD) == pytest.approx(float(by_hand), rel=REL)
    # the critic's value loss uses the same divisor over all completion tokens; an empty minibatch
    # (sums of 0) still divides by something
    assert pros_ppo.token_divisor(0.0, WORLD) == 1.0
