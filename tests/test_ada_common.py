"""common/ada.py: positives, right-aligned old log-probs, and the summed clipped surrogate."""
import math

import pytest
import torch

from common.ada import count_positive, surrogate_sum
from common.masking import pad_sequences, right_align


def test_positive_is_strictly_above_the_threshold():
    assert count_positive([0.7, 0.71, 1.0, 0.1, 0.0], 0.7) == 2
    assert count_positive([], 0.5) == 0


def test_right_align_matches_the_loss_mask_of_pad_sequences():
    comps = [[5, 6, 7], [8], []]
    batch = pad_sequences([[1, 2], [1], [3, 4, 5]], comps, pad_id=0)
    old = right_align([[-0.1, -0.2, -0.3], [-0.4], []], batch.completion_width)
    assert torch.allclose(old, torch.tensor([[-0.1, -0.2, -0.3], [0.0, 0.0, -0.4], [0.0, 0.0, 0.0]]))
    assert ((old != 0).float() == batch.loss_mask).all()  # every old log-prob sits on its own token
    with pytest.raises(ValueError):
        right_align([[1.0, 2.0]], 1)


def test_surrogate_sum_clips_and_masks():
    old = torch.zeros(1, 4)
    logp = torch.tensor([[0.0, math.log(1.5), math.log(0.5), math.log(1.5)]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, n_clip = surrogate_sum(logp, old, torch.tensor([2.0]), mask, 0.2, 0.28)
    # token 0: ratio 1 -> -2; token 1: ratio 1.5 clipped to 1.28 -> -2.56; token 2: ratio 0.5 (A > 0: unclipped) -> -1
    assert loss.item() == pytest.approx(-(2.0 + 2.56 + 1.0))
    assert n_clip.item() == 1.0  # the masked 4th token does not count
    loss.backward()
    assert logp.grad[0, 1] == 0.0 and logp.grad[0, 3] == 0.0 and logp.grad[0, 0] == pytest.approx(-2.0)
    neg, n_clip = surrogate_sum(logp.detach(), old, torch.tensor([-1.0]), mask, 0.2, 0.28)
    # A < 0: ratio 0.5 is clipped up to 0.8 (pessimistic), ratio 1.5 is not clipped
    assert neg.item() == pytest.approx(1.0 + 1.5 + 0.8) and n_clip.item() == 1.0


def _fake_run(seed: int = 0, ppo_epochs: int = 1):
    """Just enough of common.runtime.Run for clipped_update: a tiny random policy, SGD(lr=1) so that the
    parameter change after one step is minus the (clipped-norm) gradient."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from common.policy import BaseRecipe, build_char_tokenizer, build_tiny_model

    torch.manual_seed(seed)
    tok = build_char_tokenizer()
    model = build_tiny_model(BaseRecipe(), len(tok))
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    args = SimpleNamespace(eps_low=0.2, eps_high=0.28, max_new_tokens=8, beta=0.0, ppo_epochs=ppo_epochs,
                           micro_batch_size=2, max_grad_norm=1e9, use_vllm=False)
    return SimpleNamespace(args=args, model=model, policy=model, acc=Accelerator(cpu=True), tokenizer=tok, ref=None,
                           opt=opt, sched=torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0),
                           generator=SimpleNamespace(sync_weights=lambda m: None))


def test_clipped_update_without_sampler_logprobs_equals_the_scored_pi_old():
    # one epoch, HF weights: pi_old read from the update's own pass == the generator's extra scoring pass
    from common.ada import clipped_update, sampler_logprobs_needed
    from common.logprobs import score_completions

    prompts = [[3, 4, 5], [3, 4, 5], [6, 7], [6, 7]]
    comps = [[8, 9, 10, 2], [11, 12], [13, 14, 15], [9]]
    adv = torch.tensor([0.5, -0.5, 1.0, -1.0])
    after = []
    for scored in (True, False):
        run = _fake_run()
        before = [p.detach().clone() for p in run.model.parameters()]
        old = score_completions(run.model, prompts, comps, run.tokenizer.pad_token_id, 4, "cpu", 1.0) if scored else None
        sums = clipped_update(run, prompts, comps, old, adv, 32.0, 1.0)
        after.append(([(p.detach() - b) for p, b in zip(run.model.parameters(), before)], sums))
    (d1, s1), (d2, s2) = after
    assert any(d.abs().max() > 1e-4 for d in d1)  # the step did move the weights
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(d1, d2))
    assert s1["loss_sum"] == pytest.approx(s2["loss_sum"], abs=1e-5) and s2["clip_sum"] == 0.0
    # a wrong pi_old would change the update: the equality above is not vacuous
    run = _fake_run()
    before = [p.detach().clone() for p in run.model.parameters()]
    clipped_update(run, prompts, comps, [[-5.0] * len(c) for c in comps], adv, 32.0, 1.0)
    assert not all(torch.allclose(p.detach() - b, d, atol=1e-6) for p, b, d in zip(run.model.parameters(), before, d1))
    # the skip is only taken where it is exact
    from types import SimpleNamespace
    assert not sampler_logprobs_needed(SimpleNamespace(use_vllm=False, ppo_epochs=1))
    assert sampler_logprobs_needed(SimpleNamespace(use_vllm=True, ppo_epochs=1))
    assert sampler_logprobs_needed(SimpleNamespace(use_vllm=False, ppo_epochs=2))
    with pytest.raises(ValueError, match="ppo_epochs"):
        clipped_update(_fake_run(ppo_epochs=2), prompts, comps, None, adv, 32.0, 1.0)
