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

`environment: my_env.py:MyGame` (a top-level key) names your agent environment
(docs/custom_env.md): the sweep then runs Prefix Sampling's multi-turn configs on it (PS against
GRPO, `ps_grpo.py --environment`), and its check builds one instance and calls `reset` first.

Top-level keys are run.py's own flags (`python benchmarks/sweep/run.py --help`) plus `name`,
`report_dir` and `flags`; a flag given on the command line wins over the file. Two placeholders
stand for the shipped word-problem task: `{word_problems}` (the folder its .jsonl files are written
to, `runs/word_problems/data`) and `{word_problems_base}` (its shipped base model).

A relative path in the file (`runs_dir`, `report_dir`, a local model folder, data files, a reward
file) is read from the task file's folder, wherever run.py is started; `check_task` then checks,
before any run, that each exists, that the reward functions import and return numbers on a few
training rows, and that a local model folder holds a model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import importlib.util
import inspect
import json
import math
import numbers
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[2]
WORD_PROBLEMS_DATA = "runs/word_problems/data"
PLACEHOLDER = re.compile(r"\{(word_problems(?:_base)?)\}")
TASK_KEYS = ("name", "report_dir", "flags", "environment")
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
    environment: Optional[str] = None  # `file.py:ClassName`, from the repository or absolute


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


# file suffixes that make a value a local file (a hub id has none)
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".py", ".yaml", ".yml")
PATH_KEYS = ("runs_dir", "report_dir", "model_name_or_path")  # top-level keys that name a folder
PATH_FLAGS = ("dataset_name", "eval_dataset", "config")  # script flags that may name a file


def _portable(path: Path) -> str:
    """A resolved path as a run's command gives it: relative to the repository when inside it (the
    runs start there), else absolute."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path.resolve())


def is_local(value: str, folder: Path) -> bool:
    """`value` names a local file or folder (not a hub id, `embedded` or `countdown`): it exists
    under `folder`, is absolute, starts with `.` or `~`, or ends with a file suffix."""
    return (
        value.startswith((".", "~", "/"))
        or value.endswith(LOCAL_SUFFIXES)
        or (folder / value).exists()
    )


def resolve_path(value: str, folder: Path) -> str:
    """A task file's relative path read from the file's folder; a hub id unchanged."""
    if not is_local(value, folder):
        return value
    return _portable(folder / Path(value).expanduser())


def _resolve_reward_specs(text: str, folder: Path) -> str:
    """`file.py:function` items read from the task file's folder (module and hub items kept)."""
    items = []
    for item in text.split(","):
        target, sep, name = item.strip().rpartition(":")
        if sep and (target.endswith(".py") or "/" in target):
            items.append(f"{resolve_path(target, folder)}:{name}")
        elif not sep and item.strip():
            items.append(resolve_path(item.strip(), folder))  # a reward model's folder or hub id
        else:
            items.append(item.strip())
    return ",".join(items)


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
    report_dir = data.get("report_dir")
    if report_dir:
        report_dir = str((file.parent / Path(str(report_dir)).expanduser()).resolve())
    task = TaskFile(file, name, report_dir=report_dir)
    problems: list[str] = []  # every problem of the file, a line each, reported together
    if data.get("environment"):
        task.environment = _resolve_reward_specs(str(data["environment"]), file.parent)
    for key, value in data.items():
        where = f"--task {path}: key {key!r}"
        if key in TASK_KEYS:
            continue
        if key in RUNNER_ONLY or key not in runner_fields:
            known = sorted(set(runner_fields) - set(RUNNER_ONLY)) + list(TASK_KEYS)
            problems.append(
                f"{where}: not a task key (script flags go under `flags:`){_nearest(key, known)}; "
                f"known: {', '.join(known)}"
            )
            continue
        try:
            task.runner[key] = _runner_value(key, value, where, file)
        except SystemExit as refused:
            problems.append(str(refused))
    flags = data.get("flags") or {}
    if not isinstance(flags, dict):
        problems.append(f"--task {path}: key 'flags': expected a mapping of flag to value")
        flags = {}
    shared = _shared_script_flags()
    for key, value in flags.items():
        try:
            task.script_flags += _script_flag(
                key, value, f"--task {path}: flags.{key}", shared, file
            )
        except SystemExit as refused:
            problems.append(str(refused))
    if problems:
        raise SystemExit("\n".join(problems))
    if task.environment:
        task.script_flags += ["--environment", task.environment]
    return task


def _nearest(name: str, known) -> str:
    import difflib

    near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; the nearest is {near[0]!r}" if near else ""


def _runner_value(key: str, value, where: str, file: Path):
    """A top-level key's value, its placeholders expanded and its path read from the file's folder."""
    if isinstance(value, str):
        expanded = _expand(value, where)
        # a placeholder gives a path from the repository; the rest, from the file's folder
        if key in ("runs_dir", "report_dir") and expanded == value:  # the runner's own folders
            expanded = str((file.parent / Path(value).expanduser()).resolve())
        elif key in PATH_KEYS and expanded == value:
            expanded = resolve_path(value, file.parent)
        value = expanded
    return value


