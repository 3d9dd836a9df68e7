"""(prompt, completion) pairs as one left-padded batch with a loss mask. Left padding puts every
completion at the right edge: the trainable region is the last `completion_width` columns of every
row, the only place the model produces logits (`logits_to_keep`). Context that gets no gradient
(environment observations, replayed prefixes) is marked 0 in a per-completion mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    # [B, T] left-padded prompt + completion (packed: [rows, W], sequences back to back)
    input_ids: torch.Tensor
    # [B, T]; None when packed (transformers reads the packing from position_ids)
    attention_mask: torch.Tensor | None
    # [B, T], from each row's first real token (packed: restarting at 0 per sequence)
    position_ids: torch.Tensor
    loss_mask: torch.Tensor  # [B, R] float: 1 on completion tokens that get gradient
    completion_width: int  # R: width of the completion region (the last R columns)
    completion_lens: list[int]
    # packed only: [B, R] flat index (row * W + column) of the position whose output predicts
    # completion column (b, j) of the padded layout, -1 where that column is padding; every [B, R]
    # result keeps the padded layout
    gather_index: torch.Tensor | None = None
    # [B, R] the generator's log-prob of each completion token, in the completion region's columns
    # (0 where it gave none); None unless asked for (`Forward.rows`)
    sampler_logp: torch.Tensor | None = None

    def to(self, device) -> "Batch":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Batch(
            move(self.input_ids),
            move(self.attention_mask),
            move(self.position_ids),
            move(self.loss_mask),
            self.completion_width,
            self.completion_lens,
            move(self.gather_index),
            move(self.sampler_logp),
        )

    def completion_states(self, per_position: torch.Tensor) -> torch.Tensor:
        """[B, R, ...] from a [rows, T, ...] per-position output (hidden states, logits): the
        outputs that predict each completion token, in the padded completion layout (zeros at
        padding when packed)."""
        width = self.completion_width
        if self.gather_index is None:
            return per_position[:, -(width + 1) : -1]
        valid = self.gather_index >= 0
        flat = per_position.reshape(-1, *per_position.shape[2:])[self.gather_index[valid]]
        out = flat.new_zeros(*self.gather_index.shape, *per_position.shape[2:])
        out[valid] = flat
        return out


def pad_sequences(
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    completion_masks: list[list[int]] | None = None,
    pack_tokens: int = 0,
) -> Batch:
    """Left-pad prompt+completion rows; `completion_masks[i][j]` = 0 masks token j of completion i.
    With `pack_tokens` > 0 the padding-free layout instead (`pack_sequences`, rows of at most that
    many tokens)."""
    if pack_tokens > 0:
        return pack_sequences(prompts, completions, pad_id, pack_tokens, completion_masks)
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
        ids[r, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        att[r, width - len(seq) :] = 1
        if c:
            m = completion_masks[r] if completion_masks is not None else [1] * len(c)
            loss[r, r_width - len(c) :] = torch.tensor(m, dtype=torch.float32)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    return Batch(ids, att, pos, loss, r_width, [len(c) for c in completions])


def pack_sequences(
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_id: int,
    row_tokens: int,
    completion_masks: list[list[int]] | None = None,
) -> Batch:
    """The padding-free layout of `pad_sequences`' batch: prompt + completion sequences back to back
    in rows of at most `row_tokens` tokens or the longest sequence, whichever is more (filled in
    order), `position_ids` restarting at 0 for each sequence, so attention never crosses sequences
    (transformers builds a block-diagonal causal mask from them when attention_mask is None and no
    KV cache is used: forward with use_cache=False). A row's unused tail is padding with positions
    of its own. Loss mask, completion width and results keep the padded [B, R] layout
    (`gather_index`)."""
    # the reference layout and its checks
    padded = pad_sequences(prompts, completions, pad_id, completion_masks)
    # rows are as wide as the longest sequence anyway (every row is padded to the widest), so fill
    # them that far
    row_tokens = max(row_tokens, max(len(p) + len(c) for p, c in zip(prompts, completions)))
    rows: list[list[int]] = [[]]
    for i, (p, c) in enumerate(zip(prompts, completions)):
        used = sum(len(prompts[j]) + len(completions[j]) for j in rows[-1])
        if rows[-1] and used + len(p) + len(c) > row_tokens:
            rows.append([])
        rows[-1].append(i)
    width = max(sum(len(prompts[j]) + len(completions[j]) for j in row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    r_width = padded.completion_width
    gather = torch.full((len(prompts), r_width), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        start = 0
        for j in row:
            seq = list(prompts[j]) + list(completions[j])
            ids[r, start : start + len(seq)] = torch.tensor(seq, dtype=torch.long)
            pos[r, start : start + len(seq)] = torch.arange(len(seq))
            # completion token t sits at start + len(prompt) + t; predicted one before
            n = len(completions[j])
            first = r * width + start + len(prompts[j]) - 1
            gather[j, r_width - n :] = torch.arange(first, first + n)
            start += len(seq)
        # the tail: a padding "sequence" nothing real attends to
        pos[r, start:] = torch.arange(width - start)
    return Batch(ids, None, pos, padded.loss_mask, r_width, padded.completion_lens, gather)


def unpad_completion(values: torch.Tensor, lens: list[int]) -> list[list[float]]:
    """Per-row lists from a [B, R] completion-region tensor (row i: its last lens[i] columns)."""
    r = values.shape[1]
    return [values[i, r - n :].tolist() if n else [] for i, n in enumerate(lens)]


def right_align(rows, width: int) -> torch.Tensor:
    """[B, width] float tensor with row i's values (a list or 1-D tensor) in its last len(rows[i])
    columns, zeros elsewhere: the layout of a completion region built by `pad_sequences`
    (completions end at the right)."""
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        if len(r) > width:
            raise ValueError(f"row {i} has {len(r)} values, wider than {width}")
        if len(r):
            out[i, width - len(r) :] = torch.as_tensor(r, dtype=torch.float32)
    return out
