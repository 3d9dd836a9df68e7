"""`--config FILE`: flag values from YAML or JSON (a run's args.json works), checked like the command line.
Loaded only when a config is given."""
from __future__ import annotations

import argparse
import typing
from pathlib import Path

from common.ranges import declared, refusal


def load_config(path: str, parser: argparse.ArgumentParser, cls) -> dict:
    """Flag values from a YAML/JSON file (a run's args.json works), checked like the command line: every key must
    be a flag, every value of the flag's type, among its choices and in its declared range; errors name the file and
    the key."""
    import yaml  # PyYAML (a dependency of transformers and accelerate); JSON is YAML

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"--config {path}: cannot read it ({e})") from None
    if not isinstance(data, dict):
        raise SystemExit(f"--config {path}: expected a mapping of flag names to values, got {type(data).__name__}")
    actions = {action.dest: action for action in parser._actions if action.dest != "help"}
    hints = typing.get_type_hints(cls)
    optional = {name for name, hint in hints.items() if type(None) in typing.get_args(hint)}  # Optional[...] flags
    ranges = declared(cls)
    values = {}
    for key, value in data.items():
        where = f"--config {path}: key {key!r}"
        if key == "resumes":  # a saved args.json's record of flag changes at resumes: not a flag
            continue
        if key not in actions:
            raise SystemExit(f"{where} is not a flag of this script (see --help)")
        if key == "config":  # a saved args.json names the config it was made from; it is not followed
            continue
        action = actions[key]
        if value is None:
            if key not in optional:
                raise SystemExit(f"{where}: null is not allowed (the flag has a default of {action.default!r})")
        elif action.nargs == "*":
            if not isinstance(value, list):
                raise SystemExit(f"{where}: expected a list, got {type(value).__name__}")
            value = [_convert(where, action.type, item, False) for item in value]
        else:
            value = _convert(where, action.type, value, bool in (hints[key], *typing.get_args(hints[key])))
            if action.choices is not None and value not in action.choices:
                raise SystemExit(f"{where}: {value!r} is not one of {list(action.choices)}")
            why = refusal(ranges[key], value)
            if why:
                raise SystemExit(f"{where}: {value!r} {why}")
        values[key] = value
    return values


def _convert(where: str, kind, value, is_bool: bool):
    """A YAML value for a flag parsed by `kind`: strings go through the flag's own parser (YAML reads 1e-6 as a
    string, for one), other YAML types must already fit the flag."""
    fits = (bool,) if is_bool else {str: (str,), int: (int,), float: (int, float)}.get(kind, ())
    name = "true/false" if is_bool else getattr(kind, "__name__", str(kind))
    if isinstance(value, bool) and not is_bool or not isinstance(value, (str, *fits)):
        hint = " (quote it)" if kind is str else ""
        raise SystemExit(f"{where}: expected {name}, got the YAML {type(value).__name__} {value!r}{hint}")
    if not isinstance(value, str):
        return float(value) if kind is float else value
    try:
        return kind(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise SystemExit(f"{where}: {value!r} is not a valid {name} ({e})") from None
