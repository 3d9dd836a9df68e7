"""The output folder holds one run. Before any model is loaded, `claim_output_dir` (every rank calls
it) holds the folder for this launch, refuses a fresh run into a folder that holds a run's files,
refuses a resume that would mix runs (another script's, another checkpoint shape, changed flags, a
checkpoint older than the folder's latest: common/run/resume_checks.py), clears a run with
`--overwrite_output_dir` (common/run/clear_run.py), records which run now writes there, and checks
that every process of the launch sees the folder rank 0 writes in (common/run/shared_folder.py).

`<output_dir>/.run.lock` is held (an exclusive lock) by the launch writing there and records it;
`.run.json` holds the id of the run writing there (new for a fresh run, the checkpoint's for a
resume), its script, the settings that shape its checkpoints and its flags. Each checkpoint records
the same (common/run/checkpoint.py), so that rotation removes only the checkpoints of the run that
is writing and a resume knows what wrote it.
"""

from __future__ import annotations

import json
import secrets
import sys
from dataclasses import asdict
from pathlib import Path

from common.run.checkpoint import MARKER, resolve_resume
from common.run.folder_lock import defer_writes, hold, release
from common.run.run_folder import RESUMES, describe, read_record

# flags that shape a checkpoint's contents: never changed on resume
SHAPE = ("fsdp", "lora_r", "lora_target_modules")


def claim_output_dir(args, accelerator, log=print) -> None:
    """Every rank, after the Accelerator exists and before any model is loaded. Rank 0 holds the
    folder (`.run.lock`), decides whether the run may write there (`--resume_from_checkpoint`,
    `--overwrite_output_dir`), writes `.run.json` and `args.json`; then every rank checks that it
    reads rank 0's token from the same folder. A refusal stops every rank with one line and leaves
    every file of the folder as it was."""
    token, verdict = secrets.token_hex(8), None
    if accelerator.is_main_process:
        folder = Path(args.output_dir)
        existed = folder.exists()
        try:
            hold(folder, token, _script(args), log)
            verdict = _claim(args, accelerator.num_processes, log)
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


def _claim(args, world_size: int, log) -> str | None:
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
            f"{args.resume_from_checkpoint} continues it: drop one of the two flags"
        )
    mine, marker = _record(args, world_size), read_record(folder / MARKER)
    if used and not overwrite and marker.get("script", mine["script"]) != mine["script"]:
        return (
            f"--output_dir {folder} holds a run of {marker['script']}.py ({describe(folder)}), not "
            f"of {mine['script']}.py: a run continues only with the script that started it; choose "
            "another --output_dir, or add --overwrite_output_dir to remove that run first"
        )
    history = []
    if source is not None:  # the resume's checks (common/run/resume_checks.py)
        from common.run.resume_checks import check_resume

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
                "choose another --output_dir"
            )
    if overwrite and used:  # common/run/clear_run.py
        from common.run.clear_run import overwrite_run

        refusal = overwrite_run(args, folder, log)
        if refusal:
            return refusal
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


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