def _script_flag(key: str, value, where: str, shared: dict, file: Path) -> list[str]:
    """`--key value` of the file's `flags:` mapping, checked against the flags the scripts share."""
    if key not in shared:
        raise SystemExit(
            f"{where}: not a flag the five scripts share (common/run/flags.py BaseArgs)"
            f"{_nearest(key, shared)}; a method's own flag belongs to its config"
        )
    if key in ("seed", "output_dir", "max_steps", "prompts_per_step", "model_name_or_path"):
        raise SystemExit(f"{where}: set by the sweep; give it as the top-level key {key!r}")
    raw = _flag_text(value)
    text = _expand(raw, where)
    if text == raw and key in PATH_FLAGS:
        text = resolve_path(text, file.parent)
    elif text == raw and key in ("reward_funcs", "eval_reward_funcs"):
        text = _resolve_reward_specs(text, file.parent)
    choices = shared[key]
    if choices is not None and text not in [str(c) for c in choices]:
        raise SystemExit(f"{where}: {text!r} is not one of {choices}")
    return [f"--{key}", text]


def runner_types(args_cls) -> dict[str, type]:
    """run.py's flag names and their declared types."""
    return {f.name: f.type for f in dataclasses.fields(args_cls)}


def left_out_lines(environment: bool = False) -> list[str]:
    """The configs a task sweep leaves out, each with why (the runner prints them, the page lists
    them)."""
    from benchmarks.sweep.configs import TASK_LEFT_OUT

    if environment:
        return [
            "every method but Prefix Sampling: the others train on single-turn completions, "
            "not in an environment"
        ]

    lines = [
        "Prefix Sampling's multi-turn configs (`ps_off`, `ps_fixed`, `ps_adaptive`, "
        "`ps_adaptive_reset` with `--mode multiturn`): the multi-turn environment is the "
        "embedded Countdown task's own; a task sweep runs the same four configs in their text mode "
        "(a step is a line of the response)"
    ]
    for name, why in TASK_LEFT_OUT.items():
        lines.append(f"the `{name}` configs: {why}" if name.startswith("_") else f"`{name}`: {why}")
    return lines


# --------------------------------------------------------------------------------------------------
# The checks before the first run: each stops the runner with one line naming the path
# --------------------------------------------------------------------------------------------------

CHECK_ROWS = 4  # training rows the reward functions are tried on


def _flag(flags: list[str], name: str) -> Optional[str]:
    return flags[flags.index(name) + 1] if name in flags[:-1] else None


def _where(task: TaskFile) -> str:
    return f"relative paths in a task file are read from its folder, {task.path.resolve().parent}"


def _read_rows(path: Path, count: int) -> Optional[list[dict]]:
    """The first `count` rows of a .jsonl, .json or .csv file (None for other formats)."""
    if path.suffix == ".jsonl":
        rows = []
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if line.strip():
                    rows.append(json.loads(line))
                if len(rows) == count:
                    break
        return rows
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        return data[:count] if isinstance(data, list) else None
    if path.suffix == ".csv":
        import csv

        with path.open(newline="", encoding="utf-8", errors="replace") as f:
            return [row for _, row in zip(range(count), csv.DictReader(f))]
    return None


def check_task(task: TaskFile, model: str, log=print) -> None:
    """Before any run: the model folder, the data files and the reward functions (imported and
    called on the first training rows) are there and work; SystemExit with one line naming the path
    tried otherwise. `model`: the sweep's model_name_or_path (a task file's already resolved)."""
    head = f"--task {task.path}"
    flags = task.script_flags
    if model != "embedded":
        path = ROOT / model if not Path(model).is_absolute() else Path(model)
        if is_local(model, ROOT):
            if not (path / "config.json").is_file():
                what = "has no config.json" if path.is_dir() else "no such folder"
                raise SystemExit(f"{head}: model_name_or_path: {path}: {what} ({_where(task)})")
            log(f"  checked: model folder {model}")
        else:
            log(f"  model {model}: not a local folder, taken as a hub id")
    data = {}
    for key in ("dataset_name", "eval_dataset"):
        value = _flag(flags, f"--{key}")
        if value is None or not is_local(value, ROOT):
            continue
        path = ROOT / value
        if not path.exists():
            raise SystemExit(f"{head}: flags.{key}: {path}: no such file ({_where(task)})")
        data[key] = path
        log(f"  checked: {key} {value}")
    funcs = _flag(flags, "--reward_funcs")
    if funcs:
        _check_rewards(task, funcs, _flag(flags, "--reward_weights"), data, flags, log)
    if task.environment:
        _check_environment(task, data, log)


