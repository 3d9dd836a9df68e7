"""Reading the committed runs: every `<config>/seed<k>/` of a runs folder (its metrics.jsonl rows and bench.json),
the harness settings each run records, and the two data regimes a config's name maps to (the sweep's 256-prompt
pool and run.py's `_pool2048` twins) with the baseline each config is measured against in each."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from benchmarks.sweep import run as run_mod
from benchmarks.sweep.configs import BY_NAME
from benchmarks.sweep.run_dirs import is_finished, read_rows

ROOT = Path(__file__).resolve().parents[3]
RUNS_DIR = ROOT / "benchmarks" / "sweep" / "runs"
# the second testbed: the word-problem task's sweep (run.py --task benchmarks/sweep/tasks/word_problems.yaml)
WORD_RUNS_DIR = ROOT / "benchmarks" / "sweep" / "runs-word_problems"
WORD_RESULTS = "benchmarks/sweep/results/word_problems/README.md"
# the same task with TRL-style reward functions (tasks/word_problems_funcs.yaml), where the reward modes differ
WORD_FUNCS_RUNS_DIR = ROOT / "benchmarks" / "sweep" / "runs-word_problems_funcs"
WORD_FUNCS_RESULTS = "benchmarks/sweep/results/word_problems_funcs/README.md"


@dataclass
class RunData:
    config: str
    seed: int
    rows: list[dict]
    max_steps: int
    finished: bool
    meta: dict


def flag_value(cmd: list[str], name: str) -> Optional[str]:
    """The value after flag `name` in a command line, None when absent."""
    return cmd[cmd.index(name) + 1] if name in cmd and cmd.index(name) + 1 < len(cmd) else None


def load_runs(runs_dir: Path) -> dict[str, dict[int, RunData]]:
    """{config: {seed: RunData}} for every `<config>/seed<k>/metrics.jsonl` under runs_dir."""
    out: dict[str, dict[int, RunData]] = {}
    for seed_dir in sorted(Path(runs_dir).glob("*/seed*")):
        if not seed_dir.is_dir() or not seed_dir.name[4:].isdigit():
            continue
        rows = read_rows(seed_dir)
        meta_path = seed_dir / "bench.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        max_steps = flag_value(meta.get("cmd", []), "--max_steps")
        max_steps = (
            int(max_steps) if max_steps else max((r.get("step", 0) for r in rows), default=0)
        )
        cfg = seed_dir.parent.name
        out.setdefault(cfg, {})[int(seed_dir.name[4:])] = RunData(
            cfg,
            int(seed_dir.name[4:]),
            rows,
            max_steps,
            bool(rows) and is_finished(rows, max_steps),
            meta,
        )
    return out


def recorded_settings(run: RunData) -> Optional[run_mod.Settings]:
    """The harness settings a run was made with (its bench.json; fields it predates take run.py's defaults)."""
    st = run.meta.get("settings")
    if not st:
        return None
    known = {f.name for f in dataclasses.fields(run_mod.Settings)}
    return run_mod.Settings(**{**{k: v for k, v in st.items() if k in known}, "seeds": [run.seed]})


# ----------------------------------------------------------------------------------------------------
# The two data regimes: the sweep's 256-prompt pool and the 2,048-prompt pool (run.py's `_pool2048` twins)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Regime:
    """A data regime: every claim is judged in each, on its configs' twins there (run.py's `on_pool2048`)."""

    label: str  # as the page prints it
    suffix: str  # a 256-pool config's name plus this is its twin's

    def name(self, cfg: str) -> Optional[str]:
        """The config that `cfg` (a 256-pool name) stands for in this regime; None when the harness has none."""
        twin = cfg + self.suffix
        return twin if twin in BY_NAME else None


POOL256, POOL2048 = Regime("256", ""), Regime("2,048", "_pool2048")
REGIMES = (POOL256, POOL2048)
WORD_PROBLEMS = Regime("word-problem", "")  # the second task: its own runs, one regime


def base_name(name: str) -> str:
    """A config's 256-pool name: its name less `_pool2048` (no config has it for a 2,048-only one)."""
    return name[: -len(POOL2048.suffix)] if name.endswith(POOL2048.suffix) else name


def page_baseline(r: Regime, b: str) -> Optional[str]:
    """The baseline a page's config `b` (a 256-pool name, or a 2,048-only one) is measured against in regime `r`:
    the regime's twin of the 256-pool config's baseline, so both pools compare like with like."""
    if b in BY_NAME:
        return r.name(BY_NAME[b].baseline) if BY_NAME[b].baseline else None
    name = r.name(b)
    return BY_NAME[name].baseline if name else None


def page_baselines(r: Regime, configs: tuple[str, ...]) -> set[str]:
    """The configs of a page that another of its configs is measured against in regime `r`."""
    return {page_baseline(r, b) for b in configs if r.name(b)} & {r.name(b) for b in configs}
