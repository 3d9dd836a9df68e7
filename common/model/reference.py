"""The KL reference model, a frozen copy of the initial policy (loaded only when --beta > 0)."""

from __future__ import annotations

import copy

import torch

from common.model.policy import DTYPES


def frozen_reference(policy: torch.nn.Module, dtype: str, fsdp: bool = False) -> torch.nn.Module:
    """The KL reference: a frozen copy of the initial `policy` that computes exactly as the policy
    does at step 0 (under the same autocast), so the KL before any update is 0. Stored in `dtype`
    only where the policy's forward rounds to it anyway: with `fsdp`, every parameter (FSDP's mixed
    precision gathers the policy's in `dtype`); without, the weights of linear layers (autocast
    casts them at each forward), while embeddings, norms and every buffer (e.g. rotary frequencies)
    stay fp32 as the policy keeps them."""
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if dtype == "float32":
        return reference
    if fsdp:
        params = list(reference.parameters())
    # a weight shared with another module (tied embeddings and head) is read outside autocast too:
    # kept fp32
    else:
        others = {
            id(param)
            for module in reference.modules()
            if not isinstance(module, torch.nn.Linear)
            for param in module.parameters(recurse=False)
        }
        params = [
            param
            for module in reference.modules()
            if isinstance(module, torch.nn.Linear)
            for param in module.parameters(recurse=False)
            if id(param) not in others
        ]
    for param in params:
        param.data = param.data.to(DTYPES[dtype])
    return reference
