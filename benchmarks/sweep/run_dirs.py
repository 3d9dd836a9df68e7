"""A sweep run's folder: its metrics rows, its state against the command that would run it (new, done, resume,
restart, conflict, stale), compacting a finished run, the machine it ran on, and the lock around a run."""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
from pathlib import Path
from typing import Optional


def read_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows; a torn last line (a run killed mid-write) is ignored."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def is_finished(rows: list[dict], max_steps: int) -> bool:
    """Finished = the final step's row is there and carries the final evaluation."""
    return any(r.get("step") == max_steps and r.get("eval_pass@1") is not None for r in rows)


def has_checkpoint(run_dir: Path) -> bool:
    return any((p / "trainer_state.pt").exists() for p in Path(run_dir).glob("checkpoint-*"))


def testbed_id(model_name_or_path: str) -> str:
    """What a run trains: the embedded base's cache name (it hashes the base recipe and the task's levels, so a
    changed testbed gets a new name), or the model given."""
    if model_name_or_path != "embedded":
        return model_name_or_path
    from common.demo.tiny_model import BaseRecipe  # imports torch: only here

    return f"countdown-base-{BaseRecipe().key()}"


def run_state(run_dir: Path, cmd: list[str], max_steps: int, testbed: Optional[str] = None) -> str:
    """new | done | resume | restart | conflict | stale.

    resume: unfinished with a checkpoint; restart: unfinished without one (`--resume_from_checkpoint auto` then starts
    fresh); conflict: the directory holds a run of a different command (changed flags or budget), which
    is neither skipped nor overwritten; stale: a run of the same command on another testbed (`testbed`, see
    `testbed_id`; runs recorded without one count as another), likewise left alone.
    """
    run_dir = Path(run_dir)
    meta_path = run_dir / "bench.json"
    rows = read_rows(run_dir)
    if not meta_path.exists():
        return "new" if not rows and not has_checkpoint(run_dir) else "conflict"
    meta = json.loads(meta_path.read_text())
    if meta.get("cmd") != cmd:
        return "conflict"
    if testbed is not None and meta.get("testbed") != testbed:
        return "stale"
    if is_finished(rows, max_steps):
        return "done"
    return (
        "resume"
        if has_checkpoint(run_dir)
        else ("restart" if rows or meta.get("attempts") else "new")
    )


def conflict_diff(run_dir: Path, cmd: list[str]) -> str:
    path = Path(run_dir) / "bench.json"
    if not path.exists():
        return "the directory holds files but no bench.json (not written by this runner)"
    old = json.loads(path.read_text()).get("cmd", [])
    a, b = " ".join(old), " ".join(cmd)
    return f"recorded: {a}\n        wanted:   {b}" if a != b else ""


def clean_checkpoints(run_dir: Path) -> None:
    for p in list(Path(run_dir).glob("checkpoint-*")) + list(
        Path(run_dir).glob(".tmp-checkpoint-*")
    ):
        shutil.rmtree(p, ignore_errors=True)


LOG_KEEP_LINES = (
    200  # a finished run's log.txt keeps its tail (the final evaluation, timings, any warning)
)


def compact_run(run_dir: Path, keep_checkpoints: bool = False) -> None:
    """Shrink a finished run to what the report and the skip check read (metrics.jsonl, args.json, bench.json)
    plus a short log: checkpoints and samples.jsonl go unless `keep_checkpoints`."""
    run_dir = Path(run_dir)
    if not keep_checkpoints:
        clean_checkpoints(run_dir)
        (run_dir / "samples.jsonl").unlink(missing_ok=True)
    log = run_dir / "log.txt"
    if log.exists():
        lines = log.read_text(errors="replace").splitlines(keepends=True)
        if (
            len(lines) > LOG_KEEP_LINES + 1
        ):  # + 1: the note of an earlier cut (compacting twice changes nothing)
            cut = len(lines) - LOG_KEEP_LINES
            log.write_text(
                f"[{cut} earlier lines cut by benchmarks/sweep/run.py]\n" + "".join(lines[cut:])
            )


def machine_info() -> dict:
    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        info["torch"] = version("torch")
        info["transformers"] = version("transformers")
    except Exception:  # noqa: BLE001 (informational only)
        pass
    return info


class FileLock:
    """flock on a file around one run; prints when it has to wait."""

    def __init__(self, path: str):
        self.path, self.fd = path, None

    def __enter__(self):
        if not self.path:
            return self
        self.fd = open(self.path, "a")
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"    waiting for the lock {self.path} ...", flush=True)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.fd.close()
            self.fd = None
