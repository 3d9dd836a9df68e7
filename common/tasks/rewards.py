"""User reward functions (`--reward_funcs`), called as TRL's GRPOTrainer calls them: once per batch
with the keywords `prompts`, `completions`, `completion_ids` and every other dataset column (but
`prompt` and `completion`, which TRL drops) as a list aligned with the completions. Each returns
one number or None ("does not apply") per completion; the total is the weighted sum over the
functions that gave a number (None and NaN skipped, as TRL's NaN-skipping sum), NaN when none did.
`async def` functions are awaited together in one event loop; a spec without `:` names a reward
model. Imported only when `--reward_funcs` is given.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import os
import sys
import traceback
from pathlib import Path

from transformers import TrainerState

from common.tasks.user_code import import_named

# set (to anything but "" or "0") to print the whole traceback of a reward function that raises
TRACEBACK_ENV = "RLVR_REWARD_TRACEBACK"

# dataset columns TRL's GRPOTrainer does not pass to reward functions (whatever the prompt column)
TRL_DROPPED = ("prompt", "completion", "completion_ids")
# the keywords every call passes: a dataset column of one of these names is not passed
TRL_KEYWORDS = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
)


def _load_one(spec: str, flag: str):
    """`package.module:function` or `path/to/file.py:function` -> the function (one line naming it
    on failure)."""
    form = "`package.module:function` or `path/to/file.py:function`"
    module, target, name = import_named(spec, flag, form, "rlvr_reward")
    func = getattr(module, name, None)
    if not callable(func):
        import difflib

        functions = [key for key, value in vars(module).items() if callable(value)]
        near = difflib.get_close_matches(name, functions, n=1, cutoff=0.6)
        hint = f"; the nearest is {near[0]}" if near else ""
        raise SystemExit(f"{flag} {spec}: {target} has no function {name}{hint}")
    return func


def _parse_weights(weights: str | None, count: int, flag: str) -> list[float]:
    if not weights:
        return [1.0] * count
    try:
        values = [float(item) for item in weights.split(",")]
    except ValueError:
        raise SystemExit(f"{flag} {weights!r}: expected comma-separated numbers") from None
    if len(values) != count or not all(math.isfinite(value) for value in values):
        raise SystemExit(
            f"{flag} {weights!r}: expected {count} finite numbers, one per reward function"
        )
    return values


class RewardModel:
    """A reward model named by a directory or hub id (a spec without `:`), loaded and called as TRL
    loads its string `reward_funcs`: a sequence-classification head with one label, its own
    tokenizer (and chat template for message prompts), scored on prompt + completion, in eval mode
    and the compute dtype, a whole copy on every process (it is never trained, so nothing is
    sharded)."""

    def __init__(self, spec: str, flag: str, dtype: str = "float32"):
        import torch
        from accelerate import PartialState
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not Path(spec).expanduser().is_dir() and spec.startswith((".", "/", "~")):
            raise SystemExit(
                f"{flag} {spec}: directory not found (a reward function is `module:function` or "
                "`file.py:function`; a reward model a directory or hub id)"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(spec)
            self.model = AutoModelForSequenceClassification.from_pretrained(
                spec, num_labels=1, dtype=getattr(torch, dtype)
            )
        except Exception as error:  # noqa: BLE001 - a missing or foreign model: one line
            raise SystemExit(
                f"{flag} {spec}: cannot load it as a sequence-classification reward model "
                f"({type(error).__name__}: {str(error)[:200]})"
            ) from None
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # the score is read at the last token that is not padding: the model must know the padding
        # id
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.eval().to(PartialState().device)
        self.__name__ = spec.rstrip("/").split("/")[-1]

    def __call__(self, prompts, completions, **kwargs) -> list[float]:
        import torch

        # messages: its own chat template over prompt + completion
        if prompts and isinstance(prompts[0], list):
            texts = [
                self.tokenizer.apply_chat_template(list(p) + list(c), tokenize=False)
                for p, c in zip(prompts, completions)
            ]
        else:
            texts = [p + c for p, c in zip(prompts, completions)]
        inputs = self.tokenizer(
            texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
        ).to(self.model.device)
        with torch.inference_mode():
            return self.model(**inputs).logits[:, 0].float().tolist()


def callable_name(func) -> str:
    """A function's name as TRL names it: a partial after the function it wraps, a callable object
    after its class."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def is_async(func) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)
    )


