"""The output folder holds one run. Before any model is loaded, `claim_output_dir` (every rank calls
it) holds the folder for this launch (`.run.lock`), and in a fresh folder records the run writing
there: `.run.json` (its id, script, the settings that shape its checkpoints, its flags) and
`args.json`. A folder that holds a run, or a resume, is decided by common/run/used_folder.py;
several processes check they see one folder (common/run/shared_folder.py).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict
from pathlib import Path

from common.run.checkpoint import MARKER
from common.run.flags import script_of
from common.run.folder_lock import defer_writes, hold, release
from common.run.run_folder import RESUMES, describe

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
            _claim(args, accelerator.num_processes, log)
        # a refusal (a used folder, a resume that would mix runs): every rank must stop, not only
        # this one
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
    """The script whose `Args` these are (`ra_rloo`...)."""
    return Path(script_of(type(args))).stem


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


def _claim(args, world_size: int, log) -> None:
    """Rank 0, holding the folder: writes `.run.json` and `args.json` (a resume's only once its
    checkpoint has loaded), or stops with the refusal line."""
    folder = Path(args.output_dir)
    mine = _record(args, world_size)
    this_run, history, resuming = secrets.token_hex(8), [], False  # a new run
    if args.resume_from_checkpoint or describe(folder):  # common/run/used_folder.py
        from common.run.used_folder import claim_used

        this_run, history, resuming = claim_used(args, folder, mine, this_run, log)
    records = {
        folder / MARKER: json.dumps({"run_id": this_run, **mine}),
        folder / "args.json": json.dumps(
            {**mine["args"], **({RESUMES: history} if history else {})}, indent=2
        ),
    }
    if not resuming:
        for path, text in records.items():
            path.write_text(text)
    # written when the run starts logging, after its checkpoint loaded: a failed resume changes
    # neither
    else:
        defer_writes(
            folder, {path: text for path, text in records.items() if _read_text(path) != text}
        )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
