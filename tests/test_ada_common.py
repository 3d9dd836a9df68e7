"""Pieces both Reinforce-Ada scripts use: positives, right-aligned old log-probs, the summed clipped surrogate,
and pi_old read from the update's own pass."""

import json
import math
from pathlib import Path

import pytest
import torch

import ada_est
import ada_seq
from common.rl.ada import count_positive
from common.rl.losses import clipped_surrogate
from common.rl.masking import pad_sequences, right_align


def surrogate_sum(logp, old_logp, adv, mask, eps_low, eps_high):
    """The update's summed surrogate, as ada_seq.py / ada_est.py write it inline."""
    per_token, clipped = clipped_surrogate(logp, old_logp, adv[:, None], eps_low, eps_high)
    return (per_token * mask).sum(), (clipped * mask).sum()


def test_positive_is_strictly_above_the_threshold():
    assert count_positive([0.7, 0.71, 1.0, 0.1, 0.0], 0.7) == 2
    assert count_positive([], 0.5) == 0


def test_right_align_matches_the_loss_mask_of_pad_sequences():
    comps = [[5, 6, 7], [8], []]
    batch = pad_sequences([[1, 2], [1], [3, 4, 5]], comps, pad_id=0)
    old = right_align([[-0.1, -0.2, -0.3], [-0.4], []], batch.completion_width)
    assert torch.allclose(
        old, torch.tensor([[-0.1, -0.2, -0.3], [0.0, 0.0, -0.4], [0.0, 0.0, 0.0]])
    )
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
    assert (
        logp.grad[0, 1] == 0.0 and logp.grad[0, 3] == 0.0 and logp.grad[0, 0] == pytest.approx(-2.0)
    )
    neg, n_clip = surrogate_sum(logp.detach(), old, torch.tensor([-1.0]), mask, 0.2, 0.28)
    # A < 0: ratio 0.5 is clipped up to 0.8 (pessimistic), ratio 1.5 is not clipped
    assert neg.item() == pytest.approx(1.0 + 1.5 + 0.8) and n_clip.item() == 1.0


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_pi_old_from_the_update_pass_equals_the_scored_sampler_logprobs(
    tiny_base, tmp_path, monkeypatch
):
    # one epoch, HF weights: pi_old read from the update's own pass (`--old_logprobs auto`) gives the same update
    # as the generator's extra scoring pass (`--old_logprobs sampler`), in both Reinforce-Ada scripts. The tiny
    # test base solves nothing, so the training reward is replaced by one that varies (odd text length = success).
    from common.demo import countdown
    from common.run.flags import parse_args

    monkeypatch.setitem(countdown.REWARDS, "binary", lambda text, problem: float(len(text) % 2))
    for module in (ada_seq, ada_est):
        rows = {}
        for mode in ("auto", "sampler"):
            out = tmp_path / f"{module.__name__}-{mode}"
            module.main(
                parse_args(
                    module.Args,
                    [
                        "--model_name_or_path",
                        tiny_base,
                        "--output_dir",
                        str(out),
                        "--max_steps",
                        "2",
                        "--eval_steps",
                        "0",
                        "--eval_prompts",
                        "4",
                        "--eval_samples",
                        "2",
                        "--prompts_per_step",
                        "4",
                        "--prompt_pool",
                        "16",
                        "--max_completion_length",
                        "16",
                        "--num_threads",
                        "1",
                        "--old_logprobs",
                        mode,
                        "--learning_rate",
                        "1e-3",
                    ],
                )
            )
            rows[mode] = [
                json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            ][1:]
        for auto, sampler in zip(rows["auto"], rows["sampler"]):
            assert auto["reward_mean"] == sampler["reward_mean"]  # same samples
            for key in ("loss", "grad_norm", "entropy"):
                assert auto[key] == pytest.approx(sampler[key], rel=1e-5, abs=1e-7), (
                    module.__name__,
                    key,
                )
        assert any(row["grad_norm"] > 0 for row in rows["auto"])
        auto_w = _weights(tmp_path / f"{module.__name__}-auto" / "checkpoint-2")
        sampler_w = _weights(tmp_path / f"{module.__name__}-sampler" / "checkpoint-2")
        base_w = _weights(Path(tiny_base))
        # the generator scores padded, the update is packed (--padding_free): log-probs agree to ~1e-6 (summation
        # order), the weights after two lr-1e-3 AdamW steps to 1.2e-6 (measured)
        assert all(torch.allclose(auto_w[k], sampler_w[k], atol=5e-6) for k in auto_w)
        assert any(
            (auto_w[k] - base_w[k]).abs().max() > 1e-4 for k in auto_w
        )  # the steps did move the weights