class RewardFuncs:
    """The named functions (and reward models) and their weights; `__call__` scores one batch and
    returns (totals, values per name). A total is NaN when every function returned None for the
    completion."""

    def __init__(
        self,
        specs: str,
        weights: str | None = None,
        flag: str = "--reward_funcs",
        dtype: str = "float32",
    ):
        items = [item.strip() for item in specs.split(",") if item.strip()]
        if not items:
            raise SystemExit(f"{flag}: no function named")
        self.funcs = [
            _load_one(item, flag) if ":" in item else RewardModel(item, flag, dtype)
            for item in items
        ]
        self.names = [callable_name(func) for func in self.funcs]
        if len(set(self.names)) != len(self.names):
            raise SystemExit(
                f"{flag}: two functions share the name {self.names} (metrics are logged per name)"
            )
        self.weights = _parse_weights(weights, len(self.funcs), "--reward_weights")
        self.state = TrainerState()  # the script fills max_steps, epoch, ... (common/tasks/task.py)
        self.logged: dict[str, list[float]] = {}  # log_metric's values since the last `pop_logs`
        self.extra: dict[str, list] = {}  # log_extra's columns of the last batch
        self._loop = None  # one event loop for every async function, made on first use
        self.warn, self.warned_none = None, False  # where the once-a-run "no reward" warning goes
        # steps per pass over the training prompts (trainer_state.epoch), set by the task
        self.epoch_size = None

    def fill_state(self, args, train_size: int, log) -> None:
        """trainer_state as TRL fills it (the run's length; an epoch: one pass over the training
        prompts) and where the once-a-run warning goes."""
        self.state.max_steps, self.state.train_batch_size = args.max_steps, args.prompts_per_step
        self.epoch_size = max(1, train_size) / args.prompts_per_step
        self.state.num_train_epochs = math.ceil(args.max_steps / self.epoch_size)
        self.state.logging_steps, self.state.eval_steps = 1, args.eval_steps
        self.state.save_steps = getattr(args, "save_steps", 0) or 0
        self.warn = log

    def updates_done(self, count: int) -> None:
        """trainer_state.global_step and .epoch after `count` updates."""
        self.state.global_step = count
        self.state.epoch = count / self.epoch_size if self.epoch_size else None

    def _log_metric(self, name: str, value) -> None:
        self.logged.setdefault(str(name), []).append(float(value))

    def _log_extra(self, column: str, values) -> None:
        self.extra.setdefault(str(column), []).extend(list(values))

    def pop_logs(self) -> tuple[dict, dict]:
        logged, extra, self.logged, self.extra = self.logged, self.extra, {}, {}
        return logged, extra

    def _invoke(self, func, prompts, completions, completion_ids, columns, rows):
        return func(
            prompts=[prompts[i] for i in rows],
            completions=[completions[i] for i in rows],
            completion_ids=[completion_ids[i] for i in rows],
            trainer_state=self.state,
            log_extra=self._log_extra,
            log_metric=self._log_metric,
            **{key: [column[i] for i in rows] for key, column in columns.items()},
        )

    def _call(self, func, *args):
        out = self._invoke(func, *args)
        # an async function called alone (one completion, to find the one it fails on)
        if inspect.isawaitable(out):
            out = self._run(_awaited(out))
        return out

    def _run(self, coroutine):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coroutine)

    def _fail(self, name, func, error, args, n, when):
        full = os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
        if full:
            traceback.print_exception(error, file=sys.stderr)
        index = next((i for i in range(n) if _raises(lambda: self._call(func, *args, [i]))), None)
        where = "on the batch" if index is None else f"on completion {index}"
        place = raised_at(error, func)
        notes = ([f"in {place}"] if place else []) + (
            [] if full else [f"{TRACEBACK_ENV}=1 prints the traceback"]
        )
        raise SystemExit(
            f"reward function {name} raised at {when} {where}: {type(error).__name__}: {error}"
            + (f" ({'; '.join(notes)})" if notes else "")
        ) from None

    def __call__(
        self,
        prompts: list,
        completions: list,
        completion_ids: list,
        columns: dict[str, list],
        step: int | None,
    ) -> tuple[list[float], dict[str, list]]:
        """`step`: the step being scored (`trainer_state.global_step`: the updates done before it,
        as TRL's), None for the evaluation (`trainer_state` as the last training step left it)."""
        n, values, outputs = len(completions), {}, {}
        if step is not None:
            self.updates_done(step - 1)
        when = "the evaluation" if step is None else f"step {step}"
        args = (prompts, completions, completion_ids, columns)
        pending = [(name, func) for name, func in zip(self.names, self.funcs) if is_async(func)]
        for name, func in zip(self.names, self.funcs):
            if (name, func) in pending:
                continue
            try:
                outputs[name] = self._call(func, *args, range(n))
            except Exception as error:  # noqa: BLE001 - the user's code: find the completion it fails on
                self._fail(name, func, error, args, n, when)
        if pending:  # every async function of the batch at once, in one event loop

            async def one(func):
                return await self._invoke(func, *args, range(n))

            async def gather():
                return await asyncio.gather(
                    *(one(func) for _, func in pending), return_exceptions=True
                )

            for (name, func), out in zip(pending, self._run(gather())):
                if isinstance(out, Exception):
                    self._fail(name, func, out, args, n, when)
                outputs[name] = out
        for name in self.names:
            values[name] = _check(outputs[name], n, name, when)
        totals = []
        for i in range(n):
            given = [
                (weight, values[name][i])
                for name, weight in zip(self.names, self.weights)
                if values[name][i] is not None
            ]
            totals.append(sum(weight * value for weight, value in given) if given else math.nan)
        missing = sum(1 for total in totals if math.isnan(total))
        if missing and self.warn and not self.warned_none:  # TRL's warning, once a run
            self.warned_none = True
            self.warn(
                f"warning: every reward function returned None for {missing} of {n} completions at "
                f"{when} "
                "(no reward: left out of the group's baseline, advantage 0, never a success; "
                "counted in "
                "reward_none_frac); make sure at least one function scores every completion"
            )
        return totals, values


