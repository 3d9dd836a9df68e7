"""The trackers of `--report_to` (accelerate's): which exist and are installed, each one's start
keywords and metric names, and the sampled rollouts as a table. Loaded only with a tracker
(common/run/logs.py)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

# the trackers accelerate supports, each with the modules one of which must be installed for it
TRACKERS = {
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
    "mlflow": ("mlflow",),
    "comet_ml": ("comet_ml",),
    "aim": ("aim",),
    "clearml": ("clearml",),
    "dvclive": ("dvclive",),
    "swanlab": ("swanlab",),
}
# the keyword each tracker's start takes for the run's name (the others have no such name)
RUN_NAME_KEY = {
    "wandb": "name",
    "trackio": "name",
    "mlflow": "run_name",
    "clearml": "task_name",
    "swanlab": "experiment_name",
}


def check_names(report_to: str, names: list[str]) -> list[str]:
    """`names` (of `--report_to`, not `none`) as accelerate's `log_with`: an unknown name or a
    tracker that is not installed stops with one line."""
    if names == ["all"]:  # accelerate's own: every tracker installed (none installed: none)
        return names
    for name in names:
        if name not in TRACKERS:
            raise SystemExit(
                f"--report_to {report_to}: {name!r} is not a tracker accelerate supports (one of "
                f"{', '.join(TRACKERS)}, several comma-separated, `all` or `none`)"
            )
        if not any(importlib.util.find_spec(module) for module in TRACKERS[name]):
            raise SystemExit(f"--report_to {name}: install it first (pip install {name})")
    return names


def start_trackers(accelerator, project: str, flags: dict, output_dir, run_name, resumed: bool):
    """The trackers started for the run (main process), named `run_name` or else after the output
    folder, with the run's flags as their config."""
    run_name = run_name or Path(output_dir).resolve().name
    accelerator.init_trackers(
        project,
        config=tracker_config(flags),
        init_kwargs=tracker_init_kwargs(output_dir, run_name, resumed),
    )


def log_row(trackers, row: dict) -> None:
    """A metrics.jsonl row to each tracker: its numbers (None: not measured), at its step (the x
    axis, not a value)."""
    values = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
    for tracker in trackers:
        tracker.log(tracker_keys(tracker.name, values), step=row["step"])


def tracker_keys(tracker: str, values: dict) -> dict:
    """`values` under the names `tracker` accepts: MLflow takes letters, digits and `_-. :/` only,
    so there eval_pass@1 is eval_pass_at_1 (any other character becomes `_`); the others take
    metrics.jsonl's names."""
    if tracker != "mlflow":
        return values
    return {re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_")): v for key, v in values.items()}


def tracker_init_kwargs(output_dir, run_name: str, resumed: bool) -> dict:
    """Each tracker's start keywords: the run's name; a resume continues the tracker's run where the
    tracker can: wandb's run id is the output folder's run id (kept by a resume), trackio continues
    the run of that name in the project. The others start a new run at each launch."""
    from common.run.checkpoint import MARKER, run_id

    kwargs = {name: {key: run_name} for name, key in RUN_NAME_KEY.items()}
    folder_run = run_id(Path(output_dir) / MARKER)
    if folder_run:
        kwargs["wandb"].update(id=folder_run, resume="allow")
    if resumed:  # a fresh run never appends to an older run of the same name
        kwargs["trackio"]["resume"] = "allow"
    return kwargs


def tracker_config(flags: dict) -> dict:
    """The run's flags as every tracker stores them: numbers, strings, booleans and None as they
    are, anything else (a list) as its text; `_private` attributes left out."""
    return {
        key: value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
        for key, value in flags.items()
        if not key.startswith("_")
    }


def log_sample_table(trackers, step: int, clean: list[dict]) -> None:
    """The step's sampled rollouts (samples.jsonl's rows) to each tracker that shows them: a table
    (wandb, trackio) or text (tensorboard)."""
    for tracker in trackers:
        columns = sorted({key for row in clean for key in row})
        if tracker.name == "wandb":
            import wandb

            tracker.log(
                {
                    "samples": wandb.Table(
                        columns=columns, data=[[row.get(c) for c in columns] for row in clean]
                    )
                },
                step=step,
            )
        elif tracker.name == "trackio":
            import trackio

            table = trackio.Table(
                columns=columns, data=[[row.get(c) for c in columns] for row in clean]
            )
            tracker.log({"samples": table}, step=step)
        elif tracker.name == "tensorboard":
            tracker.writer.add_text(
                "samples", "\n\n".join(f"    {json.dumps(row)}" for row in clean), step
            )
