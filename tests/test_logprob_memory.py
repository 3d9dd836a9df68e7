"""The log-prob step's memory for backward: what a pass keeps for its backward (saved tensors and
any other tensor left alive) does not grow with tokens x V, and values and gradients equal the plain
formula's (autograd through the model's logits and a float32 log-softmax) in every path that reaches
it: padded and packed batches, the entropy bonus, bf16 autocast, tied heads."""

import gc
import random

import pytest
import torch

from common.rl.logprobs import head_of, token_logprobs
from common.rl.masking import pack_sequences, pad_sequences

VOCAB = 8192  # large next to the hidden width (32), as a real model's 152k is next to its 896-3584


def tiny(model_type: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    if model_type == "qwen2":  # tied head, as Qwen2.5-0.5B / 1.5B
        return Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=True))
    return LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False))


def reference(model, batch, temperature: float):
    """The formula this step computed before: the model's logits, a float32 copy, log-softmax and entropy, with
    autograd through all of it (4 x V bytes kept per token, 8 x V with the entropy)."""
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    r = batch.completion_width
    x = out.logits[:, -r - 1 : -1].float() / temperature
    logp = torch.log_softmax(x, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, batch.input_ids[:, -r:, None]).squeeze(-1), entropy


def gradients(model, batch, compute, temperature=0.7):
    model.zero_grad()
    logp, entropy = compute(model, batch, temperature)
    # a policy-gradient-like loss with an entropy bonus: weights of both signs, masked tokens excluded
    weights = torch.linspace(-1.0, 1.0, logp.numel()).view(logp.shape)
    ((logp * weights + 0.1 * entropy) * batch.loss_mask).sum().backward()
    return logp.detach(), entropy.detach(), [param.grad.clone() for param in model.parameters()]


def ours(model, batch, temperature):
    return token_logprobs(
        model, batch, temperature, chunk_size=5, entropy_grad=True
    )  # several chunks


def batches(length: int, packed: bool, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randint(3, 9))] for _ in range(3)]
    completions = [[rng.randrange(3, VOCAB) for _ in range(length - i)] for i in range(3)]
    masks = [[rng.randint(0, 1) for _ in c] for c in completions]
    padded = pad_sequences(prompts, completions, 0, masks)
    return padded, pack_sequences(prompts, completions, 0, 10_000, masks) if packed else padded


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_values_and_gradients_equal_the_plain_formula(model_type):
    model = tiny(model_type)
    assert head_of(model) is model.lm_head  # the hidden-state path runs
    padded, packed = batches(12, packed=True)
    want = gradients(model, padded, reference)
    for batch in (padded, packed):
        got = gradients(model, batch, ours)
        mask = packed.gather_index >= 0  # the completion tokens (a packed batch leaves the rest 0)
        # fp32: the same sums in another order; log p and entropy are O(log V) = 9, so 1e-5 is ~100 ulps of them
        for name, a, b in (("logp", got[0], want[0]), ("entropy", got[1], want[1])):
            assert torch.allclose(a[mask], b[mask], atol=1e-5, rtol=0), name
        for (name, _), a, b in zip(model.named_parameters(), got[2], want[2]):
            scale = (
                b.abs().max().item()
            )  # each gradient is a sum over tokens: tolerance relative to its largest entry
            assert torch.allclose(a, b, atol=1e-5 * scale + 1e-9, rtol=1e-4), name
    with torch.no_grad():  # scoring passes take the same path, with the last layer's state only
        assert torch.allclose(
            token_logprobs(model, packed, 0.7)[0][mask], want[0][mask], atol=1e-5, rtol=0
        )
    with torch.autocast(
        "cpu", torch.bfloat16
    ):  # bf16 compute over fp32 weights, as --dtype bfloat16 runs
        want, got = gradients(model, padded, reference), gradients(model, padded, ours)
    # the same bf16 logits (one rounding of 2^-8 at most apart per product sum): log p within a few bf16 ulps of 9
    assert torch.allclose(got[0][mask], want[0][mask], atol=0.1, rtol=0)
    for a, b in zip(got[2], want[2]):
        assert torch.allclose(a, b, atol=0.02 * b.abs().max().item() + 1e-9, rtol=0)


def kept_bytes(model, batch) -> int:
    """Bytes of the distinct storages alive after one log-prob pass (entropy bonus on), however
    kept: saved for backward (saved-tensor hooks) or held by a Python object, e.g. an attribute of
    an autograd Function's `ctx` (every tensor object alive after the forward, through the garbage
    collector)."""
    storages = {}

    def keep(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        logp, entropy = token_logprobs(model, batch, 1.0, entropy_grad=True)
    gc.collect()
    for obj in gc.get_objects():  # the rest of the process's tensors too: the same in every call
        if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.layout == torch.strided:
            keep(obj)
    (logp.sum() + entropy.sum()).backward()  # and the graph it kept is a working one
    return sum(storages.values())


@pytest.mark.parametrize("packed", [False, True])
def test_kept_bytes_do_not_grow_with_tokens_times_vocabulary(packed):
    model = tiny("llama")
    tokens, kept = [], []
    for length in (16, 80):
        batch = batches(length, packed)[1]
        tokens.append(
            int(batch.attention_mask.sum()) if not packed else int((batch.gather_index >= 0).sum())
        )
        kept.append(kept_bytes(model, batch))
    per_token = (kept[1] - kept[0]) / (tokens[1] - tokens[0])
    # the model's own activations (width 32, one layer) grow by ~3-4 KB per token; a float32 softmax kept per token
    # is 4 x V = 32 KB, 64 KB with the entropy bonus (the formula before this step kept 69 KB): V bytes tells them apart
    assert per_token < VOCAB, f"the pass keeps {per_token:.0f} bytes per added token (V = {VOCAB})"
