"""Your environment class (`--environment PATH.py:ClassName` or `package.module:ClassName`), called
through one of two conventions (docs/custom_env.md):

- the text protocol: `reset(**row) -> str` (the first observation), `step(action) -> (observation,
  reward, done)`, optional `snapshot() -> state` and `restore(state)` (prefix replay uses them);
- TRL's `environment_factory` convention (a class without `step`): `reset(**row) -> str | None`,
  public methods the model calls as tools through the chat template (each needs the type hints and
  docstring its JSON schema is built from: checked when the class is loaded), optional
  `get_reward()`; an `async def` tool or get_reward is awaited, as TRL awaits them.

Every call of your code goes through `Environment`: what it raises becomes an `EnvFault` with one
line naming the exception and the file:line in your file (that episode ends, marked `env_error`,
and is left out of the update); a call that returns the wrong type stops the run with one line
naming the class and what it returned.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import json
import numbers
import os
import sys
import traceback
from pathlib import Path

from common.tasks.user_code import import_named

# set (to anything but "" or "0") to print the whole traceback of an environment that raises
TRACEBACK_ENV = "RLVR_ENV_TRACEBACK"
# methods of a TRL-convention class that are not tools (TRL leaves out reset and get_reward; the
# text protocol's replay methods are not tools either)
NOT_TOOLS = ("reset", "get_reward", "step", "snapshot", "restore")


class EnvFault(Exception):
    """Your environment raised during one episode; `str()` is the one line that says so, `key`
    what the same fault shares (the method, the exception's type and where it was raised), `short`
    the fault alone (what raised what, and where), without the line's notes."""

    def __init__(self, line: str, key: tuple = (), short: str = ""):
        super().__init__(line)
        self.key = key or (line,)
        self.short = short or line


def load_class(spec: str, flag: str = "--environment"):
    """`path/to/file.py:ClassName` or `package.module:ClassName` -> the class (one line naming the
    spec on failure)."""
    form = "`path/to/file.py:ClassName` or `package.module:ClassName`"
    module, target, name = import_named(spec, flag, form, "rlvr_env")
    cls = getattr(module, name, None)
    if not inspect.isclass(cls):
        raise SystemExit(f"{flag} {spec}: {target} has no class {name}{nearest(module, name)}")
    return cls


def nearest(module, name: str) -> str:
    """The refusal's hint: the classes defined in `module` nearest to `name`, else all of them."""
    import difflib

    classes = [
        key
        for key, value in vars(module).items()
        if inspect.isclass(value) and value.__module__ == module.__name__
    ]
    near = difflib.get_close_matches(name, classes, n=3, cutoff=0.6)
    if near:
        return f"; the nearest {'is' if len(near) == 1 else 'are'} {', '.join(near)}"
    return f"; its classes: {', '.join(classes)}" if classes else "; it defines no class"


def raised_at(error: BaseException, file: str | None) -> str | None:
    """`file:line` where `error` was raised: the deepest frame in `file` (the class's own file),
    else the deepest frame outside this package (None without a traceback)."""
    frames = traceback.extract_tb(error.__traceback__)
    here = Path(__file__).resolve().parent
    own = Path(file).resolve() if file else None
    mine = [f for f in frames if own is not None and Path(f.filename).resolve() == own]
    others = [f for f in frames if Path(f.filename).resolve().parent != here]
    frame = (mine or others or [None])[-1]
    return None if frame is None else f"{frame.filename}:{frame.lineno}"


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class Environment:
    """One environment class behind one interface: `new()` builds an instance (one per episode),
    then `reset`, `step` (text protocol) or `tool_calls` (TRL's convention), `snapshot` /
    `restore` and `reward`, each with the faults and the type checks of the module's docstring.

    `factory` builds an instance with no arguments (the class itself, or a `functools.partial` of
    it, as the embedded demo does); `name` is what the reward is logged under (TRL: the class's
    name)."""

    def __init__(self, factory, name: str | None = None):
        cls = factory
        while isinstance(cls, functools.partial):
            cls = cls.func
        self.factory, self.cls = factory, cls
        self.name = name or cls.__name__
        try:
            self.file = inspect.getsourcefile(cls)
        except TypeError:  # a class without a source file (built-in)
            self.file = None
        if not callable(getattr(cls, "reset", None)):
            raise SystemExit(f"environment {self.name}: no method reset(**row)")
        self.text = callable(getattr(cls, "step", None))
        self.restores = callable(getattr(cls, "snapshot", None)) and callable(
            getattr(cls, "restore", None)
        )
        # the text protocol's optional keyword: the policy ended its turn with an end token
        self.step_takes_final = self.text and "final" in inspect.signature(cls.step).parameters
        self.tool_names = [
            member
            for member, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if member not in NOT_TOOLS and not member.startswith("_")
        ]
        self.has_reward = callable(getattr(cls, "get_reward", None))
        if not self.text and not self.tool_names:
            raise SystemExit(
                f"environment {self.name}: neither step(action) (the text protocol) nor public "
                "tool methods (TRL's environment_factory convention)"
            )
        # TRL's convention: each tool's JSON schema, what the chat template's `tools` renders
        self.schemas = [] if self.text else [self._schema(name) for name in self.tool_names]
        self.traceback = os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
        self._loop = None  # one event loop for the async tools and get_reward, made on first use

    def _schema(self, tool: str) -> dict:
        """A tool's JSON schema as transformers builds it from the method (its type hints and
        docstring); one line naming the method when it cannot."""
        from transformers.utils import get_json_schema

        try:
            return get_json_schema(getattr(self.cls, tool))
        except Exception as error:  # noqa: BLE001 - transformers' reason, in one line
            raise SystemExit(
                f"environment {self.name}: tool method {self.name}.{tool} has no usable schema: "
                f"{error} (a tool needs a type hint per argument and a docstring with a summary "
                "and an `Args:` line per argument; "
                f"a method that is not a tool: name it _{tool})"
            ) from None

    def _awaited(self, value):
        """`value`, awaited when it is awaitable (an `async def` tool or get_reward, as TRL awaits
        them)."""
        if not inspect.isawaitable(value):
            return value
        if self._loop is None:
            self._loop = asyncio.new_event_loop()

        async def wait():
            return await value

        return self._loop.run_until_complete(wait())

    # ---------------- calls of your code ----------------
    def _call(self, what: str, function, *args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the user's code: one line, the episode ends
            place = raised_at(error, self.file)
            key = (what, type(error).__name__, place)
            short = f"{self.name}.{what} raised {type(error).__name__}: {error}" + (
                f" (at {place})" if place else ""
            )
            raise EnvFault(self.fault_line(what, error), key, short) from error

    def fault_line(self, what: str, error: BaseException) -> str:
        """The one line of an exception your code raised in `what` (the traceback too with
        RLVR_ENV_TRACEBACK=1)."""
        if self.traceback:
            traceback.print_exception(error, file=sys.stderr)
        place = raised_at(error, self.file)
        notes = ([f"at {place}"] if place else []) + (
            [] if self.traceback else [f"{TRACEBACK_ENV}=1 prints the traceback"]
        )
        return (
            f"environment {self.name}.{what} raised {type(error).__name__}: {error} "
            f"({'; '.join(notes)}; said once, each such episode counts in env_errors)"
        )

    def _wrong(self, what: str, got, expected: str):
        raise SystemExit(
            f"environment {self.name}.{what} returned {_shown(got)} ({type(got).__name__}); "
            f"expected {expected}"
        )

    def new(self):
        """A fresh instance (built with no arguments)."""
        return self._call("__init__", self.factory)

    def reset(self, instance, row: dict) -> str | None:
        """The first observation: a `str` (TRL's convention: a `str` or None). The instance gets
        its own copy of the row's values, as a fresh read of the dataset would give it: what it
        changes in them (`self.items = items`, then appending) reaches no other episode, no later
        step and no reward function."""
        observation = self._call("reset", instance.reset, **copy.deepcopy(row))
        if isinstance(observation, str) or (observation is None and not self.text):
            return observation
        return self._wrong("reset", observation, "a str" if self.text else "a str or None")

    def step(self, instance, action: str, final: bool) -> tuple[str, float, bool]:
        """The text protocol's step, checked: (observation: str, reward: a number, done: bool)."""
        keywords = {"final": final} if self.step_takes_final else {}
        out = self._call("step", instance.step, action, **keywords)
        expected = "(observation: str, reward: float, done: bool)"
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            self._wrong("step", out, expected)
        observation, reward, done = out
        if not isinstance(observation, str):
            self._wrong(
                "step", out, expected + f": the observation is a {type(observation).__name__}"
            )
        if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
            self._wrong("step", out, expected + f": the reward is a {type(reward).__name__}")
        if not isinstance(done, bool) and type(done).__name__ != "bool_":  # numpy's bool too
            self._wrong("step", out, expected + f": done is a {type(done).__name__}")
        return observation, float(reward), bool(done)

    def snapshot(self, instance):
        return self._call("snapshot", instance.snapshot)

    def restore(self, instance, state) -> None:
        self._call("restore", instance.restore, state)

    def reward(self, instance) -> float | None:
        """TRL's convention: get_reward() when the class has it (None: no reward of its own)."""
        if not self.has_reward:
            return None
        value = self._call("get_reward", lambda: self._awaited(instance.get_reward()))
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            self._wrong("get_reward", value, "a float")
        return float(value)

    # ---------------- TRL's convention: tools ----------------
    def tool_calls(self, instance, calls: list[dict]) -> tuple[list[dict], int]:
        """Run the parsed tool calls in order (an `async def` tool awaited); a tool message each, as
        TRL builds them: an unknown tool or a tool that raises answers {"error": ...} (the episode
        goes on), a result is stringified. Returns (the messages, how many calls failed)."""
        messages, failures = [], 0
        for call in calls:
            function = call.get("function", call)
            name = function.get("name", "unknown")
            arguments = function.get("arguments") or {}
            if isinstance(arguments, str):  # some parsers leave the arguments as JSON text
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    arguments = None
            failed = True  # TRL's tools/failure_frequency: the calls answered with an error
            if call.get("type", "function") != "function":
                result = {"error": f"Unsupported tool call type: {call.get('type')}"}
            elif name not in self.tool_names:
                result = {"error": f"Tool {name} not found."}
            elif not isinstance(arguments, dict):
                result = {"error": f"Tool {name}: arguments are not a JSON object."}
            else:
                try:
                    result = self._awaited(getattr(instance, name)(**arguments))
                    failed = False
                except Exception as error:  # noqa: BLE001 - TRL answers the model with the error
                    result = {"error": str(error)}
            failures += failed
            messages.append({"role": "tool", "name": name, "content": str(result)})
        return messages, failures
