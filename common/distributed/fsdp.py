"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for `--fsdp`: each rank keeps 1/world of every
weight, gradient and AdamW state; a decoder layer's full weights exist only while that layer runs.
Called directly (not through accelerate, whose FSDP plugin is ignored on CPU), so the same code runs
on GPUs (NCCL) and CPU processes (gloo).

Every sharded forward all-gathers, so all ranks must run the same forwards in the same order. Two
rules keep that:
- `whole_weights` (the scripts' `common.distributed.ranks.gathered`): HF generation, whose number
  of forwards differs per rank (Ada's rounds, stop lengths), runs with the whole policy gathered
  once on entry (so does ra_rloo.py's seed scoring on the embedded demo task); nothing inside
  communicates.
- `sharded_micro_batches` (through `common.distributed.ranks.micro_batches`) gives every rank the
  same number of micro-batches, so the training forwards and gradient reduce-scatters line up, and
  so do no-grad scoring passes (pros_ppo.py's old log-probs, values and reference log-probs), which
  then gather one layer at a time.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from common.model.policy import DTYPES


def ensure_process_group(device: torch.device) -> None:
    """FSDP needs a process group; a single process (no launcher) gets a world of one."""
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            store=dist.HashStore(),
            rank=0,
            world_size=1,
        )


def shard(model: torch.nn.Module, compute_dtype: str = "float32") -> torch.nn.Module:
    """Shard `model` in place: one FSDP unit per decoder layer (the classes its transformers models
    list in `_no_split_modules`) and the root for the rest (embeddings, final norm, head). With bf16
    compute the layers are gathered in bf16 and gradients reduced in fp32 while the shards (master
    weights) stay fp32."""
    if hasattr(model, "get_base_model"):
        raise SystemExit(
            "--fsdp with --lora_r: sharding a LoRA (peft) policy is not supported; use one or the "
            "other"
        )
    ensure_process_group(next(model.parameters()).device)
    layer_classes = set()
    for module in model.modules():
        layer_classes |= set(getattr(module, "_no_split_modules", None) or [])
    layers = [module for module in model.modules() if type(module).__name__ in layer_classes]
    if not layers:
        raise SystemExit(
            f"--fsdp: found no decoder layers to shard in {type(model).__name__} "
            "(looked for the classes in its `_no_split_modules`)"
        )
    storage = next(model.parameters()).dtype
    mixed = (
        MixedPrecisionPolicy(param_dtype=DTYPES[compute_dtype], reduce_dtype=torch.float32)
        if compute_dtype != "float32" and storage == torch.float32
        else MixedPrecisionPolicy()
    )
    for layer in layers:
        fully_shard(layer, mp_policy=mixed)
    fully_shard(model, mp_policy=mixed, reshard_after_forward=reshards_after_forward(model, model))
    return model


def reshards_after_forward(unit, model) -> bool:
    """The reshard-after-forward setting `shard` gives `unit` of `model` (`whole_weights` restores
    it): a decoder layer frees its weights after each forward (gathered again in backward); the root
    (embeddings, final norm, head) of a trained model stays whole until its backward frees it
    (FSDP2's root default); a frozen model's root, which no backward frees, after each forward."""
    return unit is not model or not any(param.requires_grad for param in model.parameters())


@contextlib.contextmanager
def whole_weights(models: list):
    """Whole weights of the sharded `models` for the duration: one all-gather per unit on entry
    (every rank must enter), no communication inside, shards restored on exit."""
    units = [
        (unit, model)
        for model in models
        for unit in model.modules()
        if isinstance(unit, FSDPModule)
    ]
    for unit, _ in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit, model in units:
            unit.reshard()
            unit.set_reshard_after_forward(reshards_after_forward(unit, model), recurse=False)


def sharded_micro_batches(chunks: list[list[int]], accelerator, model, peers=()):
    """`micro_batches` for a wrapped model (FSDP, whose every forward all-gathers, or DDP, whose
    forwards broadcast buffers): all ranks run the largest rank's number of micro-batches (at least
    one), a rank with fewer making zero-weight passes (`dummy_pass`) through `model` and `peers`
    (the sharded models the loop body also runs, in that order); gradients are reduced once, in the
    last one. Every FSDP root is freed after its forward, except `model`'s in grad mode, kept whole
    until its backward: one model's root and one layer are whole at a time, and nothing stays
    gathered after the passes (a frozen peer's root included)."""
    sharded = isinstance(model, FSDPModule)
    # every rank sets its roots before its first pass, whatever path its rows take (none:
    # zero-weight passes only), so all ranks issue the same gathers in forward and backward
    roots = [net for net in (model, *peers) if isinstance(net, FSDPModule)]
    for root in roots:
        keep = root is model and torch.is_grad_enabled()
        root.set_reshard_after_forward(not keep, recurse=False)
    counts = torch.tensor([len(chunks)], device=accelerator.device)
    if accelerator.num_processes > 1:
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    total = max(1, int(counts.item()))
    for i in range(total):
        if sharded:
            model.set_requires_gradient_sync(i == total - 1)
        with contextlib.nullcontext() if sharded or i == total - 1 else accelerator.no_sync(model):
            if i < len(chunks):
                yield chunks[i]
            else:
                dummy_pass(model, peers)
    for root in roots:
        root.set_reshard_after_forward(reshards_after_forward(root, root), recurse=False)


def full_state_dict(model) -> dict:
    """The whole model's weights as CPU tensors on rank 0 (empty elsewhere); every rank must call
    it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def iter_full_weights(model):
    """(name, full tensor) one at a time on every rank (for the vLLM push: one layer's weights in
    memory at once); every rank must consume the whole iterator in the same order."""
    for name, value in model.state_dict().items():
        yield name, value.full_tensor() if isinstance(value, DTensor) else value


def load_full_state_dict(model, weights: dict) -> tuple[list[str], list[str]]:
    """Load whole (unsharded) weights into a sharded model on every rank; returns (missing,
    unexpected) keys."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    keys = set(model.state_dict())
    missing, unexpected = sorted(keys - set(weights)), sorted(set(weights) - keys)
    set_model_state_dict(
        model,
        {key: value for key, value in weights.items() if key in keys},
        options=StateDictOptions(full_state_dict=True, strict=False),
    )
    return missing, unexpected


def save_shards(model, optimizer, rank_state: dict | None, path, skip=()) -> dict:
    """Checkpoint under FSDP (every rank calls it): this rank's optimizer shard and `rank_state` to
    `path`; returns the whole weights without the `skip` keys (tied copies) on rank 0, an empty dict
    elsewhere."""
    # the collective first: a failed write below then stops this rank after every rank took part (no
    # hang)
    weights = {key: value for key, value in full_state_dict(model).items() if key not in skip}
    torch.save({"optimizer": local_optimizer_state(optimizer), **(rank_state or {})}, path)
    return weights


def load_shards(optimizer, shards: dict) -> dict:
    """Inverse of `save_shards` for the optimizer, given the file's content (read by
    `common.run.resume.safe_load`); returns the `rank_state` saved with it."""
    load_local_optimizer_state(optimizer, shards.pop("optimizer"))
    return shards


def local_optimizer_state(optimizer) -> dict:
    """This rank's share of the optimizer state (DTensor states as their local shards), for
    `optimizer_rank<r>.pt`."""
    state = optimizer.state_dict()
    state["state"] = {
        index: {
            name: value.to_local() if isinstance(value, DTensor) else value
            for name, value in entry.items()
        }
        for index, entry in state["state"].items()
    }
    return state


def load_local_optimizer_state(optimizer, state: dict) -> None:
    """Inverse of `local_optimizer_state` (same world size): each local shard is re-wrapped like its
    parameter."""
    params = [param for group in optimizer.param_groups for param in group["params"]]
    for index, entry in state["state"].items():
        param = params[int(index)]
        for name, value in entry.items():
            if isinstance(param, DTensor) and torch.is_tensor(value) and value.dim() > 0:
                entry[name] = DTensor.from_local(
                    value.to(param.device),
                    param.device_mesh,
                    param.placements,
                    shape=param.shape,
                    stride=param.stride(),
                )
    optimizer.load_state_dict(state)


def dummy_pass(model, peers=()) -> None:
    """A zero-weight forward + backward of one token through `model` (and a no-grad forward through
    each of `peers`, in the order the caller's micro-batch body runs them): a rank with no real
    micro-batch left joins its peers' all-gathers and gradient reduce-scatter without changing any
    gradient (under no_grad: forwards only)."""
    from common.rl.masking import pad_sequences

    device = next(model.parameters()).device
    batch = pad_sequences([[0]], [[0]], 0).to(device)

    def forward(module):
        # pros_ppo.py's critic (or its DDP)
        if getattr(getattr(module, "module", module), "config", None) is None:
            return module(batch)
        return module(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).logits

    output = forward(model)
    with torch.no_grad():
        for peer in peers:
            if peer is not None:
                forward(peer)
    if output.requires_grad:
        (output.float().sum() * 0.0).backward()
