"""The output folder's checks of a resume (only with --resume_from_checkpoint, made by
common/run/output_dir.py `claim_output_dir`): the checkpoint must be of the run in the folder, of
this script and shape (processes, --fsdp, LoRA), with the flags that change what the run computes
unchanged (or --accept_changed_flags), and the latest in the folder (or
--discard_later_checkpoints). Every check is made before anything is written. Also the logs
rewound to the checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from common.run.checkpoint import run_id
from common.run.clear_run import check_removable
from common.run.run_folder import (
    RESUMES,
    SAME_RUN,
    checkpoint_step,
    describe,
    held,
    read_record,
)

FREE = (
    "max_steps",
    "eval_steps",
    "save_steps",
    "save_total_limit",
    "log_samples_every",
    "log_samples_per_kind",
    "report_to",
    "project",
    "run_name",
    "num_threads",
    "lora_merged_export",
    "save_dtype",
    "collective_timeout",
    # the KV cache of HF generate: how fast a step samples, as the thread count (a checkpoint
    # recorded before `auto` became the default holds None)
    "cache_implementation",
)  # length, logging, patience, speed: free


def check_resume(args, source: Path, mine: dict, used: bool, log) -> tuple[str | None, str, list]:
    """Rank 0, holding the folder, resuming from `source`: (the refusal line or None, the run's id,
    its history of flag changes with this resume's appended). `mine`: what `.run.json` will record
    of this launch (its flags take the run's own values of the flags that only say how this command
    reached the run); `used`: whether --output_dir holds a run. Later checkpoints go here, with
    --discard_later_checkpoints."""
    folder = Path(args.output_dir)
    overwrite = getattr(args, "overwrite_output_dir", False)
    inside = source.resolve().parent == folder.resolve()
    saved = read_record(source / "run.json")
    this_run = saved.get("run_id", "")
    others = {run_id(folder / name / "run.json") for name in held(folder)[0]} - {this_run}
    if not inside and used and not overwrite and (others or not held(folder)[0]):
        return (
            (
                f"--resume_from_checkpoint {args.resume_from_checkpoint} continues another run "
                f"than the one in --output_dir {folder} "
                f"({describe(folder)}): resume into an empty --output_dir, or add "
                "--overwrite_output_dir to "
                "remove that run first"
            ),
            this_run,
            [],
        )
    refusal, history, before = _compare(
        args, source, saved, mine, folder if inside else source.parent, log
    )
    if refusal:
        return refusal, this_run, []
    # how this command reached the run is no change to it: the records keep the run's own (a
    # resume that changes nothing rewrites nothing)
    mine["args"].update(
        {key: before[key] for key in SAME_RUN if key in before and (inside or key != "output_dir")}
    )
    later = [
        folder / name
        for name in held(folder)[0]
        if inside and checkpoint_step(name) > checkpoint_step(source.name)
    ]
    if later and not args.discard_later_checkpoints:
        return (
            (
                f"--resume_from_checkpoint {source}: --output_dir {folder} holds later checkpoints "
                "of this run "
                f"({', '.join(path.name for path in later)}): add --discard_later_checkpoints to "
                "remove them "
                "(and the logged rows after it) and continue from it, or resume with "
                "--resume_from_checkpoint auto"
            ),
            this_run,
            [],
        )
    # a damaged row stops the resume now, before any write
    for name in ("metrics.jsonl", "samples.jsonl"):
        if inside and (folder / name).is_file():
            read_rows(folder / name, announce=lambda message: None)
    if later:
        check_removable(folder, later, "--discard_later_checkpoints")
        for path in later:
            shutil.rmtree(path)
        log(
            f"--discard_later_checkpoints: removed {', '.join(path.name for path in later)} "
            f"from {folder}"
        )
    return None, this_run, history


def _compare(
    args, source: Path, saved: dict, mine: dict, origin: Path, log
) -> tuple[str | None, list, dict]:
    """A resume from `source` against the run that wrote it: (the refusal line or None, the run's
    history of flag changes with this resume's appended, the run's recorded flags). The script and
    the checkpoint's shape must match; a changed flag that alters what the run computes needs
    --accept_changed_flags; length and logging flags change freely."""
    if saved.get("script", mine["script"]) != mine["script"]:
        return (
            (
                f"--resume_from_checkpoint {source}: written by {saved['script']}.py, not "
                f"{mine['script']}.py: a run continues only "
                "with the script that started it"
            ),
            [],
            {},
        )
    shape = _shape_change(saved, mine)
    if shape:
        return f"--resume_from_checkpoint {source}: {shape}", [], {}
    recorded = read_record(origin / "args.json")
    before = saved.get("args") or {key: value for key, value in recorded.items() if key != RESUMES}
    changed = {
        key: [before[key], value]
        for key, value in mine["args"].items()
        if key in before and before[key] != value and key not in SAME_RUN
    }
    computing = [
        key
        for key in changed
        if key not in FREE or key == "max_steps" and schedule_reads_max_steps(mine["args"])
    ]
    if computing and not args.accept_changed_flags:
        return (
            (
                f"--resume_from_checkpoint {source}: flags differ from the run's: "
                + ", ".join(
                    f"--{key} {changed[key][0]!r} -> {changed[key][1]!r}" for key in computing
                )
                + f": resume with the run's values ({_same_command(args, source, origin)}), or "
                "add --accept_changed_flags to continue with the new ones (recorded in args.json)"
            ),
            [],
            before,
        )
    # the first step the new flags compute; a discarded branch's changes go
    start = checkpoint_step(source.name) + 1
    history = [
        entry for entry in recorded.get(RESUMES, []) if entry.get("from_step", 0) <= start - 1
    ]
    if changed:
        log(
            f"--resume_from_checkpoint {source}: from step {start} with "
            + ", ".join(f"--{key} {old!r} -> {new!r}" for key, (old, new) in changed.items())
            + " (in args.json)"
        )
    return None, history + ([{"from_step": start, "changed": changed}] if changed else []), before


def _same_command(args, source: Path, origin: Path) -> str:
    """The flags that resume the run exactly as it was: its args.json, then where to."""
    same = f"--config {origin / 'args.json'}"
    if origin.resolve() != Path(args.output_dir).resolve():  # into another folder
        return f"{same} --output_dir {args.output_dir} --resume_from_checkpoint {source}"
    return f"{same} --resume_from_checkpoint {args.resume_from_checkpoint}"


def schedule_reads_max_steps(flags: dict) -> bool:
    """Whether the learning-rate schedule is laid over --max_steps (transformers' decaying ones, or
    a warm-up given as --warmup_ratio of it): there a new --max_steps changes every later step's
    rate, so a resume treats it as a flag that changes what the run computes."""
    fixed = ("warmup_constant", "constant", "constant_with_warmup", "inverse_sqrt")
    schedule = flags.get("lr_scheduler_type", "warmup_constant")
    return flags.get("warmup_ratio", 0) > 0 or schedule not in fixed


def _shape_change(saved: dict, mine: dict) -> str | None:
    """How the checkpoint's shape (processes, --fsdp, LoRA) differs from this launch's; None when it
    does not (or a checkpoint records none of it: common/run/checkpoint.py checks those while
    loading)."""
    if saved.get("world_size", mine["world_size"]) != mine["world_size"]:
        return f"saved with {saved['world_size']} processes, now {mine['world_size']}"
    if bool(saved.get("fsdp", mine["fsdp"])) != bool(mine["fsdp"]):
        was, now = ("with" if flag else "without" for flag in (saved["fsdp"], mine["fsdp"]))
        return f"saved {was} --fsdp, resumed {now} it (the optimizer state is laid out differently)"
    before, now = saved.get("lora_r", mine["lora_r"]), mine["lora_r"]
    if bool(before) != bool(now):
        return (
            f"saved {'with' if before else 'without'} LoRA adapters, resumed "
            f"{'with' if now else 'without'} "
            "them (match --lora_r)"
        )
    for key in ("lora_r", "lora_target_modules") if now else ():
        if saved.get(key, mine[key]) != mine[key]:
            return (
                f"saved with --{key} {saved[key]}, resumed with {mine[key]}: the adapters differ "
                "(match it)"
            )
    return None


def read_rows(path: Path, announce=lambda message: print(message, flush=True)) -> list[str]:
    """The rows of a log file (`metrics.jsonl`, `samples.jsonl`) as their JSON lines, for a resume.
    A last line cut short (a run killed, or a disk filled, while writing it) is dropped and
    `announce`d in one line; a damaged line before it stops the run with one line naming the file
    and line number (the file is left as it is)."""
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    kept = []
    for index, (number, line) in enumerate(numbered):
        try:
            row = json.loads(line)
            int(row["step"])
        except (ValueError, KeyError, TypeError) as error:
            if index < len(numbered) - 1:
                raise SystemExit(
                    f"{path} line {number}: not a row this project writes ({type(error).__name__}: "
                    f"{str(error)[:80]}); repair or delete that line, then resume"
                )
            announce(
                f"{path}: dropped its last line (line {number}), cut short at {len(line.encode())} "
                "bytes by an "
                "interrupted write"
            )
            continue
        kept.append(line)
    return kept


def keep_rows_until(path: Path, resume_step: int | None) -> None:
    """Rewrite `path` with its rows up to `resume_step` (None: none), replacing the file whole, so
    that a crash while rewriting never loses the rows a resume keeps."""
    kept = (
        []
        if resume_step is None
        else [line for line in read_rows(path) if json.loads(line)["step"] <= resume_step]
    )
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
