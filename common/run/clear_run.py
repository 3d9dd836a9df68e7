"""A run's files removed from its output folder (`--overwrite_output_dir`; the later checkpoints a
resume discards: common/run/resume_checks.py), every one checked before the first goes. Loaded only
for one of them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from common.run.checkpoint import MARKER
from common.run.run_folder import CHECKPOINT_DIR, EXPORT, EXPORT_MERGED, LOGS

# --report_to tensorboard's events: the folder named by --project (this its default)
TRACKER_DIR = "rlvr-sampling"
# the trained model's folders, the one being written too
EXPORT_DIRS = (EXPORT, EXPORT_MERGED, f".tmp-{EXPORT}")


def overwrite_run(args, folder: Path, log) -> str | None:
    """--overwrite_output_dir in a folder that holds a run (rank 0, holding it): its files removed
    and named in one line; the refusal line, removing nothing, when --model_name_or_path is one of
    them."""
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
    return None


def run_files(folder: Path, tracker_dir: str = TRACKER_DIR) -> list[Path]:
    """The run's files in `folder`: checkpoints (half-written ones too), logs, marker, tracker
    events (in `tracker_dir`, the run's --project) and the trained model (`model/`,
    `model-merged/`); a user's other files are not among them."""
    return [
        path
        for path in (sorted(folder.iterdir()) if folder.is_dir() else [])
        if (
            CHECKPOINT_DIR.match(path.name)
            or path.name in (TRACKER_DIR, tracker_dir)
            or path.name in EXPORT_DIRS
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
