"""Re-making the runs: the `python benchmarks/sweep/run.py ...` commands that build each committed run's recorded
command from the settings in its bench.json (the results page and docs/benchmark.md list them)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Optional

from benchmarks.sweep import run as run_mod
from benchmarks.sweep.configs import BY_NAME
from benchmarks.sweep.report.load import RUNS_DIR, RunData, recorded_settings


def runner_flags(s: run_mod.Settings) -> list[str]:
    """The benchmarks/sweep/run.py flags, besides --only and --seeds, that give settings `s` (run.py's defaults left
    out)."""
    defaults = run_mod.resolve(run_mod.Args())[0]
    out = []
    for f in dataclasses.fields(run_mod.Settings):
        value, default = getattr(s, f.name), getattr(defaults, f.name)
        if f.name == "seeds" or value == default:
            continue
        out += [f"--{f.name}", shlex.join(value) if f.name == "extra" else str(value)]
    return out


def rerun_commands(
    runs: dict[str, dict[int, RunData]],
    names: Optional[list[str]] = None,
    runs_dir: Optional[Path] = None,
) -> tuple[list[str], list[str]]:
    """(commands, problems): the `python benchmarks/sweep/run.py ...` lines that re-make the finished runs of `names`
    (default all) into `runs_dir`, one per set of configs sharing seeds and settings, built from each run's
    bench.json; problems: the runs whose recorded command is not what run.py builds from those settings (or that
    record none)."""
    groups: dict[tuple, list[str]] = {}
    problems = []
    for cfg in (n for n in (names or list(runs)) if n in runs):
        by_flags: dict[tuple, list[int]] = {}
        for seed, r in sorted(runs[cfg].items()):
            if not r.finished:
                continue
            s = recorded_settings(r)
            built = None
            if s is not None and cfg in BY_NAME:
                out_dir = run_mod._portable(Path(runs_dir or RUNS_DIR) / cfg / f"seed{seed}")
                built = run_mod.build_command(BY_NAME[cfg], s, seed, out_dir)
            if built is None or built != r.meta.get("cmd"):
                problems.append(f"{cfg} seed {seed}")
                continue
            by_flags.setdefault(tuple(runner_flags(s)), []).append(seed)
        for flags, seeds in by_flags.items():
            groups.setdefault((tuple(seeds), flags), []).append(cfg)
    commands = [
        shlex.join(
            [
                "python",
                "benchmarks/sweep/run.py",
                "--only",
                ",".join(cfgs),
                "--seeds",
                *map(str, seeds),
                *flags,
            ]
        )
        for (seeds, flags), cfgs in groups.items()
    ]
    return commands, problems


def commands_text(
    runs: dict[str, dict[int, RunData]],
    names: Optional[list[str]] = None,
    runs_dir: Optional[Path] = None,
) -> str:
    commands, problems = rerun_commands(runs, names, runs_dir)
    text = "```bash\n" + "\n".join(commands) + "\n```\n" if commands else "No finished runs.\n"
    if problems:
        text += (
            "Recorded commands that run.py would not build from their settings (re-make by hand from their "
            "bench.json): " + ", ".join(problems) + "\n"
        )
    return text