def _check_environment(task: TaskFile, data: dict, log) -> None:
    """One instance of the task's environment built and reset (on the first training row, else
    with seed 0), as the runs will; one line naming the class and the fault otherwise."""
    from common.envs.protocol import EnvFault, Environment, load_class

    head = f"--task {task.path}: environment"
    spec = task.environment
    target, _, name = spec.rpartition(":")
    if (target.endswith(".py") or "/" in target) and not (ROOT / target).is_file():
        raise SystemExit(f"{head}: {ROOT / target}: no such file ({_where(task)})")
    try:
        env = Environment(
            load_class(
                str(ROOT / target) + ":" + name
                if "/" in target or target.endswith(".py")
                else spec,
                head,
            )
        )
        train = data.get("dataset_name")
        rows = _read_rows(train, 1) if train else None
        row = rows[0] if rows else {"seed": 0}
        env.reset(env.new(), row)
    except EnvFault as fault:
        raise SystemExit(f"{head}: {fault.short}") from None
    except SystemExit as stop:
        raise SystemExit(
            f"{head}: {stop}" if not str(stop).startswith(head) else str(stop)
        ) from None
    log(f"  checked: environment {spec} builds and resets")


def _check_rewards(task, funcs, weights, data, flags, log) -> None:
    head = f"--task {task.path}: flags.reward_funcs"
    specs = [item.strip() for item in funcs.split(",") if item.strip()]
    for item in specs:
        target = item.rpartition(":")[0]
        if target.endswith(".py") or "/" in target:
            path = ROOT / target
            if not path.is_file():
                raise SystemExit(f"{head}: {path}: no such file ({_where(task)})")
    named = [item for item in specs if ":" in item]  # reward models (no `:`) load in the runs
    if not named:
        return
    funcs = [(item, _import_reward(item, head, task)) for item in named]
    train = data.get("dataset_name")
    rows = _read_rows(train, CHECK_ROWS) if train else None
    names = ", ".join(item.rpartition(":")[2] for item in named)
    if not rows:
        log(f"  checked: reward functions {names} import (no rows tried)")
        return
    head = f"{head} on the first {len(rows)} rows of {train}"
    column = _flag(flags, "--prompt_column") or ("prompt" if "prompt" in rows[0] else "question")
    answer = _flag(flags, "--answer_column") or "answer"
    prompts = [row.get(column) for row in rows]
    texts = [f"The answer is \\boxed{{{row.get(answer, 0)}}}." for row in rows]
    # as the scripts call them (TRL's keywords): message prompts get one assistant message back
    completions = [
        [{"role": "assistant", "content": t}] if isinstance(q, list) else t
        for q, t in zip(prompts, texts)
    ]
    columns = {k: [row.get(k) for row in rows] for k in rows[0] if k not in (column, *TRL_KEYS)}
    state = SimpleNamespace(global_step=0, epoch=0.0, max_steps=0)
    for item, func in funcs:
        name = item.rpartition(":")[2]
        try:
            out = func(
                prompts=prompts,
                completions=completions,
                completion_ids=[[0] for _ in rows],
                trainer_state=state,
                log_extra=lambda *a, **k: None,
                log_metric=lambda *a, **k: None,
                **columns,
            )
            if inspect.isawaitable(out):
                out = asyncio.run(_awaited(out))
        except Exception as e:  # noqa: BLE001 - the user's code
            frames = traceback.extract_tb(e.__traceback__)
            at = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
            raise SystemExit(
                f"{head}: reward function {name} raised{at}: {type(e).__name__}: {e}"
            ) from None
        values = list(out) if isinstance(out, (list, tuple)) else None
        if values is None or len(values) != len(rows):
            raise SystemExit(
                f"{head}: reward function {name} returned {type(out).__name__}, not a list of "
                f"{len(rows)} numbers"
            )
        for index, value in enumerate(values):
            if value is not None and not _is_number(value):
                raise SystemExit(
                    f"{head}: reward function {name}: value {index} is {value!r:.80}, not a number "
                    "or None"
                )
    log(f"  checked: reward functions {names} return numbers on the first {len(rows)} rows")


TRL_KEYS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


async def _awaited(awaitable):
    return await awaitable


def _is_number(value) -> bool:
    if callable(getattr(value, "item", None)) and getattr(value, "ndim", 0) == 0:
        value = value.item()  # a numpy or one-element tensor number
    return isinstance(value, numbers.Real) and not math.isinf(float(value))  # NaN: no reward


def _import_reward(item: str, head: str, task: TaskFile):
    """`file.py:function` or `package.module:function` -> the function; one line naming the file
    or module otherwise (the user's module only: the check stays seconds)."""
    target, _, name = item.rpartition(":")
    try:
        if target.endswith(".py") or "/" in target:
            path = ROOT / target
            spec = importlib.util.spec_from_file_location(f"sweep_check_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except Exception as e:  # noqa: BLE001 - whatever the user's module raises while importing
        raise SystemExit(f"{head}: cannot import {target} ({type(e).__name__}: {e})") from None
    func = getattr(module, name, None)
    if not callable(func):
        raise SystemExit(f"{head}: {target} has no function {name}")
    return func
