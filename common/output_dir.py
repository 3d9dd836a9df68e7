"""The output folder holds one run. Before any model is loaded, `claim_output_dir` (every rank calls it) refuses a
fresh run into a folder that holds a run's files, clears that run with `--overwrite_output_dir`, records which run
now writes there, and checks that every process of the launch sees the folder rank 0 writes in (machines without a
shared folder would otherwise fail at the first checkpoint).

`<output_dir>/.run.json` holds the id of the run writing there (new for a fresh run, the checkpoint's for a resume)
and a random token per launch; each checkpoint records its run's id (common/checkpoint.py), so that rotation removes
only the checkpoints of the run that is writing.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import asdict
from pathlib import Path

from common.checkpoint import MARKER, resolve_resume, run_id
from common.distributed import stop_every_rank

LOGS = ("metrics.jsonl", "samples.jsonl", "args.json", "curves.png")  # a run's files besides its checkpoints
TRACKER_DIR = "rlvr-sampling"  # --report_to tensorboard's events (the project common.metrics.MetricsLogger names)
_CHECKPOINT_DIR = re.compile(r"^(\.tmp-)?checkpoint-(\d+)$")


def claim_output_dir(args, accelerator, log=print) -> None:
    """Every rank, after the Accelerator exists and before any model is loaded. Rank 0 decides whether the run may
    write in `args.output_dir` (`--resume`, `--overwrite_output_dir`), writes `.run.json` and `args.json`; then every
    rank checks that it reads rank 0's token from the same folder. A refusal stops every rank with one line."""
    token, verdict = secrets.token_hex(8), None
    if accelerator.is_main_process:
        try:
            verdict = _claim(args, token, log)
        except SystemExit as refusal:  # e.g. --resume naming no checkpoint: every rank must stop, not only this one
            verdict = str(refusal)
        except OSError as error:
            verdict = f"--output_dir {args.output_dir}: cannot write there ({error})"
    if accelerator.num_processes == 1:
        if verdict:
            raise SystemExit(verdict)
        return
    from accelerate.utils import broadcast_object_list, gather_object

    verdict, token = broadcast_object_list([verdict, token])  # after rank 0 wrote the marker: a barrier too
    if verdict:
        stop_every_rank(accelerator, verdict)
    seen = _sees(Path(args.output_dir), token)
    node = os.environ.get("GROUP_RANK", "?")  # the machine's rank (set by torchrun / accelerate launch)
    views = gather_object([(node, socket.gethostname(), seen)])
    blind = sorted({(node, host) for node, host, ok in views if not ok})
    if blind:
        names = ", ".join(f"node rank {node} (host {host})" for node, host in blind)
        stop_every_rank(accelerator, f"--output_dir {args.output_dir}: the machine with {names} does not see the "
                                     "folder rank 0 writes in; --output_dir must be a folder every machine shares (a "
                                     "network filesystem mounted at the same path, best given as an absolute path)")


def held(folder: Path) -> tuple[list[str], int | None, list[str]]:
    """What `folder` holds of a run: its checkpoint dirs (by step), the last step in metrics.jsonl (None: no row)
    and its log files that are not empty."""
    if not folder.is_dir():
        return [], None, []
    dirs = sorted((int(m.group(2)), p.name) for p in folder.iterdir() if p.is_dir()
                  and (m := _CHECKPOINT_DIR.match(p.name)) and not m.group(1))
    logs = [name for name in LOGS[:2] if (folder / name).is_file() and (folder / name).stat().st_size > 0]
    last = None
    if "metrics.jsonl" in logs:
        for line in (folder / "metrics.jsonl").read_text(errors="replace").splitlines():
            try:
                last = int(json.loads(line)["step"])
            except (ValueError, KeyError, TypeError):  # a cut or damaged row: the resume will say which
                continue
    return [name for _, name in dirs], last, logs


def describe(folder: Path) -> str:
    """`metrics.jsonl to step 300, checkpoint-250, checkpoint-300`: what a used folder holds, for a refusal."""
    checkpoints, last, logs = held(folder)
    parts = [f"metrics.jsonl to step {last}"] if last is not None else logs  # samples.jsonl: only when alone
    return ", ".join(parts + checkpoints)


def clear_run(folder: Path) -> list[str]:
    """Remove a run's files from `folder` (checkpoints, half-written ones, logs, marker, tracker events); other files
    stay. Returns the names removed."""
    removed = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.is_dir() and (_CHECKPOINT_DIR.match(path.name) or path.name == TRACKER_DIR):
            shutil.rmtree(path)
        elif path.is_file() and path.name in (*LOGS, MARKER):
            path.unlink()
        else:
            continue
        removed.append(path.name)
    return [name for name in removed if name != MARKER]


def _claim(args, token: str, log) -> str | None:
    """Rank 0: the refusal line, or None after writing `.run.json` and `args.json`."""
    folder = Path(args.output_dir)
    used = bool(describe(folder))
    overwrite = getattr(args, "overwrite_output_dir", False)
    source = resolve_resume(args.resume, args.output_dir)  # None: a fresh run
    inside = source is not None and source.resolve().parent == folder.resolve()
    if overwrite and args.resume and (args.resume == "auto" or inside):
        return (f"--overwrite_output_dir starts the run in {folder} over and --resume {args.resume} continues it: "
                "drop one of the two flags")
    if source is not None:
        this_run = run_id(source / "run.json")
        others = {run_id(folder / name / "run.json") for name in held(folder)[0]} - {this_run}
        if not inside and used and not overwrite and (others or not held(folder)[0]):
            return (f"--resume {args.resume} continues another run than the one in --output_dir {folder} "
                    f"({describe(folder)}): resume into an empty --output_dir, or add --overwrite_output_dir to "
                    "remove that run first")
    else:
        this_run = secrets.token_hex(8)  # a new run
        if args.resume == "auto" and used:
            log(f"--resume auto: {folder} holds no checkpoint yet ({describe(folder)}): the run starts over")
        elif used and not overwrite:
            return (f"--output_dir {folder} holds a run ({describe(folder)}): add --resume auto to continue it, "
                    "--overwrite_output_dir to start over (removes its checkpoints and logs), or choose another "
                    "--output_dir")
    if overwrite and used:
        log(f"--overwrite_output_dir: removed the earlier run from {folder}: {', '.join(clear_run(folder))}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text(json.dumps({"run_id": this_run, "launch": token}))
    (folder / "args.json").write_text(json.dumps(asdict(args), indent=2))
    return None


def _sees(folder: Path, token: str, wait_s: float = 2.0) -> bool:
    """Whether this process reads `token` in `folder`'s marker (read again for `wait_s`: an NFS may lag)."""
    deadline = time.time() + wait_s
    while True:
        try:
            if json.loads((folder / MARKER).read_text()).get("launch") == token:
                return True
        except (OSError, ValueError, AttributeError):
            pass
        if time.time() > deadline:
            return False
        time.sleep(0.2)