def raised_at(error: BaseException, func) -> str | None:
    """`file:line` where `error` was raised in the user's code: the deepest frame in the file that
    defines `func`, else the deepest outside this module (None when there is no traceback)."""
    frames = traceback.extract_tb(error.__traceback__)
    while isinstance(func, functools.partial):
        func = func.func
    code = getattr(func, "__code__", None) or getattr(
        getattr(func, "__call__", None), "__code__", None
    )
    own = Path(code.co_filename).resolve() if code is not None else None
    here = Path(__file__).resolve()
    mine = [f for f in frames if own is not None and Path(f.filename).resolve() == own]
    others = [f for f in frames if Path(f.filename).resolve() != here]
    frame = (mine or others or [None])[-1]
    return None if frame is None else f"{frame.filename}:{frame.lineno}"


async def _awaited(awaitable):
    return await awaitable


def _raises(call) -> bool:
    try:
        call()
    except Exception:  # noqa: BLE001
        return True
    return False


def _number(value):
    """A value as TRL reads it: None and NaN are "no reward"; a Python, numpy or one-element tensor
    number is a float; anything else is None-valued (`False` returned: not a number)."""
    if value is None:
        return None
    if (
        not isinstance(value, numbers.Real)
        and callable(getattr(value, "item", None))
        and getattr(value, "ndim", 0) == 0
    ):
        try:
            value = value.item()
        except Exception:  # noqa: BLE001
            return False
    if not isinstance(value, numbers.Real):
        return False
    value = float(value)
    return None if math.isnan(value) else value


def _check(out, n: int, name: str, when: str) -> list:
    """The function's values as floats or None; one line naming the function and the index for
    anything else."""
    try:
        out = list(out)
    except TypeError:
        raise SystemExit(
            f"reward function {name} at {when}: returned {type(out).__name__}, not a list of "
            f"{n} numbers"
        ) from None
    if len(out) != n:
        raise SystemExit(
            f"reward function {name} at {when}: returned {len(out)} values for {n} completions"
        )
    clean = []
    for index, value in enumerate(out):
        number = _number(value)
        if number is False:
            raise SystemExit(
                f"reward function {name} at {when}: value {index} is {value!r:.80}, not a number "
                "or None"
            )
        if number is not None and not math.isfinite(number):
            raise SystemExit(
                f"reward function {name} at {when}: value {index} is {number}, not finite"
            )
        clean.append(number)
    return clean


