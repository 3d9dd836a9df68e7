"""The critic for PPO: a transformers backbone with a scalar head (its loss and update are in pros_ppo.py).

`build_value_model` initialises the critic from the policy (a deep copy of its backbone, the LM head dropped)
plus a zero-initialised linear head, so V ≡ 0 at the start and the backbone starts from features that already
read the task. On a real model this doubles the parameter memory; `path` loads a separate (smaller) backbone
instead (it must share the policy's tokenizer).

Values line up with `token_logprobs`: column j of the [B, R] output is V(s_t) for the state that predicts
completion token j (the hidden state one position earlier), so V[:, j] and log p[:, j] refer to the same action.
"""
from __future__ import annotations

import copy

import torch

from common.masking import Batch


class ValueModel(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        # skip_init: no draw from the global RNG (resume must replay the same random stream), then V ≡ 0
        self.head = torch.nn.utils.skip_init(torch.nn.Linear, hidden_size, 1, dtype=next(backbone.parameters()).dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, batch: Batch) -> torch.Tensor:
        """[B, R] values of the states before each completion-region token (float32)."""
        r = batch.completion_width
        h = self.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                          position_ids=batch.position_ids, use_cache=False).last_hidden_state
        return self.head(h[:, -(r + 1):-1]).squeeze(-1).float()


def build_value_model(policy, path: str | None = None) -> ValueModel:
    """Critic = copy of the policy's backbone (or the backbone of `path`) + zero-initialised scalar head."""
    if path:
        from transformers import AutoModel

        try:
            with torch.random.fork_rng(devices=[]):  # loading must not consume the global RNG (exact resume)
                backbone = AutoModel.from_pretrained(path, dtype=next(policy.parameters()).dtype)
        except OSError as e:
            raise SystemExit(f"--critic_model_name_or_path {path!r}: cannot load ({e})")
        if backbone.config.vocab_size != policy.config.vocab_size:
            raise SystemExit(f"--critic_model_name_or_path {path!r}: vocab size {backbone.config.vocab_size} "
                             f"differs from the policy's {policy.config.vocab_size} (the critic reads policy tokens)")
    else:
        backbone = copy.deepcopy(policy.base_model)
    for p in backbone.parameters():
        p.requires_grad_(True)
    backbone.train()
    return ValueModel(backbone, backbone.config.hidden_size)
