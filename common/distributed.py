"""Multi-process helpers: this rank's share of a batch, sums and lists over ranks, micro-batches whose gradient
all-reduce happens once, whole weights of FSDP-sharded models for generation, and a graceful stop on SIGINT /
SIGTERM that every rank agrees on, and an end of the process group that exits cleanly."""
from __future__ import annotations

import contextlib
import signal
import sys
import time

import torch
from torch.distributed.fsdp import FSDPModule


def my_slice(items: list, accelerator) -> list:
    """This rank's contiguous share of a global list (shares differ by at most one item)."""
    num, world, rank = len(items), accelerator.num_processes, accelerator.process_index
    return items[rank * num // world:(rank + 1) * num // world]


def reduce_sums(accelerator, sums: dict[str, float]) -> dict[str, float]:
    """Sum named scalars over ranks (every rank passes the same keys in the same order)."""
    if accelerator.num_processes == 1:
        return {key: float(value) for key, value in sums.items()}
    keys = list(sums)
    packed = torch.tensor([float(sums[key]) for key in keys], dtype=torch.float64, device=accelerator.device)
    return dict(zip(keys, accelerator.reduce(packed, reduction="sum").tolist()))


def gather_list(accelerator, items: list) -> list:
    """Every rank's list, concatenated in rank order (the same result on every rank)."""
    if accelerator.num_processes == 1:
        return list(items)
    from accelerate.utils import gather_object

    return gather_object(list(items))


def first_failure(accelerator, failed: list[str]) -> str | None:
    """Every rank: None when no rank failed, else the first failing rank's first reason (the same on every rank)."""
    # a float all-reduce first: gather_list pickles into tensors that reference Python memory, and gloo may free
    # those in its own thread while the run destroys its process group (a deadlock on the GIL); gather only to stop
    if not reduce_sums(accelerator, {"failed": float(len(failed))})["failed"]:
        return None
    return gather_list(accelerator, [str(reason).strip().splitlines()[0] for reason in failed])[0]


def stop_every_rank(accelerator, message: str) -> None:
    """Stop the run on every rank (each calls this) with `message`: printed once per machine, by its first process,
    before any rank exits (a launcher ends the other processes as soon as one exits); the process group ends, then
    exit status 1."""
    if accelerator.num_processes == 1:
        raise SystemExit(message)
    if accelerator.is_local_main_process:
        print(message, file=sys.stderr, flush=True)
    accelerator.wait_for_everyone()
    end_processes(accelerator)  # a gloo group alive at exit aborts its process (SIGABRT)
    raise SystemExit(1)


def token_budget_cuts(lengths: list[int], max_tokens: int) -> list[int]:
    """Start rows of consecutive micro-batches of at most `max_tokens` tokens (a longer row goes alone)."""
    starts, used = [], max_tokens + 1
    for i, length in enumerate(lengths):
        if used + length > max_tokens:
            starts.append(i)
            used = 0
        used += length
    return starts


def micro_batches(num_rows: int, size: int, accelerator, model, peers=(), lengths: list[int] | None = None,
                  max_tokens: int = 0):
    """Yield the row indices of each micro-batch (`size` rows, or with `max_tokens` > 0 as many rows as fit that many
    of their `lengths` tokens); the loop body runs the forward and `backward`. Under DDP the all-reduce is skipped
    (`no_sync`) on all but the last, so gradients are summed locally and synced once. With no rows nothing is
    yielded and a zero loss is back-propagated here, so the rank still joins that all-reduce (the optimizer then
    steps on zero gradients, as on every rank: Adam's momentum carries on). Under `--fsdp` every rank runs the same
    number of micro-batches (`common.fsdp.sharded_micro_batches`; `peers`: the sharded frozen models the body also
    runs, e.g. the reference), also under no_grad (scoring: no backward, the layers gathered one at a time)."""
    starts = token_budget_cuts(lengths, max_tokens) if max_tokens > 0 else list(range(0, num_rows, size))
    chunks = [list(range(start, end)) for start, end in zip(starts, starts[1:] + [num_rows])]
    if isinstance(model, FSDPModule):
        from common.fsdp import sharded_micro_batches

        yield from sharded_micro_batches(chunks, accelerator, model, peers)
        return
    if not chunks:
        if torch.is_grad_enabled():  # (no-grad scoring has no all-reduce to join)
            accelerator.backward(sum(p.sum() * 0.0 for p in model.parameters() if p.requires_grad))
        return
    for i, rows in enumerate(chunks):
        last = i == len(chunks) - 1
        sync = contextlib.nullcontext() if last or accelerator.num_processes == 1 else accelerator.no_sync(model)
        with sync:
            yield rows


def gathered(*models, enabled: bool = True):
    """Context: whole weights of the FSDP-sharded `models` inside the block (HF generation, the demo's seed scoring:
    see common/fsdp.py); a no-op for unsharded models and None, and with `enabled=False`: the scripts pass
    `enabled=generator.reads_policy` around generation, since a vLLM engine samples from its own pushed copy and
    gathering would only put the whole policy next to vLLM's weights and KV cache on every rank."""
    sharded = [model for model in models if isinstance(model, FSDPModule)] if enabled else []
    if not sharded:
        return contextlib.nullcontext()
    from common.fsdp import whole_weights

    return whole_weights(sharded)


class GracefulStop:
    """First Ctrl-C / SIGTERM: finish the current step, then stop (the script saves a checkpoint, and its process
    exits with `exit_status()`: 128 + the signal's number, as a shell reports a process the signal ended).
    A second signal raises KeyboardInterrupt at once."""

    received: list[int] = []
    """every signal any GracefulStop of this process took: a program that runs a script's main() in its own process
    learns from it that a stop was asked for while the script held the signals"""
    stopped = 0
    """the exit status of a run that a signal stopped (0: none did), for the script's process"""

    def __init__(self, log=print):
        self.requested = False
        GracefulStop.stopped = 0
        self.log = log
        self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def close(self) -> None:
        """Give the signals back to their previous handlers (a script's main() may run inside another program)."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        GracefulStop.received.append(signum)
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.log(f"\nsignal {signum}: saving a checkpoint after this step, then stopping (again to abort)")

    def agreed(self, accelerator) -> bool:
        """True on every rank when any rank was signalled (all must stop together, or a collective hangs)."""
        if reduce_sums(accelerator, {"stop": float(self.requested)})["stop"] == 0:
            return False
        # this rank's signal, or (another rank was signalled) the scheduler's usual one
        GracefulStop.stopped = 128 + (GracefulStop.received[-1] if self.requested else signal.SIGTERM)
        return True

    @staticmethod
    def exit_status() -> int:
        """0 for a finished run, 128 + the signal's number (130 SIGINT, 143 SIGTERM) for one a signal stopped."""
        return GracefulStop.stopped


def end_processes(accelerator, settle_s: float = 0.2) -> None:
    """Finish the trackers, destroy the process group and give back the output folder, at the end of a run.

    The group is destroyed here, not at interpreter exit (a gloo group alive at exit can abort the process). Its last
    reference may go later, with the DDP/FSDP model, and that destructor joins gloo's worker threads while holding
    the GIL. A worker still dropping its last collective's tensors needs the GIL for that (torch keeps a tensor's
    Python object alive while C++ holds the tensor), so the join would wait forever: a hang after the run's last
    line. Sleeping `settle_s` first releases the GIL so every worker finishes; no collective starts after it."""
    from common.folder_lock import release_all

    if accelerator.num_processes > 1:
        time.sleep(settle_s)
    accelerator.end_training()
    release_all()
