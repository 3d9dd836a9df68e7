"""The output folder holds one run. Before any model is loaded, `claim_output_dir` (every rank calls
it) holds the folder for this launch, refuses a fresh run into a folder that holds a run's files,
refuses a resume that would mix runs (another script's, another checkpoint shape, changed flags, a
checkpoint older than the folder's latest: common/run/resume_checks.py), clears a run with
`--overwrite_output_dir`, records which run now writes there, and checks that every process of the
launch sees the folder rank 0 writes in (common/run/shared_folder.py).

`<output_dir>/.run.lock` is held (an exclusive lock) by the launch writing there and records it;
`.run.json` holds the id of the run writing there (new for a fresh run, the checkpoint's for a
resume), its script, the settings that shape its checkpoints and its flags. Each checkpoint records
the same (common/run/checkpoint.py), so that rotation removes only the checkpoints of the run that
is writing and a resume knows what wrote it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from common.run.checkpoint import MARKER, resolve_resume
from common.run.folder_lock import defer_writes, hold, release

# a run's files besides its checkpoints
LOGS = ("metrics.jsonl", "samples.jsonl", "args.json", "curves.png")
# --report_to tensorboard's events: the folder named by --project (this its default)
TRACKER_DIR = "rlvr-sampling"
# the trained model the run leaves at its end (common/run/export.py), and its folder while written
EXPORT = "model"
# under LoRA with --lora_merged_export: the adapters folded into the base, a plain model
EXPORT_MERGED = "model-merged"
_EXPORT_DIRS = (EXPORT, EXPORT_MERGED, f".tmp-{EXPORT}")
_CHECKPOINT_DIR = re.compile(r"^(\.tmp-)?checkpoint-(\d+)$")
# args.json's key for the run's flag changes: [{"from_step": N, "changed": {flag: [old, new]}}]
RESUMES = "resumes"
# flags that shape a checkpoint's contents: never changed on resume
SHAPE = ("fsdp", "lora_r", "lora_target_modules")
SAME_RUN = (
    "output_dir",
    "resume_from_checkpoint",
    "overwrite_output_dir",
    "config",
    "accept_changed_flags",
    "discard_later_checkpoints",
)  # how a command reaches the run, not what it computes: not recorded


def claim_output_dir(args, accelerator, log=print, check_resume=None) -> None:
    """Every rank, after the Accelerator exists and before any model is loaded. Rank 0 holds the
    folder (`.run.lock`), decides whether the run may write there (`--resume_from_checkpoint`, whose
    checks `check_resume` makes: common/run/resume_checks.py's; `--overwrite_output_dir`), writes
    `.run.json` and `args.json`; then every rank checks that it reads rank 0's token from the same
    folder. A refusal stops every rank with one line and leaves every file of the folder as it
    was."""
    token, verdict = secrets.token_hex(8), None
    if accelerator.is_main_process:
        folder = Path(args.output_dir)
        existed = folder.exists()
        try:
            hold(folder, token, _script(args), log)
            verdict = _claim(args, accelerator.num_processes, log, check_resume)
        # e.g. --resume_from_checkpoint naming no checkpoint: every rank must stop, not only this
        # one
        except SystemExit as refusal:
            verdict = str(refusal)
        except OSError as error:
            verdict = f"--output_dir {args.output_dir}: cannot write there ({error})"
        if verdict:  # refused: the folder is left as it was found
            release(folder)
            if not existed and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
    if accelerator.num_processes == 1:
        if verdict:
            raise SystemExit(verdict)
        return
    from common.run.shared_folder import every_rank_sees

    every_rank_sees(args, accelerator, verdict, token)


def held(folder: Path) -> tuple[list[str], int | None, list[str]]:
    """What `folder` holds of a run: its checkpoint dirs (by step), the last step in metrics.jsonl
    (None: no row) and its log files that are not empty."""
    if not folder.is_dir():
        return [], None, []
    dirs = sorted(
        (int(m.group(2)), p.name)
        for p in folder.iterdir()
        if p.is_dir() and (m := _CHECKPOINT_DIR.match(p.name)) and not m.group(1)
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


def run_files(folder: Path, tracker_dir: str = TRACKER_DIR) -> list[Path]:
    """The run's files in `folder`: checkpoints (half-written ones too), logs, marker, tracker
    events (in `tracker_dir`, the run's --project) and the trained model (`model/`,
    `model-merged/`); a user's other files are not among them."""
    return [
        path
        for path in (sorted(folder.iterdir()) if folder.is_dir() else [])
        if (
            _CHECKPOINT_DIR.match(path.name)
            or path.name in (TRACKER_DIR, tracker_dir)
            or path.name in _EXPORT_DIRS
        )
        and (path.is_dir() or path.is_symlink())
        or path.name in (*LOGS, MARKER)
        and (path.is_file() or path.is_symlink())
    ]


def clear_run(folder: Path, tracker_dir: str = TRACKER_DIR) -> list[str]:
    """Remove a run's files from `folder` (`run_files`); other files stay. Everything is checked
    first: a link among them (or inside a checkpoint) stops with one line naming it and nothing is
    removed, since the run never writes links and removing through one would reach outside the
    folder. Returns the names removed."""
    doomed = run_files(folder, tracker_dir)
    check_removable(folder, doomed, "--overwrite_output_dir")
    for path in doomed:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    return [path.name for path in doomed if path.name != MARKER]


def check_removable(folder: Path, paths: list[Path], flag: str) -> None:
    """Stop with one line, before anything is removed, when one of `paths` is, or holds, a link, or
    when a folder they lie in is not writable."""
    links = [path for path in paths if path.is_symlink()]
    links += [
        inner
        for path in paths
        if path.is_dir() and not path.is_symlink()
        for inner in path.rglob("*")
        if inner.is_symlink()
    ]
    if links:
        raise SystemExit(
            f"{flag}: {links[0]} is a link, which this project never writes: nothing was removed "
            "from "
            f"{folder}; remove or replace the link{'s' if len(links) > 1 else ''} "
            f"({', '.join(str(link.relative_to(folder)) for link in links[:3])}) first"
        )
    parents = {folder} | {
        inner.parent for path in paths if path.is_dir() for inner in path.rglob("*")
    }
    locked = sorted(str(parent) for parent in parents if not os.access(parent, os.W_OK | os.X_OK))
    if locked:
        raise SystemExit(
            f"{flag}: no permission to remove files in {locked[0]}: nothing was removed from "
            f"{folder}"
        )


def _script(args) -> str:
    """The script whose `Args` these are (`ra_rloo`...), also when it runs as `__main__`."""
    module = sys.modules.get(type(args).__module__)
    return Path(getattr(module, "__file__", None) or type(args).__module__).stem


def _record(args, world_size: int) -> dict:
    """What `.run.json` (and each checkpoint's `run.json`) records of the run writing: the script,
    the settings that shape a checkpoint's contents, and every flag."""
    flags = json.loads(json.dumps(asdict(args)))
    return {
        "script": _script(args),
        "world_size": world_size,
        **{key: flags.get(key) for key in SHAPE},
        "args": flags,
    }


def _claim(args, world_size: int, log, check_resume) -> str | None:
    """Rank 0, holding the folder: the refusal line, or None after writing `.run.json` and
    `args.json` (a resume's only once its checkpoint has loaded)."""
    folder = Path(args.output_dir)
    used = bool(describe(folder))
    overwrite = getattr(args, "overwrite_output_dir", False)
    source = resolve_resume(args.resume_from_checkpoint, args.output_dir)  # None: a fresh run
    inside = source is not None and source.resolve().parent == folder.resolve()
    if (
        overwrite
        and args.resume_from_checkpoint
        and (args.resume_from_checkpoint == "auto" or inside)
    ):
        return (
            f"--overwrite_output_dir starts the run in {folder} over and --resume_from_checkpoint "
            f"{args.resume_from_checkpoint} continues it: "
            "drop one of the two flags"
        )
    mine, marker = _record(args, world_size), _read(folder / MARKER)
    if used and not overwrite and marker.get("script", mine["script"]) != mine["script"]:
        return (
            f"--output_dir {folder} holds a run of {marker['script']}.py ({describe(folder)}), not "
            "of "
            f"{mine['script']}.py: a run continues only with the script that started it; choose "
            "another "
            "--output_dir, or add --overwrite_output_dir to remove that run first"
        )
    history = []
    if source is not None:  # the resume's checks (common/run/resume_checks.py)
        refusal, this_run, history = check_resume(args, source, mine, used, log)
        if refusal:
            return refusal
    else:
        this_run = secrets.token_hex(8)  # a new run
        if args.resume_from_checkpoint == "auto" and used:
            log(
                f"--resume_from_checkpoint auto: {folder} holds no checkpoint yet "
                f"({describe(folder)}): the run starts over"
            )
        elif used and not overwrite:
            return (
                f"--output_dir {folder} holds a run ({describe(folder)}): add "
                "--resume_from_checkpoint auto to continue it, "
                "--overwrite_output_dir to start over (removes its checkpoints and logs), or "
                "choose another "
                "--output_dir"
            )
    if overwrite and used:
        # e.g. training on from the run's own trained model, in the same folder
        source_model = Path(args.model_name_or_path).resolve()
        for path in run_files(folder):
            if source_model == path.resolve() or path.resolve() in source_model.parents:
                return (
                    f"--overwrite_output_dir would remove --model_name_or_path "
                    f"{args.model_name_or_path} ({path.name} is a file of the run in {folder}): "
                    "copy it out of the folder first, or choose another --output_dir"
                )
        log(
            f"--overwrite_output_dir: removed the earlier run from {folder}: "
            f"{', '.join(clear_run(folder, getattr(args, 'project', TRACKER_DIR)))}"
        )
    records = {
        folder / MARKER: json.dumps({"run_id": this_run, **mine}),
        folder / "args.json": json.dumps(
            {**mine["args"], **({RESUMES: history} if history else {})}, indent=2
        ),
    }
    if source is None:
        for path, text in records.items():
            path.write_text(text)
    # written when the run starts logging, after its checkpoint loaded: a failed resume changes
    # neither
    else:
        defer_writes(
            folder, {path: text for path, text in records.items() if _read_text(path) != text}
        )
    return None


def _read(record: Path) -> dict:
    try:
        content = json.loads(record.read_text())
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def _step(name: str) -> int:
    match = _CHECKPOINT_DIR.match(name)
    return int(match.group(2)) if match else -1


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