def test_entropy_gradient_only_when_asked():
    from common.rl.logprobs import logprobs_from_logits

    logits = torch.randn(2, 3, 7, requires_grad=True)
    targets = torch.randint(0, 7, (2, 3))
    _, ent = logprobs_from_logits(logits, targets, temperature=0.6, chunk_size=2)
    assert not ent.requires_grad  # a metric by default
    _, ent = logprobs_from_logits(logits, targets, temperature=0.6, chunk_size=2, entropy_grad=True)
    reference = torch.distributions.Categorical(logits=logits / 0.6).entropy()
    assert torch.allclose(ent, reference, atol=1e-5)
    (grad,) = torch.autograd.grad(ent.sum(), logits)
    (want,) = torch.autograd.grad(reference.sum(), logits)
    assert torch.allclose(grad, want, atol=1e-5)


def test_entropy_bonus_changes_the_update_not_the_logged_surrogate(
    tiny_base, tmp_path, monkeypatch
):
    from common.demo import countdown
    from common.run.flags import parse_args

    monkeypatch.setitem(countdown.REWARDS, "binary", lambda text, problem: float(len(text) % 2))
    for module in (ada_seq, ada_est):
        rows = {}
        for coef in ("0", "1.0"):
            out = tmp_path / f"{module.__name__}-{coef}"
            module.main(
                parse_args(
                    module.Args,
                    [
                        "--model_name_or_path",
                        tiny_base,
                        "--output_dir",
                        str(out),
                        "--max_steps",
                        "1",
                        "--eval_steps",
                        "0",
                        "--eval_prompts",
                        "4",
                        "--eval_samples",
                        "2",
                        "--prompts_per_step",
                        "4",
                        "--prompt_pool",
                        "16",
                        "--max_completion_length",
                        "16",
                        "--num_threads",
                        "1",
                        "--entropy_coef",
                        coef,
                    ],
                )
            )
            rows[coef] = [
                json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
            ][1]
        off, on = rows["0"], rows["1.0"]
        assert off["reward_mean"] == on["reward_mean"] and off["loss"] == pytest.approx(
            on["loss"], rel=1e-6
        )
        assert off["grad_norm"] != pytest.approx(on["grad_norm"], rel=1e-3), module.__name__


@pytest.mark.parametrize("module", [ada_seq, ada_est], ids=["ada_seq", "ada_est"])
def test_the_kl_is_divided_by_the_policy_gradients_constant(
    tiny_base, tmp_path, monkeypatch, module
):
    """With --beta > 0 the optimised loss is (surrogate + beta x KL), each summed over the trained tokens, over one
    constant: trained responses x max_new_tokens. With the surrogate set to 0 and the k3 KL to 1 per token, the
    step's losses must add up to beta x trained tokens / (responses x max_new_tokens) by hand; a KL divided by the
    rank's own token count instead would add up to beta whatever the lengths."""
    from accelerate import Accelerator

    from common.run.flags import parse_args

    monkeypatch.setattr(
        module,
        "clipped_surrogate",
        lambda logp, old, adv, lo, hi: (logp * 0.0, torch.zeros_like(logp, dtype=torch.bool)),
    )
    monkeypatch.setattr(module, "kl_k3", lambda logp, ref_logp: logp * 0.0 + 1.0)
    losses, backward = [], Accelerator.backward
    monkeypatch.setattr(
        Accelerator,
        "backward",
        lambda self, loss, **kw: (losses.append(loss.item()), backward(self, loss, **kw))[1],
    )
    beta, max_new = 0.5, 48
    out = tmp_path / module.__name__
    own = (
        ["--max_rounds", "1", "--round_repeat", "4"] if module is ada_seq else []
    )  # GRPO-n4: every response trains
    module.main(
        parse_args(
            module.Args,
            [
                "--model_name_or_path",
                tiny_base,
                "--output_dir",
                str(out),
                "--max_steps",
                "1",
                "--eval_steps",
                "0",
                "--eval_prompts",
                "4",
                "--eval_samples",
                "1",
                "--prompts_per_step",
                "4",
                "--prompt_pool",
                "16",
                "--max_completion_length",
                str(max_new),
                "--num_threads",
                "1",
                "--entropy_coef",
                "0",
                "--beta",
                str(beta),
                *own,
            ],
        )
    )
    row = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1]
    responses, tokens = (
        row["rollouts"],
        row["gen_tokens"],
    )  # step 1: this step's, all of them trained
    assert responses == (16 if module is ada_seq else 32) and row["kl"] == pytest.approx(
        1.0
    )  # 4 x 4; 4 x 8
    by_hand = beta * tokens / (responses * max_new)
    assert (
        tokens < 0.8 * responses * max_new
    )  # the two normalisers give clearly different losses here
    assert sum(losses) == pytest.approx(by_hand, rel=1e-5)
