"""Multi-process helpers: this rank's share of a batch, sums and lists over ranks, micro-batches
every rank joins whatever its share, whole weights of FSDP-sharded models for generation, and an
end of the process group that exits cleanly."""

from __future__ import annotations

import contextlib
import sys
import time

import torch
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel


def my_indices(num: int, accelerator) -> list[int]:
    """The positions of this rank's share of a global list of `num` items: every world-th one from
    its rank on (shares differ by at most one item). Strided, not contiguous: a batch that puts one
    kind of row first (prefix tasks, stream queries) gives every rank its part of each kind, as one
    process would see them."""
    return list(range(accelerator.process_index, num, accelerator.num_processes))


def my_slice(items, accelerator) -> list:
    """This rank's share of a global list (`my_indices`)."""
    return [items[i] for i in my_indices(len(items), accelerator)]


def rank_mean(accelerator, value: float) -> float:
    """The mean over ranks of a per-rank count (its global sum / the number of ranks). DDP and FSDP
    average the ranks' gradients, so a rank's loss sum divided by this is, after that average, the
    global sum over the global count: the same objective on any number of processes, whatever each
    rank's share of rows (zero included)."""
    return reduce_sums(accelerator, {"value": value})["value"] / accelerator.num_processes


def reduce_sums(accelerator, sums: dict[str, float]) -> dict[str, float]:
    """Sum named scalars over ranks (every rank passes the same keys in the same order)."""
    if accelerator.num_processes == 1:
        return {key: float(value) for key, value in sums.items()}
    keys = list(sums)
    packed = torch.tensor(
        [float(sums[key]) for key in keys], dtype=torch.float64, device=accelerator.device
    )
    return dict(zip(keys, accelerator.reduce(packed, reduction="sum").tolist()))


def gather_list(accelerator, items: list) -> list:
    """Every rank's list, concatenated in rank order (the same result on every rank)."""
    if accelerator.num_processes == 1:
        return list(items)
    from accelerate.utils import gather_object

    return gather_object(list(items))


def first_failure(accelerator, failed: list[str]) -> str | None:
    """Every rank: None when no rank failed, else the first failing rank's first reason (the same on
    every rank)."""
    # a float all-reduce first: gather_list pickles into tensors that reference Python memory, and
    # gloo may free those in its own thread while the run destroys its process group (a deadlock on
    # the GIL); gather only to stop
    if not reduce_sums(accelerator, {"failed": float(len(failed))})["failed"]:
        return None
    return gather_list(accelerator, [str(reason).strip().splitlines()[0] for reason in failed])[0]


def stop_every_rank(accelerator, message: str) -> None:
    """Stop the run on every rank (each calls this) with `message`: printed once per machine, by its
    first process, before any rank exits (a launcher ends the other processes as soon as one exits);
    the process group ends, then exit status 1."""
    if accelerator.num_processes == 1:
        raise SystemExit(message)
    if accelerator.is_local_main_process:
        print(message, file=sys.stderr, flush=True)
    accelerator.wait_for_everyone()
    end_process_group(accelerator)  # a gloo group alive at exit aborts its process (SIGABRT)
    raise SystemExit(1)


def token_budget_cuts(lengths: list[int], max_tokens: int) -> list[int]:
    """Start rows of consecutive micro-batches of at most `max_tokens` tokens (a longer row goes
    alone)."""
    starts, used = [], max_tokens + 1
    for i, length in enumerate(lengths):
        if used + length > max_tokens:
            starts.append(i)
            used = 0
        used += length
    return starts


def micro_batches(
    num_rows: int,
    size: int,
    accelerator,
    model,
    peers=(),
    lengths: list[int] | None = None,
    max_tokens: int = 0,
):
    """Yield the row indices of each micro-batch (`size` rows, or with `max_tokens` > 0 as many rows
    as fit that many of their `lengths` tokens); the loop body runs the forward and `backward`.
    A wrapped model (DDP or `--fsdp`) communicates in its forwards and backward, so every rank runs
    the largest rank's number of micro-batches (at least one), the missing ones as zero-weight
    passes through `model` and `peers` (the sharded frozen models the body also runs: FSDP only;
    common/distributed/fsdp.py `sharded_micro_batches`), gradients synced once. An unwrapped model
    runs only its own micro-batches; with none, a zero loss is back-propagated here (grad mode), so
    the optimizer steps on zero gradients as every rank of several processes does then."""
    starts = (
        token_budget_cuts(lengths, max_tokens) if max_tokens > 0 else list(range(0, num_rows, size))
    )
    chunks = [list(range(start, end)) for start, end in zip(starts, starts[1:] + [num_rows])]
    if isinstance(model, FSDPModule) or (
        accelerator.num_processes > 1 and isinstance(model, DistributedDataParallel)
    ):
        from common.distributed.fsdp import sharded_micro_batches

        # Joining by zero-weight passes rather than DDP's join(): one mechanism for DDP and FSDP
        # (whose forwards all-gather, which join() does not shadow), every collective runs as usual,
        # and a pass costs one token.
        yield from sharded_micro_batches(
            chunks, accelerator, model, peers if isinstance(model, FSDPModule) else ()
        )
        return
    # zero gradients: the optimizer steps as a rank of several would
    if not chunks and torch.is_grad_enabled():
        accelerator.backward(sum(p.sum() * 0.0 for p in model.parameters() if p.requires_grad))
    yield from chunks


def gathered(*models, enabled: bool = True):
    """Context: whole weights of the FSDP-sharded `models` inside the block (HF generation:
    common/distributed/fsdp.py); a no-op for unsharded models, None, and `enabled=False` (the
    scripts pass `generator.reads_policy`: a vLLM engine samples from its own pushed copy)."""
    sharded = [model for model in models if isinstance(model, FSDPModule)] if enabled else []
    if not sharded:
        return contextlib.nullcontext()
    from common.distributed.fsdp import whole_weights

    return whole_weights(sharded)


def end_process_group(accelerator, settle_s: float = 0.2) -> None:
    """Finish the trackers and destroy the process group (a gloo group alive at exit can abort the
    process). Sleeping `settle_s` first releases the GIL so that gloo's workers drop their last
    collective's tensors: the group's destructor joins them holding the GIL, a hang otherwise."""
    if accelerator.num_processes > 1:
        time.sleep(settle_s)
    accelerator.end_training()