def add_reward_funcs(task, args, log) -> None:
    """`task` scored by --reward_funcs in training and by --eval_reward_funcs (default: the same
    functions) in evaluation, instead of the built-in rewards; each set's trainer state filled."""
    task.reward_funcs = (
        RewardFuncs(args.reward_funcs, args.reward_weights, dtype=args.dtype)
        if args.reward_funcs
        else None
    )
    task.eval_reward_funcs = (
        RewardFuncs(args.eval_reward_funcs, None, "--eval_reward_funcs", args.dtype)
        if args.eval_reward_funcs
        else task.reward_funcs
    )
    for funcs in {id(f): f for f in (task.reward_funcs, task.eval_reward_funcs) if f}.values():
        funcs.fill_state(args, len(task.train), log)


def reward_metrics(accelerator, scored) -> dict:
    """A batch's `Scored.metrics` with functions' values: time_reward_s, rewards/<name>/mean and
    /std (sample std) over every rank's completions (TRL's names), leaving out those a function
    returned None for, reward_none_frac and each `log_metric` name (`logged_metrics`). Call on every
    rank."""
    from common.distributed.ranks import reduce_sums

    sums = {
        "seconds": scored.seconds,
        "none": sum(1 for ok in scored.scored if not ok),
        "n": len(scored.total),
    }
    for name, values in scored.values.items():
        given = [value for value in values if value is not None]
        sums.update(
            {
                f"{name}:n": len(given),
                f"{name}:sum": sum(given),
                f"{name}:sq": sum(v * v for v in given),
            }
        )
    sums = reduce_sums(accelerator, sums)
    out = {"time_reward_s": sums["seconds"] / accelerator.num_processes}
    for name in scored.values:
        count = sums[f"{name}:n"]
        mean = sums[f"{name}:sum"] / count if count else None
        out[f"rewards/{name}/mean"] = mean
        # the sample std (Bessel's correction), as TRL logs it; None below two values
        out[f"rewards/{name}/std"] = (
            math.sqrt(max(0.0, (sums[f"{name}:sq"] - count * mean**2) / (count - 1)))
            if count > 1
            else None
        )
    out.update(
        reward_none_frac=sums["none"] / max(1.0, sums["n"]),
        **logged_metrics(accelerator, scored.logged),
    )
    return out


def logged_metrics(accelerator, logged: dict[str, list[float]]) -> dict:
    """`log_metric`'s values as reward_fn/<name>: each name's mean over every rank's calls (call on
    every rank)."""
    from common.distributed.ranks import gather_list, reduce_sums

    # every rank: the same names, in one order
    names = sorted(set(gather_list(accelerator, sorted(logged))))
    sums = {}
    for name in names:
        sums.update(
            {f"{name}:n": len(logged.get(name, [])), f"{name}:sum": sum(logged.get(name, []))}
        )
    sums = reduce_sums(accelerator, sums)
    return {
        f"reward_fn/{name}": sums[f"{name}:sum"] / sums[f"{name}:n"] if sums[f"{name}:n"] else None
        for name in names
    }


def join_logs(parts: list) -> tuple[dict, dict]:
    """Several batches' `log_metric` values and `log_extra` columns as one batch's (a column is None
    where a batch did not log it, so that it stays aligned with the completions)."""
    logged, extra = {}, {}
    for part in parts:
        for name, values in part.logged.items():
            logged.setdefault(name, []).extend(values)
    for column in {column for part in parts for column in part.extra}:
        extra[column] = [
            value
            for part in parts
            for value in (list(part.extra.get(column, [])) + [None] * len(part.total))[
                : len(part.total)
            ]
        ]
    return logged, extra


def call_reward_funcs(
    funcs: RewardFuncs,
    texts: list[str],
    rows: list[dict],
    completion_ids: list,
    prompt_column: str,
    step: int | None,
) -> tuple[list[float], dict[str, list]]:
    """`funcs` on completions `texts` (`rows[i]`: the dataset row of completion i's prompt) with
    TRL's keywords: the prompt column as `prompts`, completions as text or, for message prompts, as
    one assistant message."""
    prompts = [row.get(prompt_column) for row in rows]
    completions = [
        [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
        for prompt, text in zip(prompts, texts)
    ]
    dropped = (prompt_column, *TRL_DROPPED, *TRL_KEYWORDS)
    keys = [key for key in (rows[0] if rows else {}) if key not in dropped]
    columns = {key: [row.get(key) for row in rows] for key in keys}
    return funcs(prompts, completions, [list(ids) for ids in completion_ids], columns, step)
