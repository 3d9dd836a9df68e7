"""An --output_dir that already holds a run's files, or a --resume_from_checkpoint: a fresh run is
refused (or the folder cleared with --overwrite_output_dir: common/run/clear_run.py), and a resume
that would mix runs (another script's, another checkpoint shape, changed flags, a checkpoint older
than the folder's latest: common/run/resume_checks.py). Loaded only for one of them, by
common/run/output_dir.py `claim_output_dir`."""

from __future__ import annotations

from pathlib import Path

from common.run.checkpoint import MARKER, resolve_resume
from common.run.run_folder import describe, read_record


def claim_used(args, folder: Path, mine: dict, this_run: str, log) -> tuple[str, list, bool]:
    """Rank 0, holding `folder`: (the id of the run that writes there, its history of flag
    changes, whether it resumes), or SystemExit with the refusal line. `mine`: what `.run.json`
    records of this launch; `this_run`: a new run's id."""
    used = bool(describe(folder))
    overwrite = getattr(args, "overwrite_output_dir", False)
    source = resolve_resume(args.resume_from_checkpoint, args.output_dir)  # None: a fresh run
    inside = source is not None and source.resolve().parent == folder.resolve()
    if (
        overwrite
        and args.resume_from_checkpoint
        and (args.resume_from_checkpoint == "auto" or inside)
    ):
        raise SystemExit(
            f"--overwrite_output_dir starts the run in {folder} over and --resume_from_checkpoint "
            f"{args.resume_from_checkpoint} continues it: drop one of the two flags"
        )
    marker = read_record(folder / MARKER)
    if used and not overwrite and marker.get("script", mine["script"]) != mine["script"]:
        raise SystemExit(
            f"--output_dir {folder} holds a run of {marker['script']}.py ({describe(folder)}), not "
            f"of {mine['script']}.py: a run continues only with the script that started it; choose "
            "another --output_dir, or add --overwrite_output_dir to remove that run first"
        )
    history = []
    if source is not None:  # the resume's checks (common/run/resume_checks.py)
        from common.run.resume_checks import check_resume

        refusal, this_run, history = check_resume(args, source, mine, used, log)
        if refusal:
            raise SystemExit(refusal)
    elif args.resume_from_checkpoint == "auto" and used:
        log(
            f"--resume_from_checkpoint auto: {folder} holds no checkpoint yet "
            f"({describe(folder)}): the run starts over"
        )
    elif used and not overwrite:
        raise SystemExit(
            f"--output_dir {folder} holds a run ({describe(folder)}): add "
            "--resume_from_checkpoint auto to continue it, "
            "--overwrite_output_dir to start over (removes its checkpoints and logs), or "
            "choose another --output_dir"
        )
    if overwrite and used:  # common/run/clear_run.py
        from common.run.clear_run import overwrite_run

        refusal = overwrite_run(args, folder, log)
        if refusal:
            raise SystemExit(refusal)
    return this_run, history, source is not None
