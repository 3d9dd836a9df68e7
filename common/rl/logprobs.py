"""Per-token log-probs and entropies of the completion region, a chunk of tokens at a time
(`ChunkedLogProbs`), each chunk recomputed in backward: autograd keeps H values per token, not 4 x V
bytes of float32 softmax. With a plain linear head (`head_of`) the model returns its last hidden
states and the head runs here by chunks, so no [tokens, V] tensor exists; otherwise (a LoRA'd or
scaled head, FSDP's no-grad scoring, the compiled packed forward) the model's logits are the input.
"""

from __future__ import annotations

import torch

from common.model.policy import autocast
from common.rl.masking import Batch, pad_sequences, right_align, unpad_completion

# tokens per chunk: a few float32 [chunk, V] temporaries (0.3 GB each at V = 152k)
CHUNK_TOKENS = 512
# model types whose output head is a plain linear map of the last hidden state (no softcap or logit
# scale)
PLAIN_HEADS = ("llama", "qwen2", "qwen3", "mistral")


def _chunk_logits(inputs: torch.Tensor, weight, dtype, temperature: float) -> torch.Tensor:
    """float32 logits / temperature of a chunk of logits, or of hidden states through `weight` in
    `dtype`."""
    return (
        inputs if weight is None else torch.nn.functional.linear(inputs.to(dtype), weight)
    ).float() / temperature


class ChunkedLogProbs(torch.autograd.Function):
    """(log p(target), entropy) per token from hidden states [N, H] and the head's weight [V, H] (or
    logits [N, V], weight None), `chunk` tokens at a time; backward recomputes each chunk: for x =
    logits / temperature, d log p / dx = onehot - p and d entropy / dx = -p (x - E_p[x]), the latter
    only with `entropy_grad`."""

    @staticmethod
    def forward(
        ctx, inputs, weight, targets, temperature: float, chunk: int, entropy_grad: bool, dtype
    ):
        empty = inputs.new_zeros(0, dtype=torch.float32)  # what torch.cat gives for no token
        lps, ents = [empty], [empty]
        # the compute dtype is explicit: `dtype`
        with torch.autocast(inputs.device.type, enabled=False):
            head = None if weight is None else weight.to(dtype)
            for start in range(0, inputs.shape[0], chunk):
                x = _chunk_logits(inputs[start : start + chunk], head, dtype, temperature)
                lse = torch.logsumexp(x, dim=-1)
                lps.append(x.gather(-1, targets[start : start + chunk, None]).squeeze(-1) - lse)
                ents.append(lse - (torch.softmax(x, dim=-1) * x).sum(-1))
        ctx.save_for_backward(inputs, weight, targets)
        ctx.settings = temperature, chunk, entropy_grad, dtype
        lp, ent = torch.cat(lps), torch.cat(ents)
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        inputs, weight, targets = ctx.saved_tensors
        temperature, chunk, entropy_grad, dtype = ctx.settings
        need_inputs, need_weight = ctx.needs_input_grad[:2]
        grad_inputs = torch.empty_like(inputs) if need_inputs else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            if need_weight
            else None
        )
        with torch.autocast(inputs.device.type, enabled=False):
            head = None if weight is None else weight.to(dtype)
            for start in range(0, inputs.shape[0], chunk):
                end = start + chunk
                x = _chunk_logits(inputs[start:end], head, dtype, temperature)
                probs = torch.softmax(x, dim=-1)
                grad = probs * -grad_lp[start:end, None]
                grad.scatter_add_(-1, targets[start:end, None], grad_lp[start:end, None])
                if entropy_grad:
                    grad -= (
                        grad_ent[start:end, None] * probs * (x - (probs * x).sum(-1, keepdim=True))
                    )
                grad /= temperature
                if weight is not None:
                    grad = grad.to(dtype)
                    if need_weight:
                        grad_weight += grad.T @ inputs[start:end].to(dtype)
                if need_inputs:
                    grad_inputs[start:end] = grad if weight is None else grad @ head
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_inputs, grad_weight, None, None, None, None, None


