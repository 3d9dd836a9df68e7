"""Flag values from elsewhere than the script's own flags: a `--config` YAML or JSON file and TRL
GRPOConfig names typed on the command line, both read through common/run/trl_config.py's table and
checked as the command line checks a flag, and the line naming each word argparse did not take.
common/run/flags.py `parse_args` loads it only for one of these."""

from __future__ import annotations

import argparse
import difflib
import os
import typing
from pathlib import Path

from common.run.ranges import declared, refusal
from common.run.trl_config import TABLE, left_out_defaults, translate


def trl_names(argv: list[str], own: set[str]) -> tuple[list[str], dict]:
    """(argv without them, {name: value}) for the TRL GRPOConfig names in `argv` that are not the
    script's own flags (`own`); common/run/flags.py `trl_flags` says how they are read."""
    rest, found, i = [], {}, 0
    while i < len(argv):
        name, eq, text = argv[i].partition("=")
        key = name[2:] if name.startswith("--") else ""
        if key not in TABLE or key in own:
            rest.append(argv[i])
            i += 1
            continue
        values, i = ([text] if eq else []), i + 1
        while not eq and i < len(argv) and not _looks_like_flag(argv[i]):
            values.append(argv[i])
            i += 1
        read = [_cli_value(v) for v in values]
        found[key] = True if not read else read[0] if len(read) == 1 else read
    return rest, found


def _looks_like_flag(token: str) -> bool:
    if not token.startswith("-"):
        return False
    try:
        float(token)  # a negative number is a value
        return False
    except ValueError:
        return True


def _cli_value(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def unknown_flags(parser, extras: list[str], script: str, trl_names: bool) -> list[str]:
    """A line for each command-line word argparse did not take: a flag `script` does not have,
    named with the nearest one it has (or, for a script's flags, `trl_names`, the nearest TRL
    GRPOConfig name)."""
    names = [s[2:] for action in parser._actions for s in action.option_strings if s[:2] == "--"]
    if trl_names:
        names += [key for key in TABLE if key not in names]
    lines = []
    for i, word in enumerate(extras):
        if not _looks_like_flag(word):
            if i == 0 or not _looks_like_flag(extras[i - 1]):
                lines.append(f"{word}: not a flag (flags start with --; --help lists every flag)")
            continue
        name = word.split("=")[0].lstrip("-")
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f"; the nearest is --{near[0]}" if near else " (--help lists every flag)"
        trl = " nor a TRL GRPOConfig name" if trl_names else ""
        lines.append(f"--{name}: not a flag of {script}{trl}{hint}")
    return lines


def command_line_trl(
    typed: dict, parser, cls, problems: list[str], known: dict, own: set, from_config: dict
) -> dict:
    """{flag: value} of the TRL names typed on the command line, through the --config table
    (common/run/trl_config.py), checked like the flags; the run's first lines say what each
    became. Each value is set in `known` (the parsed flags) unless the command line sets that flag
    itself (`own`): a different value there is a problem."""
    given = own | set(from_config)
    settings, notes, refused = translate(
        typed, cls, "the command line", where=lambda key: f"--{key}", known=known, given=given
    )
    problems += refused
    if os.environ.get("RANK", "0") == "0":
        for note in notes:
            print(note, flush=True)
    values = check_settings(settings, parser, cls, problems, None, True, _SetBy())
    for flag, value in values.items():
        if flag not in own:
            known[flag] = value
        elif known[flag] != value:
            problems.append(
                f"--{values.source[flag]} and --{flag} set --{flag} to {value!r} and "
                f"{known[flag]!r}: keep one"
            )
    return values


class _SetBy(dict):
    """A dict of flag values that remembers which name set each one (`.source`)."""

    def __init__(self):
        super().__init__()
        self.source: dict[str, str] = {}


def load_config(
    path: str, parser: argparse.ArgumentParser, cls, problems=None, given=(), trl_keys=True
) -> dict:
    """Flag values from a YAML/JSON file (a run's args.json works, and a TRL GRPOConfig file: its
    keys through common/run/trl_config.py's table), checked like the command line: every key must
    be a flag, every value of the flag's type, among its choices and in its declared range; errors
    name the file and the key, every one of them (appended to `problems`, else raised together).
    `trl_keys`: a script's flags (a misspelt key may be named by its TRL spelling)."""
    import yaml  # PyYAML (a dependency of transformers and accelerate); JSON is YAML

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"--config {path}: cannot read it ({e})") from None
    if not isinstance(data, dict):
        raise SystemExit(
            f"--config {path}: expected a mapping of flag names to values, got "
            f"{type(data).__name__}"
        )
    found: list[str] = []
    # `given`: the flags the command line sets (they win over the file's keys)
    settings, notes, refused = translate(data, cls, f"--config {path}", given=given)
    defaults = left_out_defaults(data, cls, f"--config {path}", given)
    notes += [defaults] if defaults else []
    found += refused
    if os.environ.get("RANK", "0") == "0":  # the run's first lines, once a run
        for note in notes:
            print(note, flush=True)

    values = check_settings(settings, parser, cls, found, f"--config {path}", trl_keys)
    if problems is None and found:
        raise SystemExit("\n".join(found))
    if problems is not None:
        problems += found
    return values


