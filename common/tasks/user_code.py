"""The user's own code named on the command line (`path/to/file.py:name` or `package.module:name`),
imported for --reward_funcs and --environment; a failure is one line naming the flag."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def import_named(spec: str, flag: str, form: str, prefix: str):
    """(the module `spec` names, imported; the module's text; the name after the colon). `form` is
    the shape a refusal shows; `prefix` names a file's module."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise SystemExit(f"{flag} {spec!r}: expected {form}")
    try:
        if target.endswith(".py") or "/" in target or "\\" in target:
            path = Path(target)
            if not path.is_file():
                raise SystemExit(f"{flag} {spec}: file {target} not found")
            # one module name per file: two files with the same stem do not replace each other
            module_name = f"{prefix}_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - whatever the user's module raises on import
        raise SystemExit(
            f"{flag} {spec}: cannot import {target} ({type(error).__name__}: {error})"
        ) from None
    return module, target, name