def logprobs_from_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = CHUNK_TOKENS,
    entropy_grad: bool = False,
):
    """logits [B, R, V], targets [B, R] -> (log p(target), entropy), each [B, R]; backward keeps
    only `logits`. `entropy_grad` keeps the entropy in the graph (an entropy bonus)."""
    flat = logits.reshape(-1, logits.shape[-1])
    lp, ent = ChunkedLogProbs.apply(
        flat, None, targets.reshape(-1), temperature, chunk_size, entropy_grad, logits.dtype
    )
    return lp.view(targets.shape), ent.view(targets.shape)


def _unwrapped(model):
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def head_of(model):
    """The output head when the logits are exactly head(last hidden state) and it can run after the
    forward; None otherwise (another architecture, a LoRA'd head, an FSDP model under no_grad, its
    root sharded after forward)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule) and not torch.is_grad_enabled():
        return None
    inner = _unwrapped(model)
    config, get_head = getattr(inner, "config", None), getattr(inner, "get_output_embeddings", None)
    if getattr(config, "model_type", None) not in PLAIN_HEADS or get_head is None:
        return None
    head = get_head()
    return head if type(head) is torch.nn.Linear and head.bias is None else None


def _hidden_logprobs(
    model,
    head,
    kwargs: dict,
    pick,
    targets: torch.Tensor,
    temperature: float,
    chunk: int,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`ChunkedLogProbs` through `head` (in autocast's dtype) on the model's last hidden states,
    `pick`ed to [N, H] (the model computes no logits: an empty `logits_to_keep`)."""
    device = kwargs["input_ids"].device
    # under FSDP the head's weight is whole here: a trained root stays gathered until its backward
    # only the last layer's state kept (not all: no_grad)
    last = [_unwrapped(model).config.num_hidden_layers - 1]
    out = model(
        **kwargs,
        logits_to_keep=torch.zeros(0, dtype=torch.long, device=device),
        output_hidden_states=last,
        use_cache=False,
    )
    # replaced by the final norm's output: what the head maps to logits
    hidden = pick(out.hidden_states[-1])
    dtype = (
        torch.get_autocast_dtype(device.type)
        if torch.is_autocast_enabled(device.type)
        else head.weight.dtype
    )
    return ChunkedLogProbs.apply(
        hidden, head.weight, targets, temperature, chunk, entropy_grad, dtype
    )


