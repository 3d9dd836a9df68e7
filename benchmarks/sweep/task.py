"""A task file for `benchmarks/sweep/run.py --task`: your model, data and reward, and the sweep's
budget, in one YAML file. Every applicable method and its baseline runs on it with paired seeds, and
the report (the papers' claims, each method against its baseline) is written for those runs.

    name: my_task                       # names the default runs folder, runs/sweep-my_task
    model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
    seeds: [0, 1, 2, 3, 4]
    max_steps: 100
    prompts_per_step: 64
    learning_rate: 1.0e-6
    extra: --use_vllm --dtype bfloat16  # appended to every run
    flags:                              # any flag the five scripts share, passed to every run
      dataset_name: my_org/my_math_set
      prompt_column: problem
      reward_funcs: my_rewards.py:correctness
      success_reward: 1

Top-level keys are run.py's own flags (`python benchmarks/sweep/run.py --help`) plus `name`,
`report_dir` and `flags`; a flag given on the command line wins over the file. Two placeholders
stand for the shipped word-problem task: `{word_problems}` (the folder its .jsonl files are written
to, `runs/word_problems/data`) and `{word_problems_base}` (its shipped base model).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
WORD_PROBLEMS_DATA = "runs/word_problems/data"
PLACEHOLDER = re.compile(r"\{(word_problems(?:_base)?)\}")
TASK_KEYS = ("name", "report_dir", "flags")
# run.py flags a task file cannot set (they choose what to do, not the task)
RUNNER_ONLY = ("task", "dry_run", "quick", "python", "progress_every", "lock", "keep_checkpoints")


@dataclass
class TaskFile:
    """A parsed task file: run.py flag values it sets, the script flags every run gets."""

    path: Path
    name: str
    runner: dict[str, Any] = field(default_factory=dict)
    script_flags: list[str] = field(default_factory=list)
    report_dir: Optional[str] = None


def _shared_script_flags() -> dict[str, Optional[list]]:
    """The flags the five scripts share (common/run/flags.py's BaseArgs: its groups), read from the
    source."""
    from benchmarks.sweep.configs import composed_fields, flag_classes

    classes = flag_classes()
    return composed_fields(classes["BaseArgs"], classes)


def _flag_text(value: Any) -> str:
    """A YAML value as a command-line value (lists become comma lists, booleans true / false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_flag_text(v) for v in value)
    return str(value)


def _expand(text: str, where: str) -> str:
    """`{word_problems}` / `{word_problems_base}` replaced (the files are written or found here)."""

    def fill(match: re.Match) -> str:
        if match.group(1) == "word_problems":
            from benchmarks.sweep import word_problems

            word_problems.write_data(ROOT / WORD_PROBLEMS_DATA)
            return WORD_PROBLEMS_DATA
        return word_problems_base(where)

    return PLACEHOLDER.sub(fill, text)


def word_problems_base(where: str = "") -> str:
    """The shipped word-problem base, as a path relative to the repository (recorded commands stay
    the same on every clone)."""
    from benchmarks.sweep.word_problems import ModelRecipe

    shipped = Path("assets") / f"wordproblems-base-{ModelRecipe().key()}"
    if not (ROOT / shipped / "config.json").exists():
        raise SystemExit(f"{where}: {{word_problems_base}}: {shipped} is not in this checkout")
    return str(shipped)


def load_task(path: str, runner_fields: dict[str, type]) -> TaskFile:
    """Read and check a task file; `runner_fields` are run.py's flags and their types."""
    import yaml

    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text())
    except OSError as e:
        raise SystemExit(f"--task {path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise SystemExit(f"--task {path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise SystemExit(f"--task {path}: expected a mapping of keys to values at the top")
    name = str(data.get("name") or file.stem)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise SystemExit(f"--task {path}: name {name!r}: use letters, digits, '_', '.', '-'")
    task = TaskFile(file, name, report_dir=data.get("report_dir"))
    for key, value in data.items():
        where = f"--task {path}: key {key!r}"
        if key in TASK_KEYS:
            continue
        if key in RUNNER_ONLY or key not in runner_fields:
            known = sorted(set(runner_fields) - set(RUNNER_ONLY)) + list(TASK_KEYS)
            raise SystemExit(
                f"{where}: not a task key (script flags go under `flags:`); known: {', '.join(known)}"
            )
        if isinstance(value, str):
            value = _expand(value, where)
        task.runner[key] = value
    flags = data.get("flags") or {}
    if not isinstance(flags, dict):
        raise SystemExit(f"--task {path}: key 'flags': expected a mapping of flag to value")
    shared = _shared_script_flags()
    for key, value in flags.items():
        where = f"--task {path}: flags.{key}"
        if key not in shared:
            raise SystemExit(
                f"{where}: not a flag the five scripts share (common/run/flags.py BaseArgs); "
                "a method's own flag belongs to its config"
            )
        if key in ("seed", "output_dir", "max_steps", "prompts_per_step", "model_name_or_path"):
            raise SystemExit(f"{where}: set by the sweep; give it as the top-level key {key!r}")
        text = _expand(_flag_text(value), where)
        choices = shared[key]
        if choices is not None and text not in [str(c) for c in choices]:
            raise SystemExit(f"{where}: {text!r} is not one of {choices}")
        task.script_flags += [f"--{key}", text]
    return task


def runner_types(args_cls) -> dict[str, type]:
    """run.py's flag names and their declared types."""
    return {f.name: f.type for f in dataclasses.fields(args_cls)}
