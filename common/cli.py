"""Command line from an `Args` dataclass: every field is a `--flag` and the string literal under it (CleanRL's
convention, read with `ast`) its help, so a flag, its default, its meaning and what it accepts (`Annotated[int,
Range(1)]`, common/ranges.py: checked right after parsing, shown in the help) are written in one place.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import sys
import textwrap
import typing

from common.ranges import declared, refusal


def field_docs(cls) -> dict[str, str]:
    """{field: docstring} for a dataclass and its bases (a subclass's docstring wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        try:
            src = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(src).body[0].body
        for node, nxt in zip(body, body[1:] + [None]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _str2bool(v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "y", "on"):
        return True
    if v.lower() in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


def build_parser(cls, description: str = "") -> argparse.ArgumentParser:
    docs = field_docs(cls)
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints, ranges = typing.get_type_hints(cls), declared(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        origin, targs = typing.get_origin(hint), typing.get_args(hint)
        optional = origin is typing.Union and type(None) in targs
        if optional:
            hint = next(a for a in targs if a is not type(None))
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        accepts = f" [{ranges[f.name]}]" if ranges[f.name] else ""
        # argparse %-formats every help string (for `%(default)s`): a docstring's own `%` is escaped
        kw: dict = {"default": default, "help": (docs.get(f.name, "") + accepts).replace("%", "%%")}
        if hint is bool:
            kw.update(type=_str2bool, nargs="?", const=True, metavar="BOOL")
        elif typing.get_origin(hint) is typing.Literal:
            kw.update(choices=list(typing.get_args(hint)), type=type(typing.get_args(hint)[0]))
        elif typing.get_origin(hint) is list:
            kw.update(nargs="*", type=typing.get_args(hint)[0])
        else:
            kw.update(type=hint)
        parser.add_argument(f"--{f.name}", **kw)
    return parser


def parse_args(cls, argv: list[str] | None = None, description: str = ""):
    """`cls` from the command line; `--config FILE` first sets defaults for any flag (command-line flags win)."""
    parser = build_parser(cls, description)
    argv = sys.argv[1:] if argv is None else list(argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    config = pre.parse_known_args(argv)[0].config
    if config:
        from common.config import load_config

        parser.set_defaults(**load_config(config, parser, cls))
    ns = parser.parse_args(argv)
    args = cls(**vars(ns))
    if getattr(args, "eval_train_prompts", 0) is None:  # recorded in args.json as the count used
        args.eval_train_prompts = args.eval_prompts
    for name, declaration in declared(cls).items():  # before anything is loaded or written
        why = refusal(declaration, getattr(args, name))
        if why:
            raise SystemExit(f"--{name} {getattr(args, name)}: {why}")
    if getattr(args, "use_vllm", False) and getattr(args, "cache_implementation", None):
        raise SystemExit(f"--cache_implementation {args.cache_implementation}: applies to HF generate only; vLLM "
                         "(--use_vllm) manages its own KV cache: drop one of the two flags")
    clash = [flag for flag in ("use_vllm", "fsdp", "cache_implementation") if getattr(args, flag, None)]
    if getattr(args, "torch_compile", False) and clash:  # vLLM compiles its own; FSDP and a cache of the user's:
        raise SystemExit(f"--torch_compile: not with --{clash[0]} (it compiles HF generate's decoding step on a "
                         "static KV cache of its own, on whole weights): drop one of the two flags")
    if hasattr(args, "validate"):
        args.validate()
    return args
