"""A collective that timed out or lost a peer, told in one line naming the rank, the step and the
phase (common/run/process.py's exit hook loads it only then, in a run of several processes)."""

from __future__ import annotations

import linecache
import os
import sys
from pathlib import Path

import torch


def exit_if_collective_error(error: BaseException, trace, seconds: int, release) -> None:
    """For a collective that failed: its line, `release()` (the output folder given back) and exit
    status 1 at once (the teardown would hang on the group); any other error returns."""
    if not is_collective_error(error):
        return
    # the process's own stderr: torch.distributed's hook, installed over this one, swaps
    # sys.stderr for a buffer printed only after this hook returns, and it does not return
    print(timeout_line(error, trace, seconds), file=sys.__stderr__, flush=True)
    sys.stdout.flush()
    release()
    os._exit(1)


def is_collective_error(error: BaseException) -> bool:
    """A collective that timed out, or whose peer left (gloo, NCCL's blocking wait, the store)."""
    if isinstance(error, torch.distributed.DistError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        mark in text
        for mark in (
            "Timed out",
            "timed out",
            "Connection closed by peer",
            "Connection reset by peer",
            "gloo",
            "NCCL",
            "Broken pipe",
        )
    )


def timeout_line(error: BaseException, trace, seconds: int) -> str:
    """One line for a collective that failed: the rank, the step (the `step` of the method script's
    main, or set-up before its loop), the phase (the script's line that was running, with its
    source, and the innermost line of this project's code that was waiting) and what to do."""
    root, step, lines = Path(__file__).resolve().parents[2], None, []
    while trace is not None:
        frame, path = trace.tb_frame, Path(trace.tb_frame.f_code.co_filename).resolve()
        if path.is_relative_to(root) and path.parent.name != "tests":
            source = linecache.getline(str(path), trace.tb_lineno).strip()
            lines.append(f"{path.relative_to(root)}:{trace.tb_lineno} `{source[:60]}`")
            if frame.f_code.co_name == "main" and "step" in frame.f_locals:
                step, lines = frame.f_locals["step"], lines[-1:]
        trace = trace.tb_next
    where = lines[0] + (f", waiting in {lines[-1]}" if len(lines) > 1 else "") if lines else "?"
    return (
        f"rank {os.environ.get('RANK', '0')}: step {step if step is not None else '(set-up)'}, "
        f"phase {where}: a "
        f"collective waited longer than --collective_timeout {seconds} s or a peer process left "
        f"({type(error).__name__}); stopping. Another rank is stalled or gone; the last checkpoint "
        "is whole: "
        "continue with --resume_from_checkpoint auto"
    )
