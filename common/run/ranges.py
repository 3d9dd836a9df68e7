"""A flag's accepted values, declared beside it (`Annotated[int, Range(1)]`): checked right after
parsing (common/run/flags.py) and for every value a `--config` file or a TRL name gives
(common/run/flag_sources.py), and shown in `--help`."""

from __future__ import annotations

import dataclasses
import math
import typing


@dataclasses.dataclass(frozen=True)
class Range:
    """lo <= value <= hi (None: no bound; `lo_open` / `hi_open`: strict); `zero`, when given, is
    what 0 means, and 0 is then accepted too (`Range(1, zero="off")`: 0 or >= 1)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    zero: str = ""

    def accepts(self, value) -> bool:
        if value is None or (self.zero and value == 0):  # None: an Optional flag's default
            return True
        above = self.lo is None or value > self.lo or (value == self.lo and not self.lo_open)
        below = self.hi is None or value < self.hi or (value == self.hi and not self.hi_open)
        return math.isfinite(value) and above and below

    def __str__(self) -> str:
        lo, hi = (None if bound is None else f"{bound:g}" for bound in (self.lo, self.hi))
        if lo and hi:
            text = f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        elif lo:
            text = f"{'>' if self.lo_open else '>='} {lo}"
        elif hi:
            text = f"{'<' if self.hi_open else '<='} {hi}"
        else:
            text = "finite"
        return text + (f"; 0 = {self.zero}" if self.zero else "")


def declared(cls) -> dict[str, Range | None]:
    """{field: its Range, or None} for every field of the dataclass `cls` (`Annotated[type,
    Range(...)]`)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {
        f.name: next(
            (m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Range)), None
        )
        for f in dataclasses.fields(cls)
    }


def refusal(declaration: Range | None, value) -> str | None:
    """Why `value` is refused ("must be ..."), or None when it is accepted."""
    if isinstance(value, float) and not math.isfinite(value):  # inf or nan, whatever the range
        return "must be a finite number" + (f" {declaration}" if declaration is not None else "")
    if declaration is not None and not declaration.accepts(value):
        return f"must be {declaration}"
    return None