def check_settings(
    settings, parser, cls, problems: list[str], file, trl_keys: bool, values=None
) -> dict:
    """{flag: value} of (name, flag, value) settings, each checked as the command line checks a
    flag (a flag of this script, of its type, among its choices, in its range); a line per problem
    is appended to `problems` and the setting left out. `file`: the `--config FILE` they come from
    (None: the command line); `trl_keys`: a misspelt key may be named by its TRL spelling."""

    def where(source: str, key: str) -> str:
        named = f"{file}: key {source!r}" if file else f"--{source}"
        return named + (f" (--{key})" if key != source else "")

    actions = {action.dest: action for action in parser._actions if action.dest != "help"}
    hints = typing.get_type_hints(cls)
    # Optional[...] flags
    optional = {name for name, hint in hints.items() if type(None) in typing.get_args(hint)}
    ranges = declared(cls)
    values = {} if values is None else values
    set_by = getattr(values, "source", {})
    for source, key, value in settings:
        if key == "resumes":  # a saved args.json's record of flag changes at resumes: not a flag
            continue
        if key not in actions:
            # TRL's keys are candidates too: a misspelt TRL key is named by its TRL spelling
            trl = [name for name in TABLE if name not in actions] if trl_keys else []
            near = difflib.get_close_matches(key, [*actions, *trl], n=1, cutoff=0.6)
            hint = ""
            if near:
                hint = f"; the nearest {'TRL key is ' if near[0] in trl else 'flag is --'}{near[0]}"
            problems.append(
                f"{where(source, key)} is not a flag of this script nor a TRL GRPOConfig key (see "
                f"--help and docs/custom_task.md){hint}"
            )
            continue
        # a saved args.json names the config it was made from; it is not followed
        if key == "config":
            continue
        try:
            value = _checked(where(source, key), actions[key], value, key in optional, hints[key])
            why = None if value is None else refusal(ranges[key], value)
            if why:
                raise SystemExit(f"{where(source, key)}: {value!r} {why}")
        except SystemExit as e:
            problems.append(str(e))
            continue
        if key in values and values[key] != value:  # two names, one flag
            first = set_by.get(key, key)
            both = f"{file}: keys {first!r} and {source!r}" if file else f"--{first} and --{source}"
            problems.append(f"{both} set --{key} to {values[key]!r} and {value!r}: keep one")
            continue
        values[key], set_by[key] = value, source
    return values


def _checked(where: str, action, value, optional: bool, hint):
    """A setting's value of the flag's type and among its choices (SystemExit naming it, if not)."""
    if value is None:
        if not optional:
            raise SystemExit(
                f"{where}: null is not allowed (the flag has a default of {action.default!r})"
            )
        return None
    if action.nargs == "*":
        if not isinstance(value, list):
            raise SystemExit(f"{where}: expected a list, got {type(value).__name__}")
        return [_convert(where, action.type, item, False) for item in value]
    value = _convert(where, action.type, value, bool in (hint, *typing.get_args(hint)))
    if action.choices is not None and value not in action.choices:
        raise SystemExit(f"{where}: {value!r} is not one of {list(action.choices)}")
    return value


def _convert(where: str, kind, value, is_bool: bool):
    """A YAML value for a flag parsed by `kind`: strings go through the flag's own parser (YAML
    reads 1e-6 as a string, for one), other YAML types must already fit the flag."""
    fits = (bool,) if is_bool else {str: (str,), int: (int,), float: (int, float)}.get(kind, ())
    name = "true/false" if is_bool else getattr(kind, "__name__", str(kind))
    if isinstance(value, bool) and not is_bool or not isinstance(value, (str, *fits)):
        hint = " (quote it)" if kind is str else ""
        raise SystemExit(
            f"{where}: expected {name}, got the YAML {type(value).__name__} {value!r}{hint}"
        )
    if not isinstance(value, str):
        return float(value) if kind is float else value
    try:
        return kind(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
        raise SystemExit(f"{where}: {value!r} is not a valid {name} ({e})") from None
