"""Padding-free (packed) passes against padded ones: same log-probs, entropies, values and gradients; attention
never crosses sequences; micro-batches by token budget."""

import random

import pytest
import torch
from conftest import loss_tolerance

from common.demo.tiny_model import BaseRecipe, build_char_tokenizer, build_tiny_model
from common.distributed.ranks import token_budget_cuts
from common.rl.logprobs import token_logprobs
from common.rl.masking import pack_sequences, pad_sequences

TOL = 2e-5  # fp32: packed and padded differ only in summation order (measured <= 1.1e-5 on the gradients)


@pytest.fixture(scope="module")
def model_and_data():
    torch.manual_seed(0)
    rng = random.Random(0)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(BaseRecipe(), len(tokenizer))
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(
            3.0
        )  # peaked distributions: a wrong position would show
    vocab = len(tokenizer)
    # prompts of different lengths (left padding in the padded layout), an empty completion, prefix-style masks
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(3, 12))] for _ in range(9)]
    completions = [
        [rng.randrange(3, vocab) for _ in range(rng.randint(1, 20))] for _ in range(8)
    ] + [[]]
    masks = [[rng.randint(0, 1) for _ in c] for c in completions]
    return model, prompts, completions, masks


def _pass(model, batch, temperature=0.7):
    model.zero_grad()
    logp, entropy = token_logprobs(model, batch, temperature, entropy_grad=True)
    ((logp - 0.1 * entropy) * batch.loss_mask).sum().backward()
    return logp.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("row_tokens", [1, 40, 10_000])  # one sequence per row, a few rows, one row
def test_packed_equals_padded(model_and_data, row_tokens):
    model, prompts, completions, masks = model_and_data
    padded = pad_sequences(prompts, completions, 0, masks)
    packed = pad_sequences(prompts, completions, 0, masks, pack_tokens=row_tokens)
    assert packed.attention_mask is None and packed.loss_mask.equal(padded.loss_mask)
    if row_tokens == 10_000:
        assert (
            packed.input_ids.shape[0] == 1 and packed.input_ids.numel() < padded.input_ids.numel()
        )
    real = torch.zeros_like(padded.loss_mask, dtype=torch.bool)
    for i, completion in enumerate(completions):
        if completion:
            real[i, -len(completion) :] = True
    lp_a, ent_a, grads_a = _pass(model, padded)
    lp_b, ent_b, grads_b = _pass(model, packed)
    torch.testing.assert_close(lp_b[real], lp_a[real], atol=TOL, rtol=0)
    torch.testing.assert_close(ent_b[real], ent_a[real], atol=TOL, rtol=0)
    assert (lp_b[~real] == 0).all()  # the padded layout's padding columns stay empty
    for grad_a, grad_b in zip(grads_a, grads_b):
        torch.testing.assert_close(grad_b, grad_a, atol=TOL, rtol=0)


def test_attention_does_not_cross_sequences(model_and_data):
    model, prompts, completions, masks = model_and_data
    before = token_logprobs(model, pack_sequences(prompts, completions, 0, 10_000))[0].detach()
    changed = [list(p) for p in prompts]
    changed[0] = [5] * len(
        changed[0]
    )  # a different first prompt, same length: no later sequence may notice
    after = token_logprobs(model, pack_sequences(changed, completions, 0, 10_000))[0].detach()
    assert not torch.allclose(before[0], after[0])
    torch.testing.assert_close(after[1:], before[1:], atol=1e-6, rtol=0)


def test_completion_states_matches_the_padded_columns(model_and_data):
    model, prompts, completions, masks = model_and_data
    padded, packed = (
        pad_sequences(prompts, completions, 0),
        pack_sequences(prompts, completions, 0, 40),
    )
    with torch.no_grad():
        hidden_a = model.model(
            input_ids=padded.input_ids,
            attention_mask=padded.attention_mask,
            position_ids=padded.position_ids,
            use_cache=False,
        ).last_hidden_state
        hidden_b = model.model(
            input_ids=packed.input_ids,
            attention_mask=None,
            position_ids=packed.position_ids,
            use_cache=False,
        ).last_hidden_state
    states_a, states_b = padded.completion_states(hidden_a), packed.completion_states(hidden_b)
    real = padded.loss_mask > 0
    torch.testing.assert_close(states_b[real], states_a[real], atol=TOL, rtol=0)


def test_token_budget_cuts():
    assert token_budget_cuts([5, 5, 5, 20, 3, 3], 10) == [0, 2, 3, 4]  # 10 | 5 | 20 alone | 6
    assert token_budget_cuts([], 10) == [] and token_budget_cuts([30], 10) == [0]


# every script, its updates packed (rows of at most 40 tokens: several per micro-batch) and padded, from the same
# start: the same loss, gradient norm, entropy, KL and (pros_ppo.py) value loss. ps_grpo.py's second step trains
# prefix tasks (replayed-prefix masks; observation masks are the same kind of 0s, tested above); pros_ppo.py its
# critic and augmented queries. The reward (text-length parity) varies, so every step trains something.
SCRIPT_RUNS = [
    ("ra_rloo", ["--prompt_pool", "16"]),
    ("ada_seq", ["--max_rounds", "2", "--round_repeat", "4"]),
    ("ada_est", ["--prompt_pool", "16"]),
    ("ps_grpo", ["--mode", "text", "--max_steps", "2"]),
    ("pros_ppo", ["--max_steps", "2"]),
]
COMPARED = ("loss", "grad_norm", "entropy", "kl", "ppo_value_loss", "reward_mean")


@pytest.mark.parametrize(
    "script,flags", SCRIPT_RUNS, ids=[f"{s}-{i}" for i, (s, _) in enumerate(SCRIPT_RUNS)]
)
def test_every_script_trains_the_same_packed_and_padded(
    tiny_base, tmp_path, monkeypatch, script, flags
):
    import importlib
    import json

    from common.demo import countdown
    from common.run.flags import parse_args

    for name in ("binary", "tinyzero"):
        monkeypatch.setitem(countdown.REWARDS, name, lambda text, problem: float(len(text) % 2))

    module = importlib.import_module(script)
    rows = {}
    for padding_free in ("true", "false"):
        out = tmp_path / padding_free
        argv = [
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
            "8",
            "--learning_rate",
            "1e-4",
            "--micro_batch_size",
            "16",
            "--padding_free",
            padding_free,
            "--pack_row_tokens",
            "40",
            *flags,
        ]
        module.main(parse_args(module.Args, argv))
        rows[padding_free] = [
            json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
        ][1:]
    assert len(rows["true"]) == len(rows["false"]) >= 1
    assert all(
        row["grad_norm"] > 0 for row in rows["false"]
    )  # something was trained: the comparison can fail
    for packed, padded in zip(rows["true"], rows["false"]):
        for key in COMPARED:
            if padded.get(key) is not None:
                # a loss's advantages cancel within each group: an absolute bound (conftest.loss_tolerance)
                loss_bound = loss_tolerance(padded) if key == "loss" else 1e-6
                assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=loss_bound), (
                    packed["step"],
                    key,
                )
