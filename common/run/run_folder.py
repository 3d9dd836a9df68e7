"""What an output folder holds of a run, read without changing it: the names of a run's files, its
checkpoints and last logged step (`held`, `describe`), and its JSON records. The claim that decides
whether a run may write there: common/run/output_dir.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

# a run's files besides its checkpoints
LOGS = ("metrics.jsonl", "samples.jsonl", "args.json", "curves.png")
# the trained model the run leaves at its end (common/run/export.py), and its folder while written
EXPORT = "model"
# under LoRA with --lora_merged_export: the adapters folded into the base, a plain model
EXPORT_MERGED = "model-merged"
CHECKPOINT_DIR = re.compile(r"^(\.tmp-)?checkpoint-(\d+)$")
# args.json's key for the run's flag changes: [{"from_step": N, "changed": {flag: [old, new]}}]
RESUMES = "resumes"
SAME_RUN = (
    "output_dir",
    "resume_from_checkpoint",
    "overwrite_output_dir",
    "config",
    "accept_changed_flags",
    "discard_later_checkpoints",
)  # how a command reaches the run, not what it computes: not recorded


def held(folder: Path) -> tuple[list[str], int | None, list[str]]:
    """What `folder` holds of a run: its checkpoint dirs (by step), the last step in metrics.jsonl
    (None: no row) and its log files that are not empty."""
    if not folder.is_dir():
        return [], None, []
    dirs = sorted(
        (int(m.group(2)), p.name)
        for p in folder.iterdir()
        if p.is_dir() and (m := CHECKPOINT_DIR.match(p.name)) and not m.group(1)
    )
    logs = [
        name
        for name in LOGS[:2]
        if (folder / name).is_file() and (folder / name).stat().st_size > 0
    ]
    last = None
    if "metrics.jsonl" in logs:
        for line in (folder / "metrics.jsonl").read_text(errors="replace").splitlines():
            try:
                last = int(json.loads(line)["step"])
            # a cut or damaged row: the resume will say which
            except (ValueError, KeyError, TypeError):
                continue
    return [name for _, name in dirs], last, logs


def describe(folder: Path) -> str:
    """`metrics.jsonl to step 300, checkpoint-250, checkpoint-300`: what a used folder holds, for a
    refusal."""
    checkpoints, last, logs = held(folder)
    # samples.jsonl: only when alone
    parts = [f"metrics.jsonl to step {last}"] if last is not None else logs
    model = [f"{name}/" for name in (EXPORT, EXPORT_MERGED) if (folder / name).is_dir()]
    return ", ".join(parts + checkpoints + model)


def read_record(record: Path) -> dict:
    """A JSON record (`.run.json`, a checkpoint's `run.json`, `args.json`) as a dict; {} when it
    cannot be read."""
    try:
        content = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def checkpoint_step(name: str) -> int:
    """The step of a checkpoint folder's name (-1: not a checkpoint's)."""
    match = CHECKPOINT_DIR.match(name)
    return int(match.group(2)) if match else -1
