"""User reward functions (`--reward_funcs`), called as TRL's GRPOTrainer calls them: once per batch with the keywords
`prompts`, `completions`, `completion_ids` and every other dataset column as a list aligned with the completions.
Each returns one number or None ("does not apply") per completion; the total is the weighted sum over the functions
that gave a number (None skipped, as TRL's NaN-skipping sum). Imported only when `--reward_funcs` is given.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import sys
from pathlib import Path
from types import SimpleNamespace

# the keywords every call passes: a dataset column of one of these names is not passed
TRL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


def _load_one(spec: str, flag: str):
    """`package.module:function` or `path/to/file.py:function` -> the function (one line naming it on failure)."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise SystemExit(f"{flag} {spec!r}: expected `package.module:function` or `path/to/file.py:function`")
    try:
        if target.endswith(".py") or "/" in target or "\\" in target:
            path = Path(target)
            if not path.is_file():
                raise SystemExit(f"{flag} {spec}: file {target} not found")
            # a module name of its own per file, so two files with the same stem do not replace each other
            module_name = f"rlvr_reward_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - whatever the user's module raises while importing
        raise SystemExit(f"{flag} {spec}: cannot import {target} ({type(error).__name__}: {error})") from None
    func = getattr(module, name, None)
    if not callable(func):
        raise SystemExit(f"{flag} {spec}: {target} has no function {name}")
    return func


def _parse_weights(weights: str | None, count: int, flag: str) -> list[float]:
    if not weights:
        return [1.0] * count
    try:
        values = [float(item) for item in weights.split(",")]
    except ValueError:
        raise SystemExit(f"{flag} {weights!r}: expected comma-separated numbers") from None
    if len(values) != count or not all(math.isfinite(value) for value in values):
        raise SystemExit(f"{flag} {weights!r}: expected {count} finite numbers, one per reward function")
    return values


class RewardFuncs:
    """The named functions and their weights; `__call__` scores one batch and returns (totals, values per name)."""

    def __init__(self, specs: str, weights: str | None = None, flag: str = "--reward_funcs"):
        items = [item.strip() for item in specs.split(",") if item.strip()]
        if not items:
            raise SystemExit(f"{flag}: no function named")
        self.funcs = [_load_one(item, flag) for item in items]
        self.names = [getattr(func, "__name__", item.rpartition(":")[2]) for func, item in zip(self.funcs, items)]
        if len(set(self.names)) != len(self.names):
            raise SystemExit(f"{flag}: two functions share the name {self.names} (metrics are logged per name)")
        self.weights = _parse_weights(weights, len(self.funcs), "--reward_weights")

    def _call(self, func, prompts, completions, completion_ids, columns, rows, state):
        return func(prompts=[prompts[i] for i in rows], completions=[completions[i] for i in rows],
                    completion_ids=[completion_ids[i] for i in rows], trainer_state=state, log_extra=_ignored,
                    log_metric=_ignored, **{key: [column[i] for i in rows] for key, column in columns.items()})

    def __call__(self, prompts: list, completions: list, completion_ids: list, columns: dict[str, list],
                 step: int | None) -> tuple[list[float], dict[str, list]]:
        """`step`: the training step being scored, None for the evaluation (`trainer_state.global_step`: the updates
        done before it, as TRL's)."""
        n, values = len(completions), {}
        state = SimpleNamespace(global_step=None if step is None else step - 1)
        when = "the evaluation" if step is None else f"step {step}"
        for name, func in zip(self.names, self.funcs):
            try:
                out = self._call(func, prompts, completions, completion_ids, columns, range(n), state)
            except Exception as error:  # noqa: BLE001 - the user's code: find the completion it fails on
                index = next((i for i in range(n) if _raises(lambda: self._call(
                    func, prompts, completions, completion_ids, columns, [i], state))), None)
                where = "on the batch" if index is None else f"on completion {index}"
                raise SystemExit(f"reward function {name} raised at {when} {where}: "
                                 f"{type(error).__name__}: {error}") from None
            values[name] = _check(out, n, name, when)
        totals = [sum(weight * values[name][i] for name, weight in zip(self.names, self.weights)
                      if values[name][i] is not None) for i in range(n)]
        return totals, values


def _ignored(*args, **kwargs) -> None:
    """TRL's `log_extra` / `log_metric` callbacks: accepted, so that functions calling them run; nothing is logged."""


def _raises(call) -> bool:
    try:
        call()
    except Exception:  # noqa: BLE001
        return True
    return False


def _check(out, n: int, name: str, when: str) -> list:
    """The function's values as floats or None; one line naming the function and the index for anything else."""
    try:
        out = list(out)
    except TypeError:
        raise SystemExit(f"reward function {name} at {when}: returned {type(out).__name__}, not a list of "
                         f"{n} numbers") from None
    if len(out) != n:
        raise SystemExit(f"reward function {name} at {when}: returned {len(out)} values for {n} completions")
    clean = []
    for index, value in enumerate(out):
        if value is not None and not isinstance(value, numbers.Real):
            raise SystemExit(f"reward function {name} at {when}: value {index} is {value!r}, not a number "
                             "or None")
        if value is not None and not math.isfinite(value):
            raise SystemExit(f"reward function {name} at {when}: value {index} is {value}, not finite")
        clean.append(None if value is None else float(value))
    return clean


def call_reward_funcs(funcs: RewardFuncs, texts: list[str], rows: list[dict], completion_ids: list,
                      prompt_column: str, step: int | None) -> tuple[list[float], dict[str, list]]:
    """`funcs` on completions `texts` (`rows[i]`: the dataset row of completion i's prompt) with TRL's keywords:
    the prompt column as `prompts`, completions as text or, for message prompts, as one assistant message."""
    prompts = [row.get(prompt_column) for row in rows]
    completions = [[{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
                   for prompt, text in zip(prompts, texts)]
    keys = [key for key in (rows[0] if rows else {}) if key not in (prompt_column, *TRL_KEYWORDS)]
    columns = {key: [row.get(key) for row in rows] for key in keys}
    return funcs(prompts, completions, [list(ids) for ids in completion_ids], columns, step)
