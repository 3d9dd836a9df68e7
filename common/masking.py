"""(prompt, completion) pairs as one left-padded batch with a loss mask. Left padding puts every completion at
the right edge: the trainable region is the last `completion_width` columns of every row, the only place the
model produces logits (`logits_to_keep`). Context that gets no gradient (environment observations, replayed
prefixes) is marked 0 in a per-completion mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] left-padded prompt + completion
    attention_mask: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T], counted from each row's first real token
    loss_mask: torch.Tensor  # [B, R] float: 1 on completion tokens that get gradient
    completion_width: int  # R: width of the completion region (the last R columns)
    completion_lens: list[int]

    def to(self, device) -> "Batch":
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.position_ids.to(device),
                     self.loss_mask.to(device), self.completion_width, self.completion_lens)


def pad_sequences(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                  completion_masks: list[list[int]] | None = None) -> Batch:
    """Left-pad prompt+completion rows; `completion_masks[i][j]` = 0 masks token j of completion i."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if completion_masks is not None:
        for i, (c, m) in enumerate(zip(completions, completion_masks)):
            if len(c) != len(m):
                raise ValueError(f"completion {i}: {len(c)} tokens but a mask of {len(m)}")
    width = max(len(p) + len(c) for p, c in zip(prompts, completions))
    r_width = max(1, max(len(c) for c in completions))
    rows = len(prompts)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    att = torch.zeros((rows, width), dtype=torch.long)
    loss = torch.zeros((rows, r_width), dtype=torch.float32)
    for r, (p, c) in enumerate(zip(prompts, completions)):
        seq = list(p) + list(c)
        ids[r, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        att[r, width - len(seq):] = 1
        if c:
            m = completion_masks[r] if completion_masks is not None else [1] * len(c)
            loss[r, r_width - len(c):] = torch.tensor(m, dtype=torch.float32)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    return Batch(ids, att, pos, loss, r_width, [len(c) for c in completions])


def unpad_completion(values: torch.Tensor, lens: list[int]) -> list[list[float]]:
    """Per-row lists from a [B, R] completion-region tensor (row i keeps its last lens[i] columns)."""
    r = values.shape[1]
    return [values[i, r - n:].tolist() if n else [] for i, n in enumerate(lens)]


def right_align(rows, width: int) -> torch.Tensor:
    """[B, width] float tensor with row i's values (a list or 1-D tensor) in its last len(rows[i]) columns,
    zeros elsewhere: the layout of a completion region built by `pad_sequences` (completions end at the right)."""
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"row {i} has {len(r)} values, wider than {width}")
        if len(r):
            out[i, width - len(r):] = torch.as_tensor(r, dtype=torch.float32)
    return out
