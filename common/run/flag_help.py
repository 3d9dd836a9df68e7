"""`--help`: each flag's docstring (read with `ast`, CleanRL's convention) and its accepted values,
the method's own flags first, then each group of common/run/flags.py. Loaded only when the help is
shown."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import textwrap

from common.run.ranges import declared


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's, with lines broken at spaces only: a path or a name with a hyphen stays whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def documented_parser(shown, arguments: dict, script: str, base: type) -> argparse.ArgumentParser:
    """`shown` (common/run/flags.py `build_parser`, with its defaults as they are now) again with
    each flag's help text, in the groups `--help` shows; `arguments`: its add_argument keywords,
    `script`: the file of its class, `base`: the class every group of flags derives from."""
    cls = shown.flags_class
    parser = argparse.ArgumentParser(description=shown.description, formatter_class=_Formatter)
    docs, ranges = field_docs(cls), declared(cls)
    defaults = {action.dest: action.default for action in shown._actions}
    group_of = {}
    for title, about, names in flag_groups(cls, script, base):
        group = parser.add_argument_group(title, about)
        group_of.update(dict.fromkeys(names, group))
    for name, kw in arguments.items():
        about, default = docs.get(name, ""), defaults[name]
        if default is None or default == "":  # no value: its docstring says what the run then does
            about, default = worded_default(about, default)
        accepts = f" [{ranges[name]}]" if ranges[name] else ""
        # argparse %-formats every help string (for `%(default)s`): a docstring's own `%` is escaped
        kw.update(default=default, help=(about + accepts).replace("%", "%%"))
        group_of.get(name, parser).add_argument(f"--{name}", **kw)
    return parser


def worded_default(about: str, default):
    """(the docstring without it, the words) of a docstring's `(default: words)`, which `--help`
    shows last, where a flag with a value shows that value; (about, default) when it has none."""
    start = about.find("(default: ")
    if start < 0:
        return about, default
    depth = 0
    for end in range(start, len(about)):
        depth += {"(": 1, ")": -1}.get(about[end], 0)
        if depth == 0:
            break
    else:
        return about, default
    words = about[start + len("(default: ") : end]
    rest = (about[:start].rstrip() + " " + about[end + 1 :].lstrip()).strip()
    return re.sub(r" ([;,.:])", r"\1", rest), words


def field_docs(cls) -> dict[str, str]:
    """{field: docstring} for a dataclass and its bases (a subclass's docstring wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object:
            docs.update(_own_docs(klass))
    return docs


@functools.lru_cache(maxsize=None)
def _own_docs(klass) -> dict[str, str]:
    """{field: docstring} of the fields `klass` itself declares (read once a class: finding a
    class's source parses its whole file)."""
    try:
        src = textwrap.dedent(inspect.getsource(klass))
    except (OSError, TypeError):
        return {}
    body = ast.parse(src).body[0].body
    return {
        node.target.id: " ".join(nxt.value.value.split())
        for node, nxt in zip(body, body[1:] + [None])
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(nxt, ast.Expr)
        and isinstance(getattr(nxt, "value", None), ast.Constant)
        and isinstance(nxt.value.value, str)
    }


def flag_groups(cls, script: str, base: type) -> list[tuple[str, str, list[str]]]:
    """(title, description, fields) of each group of `cls`'s flags, as `--help` shows them: the
    method's own (the fields `cls` declares itself) first, then each group class it composes, in
    the order of its class line (a group's docstring is `title: description`). `--config` is in no
    group: argparse's own `options` show it beside `--help`."""
    owners: dict[type, list[str]] = {}
    for f in dataclasses.fields(cls):
        owner = next(k for k in cls.__mro__ if f.name in k.__dict__.get("__annotations__", {}))
        owners.setdefault(owner, []).append(f.name)
    groups = []
    for klass in cls.__mro__:
        if klass is base or klass not in owners:
            continue
        if not issubclass(cls, base):
            # a tool's own dataclass (the benchmarks'): its flags, not a method's
            title, about = script, "its flags"
        elif klass is cls or not issubclass(klass, base):
            title, about = f"method ({script})", "the method's own flags"
        else:
            title, _, about = (klass.__doc__ or klass.__name__).partition(": ")
        groups.append((title, " ".join(about.split()), owners[klass]))
    return groups
