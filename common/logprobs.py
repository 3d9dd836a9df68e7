"""Per-token log-probs and entropies of the completion region: the model returns logits only there
(`logits_to_keep`), and log p(token) = logit[token] - logsumexp(logits) is computed a chunk of positions at a
time, so no float32 copy of the whole [B, R, V] tensor is made. Entropy comes from the same chunks.
"""
from __future__ import annotations

import torch

from common.masking import Batch, pad_sequences, unpad_completion


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                         chunk_size: int = 64, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, R, V], targets [B, R] -> (log p(target) [B, R], entropy [B, R]); chunked over R. `entropy_grad`
    keeps the entropy in the graph (an entropy bonus; each chunk's softmax is then kept for backward)."""
    lps, ents = [], []
    for s in range(0, logits.shape[1], chunk_size):
        x = logits[:, s:s + chunk_size].float() / temperature
        lse = torch.logsumexp(x, dim=-1)
        lps.append(x.gather(-1, targets[:, s:s + chunk_size, None]).squeeze(-1) - lse)
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            xe, lse_e = (x, lse) if entropy_grad else (x.detach(), lse.detach())
            ents.append(lse_e - (torch.softmax(xe, dim=-1) * xe).sum(-1))
    return torch.cat(lps, 1), torch.cat(ents, 1)


def token_logprobs(model, batch: Batch, temperature: float = 1.0, chunk_size: int = 64, entropy_grad: bool = False,
                   compiled=None):
    """(log p, entropy) of every token in the completion region, shape [B, R] each.

    Column j of the result scores input column T - R + j. Gradient flows through log p when enabled, and through
    the entropy too with `entropy_grad`. `compiled` (--torch_compile's TorchCompile, common/compile.py) runs a
    packed batch's forward compiled.
    """
    r = batch.completion_width
    if batch.gather_index is not None:  # packed: logits only at the columns that predict a completion token
        valid = batch.gather_index >= 0
        flat = batch.gather_index[valid]
        width = batch.input_ids.shape[1]
        if compiled is not None:  # every position's logits: one graph for all micro-batches (common/compile.py)
            logits = compiled.logits(model, batch.input_ids, batch.position_ids)
            logits = logits.reshape(-1, logits.shape[-1])[flat]
        else:
            columns = torch.unique(flat % width)  # sorted; one set for all rows
            out = model(input_ids=batch.input_ids, attention_mask=None, position_ids=batch.position_ids,
                        logits_to_keep=columns, use_cache=False)
            pick = (flat // width) * len(columns) + torch.searchsorted(columns, flat % width)
            logits = out.logits.reshape(-1, out.logits.shape[-1])[pick]
        lp, ent = logprobs_from_logits(logits[None], batch.input_ids.reshape(-1)[flat + 1][None], temperature,
                                       chunk_size, entropy_grad)
        full_lp, full_ent = lp.new_zeros(valid.shape), ent.new_zeros(valid.shape)
        full_lp[valid], full_ent[valid] = lp[0], ent[0]
        return full_lp, full_ent
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, logits_to_keep=r + 1, use_cache=False)
    logits = out.logits[:, :-1]  # position t predicts token t+1
    targets = batch.input_ids[:, -r:]
    return logprobs_from_logits(logits, targets, temperature, chunk_size, entropy_grad)


@torch.no_grad()
def score_completions(model, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                      batch_size: int, device, temperature: float = 1.0) -> list[list[float]]:
    """Per-token log-probs (one list per completion) under `model`, without gradient."""
    out: list[list[float]] = []
    for s in range(0, len(prompts), batch_size):
        batch = pad_sequences(prompts[s:s + batch_size], completions[s:s + batch_size], pad_id).to(device)
        lp, _ = token_logprobs(model, batch, temperature)
        out.extend(unpad_completion(lp, batch.completion_lens))
    return out
