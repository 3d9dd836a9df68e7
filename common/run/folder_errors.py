"""The lines a run reports when it cannot write in its output folder (a full disk, no permission,
another launch holding it) or finds a launch that died holding it; loaded only then."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from common.distributed.ranks import stop_every_rank


def held_elsewhere(folder: Path, record: bytes) -> str:
    """`folder` is held by another live launch, whose lock file holds `record`."""
    return (
        f"--output_dir {folder}: another launch writes there ({_holder(record)}); wait for it to "
        "end, stop it, or choose another --output_dir"
    )


def taken_over(folder: Path, record: bytes) -> str:
    """`folder`'s lock file was left by a launch that died (its lock died with its process)."""
    return (
        f"--output_dir {folder}: the launch that held it ({_holder(record)}) ended without "
        "releasing it (killed, or its machine went down); this launch takes the folder over"
    )


def no_longer_held(folder: Path, lock: Path, now: bytes) -> str:
    """`folder`'s lock file `lock` is no longer the one this launch locked (`now`: what it holds
    now)."""
    holder = f"now held by {_holder(now)}" if now.strip() else f"its {lock.name} was removed"
    return (
        f"--output_dir {folder}: this launch no longer holds it ({holder}); the run stops before "
        "removing anything there"
    )


def _holder(raw: bytes) -> str:
    try:
        record = json.loads(raw)
        host, since = record["host"], record["since"]
        return f"{record['script']}, process {record['pid']} on {host}, since {since}"
    except (ValueError, KeyError, TypeError):
        return "an unreadable lock record"


def stop_checkpoint(accelerator, reason: str, tmp: Path, step: int, found: list[Path]) -> None:
    """Every rank: the partial checkpoint `tmp` removed, every rank stopped with one line naming
    the folder, the error and the checkpoint a resume starts from (the last of `found`)."""
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        room = f" ({shutil.disk_usage(tmp.parent).free / 2**20:,.0f} MiB free there)"
    except OSError:
        room = ""
    stop_every_rank(
        accelerator,
        f"checkpoint-{step}: could not write it in {tmp.parent}: {reason}{room}; the run "
        f"stops here. "
        + (
            f"{found[-1].name} is whole: make room (or fix the folder's "
            "permissions), then continue with --resume_from_checkpoint auto"
            if found
            else "There is no earlier checkpoint: fix the folder, then start the run again"
        ),
    )


def row_not_written(path: Path, error: OSError) -> str:
    """A log row that could not be appended to `path` (common/run/logs.py `append_rows`)."""
    return (
        f"{path}: could not append a row ({error}); the run stops here: make room (or fix the "
        "folder's permissions), then continue from its last checkpoint with "
        "--resume_from_checkpoint auto"
    )


def logs_not_written(output_dir, error: OSError) -> str:
    """A log file in `output_dir` that could not be written (common/run/logs.py)."""
    return (
        f"--output_dir {output_dir}: could not write its logs ({error}); the run stops "
        "here: make room (or fix the folder's permissions), then run the same command again"
    )
