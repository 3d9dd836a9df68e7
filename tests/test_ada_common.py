"""common/ada.py: positives, right-aligned old log-probs, and the summed clipped surrogate."""
import math

import pytest
import torch

from common.ada import count_positive, surrogate_sum
from common.masking import right_align
from common.masking import pad_sequences


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