def token_logprobs(
    model,
    batch: Batch,
    temperature: float = 1.0,
    chunk_size: int = CHUNK_TOKENS,
    entropy_grad: bool = False,
    compiled=None,
):
    """(log p, entropy) of every token in the completion region, shape [B, R] each.

    Column j of the result scores input column T - R + j. Gradient flows through log p when enabled,
    and through the entropy too with `entropy_grad`. `compiled` (--torch_compile's TorchCompile,
    common/generation/compile.py) runs a packed batch's forward compiled (from its logits). With a
    plain head (`head_of`) the head runs here, by chunks.
    """
    r = batch.completion_width
    head = head_of(model)
    # packed: logits only at the columns that predict a completion token
    if batch.gather_index is not None:
        valid = batch.gather_index >= 0
        flat = batch.gather_index[valid]
        width = batch.input_ids.shape[1]
        targets = batch.input_ids.reshape(-1)[flat + 1]
        if compiled is None and head is not None:
            kwargs = dict(
                input_ids=batch.input_ids, attention_mask=None, position_ids=batch.position_ids
            )
            pick = lambda hidden: hidden.flatten(0, 1)[flat]  # noqa: E731
            lp, ent = _hidden_logprobs(
                model, head, kwargs, pick, targets, temperature, chunk_size, entropy_grad
            )
        else:
            # every position's logits: one graph for all micro-batches
            # (common/generation/compile.py)
            if compiled is not None:
                logits = compiled.logits(model, batch.input_ids, batch.position_ids)
                logits = logits.reshape(-1, logits.shape[-1])[flat]
            else:
                columns = torch.unique(flat % width)  # sorted; one set for all rows
                out = model(
                    input_ids=batch.input_ids,
                    attention_mask=None,
                    position_ids=batch.position_ids,
                    logits_to_keep=columns,
                    use_cache=False,
                )
                pick = (flat // width) * len(columns) + torch.searchsorted(columns, flat % width)
                logits = out.logits.reshape(-1, out.logits.shape[-1])[pick]
            lp, ent = logprobs_from_logits(logits, targets, temperature, chunk_size, entropy_grad)
        full_lp, full_ent = lp.new_zeros(valid.shape), ent.new_zeros(valid.shape)
        full_lp[valid], full_ent[valid] = lp, ent
        return full_lp, full_ent
    kwargs = dict(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
    )
    targets = batch.input_ids[:, -r:]
    if head is not None:  # position t predicts token t+1
        pick = lambda hidden: hidden[:, -r - 1 : -1].flatten(0, 1)  # noqa: E731
        lp, ent = _hidden_logprobs(
            model, head, kwargs, pick, targets.reshape(-1), temperature, chunk_size, entropy_grad
        )
        return lp.view(targets.shape), ent.view(targets.shape)
    out = model(**kwargs, logits_to_keep=r + 1, use_cache=False)
    return logprobs_from_logits(out.logits[:, :-1], targets, temperature, chunk_size, entropy_grad)


class Forward:
    """A micro-batch's forward, set once per run: `rows` pads prompt + completion rows (packed
    with `pack_tokens` > 0) onto the device, and the call runs a model on them under autocast at the
    sampling temperature, returning (log p, entropy) of the completion tokens, [rows, R] each.

        forward = Forward(tokenizer.pad_token_id, device, args.dtype, temperature, pack, compiled)
        mb = forward.rows(prompts, completions)
        logp, entropy = forward(model, mb)
        ref_logp, _ = forward(ref_model, mb, grad=False)
    """

    def __init__(
        self, pad_id: int, device, dtype: str, temperature=1.0, pack_tokens=0, compiled=None
    ):
        self.pad_id, self.device, self.dtype = pad_id, device, dtype
        self.temperature, self.pack_tokens, self.compiled = temperature, pack_tokens, compiled

    def rows(self, prompts, completions, completion_masks=None, sampler_logprobs=None) -> Batch:
        """The rows padded (`pad_sequences`) on the device; a 0 in `completion_masks` leaves that
        completion token out of `loss_mask`; `sampler_logprobs` (the generator's per-token
        log-probs, one list per row) become `sampler_logp`, aligned with the completion tokens."""
        batch = pad_sequences(
            prompts, completions, self.pad_id, completion_masks, pack_tokens=self.pack_tokens
        )
        if sampler_logprobs is not None:
            batch.sampler_logp = right_align(sampler_logprobs, batch.completion_width)
        return batch.to(self.device)

    def rows_at(
        self, rows: list[int], prompts, completions, sampler_logprobs=None, completion_masks=None
    ) -> Batch:
        """`rows` (indices) of the step's prompts, completions and, when given, the generator's
        log-probs and the completions' masks, as `rows` pads them."""
        pick = lambda values: None if values is None else [values[r] for r in rows]  # noqa: E731
        return self.rows(
            pick(prompts), pick(completions), pick(completion_masks), pick(sampler_logprobs)
        )

    def __call__(self, model, batch: Batch, grad: bool = True, entropy_grad: bool = False):
        """(log p, entropy) under `model`; `grad=False` without autograd (a frozen or old policy),
        `entropy_grad` keeps the entropy in the graph (an entropy bonus)."""
        enabled = grad and torch.is_grad_enabled()
        with torch.set_grad_enabled(enabled), autocast(self.device, self.dtype):
            return token_logprobs(
                model, batch, self.temperature, entropy_grad=entropy_grad, compiled=self.compiled
            )


@torch.no_grad()
def score_completions(
    model,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    batch_size: int,
    device,
    temperature: float = 1.0,
) -> list[list[float]]:
    """Per-token log-probs (one list per completion) under `model`, without gradient."""
    out: list[list[float]] = []
    for s in range(0, len(prompts), batch_size):
        batch = pad_sequences(
            prompts[s : s + batch_size], completions[s : s + batch_size], pad_id
        ).to(device)
        lp, _ = token_logprobs(model, batch, temperature)
        out.extend(unpad_completion(lp, batch.completion_lens))
    return out
