"""Turn the benchmark runs into `benchmarks/results/README.md` (table, mechanism metrics, paired differences to each
config's baseline with 95% intervals, a verdict per paper claim on each prompt pool) and PNG plots.

    python benchmarks/report.py                              # benchmarks/runs -> benchmarks/results
    python benchmarks/report.py --runs_dir benchmarks/runs-quick --out_dir benchmarks/results-quick

Every paper claim is judged in two data regimes: the sweep's 256-prompt pool and the 2,048-prompt pool (run.py's
`_pool2048` twins). Besides the page, the per-method learning curves go to docs/figures/<script>.png.
Only finished runs (final step with its evaluation) enter the table and plots; the others are listed.
Human commentary lives in `<out_dir>/commentary.md` and is pasted into the page (never overwritten).
Plots need matplotlib (`pip install -r benchmarks/requirements.txt`); without it the page is written
without them and says so.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
RUNS_DIR = ROOT / "benchmarks" / "runs"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import run as run_mod  # noqa: E402
from benchmarks.run import BY_NAME, CONFIGS, Config, is_finished, read_rows  # noqa: E402
from common.cli import parse_args  # noqa: E402


@dataclass
class Args:
    runs_dir: str = ""
    """the runs to report (default benchmarks/runs)"""
    out_dir: str = ""
    """where README.md and the PNGs go (default benchmarks/results)"""
    plots: bool = True
    """draw the PNG plots (needs matplotlib)"""
    figures_dir: str = ""
    """where the per-method learning curves <script>.png go (default docs/figures for the default --out_dir, else
    <out_dir>/figures, so a report on other runs leaves the docs' figures alone)"""
    write_docs: bool = False
    """only rewrite the generated blocks of the docs pages (each method page's results, the README's claim list) from
    benchmarks/runs, nothing else (a full report on benchmarks/runs into benchmarks/results rewrites them too)"""


# ----------------------------------------------------------------------------------------------------
# Reading runs
# ----------------------------------------------------------------------------------------------------


@dataclass
class RunData:
    config: str
    seed: int
    rows: list[dict]
    max_steps: int
    finished: bool
    meta: dict


def _flag(cmd: list[str], name: str) -> Optional[str]:
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
        max_steps = _flag(meta.get("cmd", []), "--max_steps")
        max_steps = int(max_steps) if max_steps else max((r.get("step", 0) for r in rows), default=0)
        cfg = seed_dir.parent.name
        out.setdefault(cfg, {})[int(seed_dir.name[4:])] = RunData(cfg, int(seed_dir.name[4:]), rows, max_steps,
                                                                  bool(rows) and is_finished(rows, max_steps), meta)
    return out


# ----------------------------------------------------------------------------------------------------
# Per-run series
# ----------------------------------------------------------------------------------------------------


def _num(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def step_walls(rows: list[dict]) -> dict[int, float]:
    """Training wall time of every step, held-out evaluation excluded: an evaluating row's time_step_s
    includes the evaluation, so it is replaced by its generation + training time plus the run's median
    book-keeping (time_step_s - gen - train on non-evaluating rows)."""
    train = [r for r in rows if r.get("step", 0) >= 1 and _num(r.get("time_step_s")) is not None]
    plain = [r for r in train if r.get("eval_pass@1") is None]
    over = [r["time_step_s"] - (r.get("time_gen_s") or 0.0) - (r.get("time_train_s") or 0.0) for r in plain]
    extra = statistics.median(over) if over else 0.0
    out = {}
    for r in train:
        if r.get("eval_pass@1") is None:
            out[r["step"]] = r["time_step_s"]
        else:
            out[r["step"]] = (r.get("time_gen_s") or 0.0) + (r.get("time_train_s") or 0.0) + max(0.0, extra)
    return out


LEVELS = ("easy", "mid", "hard")  # eval_pass@1_<level>: held-out pass@1 by difficulty level (newer runs only)


def _largest_k(row: dict) -> Optional[str]:
    """The largest k of the row's eval_pass@k (k > 1; eval_pass@1_<level> and eval_paper_* are not pass@k)."""
    ks = [int(key[10:]) for key in row if key.startswith("eval_pass@") and key[10:].isdigit() and key != "eval_pass@1"]
    return str(max(ks)) if ks else None


def eval_curve(rows: list[dict]) -> list[dict]:
    """One point per evaluation: step, pass@1 (all, and by difficulty level when logged), pass@k, pass@1 on
    training-pool prompts (None in runs that do not log it), cumulative generated tokens / samples / wall time."""
    walls = step_walls(rows)
    pts, tokens, samples = [], 0, 0
    for r in sorted(rows, key=lambda r: r.get("step", 0)):
        tokens = r.get("gen_tokens", tokens) or tokens
        samples = r.get("rollouts", samples) or samples
        if r.get("eval_pass@1") is None:
            continue
        k = _largest_k(r)
        pts.append({"step": r["step"], "pass1": float(r["eval_pass@1"]),
                    "passk": _num(r.get(f"eval_pass@{k}")) if k else None, "k": k,
                    **{level: _num(r.get(f"eval_pass@1_{level}")) for level in LEVELS},
                    "paper4": _num(r.get("eval_paper_pass@4")),  # ra_rloo.py: the RA-RLOO paper's own metric
                    "train1": _num(r.get("eval_train_pass@1")),  # the same evaluation on training-pool prompts
                    "gen_tokens": tokens if r["step"] > 0 else 0, "rollouts": samples if r["step"] > 0 else 0,
                    "wall_s": sum(w for s, w in walls.items() if s <= r["step"])})
    return pts


def metric_series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], _num(r.get(key))) for r in rows if r.get("step", 0) >= 1 and _num(r.get(key)) is not None]


# ----------------------------------------------------------------------------------------------------
# Aggregation over seeds
# ----------------------------------------------------------------------------------------------------


def _mean_std(xs: list[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def mean_curve(runs: list[RunData]) -> list[dict]:
    """Seed-mean eval curve over the evaluation steps every run has."""
    curves = [{p["step"]: p for p in eval_curve(r.rows)} for r in runs]
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    out = []
    for s in steps:
        pts = [c[s] for c in curves]
        m, sd = _mean_std([p["pass1"] for p in pts])
        ks = [p["passk"] for p in pts if p["passk"] is not None]
        levels = {level: [p[level] for p in pts if p[level] is not None] for level in LEVELS}
        out.append({"step": s, "pass1": m, "pass1_std": sd, "passk": statistics.fmean(ks) if ks else None,
                    # a level's mean only where every seed logged it
                    **{level: statistics.fmean(v) if len(v) == len(pts) else None for level, v in levels.items()},
                    "k": pts[0]["k"], "gen_tokens": statistics.fmean(p["gen_tokens"] for p in pts),
                    "rollouts": statistics.fmean(p["rollouts"] for p in pts),
                    "wall_s": statistics.fmean(p["wall_s"] for p in pts)})
    return out


def reach(curve: list[dict], target: float) -> Optional[dict]:
    """The first point of a (seed-mean) curve whose pass@1 reaches `target`, or None."""
    for p in curve:
        if p["pass1"] >= target - 1e-12:
            return p
    return None


def run_summary(run: RunData, key: str) -> Optional[dict]:
    """One run's mean of a training metric over all steps, over the first and over the last quarter of them."""
    series = metric_series(run.rows, key)
    if not series:
        return None
    quarter = max(1, len(series) // 4)
    return {"mean": statistics.fmean(v for _, v in series), "early": statistics.fmean(v for _, v in series[:quarter]),
            "late": statistics.fmean(v for _, v in series[-quarter:])}


def mechanism_summary(runs: list[RunData], key: str) -> Optional[dict]:
    """Seed-mean of a metric over all training steps, over the first and over the last quarter of them."""
    per = [m for m in (run_summary(r, key) for r in runs) if m is not None]
    if not per:
        return None
    return {**{part: statistics.fmean(m[part] for m in per) for part in ("mean", "early", "late")}, "seeds": len(per)}


def final_value(run: RunData, key: str = "pass1") -> Optional[float]:
    """A run's last evaluation: pass1, passk or a difficulty level (None when not logged)."""
    curve = eval_curve(run.rows)
    return curve[-1][key] if curve else None


def median_step_s(run: RunData) -> Optional[float]:
    """Median training wall time per step, held-out evaluation excluded (see `step_walls`)."""
    walls = step_walls(run.rows)
    return statistics.median(walls.values()) if walls else None


def cost_to_reach(curve: list[dict], target: float, xkey: str = "gen_tokens") -> Optional[float]:
    """The `xkey` (generated tokens, step, ...) at which one run's eval curve first reaches `target`, linearly
    interpolated between the two evaluations around the crossing; 0 when the first evaluation is already there,
    None when never reached."""
    prev = None
    for p in curve:
        if p["pass1"] >= target - 1e-12:
            if prev is None:
                return 0.0
            frac = (target - prev["pass1"]) / (p["pass1"] - prev["pass1"])
            return prev[xkey] + frac * (p[xkey] - prev[xkey])
        prev = p
    return None


def value_at(curve: list[dict], x: float, xkey: str = "gen_tokens", key: str = "pass1") -> Optional[float]:
    """One run's eval curve read at `xkey` = x (generated tokens, step, ...), linearly interpolated between the two
    evaluations around it; None past the curve's last evaluation."""
    prev = None
    for p in curve:
        if p[xkey] >= x:
            if prev is None or p[xkey] == prev[xkey]:
                return p[key]
            frac = (x - prev[xkey]) / (p[xkey] - prev[xkey])
            return prev[key] + frac * (p[key] - prev[key])
        prev = p
    return None


@dataclass
class Agg:
    cfg: Config
    finished: list[RunData]
    unfinished: list[RunData]
    curve: list[dict]
    final: Optional[tuple[float, float]]  # pass@1 mean, std over seeds at the last step
    start: Optional[float]
    passk: Optional[float]
    k: Optional[str]
    step_s: Optional[float]
    gen_s: Optional[float]
    train_s: Optional[float]
    mechanism: dict[str, Optional[dict]]


def aggregate(cfg: Config, runs: dict[int, RunData]) -> Agg:
    fin = [runs[s] for s in sorted(runs) if runs[s].finished]
    unf = [runs[s] for s in sorted(runs) if not runs[s].finished]
    curve = mean_curve(fin)
    finals = [eval_curve(r.rows)[-1] for r in fin]
    final = _mean_std([p["pass1"] for p in finals]) if finals else None
    starts = [c[0]["pass1"] for c in (eval_curve(r.rows) for r in fin) if c and c[0]["step"] == 0]
    ks = [p["passk"] for p in finals if p["passk"] is not None]

    def med(key):
        vals = [statistics.median(v) for v in ([_num(x.get(key)) for x in r.rows if x.get("step", 0) >= 1
                                                 and x.get("eval_pass@1") is None and _num(x.get(key)) is not None]
                                                for r in fin) if v]
        return statistics.fmean(vals) if vals else None

    return Agg(cfg, fin, unf, curve, final, statistics.fmean(starts) if starts else None,
               statistics.fmean(ks) if ks else None, finals[0]["k"] if finals else None,
               med("time_step_s"), med("time_gen_s"), med("time_train_s"),
               {k: mechanism_summary(fin, k) for k in cfg.mechanism})


# ----------------------------------------------------------------------------------------------------
# Intervals over seeds (no scipy: a t table, and the F quantile from the incomplete beta function)
# ----------------------------------------------------------------------------------------------------

# two-sided 95%: t(0.975, dof) for dof 1..30
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
TARGET_HALF = 0.03  # the precision target: a 95% interval of at most about +-0.03


def t975(dof: int) -> float:
    return T975[dof - 1] if dof <= len(T975) else 1.96 + 2.4 / dof  # the tail: within 0.002 of the exact value


@dataclass(frozen=True)
class Interval:
    """Mean of per-seed values with its 95% t-interval (half None with a single value)."""
    mean: float
    half: Optional[float]
    n: int

    @property
    def lo(self) -> float:
        return self.mean - (self.half or 0.0)

    @property
    def hi(self) -> float:
        return self.mean + (self.half or 0.0)

    def text(self, nd: int = 3, sign: str = "+", target: Optional[float] = TARGET_HALF) -> str:
        """`mean [lo, hi] ±half`, with ⚠ when the half-width exceeds `target` (None: no target)."""
        if self.half is None:
            return f"{self.mean:{sign}.{nd}f} (1 seed, no interval)"
        flag = " ⚠" if target is not None and self.half > target else ""
        return f"{self.mean:{sign}.{nd}f} [{self.lo:{sign}.{nd}f}, {self.hi:{sign}.{nd}f}] ±{self.half:.{nd}f}{flag}"


def t_interval(values: list[float]) -> Optional[Interval]:
    if not values:
        return None
    if len(values) == 1:
        return Interval(values[0], None, 1)
    return Interval(statistics.fmean(values), t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)),
                    len(values))


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def f_quantile(prob: float, dof1: int, dof2: int) -> float:
    """Quantile of the F distribution (bisection on its CDF)."""
    cdf = lambda x: betainc(dof1 / 2, dof2 / 2, dof1 * x / (dof1 * x + dof2))  # noqa: E731
    lo, hi = 0.0, 1.0
    while cdf(hi) < prob:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < prob else (lo, mid)
    return (lo + hi) / 2


def std_ratio_interval(xs: list[float], ys: list[float]) -> Optional[tuple[float, float, float]]:
    """std(xs) / std(ys) with its 95% interval (F test on the variance ratio, normal seeds); None under 2 each."""
    if len(xs) < 2 or len(ys) < 2 or statistics.stdev(ys) == 0:
        return None
    ratio = statistics.variance(xs) / statistics.variance(ys)
    dx, dy = len(xs) - 1, len(ys) - 1
    return (math.sqrt(ratio), math.sqrt(ratio / f_quantile(0.975, dx, dy)),
            math.sqrt(ratio * f_quantile(0.975, dy, dx)))


def over_seeds(aggs: dict[str, Agg], name: str, value) -> Optional[Interval]:
    """Interval of value(run) over a config's finished runs (runs where it is None left out)."""
    agg = aggs.get(name)
    vals = [v for v in (value(r) for r in agg.finished) if v is not None] if agg else []
    return t_interval(vals)


def paired(aggs: dict[str, Agg], name: str, other: str, value, ratio: bool = False) -> Optional[Interval]:
    """Interval of value(name's run) - value(other's run) (or their ratio) over the seeds both finished."""
    if name not in aggs or other not in aggs:
        return None
    theirs = {r.seed: r for r in aggs[other].finished}
    out = []
    for run in aggs[name].finished:
        if run.seed not in theirs:
            continue
        x, y = value(run), value(theirs[run.seed])
        if x is not None and y is not None and not (ratio and y == 0):
            out.append(x / y if ratio else x - y)
    return t_interval(out)


def reach_ratios(aggs: dict[str, Agg], name: str, xkey: str = "gen_tokens") -> tuple[Optional[Interval], int, int]:
    """Per seed: the `xkey` (generated tokens, or steps) the config's run needs to reach its baseline's final
    seed-mean pass@1 (interpolated), over what the baseline's run of the same seed spent to first reach that same
    score (its final evaluation's spend when that run never gets there; the baselines' mean for an unpaired seed):
    a baseline that plateaus early is credited with its early arrival. Returns (interval over the seeds that
    reached it, seeds that reached it, seeds)."""
    agg = aggs.get(name)
    base = aggs.get(agg.cfg.baseline) if agg and agg.cfg.baseline else None
    if agg is None or base is None or base.final is None or not agg.finished:
        return None, 0, len(agg.finished) if agg else 0
    spent = {}
    for r in base.finished:
        own = cost_to_reach(eval_curve(r.rows), base.final[0], xkey)
        spent[r.seed] = own if own else eval_curve(r.rows)[-1][xkey]
    mean_spent = statistics.fmean(spent.values())
    ratios = []
    for run in agg.finished:
        cost, denom = cost_to_reach(eval_curve(run.rows), base.final[0], xkey), spent.get(run.seed, mean_spent)
        if cost is not None and denom:
            ratios.append(cost / denom)
    return t_interval(ratios), len(ratios), len(agg.finished)


def equal_tokens_diffs(aggs: dict[str, Agg], name: str) -> Optional[Interval]:
    """Per seed: the config's held-out pass@1 minus its baseline's, both read off their eval curves at the same
    number of generated tokens (the smaller of the two runs' totals, interpolated between evaluations): the token
    cost of a score measured on the pass@1 scale, where a threshold crossing on a flattening curve is not."""
    agg = aggs.get(name)
    base = aggs.get(agg.cfg.baseline) if agg and agg.cfg.baseline else None
    if agg is None or base is None:
        return None
    theirs = {r.seed: eval_curve(r.rows) for r in base.finished}
    diffs = []
    for run in agg.finished:
        own, ref = eval_curve(run.rows), theirs.get(run.seed)
        if not own or not ref:
            continue
        budget = min(own[-1]["gen_tokens"], ref[-1]["gen_tokens"])
        diffs.append(value_at(own, budget) - value_at(ref, budget))
    return t_interval(diffs)


def seeds_for(iv: Optional[Interval], target: float = TARGET_HALF) -> Optional[int]:
    """Seeds the same spread would need for a half-width of `target` (normal approximation: half ~ 1/sqrt(n))."""
    if iv is None or iv.half is None or iv.n < 2:
        return None
    sd = iv.half * math.sqrt(iv.n) / t975(iv.n - 1)
    return max(iv.n, math.ceil((1.96 * sd / target) ** 2))


# ----------------------------------------------------------------------------------------------------
# Markdown
# ----------------------------------------------------------------------------------------------------


def _si(x: Optional[float]) -> str:
    if x is None:
        return "-"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{suf}"
    return f"{x:.0f}"


def _f(x: Optional[float], nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def reach_cells(a: Agg, aggs: dict[str, Agg]) -> tuple[str, str, str]:
    """(target, tokens to reach it, samples to reach it) against the config's baseline."""
    base = a.cfg.baseline
    own = base is None  # a baseline is measured against its own final pass@1
    ref = a if own else aggs.get(base)
    if ref is None or ref.final is None:
        return (f"{base}: no finished run", "-", "-")
    target = ref.final[0]
    hit = reach(a.curve, target)
    label = f"{target:.3f} ({'own final' if own else base})"
    if not a.curve:
        return label, "-", "-"
    if hit is None:
        return label, "not reached", "not reached"
    if hit["step"] == 0:  # the target is at or below the starting policy: "reaching" it says nothing
        return label, "target <= step 0", "-"
    tok, smp = _si(hit["gen_tokens"]), _si(hit["rollouts"])
    if not own:
        ref_hit = reach(ref.curve, target)
        if ref_hit and ref_hit["gen_tokens"]:
            tok += f" ({hit['gen_tokens'] / ref_hit['gen_tokens']:.2f}x)"
            smp += f" ({hit['rollouts'] / ref_hit['rollouts']:.2f}x)"
    return label, f"{tok} @ step {hit['step']}", smp


def mech_cell(a: Agg) -> str:
    parts = []
    for key, m in a.mechanism.items():
        if m is None:
            parts.append(f"`{key}` not logged")
        else:
            parts.append(f"`{key}` {m['mean']:.3g} ({m['early']:.3g} → {m['late']:.3g})")
    return "<br>".join(parts) or "-"


def results_table(order: list[str], aggs: dict[str, Agg]) -> str:
    head = ("| config | seeds | eval pass@1 start → end (mean ± std) | pass@k end | baseline target | "
            "generated tokens to reach it | samples to reach it | s/step (gen / train) | mechanism: mean over steps "
            "(first → last quarter) |\n|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for name in order:
        a = aggs[name]
        seeds = f"{len(a.finished)}" + (f" (+{len(a.unfinished)} unfinished)" if a.unfinished else "")
        if a.final is None:
            lines.append(f"| {a.cfg.label} (`{name}`) | {seeds} | no finished run | | | | | | |")
            continue
        spread = f" ± {a.final[1]:.3f}" if len(a.finished) > 1 else " (1 seed)"
        pass1 = f"{_f(a.start)} → **{a.final[0]:.3f}**{spread}"
        passk = f"{_f(a.passk)} (k={a.k})" if a.passk is not None else "-"
        tgt, tok, smp = reach_cells(a, aggs)
        step = f"{_f(a.step_s, 2)} ({_f(a.gen_s, 2)} / {_f(a.train_s, 2)})"
        lines.append(f"| {a.cfg.label} (`{name}`) | {seeds} | {pass1} | {passk} | {tgt} | {tok} | {smp} | {step} | "
                     f"{mech_cell(a)} |")
    return head + "\n".join(lines) + "\n"


def _level_cell(a: Agg, level: str) -> str:
    vals = [v for v in (final_value(r, level) for r in a.finished) if v is not None]
    if not vals:
        return "-"
    return f"{statistics.fmean(vals):.3f}" + (f" ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else "")


def difference_table(order: list[str], aggs: dict[str, Agg]) -> str:
    """Per config: final pass@1 (all, hard, easy) and the paired differences to its baseline with 95% intervals."""
    head = ("| config | baseline | paired seeds | final pass@1 (mean ± std) | hard | easy | Δ pass@1 vs baseline "
            "[95% CI] ±half | Δ hard | Δ easy | Δ pass@1 at equal generated tokens [95% CI] | tokens to the "
            "baseline's final pass@1 / baseline's tokens [95% CI] (seeds reaching it) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for name in order:
        a = aggs[name]
        if a.final is None:
            continue
        final = f"{a.final[0]:.3f}" + (f" ± {a.final[1]:.3f}" if len(a.finished) > 1 else " (1 seed)")
        cells = [f"{a.cfg.label} (`{name}`)", "-", "-", final, _level_cell(a, "hard"), _level_cell(a, "easy")]
        base = a.cfg.baseline
        if base is None or base not in aggs or aggs[base].final is None:
            cells[1] = f"`{base}`: no finished run" if base else "(a baseline)"
            lines.append("| " + " | ".join(cells + ["-"] * 5) + " |")
            continue
        diffs = [paired(aggs, name, base, lambda run, key=key: final_value(run, key))
                 for key in ("pass1", "hard", "easy")]
        ratio, reached, seeds = reach_ratios(aggs, name, "gen_tokens")
        cells[1], cells[2] = f"`{base}`", str(diffs[0].n if diffs[0] else 0)
        cells += [_iv(iv, target=TARGET_HALF) for iv in diffs]
        cells.append(_iv(equal_tokens_diffs(aggs, name), target=TARGET_HALF))
        need = seeds_for(ratio) if ratio and ratio.half and ratio.half > TARGET_HALF else None
        cells.append(f"{_iv(ratio, 2, '', TARGET_HALF)} ({reached}/{seeds})"
                     + (f"; ±{TARGET_HALF} needs {f'~{need}' if need <= 1000 else '> 1000'} seeds" if need else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def _m(aggs: dict[str, Agg], cfg: str, key: str, part: str = "mean") -> Optional[float]:
    a = aggs.get(cfg)
    m = a.mechanism.get(key) if a else None
    if m is None and a is not None and a.finished:  # a metric not in the config's list: compute it on demand
        m = mechanism_summary(a.finished, key)
    return None if m is None else m[part]


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


def base_name(name: str) -> str:
    """A config's 256-pool name: its name less `_pool2048` (no config has it for a 2,048-only one)."""
    return name[:-len(POOL2048.suffix)] if name.endswith(POOL2048.suffix) else name


def pending(seeds: int) -> str:
    return f"runs pending ({seeds} seed{'' if seeds == 1 else 's'})"


def final_gaps(agg: Optional[Agg]) -> list[float]:
    """Per finished run that logs it: training-prompt minus held-out pass@1 at the final evaluation (> 0: the policy
    scores higher on the pool's prompts than on held-out ones)."""
    gaps = []
    for run in agg.finished if agg else []:
        last = eval_curve(run.rows)[-1]
        if last["train1"] is not None:
            gaps.append(last["train1"] - last["pass1"])
    return gaps


def gap_cell(aggs: dict[str, Agg], name: Optional[str], with_name: bool = True) -> str:
    """Seed-mean training - held-out gap at the final evaluation with the seeds that log it; '-' for runs that
    predate eval_train_pass@1."""
    if name is None:
        return "-"
    gaps = final_gaps(aggs.get(name))
    text = f"{statistics.fmean(gaps):+.3f} ({len(gaps)})" if gaps else "-"
    return f"`{name}` {text}" if with_name else text


def _seeds_text(aggs: dict[str, Agg], name: str) -> str:
    a = aggs.get(name)
    fin, unf = (len(a.finished), len(a.unfinished)) if a else (0, 0)
    return f"`{name}` {fin} finished seed{'' if fin == 1 else 's'}" + (f" (+{unf} unfinished)" if unf else "")


def _bases(order: list[str]) -> list[str]:
    """The 256-pool names of the harness's configs with runs in either regime, plus the 2,048-only configs whose
    baseline has runs (so that they show as pending), in the harness's order."""
    have, out = {base_name(n) for n in order}, []
    for c in CONFIGS:
        b = base_name(c.name)
        if b not in out and (b in have or (b not in BY_NAME and c.baseline and base_name(c.baseline) in have)):
            out.append(b)
    return out


def regime_table(order: list[str], aggs: dict[str, Agg]) -> str:
    """Per config: each pool's finished seeds, final held-out pass@1 and train - held-out gap, and the pool's own
    effect on final held-out pass@1 (2,048 minus 256, paired by seed)."""
    head = ("| config | 256: seeds | 256: final held-out pass@1 | 256: train − held-out gap (seeds) | 2,048: seeds | "
            "2,048: final held-out pass@1 | 2,048: train − held-out gap (seeds) | held-out pass@1, 2,048 − 256 pool "
            "[95% CI] (paired seeds) |\n|---|---|---|---|---|---|---|---|\n")
    lines = []
    for base in _bases(order):
        names = [r.name(base) for r in REGIMES]
        first = next(n for n in names if n)
        cells = [f"{BY_NAME[first].label} (`{first}`)"]
        for r, name in zip(REGIMES, names):
            a = aggs.get(name) if name else None
            if name is None:
                cells += [f"no {r.label}-pool config", "-", "-"]
            elif a is None or a.final is None:
                cells += [pending(0) + (f" (+{len(a.unfinished)} unfinished)" if a and a.unfinished else ""), "-", "-"]
            else:
                spread = f" ± {a.final[1]:.3f}" if len(a.finished) > 1 else ""
                cells += [str(len(a.finished)), f"{a.final[0]:.3f}{spread}", gap_cell(aggs, name, with_name=False)]
        if None in names:
            cells.append("-")
        else:
            iv = paired(aggs, names[1], names[0], final_value)
            n = iv.n if iv else 0
            cells.append(pending(n) if n < 2 else f"{_iv(iv, target=TARGET_HALF)} ({n})")
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n" if lines else "No runs of the harness's configs.\n"


PROS_TRIALS = 4  # pros_ppo.py's rollouts per query (--k); no config changes it

# the mechanism metrics of the two-regime comparison: (family, its scripts, metrics, which of its configs log them)
NEW_MECHANISM = (
    ("Reinforce-Ada", ("ada_seq.py", "ada_est.py"),
     ("ada_trained_responses", "ada_adv_mean_trained", "ada_adv_mean_trained_easy", "ada_adv_mean_trained_mid",
      "ada_adv_mean_trained_hard"), lambda cfg: True),
    ("PROS", ("pros_ppo.py",),
     ("pros_calib_error", "pros_calib_excess", "pros_frac_zero_var_picks", "pros_frac_zero_var_stream",
      "pros_pick_trials_mean", "pros_pick_root_frac"),
     lambda cfg: _flag(list(cfg.flags), "--pros") not in (None, "off")),  # PROS off logs none of them
)


def _g(x: float) -> str:
    """3 significant digits, rounded to 0.001 first: a group-centred mean of 1e-18 is 0."""
    return f"{round(x, 3) + 0.0:.3g}"


def _mech_text(runs: list[RunData], key: str, seeds: int) -> str:
    """A metric's seed-mean over steps (first → last quarter); '[k of n seeds]' when fewer than `seeds` runs log it."""
    m = mechanism_summary(runs, key)
    if m is None:
        return "-"
    fewer = f" [{m['seeds']} of {seeds} seeds]" if m["seeds"] < seeds else ""
    return f"{_g(m['mean'])} ({_g(m['early'])} → {_g(m['late'])}){fewer}"


def binomial_abs_floor(p: float, n: int = PROS_TRIALS) -> float:
    """E|p - s/n| for s ~ Binomial(n, p): what |θ̂ - s/n| averages for a perfectly calibrated θ̂ = p."""
    return sum(math.comb(n, s) * p ** s * (1 - p) ** (n - s) * abs(p - s / n) for s in range(n + 1))


def mechanism_tables(order: list[str], aggs: dict[str, Agg]) -> str:
    """Per family, per config and pool: each metric's seed-mean over steps (first → last quarter), over the
    finished seeds that log it."""
    out = []
    for family, scripts, keys, logs in NEW_MECHANISM:
        rows = []
        for base in _bases(order):
            for r in REGIMES:
                name = r.name(base)
                if name is None or BY_NAME[name].script not in scripts or not logs(BY_NAME[name]):
                    continue
                a = aggs.get(name)
                fin = a.finished if a else []
                if not fin:
                    rows.append(f"| `{name}` | {r.label} | {pending(0)} |" + " - |" * len(keys))
                    continue
                logging = [run for run in fin if any(metric_series(run.rows, k) for k in keys)]
                cells = [f"`{name}`", r.label, f"{len(logging)}/{len(fin)}"]
                for key in keys:
                    cells.append(_mech_text(logging, key, len(logging)))
                rows.append("| " + " | ".join(cells) + " |")
        if rows:
            out.append(f"**{family}** (mean over steps, first → last quarter; seeds: finished runs that log them / "
                       f"finished runs)\n\n| config | pool | seeds | " + " | ".join(f"`{k}`" for k in keys)
                       + " |\n|" + "---|" * (3 + len(keys)) + "\n" + "\n".join(rows) + "\n")
    lo, hi = binomial_abs_floor(0.5), binomial_abs_floor(0.4)
    out.append(f"`pros_calib_error` is the mean |θ̂ - s/n| over the pool's picks (θ̂: the model's pass rate at "
               f"selection; s of n = {PROS_TRIALS} rollouts succeed). Sampling noise alone gives it a floor, "
               f"E|p - Binomial({PROS_TRIALS}, p)/{PROS_TRIALS}| = {lo:.2f}-{hi:.2f} for p in 0.4-0.5 and 0 at p in "
               "{0, 1}: picks near a 0.5 pass rate (what the Bayesian selection aims for) score worse than all-pass "
               "or all-fail picks however well the model knows them, so `pros_calib_error` cannot rank Bayesian "
               "against random picks. `pros_calib_excess` subtracts that floor (its expectation for s ~ "
               "Binomial(n, θ̂)): about 0 for a calibrated model at any pass rate, > 0 when the observed rates sit "
               "further from θ̂ than sampling noise explains.\n")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------------
# The papers' claims: one verdict each per regime, by the rules below (also printed on the page)
# ----------------------------------------------------------------------------------------------------

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
NO_RUNS = "inconclusive (no runs)"

VERDICT_RULES = f"""Every interval is a 95% t-interval over seeds (paired by seed where two configs are compared).
Each claim has a row per data regime: the sweep's 256-prompt pool, and the 2,048-prompt pool (the same configs
with `--prompt_pool 2048`, each paired with its baseline on that pool: run.py's `_pool2048` twins; 'no 2,048-pool
config' where run.py has none). The last two columns give each compared config's training-prompt minus held-out
pass@1 at the final evaluation (seed mean; in brackets the seeds that log `eval_train_pass@1`, '-' for runs made
before it was logged): a large gap with no held-out gain says the method fits the pool's prompts, not the task.
- **'X beats Y'** (interval of X - Y): *reproduced* if it lies above 0; *not reproduced* if it lies below the
  claim's margin m (X is worse, or any gain is smaller than m); else *inconclusive*. m = {TARGET_HALF} for pass@1
  (the precision target; ⚠ marks a half-width above it), 1 group for trained groups per batch, 1 sample
  for samples per prompt, 0 for a falling calibration error.
- **'X at least matches Y'** (interval of X - Y): *not reproduced* if it lies below 0; *reproduced* if it lies above
  -{TARGET_HALF} (X is at most {TARGET_HALF} worse); else *inconclusive*.
- **'X is near v'** (interval of X): *reproduced* if it lies inside the stated band; *not reproduced* if it lies
  outside it; else *inconclusive*. 'About equal time per step': the ratio's interval inside [0.9, 1.1].
- **'Fewer steps / tokens to the baseline's final pass@1'**: per seed, the steps (tokens) to reach the baseline's final
  seed-mean pass@1, interpolated between evaluations, over the baseline's own steps (tokens) to first reach it;
  the saving 1 - ratio is judged as 'X beats Y' with m = {TARGET_HALF}. Seeds that never reach it: *not reproduced*
  when they are at least half, *inconclusive* otherwise.
- **'Lower seed-to-seed spread'**: the ratio of the two configs' std of final pass@1 with its F-test interval:
  *reproduced* below 1, *not reproduced* above 1, else *inconclusive*.
- Fewer than 2 (paired) seeds with the data: *runs pending (n seeds)*, no figure.
"""


def _few(iv: Optional[Interval]) -> Optional[str]:
    if iv is None:
        return NO_RUNS
    return "inconclusive (1 seed)" if iv.half is None else None


def verdict_greater(iv: Optional[Interval], margin: float) -> str:
    """'X beats Y' on the interval of X - Y."""
    if _few(iv):
        return _few(iv)
    return REPRODUCED if iv.lo > 0 else NOT_REPRODUCED if iv.hi < margin else INCONCLUSIVE


def verdict_not_below(iv: Optional[Interval], margin: float) -> str:
    """'X at least matches Y' on the interval of X - Y: non-inferiority within the margin."""
    if _few(iv):
        return _few(iv)
    return NOT_REPRODUCED if iv.hi < 0 else REPRODUCED if iv.lo > -margin else INCONCLUSIVE


def verdict_within(iv: Optional[Interval], low: float, high: float) -> str:
    """'X is in [low, high]' on the interval of X."""
    if _few(iv):
        return _few(iv)
    if low <= iv.lo and iv.hi <= high:
        return REPRODUCED
    return NOT_REPRODUCED if iv.hi < low or iv.lo > high else INCONCLUSIVE


@dataclass
class Claim:
    paper: str
    claim: str
    verdict: str
    measured: str
    regime: str = POOL256.label
    configs: tuple[str, ...] = ()  # the configs judged (their train - held-out gaps go beside the verdict)
    seeds: int = 0  # seeds with the data (paired where two configs are compared)


def _have(aggs: dict[str, Agg], *names: str) -> bool:
    return all(n in aggs and aggs[n].finished for n in names)


def _iv(iv: Optional[Interval], nd: int = 3, sign: str = "+", target: Optional[float] = None) -> str:
    return "-" if iv is None else iv.text(nd, sign, target)


def _n(iv: Optional[Interval]) -> int:
    return iv.n if iv else 0


def _summary_of(key: str, part: str = "mean"):
    return lambda run: (run_summary(run, key) or {}).get(part)


def _paired_seeds(aggs: dict[str, Agg], *names: str) -> int:
    return len(set.intersection(*({r.seed for r in aggs[n].finished} if n in aggs else set() for n in names)))


# A judge reads the runs of one regime's configs: judge(aggs, regime, *config names) -> (verdict, measured text,
# seeds with the data). The config names are that regime's; the regime gives its other configs for context.


def _beats(key: str = "pass1", metric: str = "pass@1"):
    """'name beats other' on a final held-out evaluation (default pass@1), paired by seed."""
    def judge(aggs, r, name, other):
        iv = paired(aggs, name, other, lambda run: final_value(run, key))
        return (verdict_greater(iv, TARGET_HALF),
                f"final {metric} `{name}` - `{other}`: {_iv(iv, target=TARGET_HALF)} ({_n(iv)} paired seeds)", _n(iv))
    return judge


def _fewer_to_reach(xkey: str):
    """'fewer steps (tokens) than the baseline to the baseline's final pass@1', per seed (see reach_ratios)."""
    def judge(aggs, r, name, base):
        both = _paired_seeds(aggs, name, base)
        if not both:
            return NO_RUNS, "", 0
        iv, reached, seeds = reach_ratios(aggs, name, xkey)
        what = (f"{xkey.replace('gen_tokens', 'tokens').replace('step', 'steps')} to `{base}`'s final pass@1 "
                f"{aggs[base].final[0]:.3f}, over `{base}`'s own to reach it: {_iv(iv, sign='')} "
                f"(reached in {reached}/{seeds} seeds)")
        if reached < seeds:  # the interval would cover the seeds that got there only
            return NOT_REPRODUCED if 2 * reached <= seeds else INCONCLUSIVE, what, both
        return verdict_greater(Interval(1.0 - iv.mean, iv.half, iv.n), TARGET_HALF), what, both
    return judge


def _time_equal(aggs, r, name, other):
    iv = paired(aggs, name, other, median_step_s, ratio=True)
    return (verdict_within(iv, 0.9, 1.1), f"median s/step (evaluation excluded) `{name}` / `{other}`: "
                                          f"{_iv(iv, 2, '')} (band [0.9, 1.1])", _n(iv))


def _ra_no_success(aggs, r, ra, rloo):
    # the paper's degenerate group has no rollout with reward 1.0 (its Sec. 1: ~57% -> ~0% after the splice); runs
    # that do not log `ra_no_success_frac_post` are left out
    post = over_seeds(aggs, ra, _summary_of("ra_no_success_frac_post"))
    base = over_seeds(aggs, rloo, _summary_of("ra_no_success_frac_post"))
    return (verdict_within(post, -math.inf, 0.05), f"mean over steps after the splice {_iv(post, sign='')} "
            f"({_n(post)} seeds log it); RLOO (no splice) {_iv(base, sign='')}", _n(post))


def _ra_zero_var(aggs, r, ra, rloo):
    post = over_seeds(aggs, ra, _summary_of("ra_zero_var_frac_post"))
    late = over_seeds(aggs, ra, _summary_of("ra_zero_var_frac_post", "late"))
    fresh = over_seeds(aggs, ra, _summary_of("frac_zero_var_groups"))
    base = over_seeds(aggs, rloo, _summary_of("frac_zero_var_groups"))
    return (verdict_within(post, -math.inf, 0.05),
            f"mean over steps after the splice {_iv(post, sign='')} (last quarter {_iv(late, sign='')}); fresh groups "
            f"before it {_iv(fresh, sign='')}; RLOO's fresh groups {_iv(base, sign='')}. The splice fires only in "
            "groups without a fresh success: all-pass groups remain", _n(post))


def _spread(aggs, r, name, other):
    xs, ys = ([final_value(x) for x in aggs[n].finished] if n in aggs else [] for n in (name, other))
    ratio = std_ratio_interval(xs, ys)
    seeds = min(len(xs), len(ys))
    if ratio is None:
        return INCONCLUSIVE, f"no spread in `{other}`'s {len(ys)} seeds", seeds
    verdict = REPRODUCED if ratio[2] < 1 else NOT_REPRODUCED if ratio[1] > 1 else INCONCLUSIVE
    return (verdict, f"std over seeds {statistics.stdev(xs):.4f} ({len(xs)} seeds) vs {statistics.stdev(ys):.4f} "
                     f"({len(ys)}): ratio {ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}]", seeds)


def _ps_rate(aggs, r, name):
    rate = over_seeds(aggs, name, _summary_of("ps_prefix_pass_rate"))
    late = over_seeds(aggs, name, _summary_of("ps_prefix_pass_rate", "late"))
    fixed = r.name("ps_fixed")
    text = f"`ps_prefix_pass_rate` adaptive {_iv(rate, sign='')} (last quarter {_iv(late, sign='')}); fixed ratios " + (
        _iv(over_seeds(aggs, fixed, _summary_of("ps_prefix_pass_rate")), sign='') if fixed else
        f"no {r.label}-pool config")
    return verdict_within(rate, 0.4, 0.6), text, _n(rate)


def _ps_groups(aggs, r, name, base):
    iv = paired(aggs, name, base, _summary_of("ps_trained_groups"))
    ref = over_seeds(aggs, base, _summary_of("ps_trained_groups"))
    return (verdict_greater(iv, 1.0), f"`ps_trained_groups` per step, difference {_iv(iv, 2)} (baseline "
                                      f"{_iv(ref, 2, '')})", _n(iv))


def _ada_matches(aggs, r, balance, n16):
    iv = paired(aggs, balance, n16, final_value)
    train = {n: aggs[n].train_s for n in (balance, r.name("grpo_n4"), n16) if n in aggs}
    return (verdict_not_below(iv, TARGET_HALF),
            f"final pass@1 `{balance}` - `{n16}`: {_iv(iv, target=TARGET_HALF)}; the update trains on 4 vs 16 samples "
            "per prompt (measured training s/step: " + ", ".join(f"{n} {_f(v, 2)}" for n, v in train.items()) + ")",
            _n(iv))


def _allocation(high: str, low: str):
    """Reinforce-Ada's samples per prompt: `high`-level prompts get more than `low`-level ones."""
    parts = {level: _summary_of(f"ada_samples_per_prompt_{level}") for level in LEVELS}

    def gap(run):
        h, lo = parts[high](run), parts[low](run)
        return None if h is None or lo is None else h - lo

    def judge(aggs, r, name):
        iv = over_seeds(aggs, name, gap)
        if iv is None:
            return "inconclusive (not logged)", "no per-difficulty metric (`ada_samples_per_prompt_<level>`)", 0
        per = {level: over_seeds(aggs, name, fn) for level, fn in parts.items()}
        spp = {part: over_seeds(aggs, name, _summary_of("ada_samples_per_prompt_mean", part))
               for part in ("early", "late")}
        context = ("samples per prompt, mean over steps: " + ", ".join(f"{lv} {_iv(v, 1, '')}" for lv, v in per.items())
                   + f"; all prompts {_iv(spp['early'], 1, '')} (first quarter) → {_iv(spp['late'], 1, '')} (last)")
        return verdict_greater(iv, 1.0), f"{high} - {low} samples per prompt {_iv(iv, 2)}; {context}", iv.n
    return judge


def _calib_falls(aggs, r, name):
    early, late = _summary_of("pros_calib_error", "early"), _summary_of("pros_calib_error", "late")
    iv = over_seeds(aggs, name, lambda run: None if early(run) is None or late(run) is None else early(run) - late(run))
    means = [over_seeds(aggs, name, fn) for fn in (early, late)]
    text = f"`pros_calib_error` {_iv(means[0], sign='')} → {_iv(means[1], sign='')}, fall {_iv(iv)}"
    excess = [over_seeds(aggs, name, _summary_of("pros_calib_excess", part)) for part in ("early", "late")]
    if excess[0] is not None:  # the error above its sampling floor (see the mechanism tables)
        text += f"; `pros_calib_excess` {_iv(excess[0])} → {_iv(excess[1])} ({excess[0].n} seeds log it)"
    return (verdict_greater(iv, 0.0) if iv else "inconclusive (not logged)"), text, _n(iv)


@dataclass(frozen=True)
class ClaimSpec:
    paper: str
    claim: str
    configs: tuple[str, ...]  # 256-pool names: each regime judges their twins
    judge: Callable[..., tuple[str, str, int]]


def _label(name: str) -> str:
    return BY_NAME[name].label


_RA, _PS, _ADA, _PROS = "RA-RLOO", "Prefix Sampling", "Reinforce-Ada", "PROS"
# The paper (Reinforce-Ada, SEQ variants): "both strategies ensure that difficult prompts (low p_i) receive more
# samples"; SEQ-BALANCE "further emphasizes collecting failure cases", i.e. prompts with pass rates near 0 or 1. So
# hard is compared with mid for both variants, and SEQ-BALANCE's easy prompts are expected high too (they rarely give
# the n/2 failures its exit needs): comparing hard with easy would test a claim the paper does not make.
CLAIMS: tuple[ClaimSpec, ...] = (
    ClaimSpec(_RA, "Splicing leaves no group without a success (`ra_no_success_frac_post` <= 0.05; the paper: ~57% → "
              "~0%)", ("ra_rloo", "rloo"), _ra_no_success),
    ClaimSpec(_RA, "Splicing stored successes leaves about no zero-variance groups (`ra_zero_var_frac_post` <= 0.05)",
              ("ra_rloo", "rloo"), _ra_zero_var),
    ClaimSpec(_RA, "RA-RLOO beats RLOO (final held-out pass@1)", ("ra_rloo", "rloo"), _beats()),
    ClaimSpec(_RA, "RA-RLOO beats RLOO on the paper's metric (pass@4 of 8 samples at T 0.6, top-p 0.95, top-k 20; the "
              "paper: +0.023, p ≈ 0.10 at 3 seeds)", ("ra_rloo", "rloo"), _beats("paper4", "`eval_paper_pass@4`")),
    ClaimSpec(_RA, "Lower seed-to-seed spread of final pass@1 than RLOO", ("ra_rloo", "rloo"), _spread),
    # `ps_adaptive` is the paper's controller (one EMA), `ps_adaptive_reset` our variant (the EMA restarted)
    *(ClaimSpec(_PS, f"The adaptive controller ({which}) keeps the prefix-task pass rate near 0.5 (mean over steps in "
                "[0.4, 0.6])", (name,), _ps_rate)
      for name, which in (("ps_adaptive", "the paper's controller"), ("ps_adaptive_reset", "our EMA-reset variant"))),
    *(spec for name in ("ps_fixed", "ps_adaptive", "ps_adaptive_reset") for spec in (
        ClaimSpec(_PS, f"{_label(name)}: more valid (trained) tasks per batch than the baseline", (name, "ps_off"),
                  _ps_groups),
        ClaimSpec(_PS, f"{_label(name)}: fewer steps to the baseline's final pass@1", (name, "ps_off"),
                  _fewer_to_reach("step")))),
    ClaimSpec(_ADA, "SEQ-BALANCE at least matches GRPO-n16's final pass@1 while training on 4 samples per prompt "
              "(GRPO-n4)", ("seq_balance", "grpo_n16"), _ada_matches),
    ClaimSpec(_ADA, "SEQ-POS draws more samples for hard prompts than for mid-difficulty ones", ("seq_pos",),
              _allocation("hard", "mid")),
    ClaimSpec(_ADA, "SEQ-BALANCE draws more samples for hard prompts than for mid-difficulty ones", ("seq_balance",),
              _allocation("hard", "mid")),
    ClaimSpec(_ADA, "SEQ-BALANCE also draws more samples for easy prompts (pass rate near 1) than for mid-difficulty "
              "ones: it collects failures", ("seq_balance",), _allocation("easy", "mid")),
    *(spec for name in ("seq_balance", "seq_pos") for spec in (
        ClaimSpec(_ADA, f"{_label(name)} beats GRPO-n4, the same update size (final pass@1)", (name, "grpo_n4"),
                  _beats()),
        ClaimSpec(_ADA, f"DAPO dynamic sampling ends below {_label(name)} (final pass@1)", (name, "dapo_n4"),
                  _beats()))),
    ClaimSpec(_ADA, "EST beats GRPO-n8, the same inference budget (final pass@1)", ("est", "grpo_n8"), _beats()),
    ClaimSpec(_PROS, "PPO+PROS beats PPO (final pass@1)", ("ppo_pros", "ppo"), _beats()),
    ClaimSpec(_PROS, "GRPO+PROS beats GRPO (final pass@1)", ("grpo_pros", "grpo_k4"), _beats()),
    ClaimSpec(_PROS, "PPO+PROS takes about the time per step of `ppo`", ("ppo_pros", "ppo"), _time_equal),
    ClaimSpec(_PROS, "GRPO+PROS takes about the time per step of `grpo_k4`", ("grpo_pros", "grpo_k4"), _time_equal),
    ClaimSpec(_PROS, "Bayesian selection beats random selection (final pass@1)", ("ppo_pros", "ppo_pros_random"),
              _beats()),
    ClaimSpec(_PROS, "The pass-rate model's calibration error falls over training (PPO+PROS, first vs last quarter)",
              ("ppo_pros",), _calib_falls),
)


def claim_rows(aggs: dict[str, Agg], regime: Regime = POOL256) -> list[Claim]:
    """The papers' claims in one regime, in CLAIMS order, each with its verdict and the measured effect; under 2
    (paired) seeds with the data the verdict is 'runs pending' and no figure is given."""
    out = []
    for spec in CLAIMS:
        names = tuple(regime.name(n) for n in spec.configs)
        if None in names:
            missing = ", ".join(f"`{n}`" for n, twin in zip(spec.configs, names) if twin is None)
            out.append(Claim(spec.paper, spec.claim, f"no {regime.label}-pool config",
                             f"benchmarks/run.py has no {regime.label}-pool config for {missing}", regime.label))
            continue
        verdict, measured, seeds = spec.judge(aggs, regime, *names)
        if seeds < 2:
            verdict, measured = pending(seeds), "; ".join(_seeds_text(aggs, n) for n in names)
        out.append(Claim(spec.paper, spec.claim, verdict, measured, regime.label, names, seeds))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def claims(aggs: dict[str, Agg]) -> str:
    """One table per paper: each claim's row in each regime, with the compared configs' train - held-out gaps."""
    per_regime = [claim_rows(aggs, r) for r in REGIMES]
    head = ("| claim | pool | verdict | measured | train − held-out gap: first config (seeds) | second config |\n"
            "|---|---|---|---|---|---|")
    out, paper = [], None
    for rows in zip(*per_regime):
        if rows[0].paper != paper:
            paper = rows[0].paper
            out += [f"\n**{paper}**\n", head]
        for j, c in enumerate(rows):
            gaps = [gap_cell(aggs, n) for n in c.configs[:2]] + ["-"] * (2 - len(c.configs[:2]))
            out.append(f"| {_cell(c.claim) if j == 0 else '″'} | {c.regime} | **{c.verdict}** | {_cell(c.measured)} | "
                       f"{gaps[0]} | {gaps[1]} |")
    for r in REGIMES:  # EST (Reinforce-Ada's estimator variant): no claim of its own here, its mechanism only
        est = r.name("est")
        if est and _have(aggs, est):
            g = lambda k, part: _f(_m(aggs, est, k, part))  # noqa: E731
            out.append(f"\n*Not a claim*: EST on the {r.label} pool, `est_calibration_error` "
                       f"{g('est_calibration_error', 'early')} → {g('est_calibration_error', 'late')} (first → last "
                       f"quarter); allocation per prompt min/max {g('est_alloc_min', 'mean')} / "
                       f"{g('est_alloc_max', 'mean')}.")
    return "\n".join(out).lstrip("\n") + "\n"


# ----------------------------------------------------------------------------------------------------
# Plots (matplotlib imported only here)
# ----------------------------------------------------------------------------------------------------

STYLE = {  # colour by family; baselines dashed
    "grpo_n4": ("#7f7f7f", "--"), "grpo_n8": ("#222222", "--"), "rloo": ("#1f77b4", "--"),
    "ra_rloo": ("#1f77b4", "-"), "ps_off": ("#2ca02c", "--"), "ps_fixed": ("#2ca02c", "-"),
    "ps_adaptive": ("#98df8a", "-"), "ps_adaptive_reset": ("#98df8a", ":"), "seq_pos": ("#ff7f0e", "-"),
    "seq_balance": ("#d62728", "-"), "est": ("#9467bd", "-"), "est_pool2048": ("#9467bd", ":"),
    "grpo_n8_pool2048": ("#222222", ":"),
    "ppo": ("#8c564b", "--"), "ppo_pros": ("#e377c2", "-"),
    "ppo_pros_random": ("#e377c2", ":"), "grpo_k4": ("#17becf", "--"), "grpo_pros": ("#17becf", "-"),
    "dr_grpo_n4": ("#7f7f7f", ":"), "grpo_n16": ("#000000", "-."), "dapo_n4": ("#bcbd22", "--"),
}


BASELINES = {c.baseline for c in CONFIGS if c.baseline}  # the configs another is measured against: dashed, labelled


def _style(name: str, i: int) -> tuple[str, str]:
    if name not in STYLE and base_name(name) in STYLE:  # a 2,048-pool twin: its config's colour, dotted
        return STYLE[base_name(name)][0], ":"
    return STYLE.get(name, (f"C{i % 10}", "-"))


def _smooth(ys: list[float], w: int) -> list[float]:
    out = []
    for i in range(len(ys)):
        win = ys[max(0, i - w + 1): i + 1]
        out.append(sum(win) / len(win))
    return out


def _mean_metric(runs: list[RunData], key: str) -> tuple[list[int], list[float]]:
    per = [dict(metric_series(r.rows, key)) for r in runs]
    per = [p for p in per if p]
    if not per:
        return [], []
    steps = sorted(set.intersection(*(set(p) for p in per)))
    return steps, [statistics.fmean(p[s] for p in per) for s in steps]


def make_plots(order: list[str], aggs: dict[str, Agg], out_dir: Path) -> list[str]:
    """Write the PNGs; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    have = [n for n in order if aggs[n].curve]

    for xkey, fname, xlabel in (("gen_tokens", "pass1_vs_tokens.png", "generated tokens (cumulative)"),
                                ("wall_s", "pass1_vs_wall.png", "training wall time, s (evaluation excluded)")):
        fig, ax = plt.subplots(figsize=(10, 5.5))
        for i, n in enumerate(have):
            a, (color, ls) = aggs[n], _style(n, i)
            xs = [p[xkey] for p in a.curve]
            ys = [p["pass1"] for p in a.curve]
            sd = [p["pass1_std"] for p in a.curve]
            mark = " (baseline)" if n in BASELINES else ""
            ax.plot(xs, ys, ls, color=color, marker="o", ms=3, lw=1.6,
                    label=f"{a.cfg.label}{mark} ({len(a.finished)})")
            if len(a.finished) > 1:
                ax.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)], color=color,
                                alpha=0.12, lw=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out eval pass@1")
        ax.set_title("eval pass@1 (mean over seeds, band ± std; legend: finished seeds)")
        ax.grid(alpha=0.3)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
        written.append(fname)

    # zero-variance groups: fresh rollouts, and what the update sees after the method's intervention
    post_key = {"ra_rloo": "ra_zero_var_frac_post", "seq_pos": "ada_frac_zero_var_groups_post",
                "seq_balance": "ada_frac_zero_var_groups_post"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for i, n in enumerate(o for o in order if aggs[o].finished):
        a, (color, ls) = aggs[n], _style(n, i)
        steps, ys = _mean_metric(a.finished, "frac_zero_var_groups")
        if steps:
            w = max(1, len(steps) // 20)
            axes[0].plot(steps, _smooth(ys, w), ls, color=color, lw=1.4, label=a.cfg.label)
        if n in post_key:
            steps, ys = _mean_metric(a.finished, post_key[n])
            if steps:
                w = max(1, len(steps) // 20)
                axes[1].plot(steps, _smooth(ys, w), ls, color=color, lw=1.4, label=f"{a.cfg.label}: {post_key[n]}")
    axes[0].set_title("zero-variance groups, fresh rollouts (frac_zero_var_groups)")
    axes[1].set_title("zero-variance groups in the update, after the method's intervention")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if axes[1].get_legend_handles_labels()[0]:
        axes[1].legend(fontsize=7)
    axes[0].set_ylabel("fraction of groups (mean over seeds, moving average)")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:  # many configs: one legend under both panels, off the data
        fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out_dir / "zero_var.png", dpi=110)
    plt.close(fig)
    written.append("zero_var.png")

    # the mechanism metrics over training
    panels = [("PS: prefix-task pass rate (target 0.5)", [("ps_fixed", "ps_prefix_pass_rate"),
                                                          ("ps_adaptive", "ps_prefix_pass_rate")], 0.5),
              ("Ada-Seq: samples per prompt (mean, max)", [("seq_pos", "ada_samples_per_prompt_mean"),
                                                           ("seq_balance", "ada_samples_per_prompt_mean"),
                                                           ("seq_pos", "ada_samples_per_prompt_max"),
                                                           ("seq_balance", "ada_samples_per_prompt_max")], None),
              ("calibration error of the pass-rate model", [("est", "est_calibration_error"),
                                                            ("ppo_pros", "pros_calib_error")], None),
              ("RA-RLOO: zero-variance groups before / after the splice", [("ra_rloo", "frac_zero_var_groups"),
                                                                          ("ra_rloo", "ra_zero_var_frac_post")], 0.0)]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, (title, series, ref) in zip(axes.flat, panels):
        drawn = 0
        for j, (cfg, key) in enumerate(series):
            if cfg not in aggs or not aggs[cfg].finished:
                continue
            steps, ys = _mean_metric(aggs[cfg].finished, key)
            if not steps:
                continue
            color, _ = _style(cfg, j)
            ls = ":" if key.endswith("_max") or key == "frac_zero_var_groups" else "-"
            ax.plot(steps, _smooth(ys, max(1, len(steps) // 20)), ls, color=color, lw=1.4,
                    label=f"{aggs[cfg].cfg.label}: {key}")
            drawn += 1
        if ref is not None and drawn:
            ax.axhline(ref, color="k", lw=0.8, alpha=0.5)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(out_dir / "mechanisms.png", dpi=110)
    plt.close(fig)
    written.append("mechanisms.png")

    # held-out pass@1 by difficulty level (runs that log it)
    levels = [n for n in have if any(p["hard"] is not None or p["easy"] is not None for p in aggs[n].curve)]
    if levels:
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
        for ax, level in zip(axes, ("hard", "easy")):
            for i, n in enumerate(levels):
                pts = [p for p in aggs[n].curve if p[level] is not None]
                if pts:
                    color, ls = _style(n, i)
                    ax.plot([p["step"] for p in pts], [p[level] for p in pts], ls, color=color, marker="o", ms=3,
                            lw=1.4, label=aggs[n].cfg.label)
            ax.set_title(f"held-out pass@1, {level} problems (mean over seeds)")
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.1, 1, 1))
        fig.savefig(out_dir / "pass1_by_difficulty.png", dpi=110)
        plt.close(fig)
        written.append("pass1_by_difficulty.png")
    return written


# the per-method docs pages' learning curves: docs/figures/<script>.png, the method's configs and what its claims
# compare them with (256-pool names; each regime's panel draws their twins)
DOC_FIGURES = {
    "ra_rloo": ("ra_rloo", "rloo"),
    "ps_grpo": ("ps_adaptive", "ps_fixed", "ps_adaptive_reset", "ps_off"),
    "pros_ppo": ("ppo_pros", "ppo_pros_random", "ppo_pros_visit", "ppo", "grpo_pros", "grpo_k4"),
    "ada_seq": ("seq_pos", "seq_balance", "grpo_n4", "grpo_n16", "dapo_n4"),
    "ada_est": ("est", "grpo_n8"),
}


def train_curve(runs: list[RunData]) -> tuple[list[int], list[float], int]:
    """Seed-mean eval_train_pass@1 over the runs that log it, at the evaluation steps they all have: (steps, means,
    runs)."""
    per = [{p["step"]: p["train1"] for p in eval_curve(r.rows) if p["train1"] is not None} for r in runs]
    per = [c for c in per if c]
    if not per:
        return [], [], 0
    steps = sorted(set.intersection(*(set(c) for c in per)))
    return steps, [statistics.fmean(c[s] for c in per) for s in steps], len(per)


def make_doc_figures(aggs: dict[str, Agg], figures_dir: Path) -> list[Path]:
    """docs/figures/<script>.png: held-out pass@1 vs step (seed mean, band ± std) of the script's configs against
    their baselines, one panel per regime; pass@1 on training-pool prompts dashed where the runs log it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for script, configs in DOC_FIGURES.items():
        fig, axes = plt.subplots(1, len(REGIMES), figsize=(13, 4.8), sharey=True)
        for ax, r in zip(axes, REGIMES):
            drawn = 0
            for i, base in enumerate(configs):
                name = r.name(base)
                a = aggs.get(name) if name else None
                if a is None or not a.curve:
                    continue
                color, label = f"C{i % 10}", f"{BY_NAME[name].label.replace(' (2048-prompt pool)', '')}"
                base = name in _baselines(r, configs)
                label += " (baseline)" if base else ""
                xs, ys = [p["step"] for p in a.curve], [p["pass1"] for p in a.curve]
                ax.plot(xs, ys, "-", color=color, marker="s" if base else "o", ms=3, lw=2.4 if base else 1.6,
                        label=f"{label}: held-out ({len(a.finished)})")
                if len(a.finished) > 1:
                    sd = [p["pass1_std"] for p in a.curve]
                    ax.fill_between(xs, [y - d for y, d in zip(ys, sd)], [y + d for y, d in zip(ys, sd)],
                                    color=color, alpha=0.12, lw=0)
                steps, train, n = train_curve(a.finished)
                if steps:
                    ax.plot(steps, train, "--", color=color, lw=1.2, label=f"{label}: training prompts ({n})")
                drawn += 1
            ax.set_title(f"{r.label}-prompt pool")
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if drawn:
                ax.legend(fontsize=7)
            else:
                missing = all(r.name(b) is None for b in configs)
                ax.text(0.5, 0.5, f"no {r.label}-pool config" if missing else "runs pending", ha="center",
                        va="center", transform=ax.transAxes)
        axes[0].set_ylabel("pass@1 (mean over seeds, band ± std)")
        fig.suptitle(f"{script}.py: held-out pass@1 (solid) and pass@1 on training-pool prompts (dashed); "
                     "baselines thick, squares; legend: seeds")
        fig.tight_layout()
        path = figures_dir / f"{script}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


# ----------------------------------------------------------------------------------------------------
# Re-making the runs: the benchmarks/run.py commands that build each committed run's recorded command
# ----------------------------------------------------------------------------------------------------


def recorded_settings(run: RunData) -> Optional[run_mod.Settings]:
    """The harness settings a run was made with (its bench.json; fields it predates take run.py's defaults)."""
    st = run.meta.get("settings")
    if not st:
        return None
    known = {f.name for f in dataclasses.fields(run_mod.Settings)}
    return run_mod.Settings(**{**{k: v for k, v in st.items() if k in known}, "seeds": [run.seed]})


def runner_flags(s: run_mod.Settings) -> list[str]:
    """The benchmarks/run.py flags, besides --only and --seeds, that give settings `s` (run.py's defaults left
    out)."""
    defaults = run_mod.resolve(run_mod.Args())[0]
    out = []
    for f in dataclasses.fields(run_mod.Settings):
        value, default = getattr(s, f.name), getattr(defaults, f.name)
        if f.name == "seeds" or value == default:
            continue
        out += [f"--{f.name}", shlex.join(value) if f.name == "extra" else str(value)]
    return out


def rerun_commands(runs: dict[str, dict[int, RunData]], names: Optional[list[str]] = None,
                   runs_dir: Optional[Path] = None) -> tuple[list[str], list[str]]:
    """(commands, problems): the `python benchmarks/run.py ...` lines that re-make the finished runs of `names`
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
    commands = [shlex.join(["python", "benchmarks/run.py", "--only", ",".join(cfgs), "--seeds",
                            *map(str, seeds), *flags]) for (seeds, flags), cfgs in groups.items()]
    return commands, problems


def commands_text(runs: dict[str, dict[int, RunData]], names: Optional[list[str]] = None,
                  runs_dir: Optional[Path] = None) -> str:
    commands, problems = rerun_commands(runs, names, runs_dir)
    text = "```bash\n" + "\n".join(commands) + "\n```\n" if commands else "No finished runs.\n"
    if problems:
        text += ("Recorded commands that run.py would not build from their settings (re-make by hand from their "
                 "bench.json): " + ", ".join(problems) + "\n")
    return text


# ----------------------------------------------------------------------------------------------------
# The docs' generated blocks: each method page's results (its tables and every figure its text quotes) and the
# README's claim list, between markers; `--write_docs` rewrites them, tests/test_docs.py checks them
# ----------------------------------------------------------------------------------------------------

MARK_BEGIN = "<!-- generated by benchmarks/report.py: begin {} -->"
MARK_END = "<!-- generated by benchmarks/report.py: end {} -->"


def _short(name: str) -> str:
    return BY_NAME[name].label.replace(" (2048-prompt pool)", "")


def _page_base(r: Regime, b: str) -> Optional[str]:
    """The baseline a page's config `b` (a 256-pool name, or a 2,048-only one) is measured against in regime `r`:
    the regime's twin of the 256-pool config's baseline, so both pools compare like with like."""
    if b in BY_NAME:
        return r.name(BY_NAME[b].baseline) if BY_NAME[b].baseline else None
    name = r.name(b)
    return BY_NAME[name].baseline if name else None


def _baselines(r: Regime, configs: tuple[str, ...]) -> set[str]:
    """The configs of a page that another of its configs is measured against in regime `r`."""
    return {_page_base(r, b) for b in configs if r.name(b)} & {r.name(b) for b in configs}


def _setting(aggs: dict[str, Agg], name: Optional[str], field: str):
    """A setting of a config's first finished run (its bench.json), None without one."""
    a = aggs.get(name or "")
    st = recorded_settings(a.finished[0]) if a and a.finished else None
    return getattr(st, field) if st else None


def _mean_over(aggs: dict[str, Agg], name: str, value) -> Optional[float]:
    iv = over_seeds(aggs, name, value)
    return iv.mean if iv else None


def _pair(aggs: dict[str, Agg], a: str, b: str, value=final_value, nd: int = 3) -> str:
    iv = paired(aggs, a, b, value)
    return "-" if iv is None else f"{_iv(iv, nd)} ({iv.n} paired seeds)"


def _level(key: str):
    return lambda run: final_value(run, key)


def _at_step(step: int):
    """A run's held-out pass@1 at one evaluation step (None when it has none there)."""
    return lambda run: next((p["pass1"] for p in eval_curve(run.rows) if p["step"] == step), None)


def doc_config_table(aggs: dict[str, Agg], r: Regime, configs: tuple[str, ...]) -> str:
    base_set = _baselines(r, configs)
    head = ("| config | seeds | held-out pass@1, start → end (± std) | pass@k at the end | easy / mid / hard at the "
            "end | Δ pass@1 vs baseline [95% CI] | Δ at equal generated tokens | s/step (gen / train) | train − held-out "
            "gap (seeds) |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for b in configs:
        name = r.name(b)
        a = aggs.get(name) if name else None
        if a is None or a.final is None:
            continue
        label = f"{_short(name)} (`{name}`)" + (" (baseline)" if name in base_set else "")
        spread = f" ± {a.final[1]:.3f}" if len(a.finished) > 1 else ""
        levels = " / ".join(_f(_mean_over(aggs, name, _level(lv))) for lv in LEVELS)
        base = _page_base(r, b)
        if base and base in aggs and aggs[base].final is not None:
            diff = f"{_pair(aggs, name, base)} vs `{base}`"
            tokens = _iv(equal_tokens_diffs(aggs, name)) if base == a.cfg.baseline else "-"
        else:
            diff, tokens = "-", "-"
        lines.append(f"| {label} | {len(a.finished)} | {_f(a.start)} → {a.final[0]:.3f}{spread} | "
                     f"{_f(a.passk)}{f' (k={a.k})' if a.k else ''} | {levels} | {diff} | {tokens} | "
                     f"{_f(a.step_s, 2)} ({_f(a.gen_s, 2)} / {_f(a.train_s, 2)}) | {gap_cell(aggs, name, False)} |")
    return "\n".join(lines) + "\n" if len(lines) > 1 else f"No finished runs on the {r.label}-prompt pool.\n"


def doc_metric_table(aggs: dict[str, Agg], r: Regime, configs: tuple[str, ...], keys: tuple[str, ...]) -> str:
    """Each metric's seed-mean over training steps (first → last quarter), over the finished seeds that log it."""
    lines = ["| config | " + " | ".join(f"`{k}`" for k in keys) + " |", "|---|" + "---|" * len(keys)]
    for b in configs:
        name = r.name(b)
        a = aggs.get(name) if name else None
        if a is None or not a.finished:
            continue
        cells = [_mech_text(a.finished, k, len(a.finished)) for k in keys]
        if any(c != "-" for c in cells):
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def doc_claims(aggs: dict[str, Agg], r: Regime, configs: tuple[str, ...], papers: tuple[str, ...]) -> str:
    rows = [c for spec, c in zip(CLAIMS, claim_rows(aggs, r))
            if spec.paper in papers and all(n in configs for n in spec.configs)
            and not c.verdict.startswith("no ")]  # a claim without this pool's configs: nothing to show
    if not rows:
        return ""
    return ("| claim | verdict | measured |\n|---|---|---|\n"
            + "\n".join(f"| {_cell(c.claim)} | **{c.verdict}** | {_cell(c.measured)} |" for c in rows) + "\n")


# Figures each page's text quotes beyond its tables: (aggs, regime) -> bullet lines


def _ada_seq_facts(aggs: dict[str, Agg], r: Regime) -> list[str]:
    n4, out = r.name("grpo_n4"), []
    if r.name("dr_grpo_n4") and _have(aggs, r.name("dr_grpo_n4"), n4):
        ratio = paired(aggs, n4, r.name("dr_grpo_n4"), _summary_of("grad_norm"), ratio=True)
        out.append(f"The std in GRPO-n4's advantage (GRPO-n4 over Dr. GRPO-n4, mean `grad_norm` over steps, paired "
                   f"ratio): {_iv(ratio, 2, '')}; the final pass@1 difference is in the table.")
    lengths = [(n, _m(aggs, r.name(n), "completion_len_mean")) for n in ("grpo_n4", "seq_pos", "seq_balance",
                                                                          "dapo_n4", "grpo_n16") if r.name(n)]
    lengths = [(n, v) for n, v in lengths if v is not None]
    cap = _setting(aggs, n4, "max_new_tokens")
    if lengths and cap:
        lo, hi = min(v for _, v in lengths), max(v for _, v in lengths)
        out.append(f"Completion length (`completion_len_mean`, mean over steps and seeds, of {cap} tokens): "
                   + ", ".join(f"{_short(n)} {v:.1f}" for n, v in lengths)
                   + f": the constant normaliser gives {lo / cap:.2f}-{hi / cap:.2f}x token-mean's step.")
    dapo = r.name("dapo_n4")
    if dapo and _have(aggs, dapo):
        def part_fill(part):
            def value(run):  # trained groups over the run's prompts per step
                m, st = run_summary(run, "dapo_kept_groups"), recorded_settings(run)
                return m[part] / st.prompts_per_step if m and st else None
            return value
        fill = {part: over_seeds(aggs, dapo, part_fill(part)) for part in ("mean", "early", "late")}
        rounds = _m(aggs, dapo, "dapo_rounds")
        out.append(f"DAPO's batch fill (trained groups / prompts_per_step: `dapo_kept_groups` / "
                   f"{_setting(aggs, dapo, 'prompts_per_step')}, what `dapo_batch_fill` logs): mean {_iv(fill['mean'], sign='')}, first quarter "
                   f"{_iv(fill['early'], sign='')}, last quarter {_iv(fill['late'], sign='')}; extra rounds per step "
                   f"(`dapo_rounds`) {_f(rounds, 2)}. A partial batch keeps a full batch's normaliser, so its step is "
                   "that fraction of a full one.")
    pairs = [("seq_balance", "grpo_n4", "easy"), ("seq_balance", "grpo_n4", "mid"), ("seq_pos", "grpo_n4", "mid"),
             ("dapo_n4", "grpo_n4", "mid"), ("grpo_n16", "seq_balance", "mid"), ("grpo_n16", "seq_balance", "hard")]
    diffs = [f"{_short(r.name(a))} − {_short(r.name(b))} {lv} {_pair(aggs, r.name(a), r.name(b), _level(lv))}"
             for a, b, lv in pairs if r.name(a) and r.name(b) and _have(aggs, r.name(a), r.name(b))]
    if diffs:
        out.append("Final held-out pass@1 by level, paired: " + "; ".join(diffs) + ".")
    return out


def _ada_est_facts(aggs: dict[str, Agg], r: Regime) -> list[str]:
    est, n8, out = r.name("est"), r.name("grpo_n8"), []
    if not (est and n8 and _have(aggs, est, n8)):
        return out
    steps = sorted({p["step"] for p in aggs[est].curve} & {p["step"] for p in aggs[n8].curve})
    by_step = [(s, paired(aggs, est, n8, _at_step(s))) for s in steps if s > 0]
    out.append("EST − GRPO-n8, held-out pass@1 at each evaluation (paired mean): "
               + ", ".join(f"step {s} {iv.mean:+.3f}" for s, iv in by_step if iv) + ".")
    out.append(f"By level at the end, EST − GRPO-n8: easy {_pair(aggs, est, n8, _level('easy'))}; mid "
               f"{_pair(aggs, est, n8, _level('mid'))}; hard {_pair(aggs, est, n8, _level('hard'))}.")
    if r is POOL2048:
        for name in ("est", "grpo_n8"):
            small, large = POOL256.name(name), r.name(name)
            out.append(f"The pool's own effect on {_short(large)} (final pass@1, 2,048 − 256 pool): "
                       f"{_pair(aggs, large, small)}.")
    return out


def _pros_facts(aggs: dict[str, Agg], r: Regime) -> list[str]:
    out = []
    peaks = []
    for b in ("ppo", "ppo_pros", "grpo_k4", "grpo_pros"):
        a = aggs.get(r.name(b) or "")
        if a and a.curve:
            top = max(a.curve, key=lambda p: p["pass1"])
            peaks.append(f"{_short(a.cfg.name)} {top['pass1']:.3f} at step {top['step']} (ends {a.final[0]:.3f})")
    if peaks:
        out.append("Seed-mean held-out pass@1 at its peak: " + "; ".join(peaks) + ".")
    shares = []
    for b in ("ppo_pros", "grpo_pros"):
        name = r.name(b)
        gibbs = _m(aggs, name, "pros_gibbs_s") if name else None
        if gibbs is not None and aggs[name].step_s:
            shares.append(f"{_short(name)} {gibbs * 1000:.0f} ms of a {aggs[name].step_s:.2f} s iteration "
                          f"({100 * gibbs / aggs[name].step_s:.1f}%)")
    if shares:
        out.append("Gibbs sweeps (`pros_gibbs_s`, mean over iterations, against the median s/step): "
                   + "; ".join(shares) + ".")
    visit, every = r.name("ppo_pros_visit"), r.name("ppo_pros")
    if visit and _have(aggs, visit, every):
        out.append(f"Forgetting on a revisit − every iteration (PPO+PROS), final pass@1: {_pair(aggs, visit, every)}.")
    return out


@dataclass(frozen=True)
class DocPage:
    """A method page's generated results: its configs (256-pool names; each pool's block shows their twins), the
    papers whose claims it lists, the metrics of its mechanism table, and the extra figures its text quotes."""
    configs: tuple[str, ...]
    papers: tuple[str, ...]
    metrics: tuple[str, ...]
    facts: Optional[Callable[[dict, Regime], list[str]]] = None
    setting: str = ""


DOC_PAGES = {
    "ra_rloo": DocPage(("rloo", "ra_rloo"), (_RA,),
                       ("frac_zero_var_groups", "ra_zero_var_frac_post", "ra_no_success_frac_post",
                        "ra_replay_fired_frac", "ra_is_weight_mean")),
    "ps_grpo": DocPage(("ps_off", "ps_fixed", "ps_adaptive", "ps_adaptive_reset"), (_PS,),
                       ("ps_trained_groups", "ps_prefix_pass_rate", "ps_ratio_hard", "ps_ratio_easy",
                        "ps_solve_partial"),
                       setting=" Multi-turn mode: the PS rows start from the multi-turn warm-up and are evaluated as "
                               "whole episodes, so they compare with each other only."),
    "pros_ppo": DocPage(("ppo", "ppo_pros", "ppo_pros_random", "ppo_pros_visit", "grpo_k4", "grpo_pros"), (_PROS,),
                        ("reward_mean", "frac_zero_var_groups", "pros_frac_children_in_batch", "pros_calib_error",
                         "pros_calib_excess", "pros_frac_zero_var_picks", "pros_frac_zero_var_stream",
                         "pros_pick_trials_mean"), _pros_facts),
    "ada_seq": DocPage(("grpo_n4", "dr_grpo_n4", "grpo_n8", "grpo_n16", "dapo_n4", "seq_pos", "seq_balance"), (_ADA,),
                       ("frac_zero_var_groups", "ada_inference_cost_rel", "ada_samples_per_prompt_mean",
                        "ada_adv_mean_trained_easy", "ada_adv_mean_trained_mid", "ada_adv_mean_trained_hard",
                        "dapo_kept_groups"), _ada_seq_facts),
    "ada_est": DocPage(("grpo_n8", "est"), (_ADA,),
                       ("est_calibration_error", "est_alloc_min", "est_alloc_max", "est_p_hat_mean",
                        "frac_zero_var_groups"), _ada_est_facts),
}


def method_block(runs: dict[str, dict[int, RunData]], aggs: dict[str, Agg], page: DocPage) -> str:
    names = [n for b in page.configs for r in REGIMES for n in [r.name(b)] if n]
    first = next((a.finished[0] for n in names for a in [aggs.get(n)] if a and a.finished), None)
    st = recorded_settings(first) if first else None
    setting = (f"{st.max_steps} steps of {st.prompts_per_step} prompts, answers <= {st.max_new_tokens} tokens, lr "
               f"{st.learning_rate} with a {st.warmup_steps}-step warm-up, held-out evaluation every {st.eval_every} "
               f"steps on {st.eval_prompts} prompts x {st.eval_samples} samples" if st else "no finished run yet")
    out = [f"Every figure below is computed by `benchmarks/report.py` from the committed runs (`benchmarks/runs/`): "
           f"{setting}; Δ columns are paired by seed with 95% t-intervals "
           "(the setting and the statistics: [benchmark.md](benchmark.md); all configs: [the results page]"
           f"(../benchmarks/results/README.md)).{page.setting} These commands re-make the rows:\n",
           commands_text(runs, names)]
    for r in REGIMES:
        out.append(f"### {r.label}-prompt pool\n")
        out.append(doc_config_table(aggs, r, page.configs))
        claims_md = doc_claims(aggs, r, page.configs, page.papers)
        if claims_md:
            out.append(claims_md)
        metrics = doc_metric_table(aggs, r, page.configs, page.metrics)
        if metrics:
            out.append("Mechanism metrics, mean over training steps (first → last quarter), over the seeds that "
                       "log them:\n")
            out.append(metrics)
        facts = page.facts(aggs, r) if page.facts else []
        if facts:
            out.append("\n".join(f"- {f}" for f in facts) + "\n")
    return "\n".join(out)


def readme_block(aggs: dict[str, Agg]) -> str:
    """The README's claim list: every paper claim's verdict on each pool."""
    per = [claim_rows(aggs, r) for r in REGIMES]
    lines = ["| paper | claim | 256-prompt pool | 2,048-prompt pool |", "|---|---|---|---|"]
    for rows in zip(*per):
        lines.append(f"| {rows[0].paper} | {_cell(rows[0].claim)} | " + " | ".join(c.verdict for c in rows) + " |")
    return "\n".join(lines) + "\n"


def default_steps(script: str) -> int:
    """A script's default --max_steps, read from its source (its Args, else common/args.py's BaseArgs)."""
    import ast

    for path, cls in ((ROOT / script, "Args"), (ROOT / "common" / "args.py", "BaseArgs")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", "") == "max_steps":
                        return ast.literal_eval(item.value)
    raise ValueError(f"{script}: no default max_steps")


# what a plain `python <script>` runs, as a harness config: its default run's duration is scaled from those runs
DEFAULT_RUNS = (("ada_seq.py", "SEQ-BALANCE", "seq_balance"), ("ada_est.py", "EST on its 2,048 pool", "est_pool2048"),
                ("ps_grpo.py", "multi-turn, adaptive", "ps_adaptive"), ("pros_ppo.py", "PPO+PROS", "ppo_pros"),
                ("ada_seq.py --max_rounds 1 --round_repeat 4", "GRPO-n4", "grpo_n4"))


def durations_block(aggs: dict[str, Agg]) -> str:
    """How long each script's default run takes, scaled from the committed runs' wall time (bench.json `wall_s`:
    start-up, training and every evaluation, at the runs' thread count beside a second runner)."""
    lines = []
    for command, what, cfg in DEFAULT_RUNS:
        a = aggs.get(cfg)
        walls = [r.meta["wall_s"] / r.max_steps for r in (a.finished if a else []) if r.meta.get("wall_s")]
        if walls:
            steps = default_steps(command.split()[0])
            threads = _setting(aggs, cfg, "num_threads") or "policy"
            lines.append(f"- `python {command}` ({what}, {steps} steps): about "
                         f"{statistics.fmean(walls) * steps / 60:.0f} min (`{cfg}`'s {len(walls)} runs: "
                         f"{statistics.fmean(walls):.2f} s a step, start-up and evaluations included, {threads} "
                         "thread beside a second run)")
    return "\n".join(lines) + "\n"


def doc_blocks(runs: dict[str, dict[int, RunData]], aggs: dict[str, Agg]) -> dict[Path, dict[str, str]]:
    """{page: {block name: its generated text}} for every page with generated blocks."""
    out = {ROOT / "docs" / f"{script}.md": {"results": method_block(runs, aggs, page)}
           for script, page in DOC_PAGES.items()}
    out[ROOT / "README.md"] = {"durations": durations_block(aggs), "claims": readme_block(aggs)}
    out[ROOT / "docs" / "benchmark.md"] = {"commands": commands_text(runs)}
    return out


def replace_blocks(text: str, blocks: dict[str, str], where: str = "") -> str:
    """`text` with each named block between its markers replaced; a missing marker is an error."""
    for name, body in blocks.items():
        begin, end = MARK_BEGIN.format(name), MARK_END.format(name)
        if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
            raise ValueError(f"{where}: needs exactly one '{begin}' ... '{end}'")
        head, rest = text.split(begin, 1)
        text = head + begin + "\n" + body.rstrip("\n") + "\n" + end + rest.split(end, 1)[1]
    return text


def stale_blocks(runs_dir: Path = None) -> list[str]:
    """The pages whose generated blocks differ from what the committed runs give ('page: block')."""
    runs = load_runs(runs_dir or RUNS_DIR)
    _, aggs = build_aggs(runs)
    stale = []
    for page, blocks in doc_blocks(runs, aggs).items():
        text = page.read_text()
        for name in blocks:
            if replace_blocks(text, {name: blocks[name]}, page.name) != text:
                stale.append(f"{page.relative_to(ROOT)}: {name}")
    return stale


def write_doc_blocks(runs: dict[str, dict[int, RunData]], aggs: dict[str, Agg]) -> list[Path]:
    written = []
    for page, blocks in doc_blocks(runs, aggs).items():
        text = page.read_text()
        new = replace_blocks(text, blocks, page.name)
        if new != text:
            page.write_text(new)
            written.append(page)
    return written


# ----------------------------------------------------------------------------------------------------
# The page
# ----------------------------------------------------------------------------------------------------


def build_aggs(runs: dict[str, dict[int, RunData]]) -> tuple[list[str], dict[str, Agg]]:
    order = [c.name for c in CONFIGS if c.name in runs] + sorted(n for n in runs if n not in BY_NAME)
    aggs = {}
    for n in order:
        cfg = BY_NAME.get(n) or Config(n, "?", (), n)
        aggs[n] = aggregate(cfg, runs[n])
    return order, aggs


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _seeds_seen(runs_dir: Path) -> list[int]:
    """Seeds with a run directory (sweep.json's settings hold only the last invocation's --seeds)."""
    return sorted({int(d.name[4:]) for d in runs_dir.glob("*/seed*") if d.is_dir() and d.name[4:].isdigit()})


def write_report(runs_dir: Path, out_dir: Path, plots: bool = True, figures_dir: Optional[Path] = None) -> Path:
    """The page `out_dir`/README.md and its PNGs; with `figures_dir`, the docs pages' learning curves there too."""
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = load_runs(runs_dir)
    order, aggs = build_aggs(runs)
    sweep_path = runs_dir / "sweep.json"
    sweep = json.loads(sweep_path.read_text()) if sweep_path.exists() else {}
    pngs, doc_pngs, plot_note = [], [], ""
    if plots and any(a.curve for a in aggs.values()):
        try:
            pngs = make_plots(order, aggs, out_dir)
            doc_pngs = make_doc_figures(aggs, figures_dir) if figures_dir is not None else []
        except ImportError:
            plot_note = "Plots skipped: matplotlib is not installed (`pip install -r benchmarks/requirements.txt`).\n"
    elif plots:
        plot_note = "No finished run to plot.\n"

    md = ["# Benchmark results\n",
          (f"Generated by `python benchmarks/report.py` from `{_rel(runs_dir)}` on "
           f"{time.strftime('%Y-%m-%d %H:%M')}. Only finished runs are counted.\n")]
    recorded = [st for st in (recorded_settings(r) for c in runs.values() for r in c.values()) if st is not None]
    st = dataclasses.asdict(recorded[0]) if recorded else sweep.get("settings")
    if st:
        same = all(dataclasses.replace(x, seeds=[]) == dataclasses.replace(recorded[0], seeds=[]) for x in recorded)
        threads = f"{st['num_threads']} torch threads per run" if st["num_threads"] else "the thread policy"
        md.append(f"**Setting** ({'every run' if same else 'the first run; the commands below give each'}): "
                  f"{st['max_steps']} steps x {st['prompts_per_step']} prompts "
                  "from a pool of "
                  f"{st['prompt_pool'] or 'all'} training prompts (the `_pool2048` configs: 2,048), completions <= "
                  f"{st['max_new_tokens']} tokens, lr {st['learning_rate'] or 'script default'}, base policy "
                  f"`{st['model_name_or_path']}`, seeds {_seeds_seen(runs_dir)} (per config: the table's `seeds` "
                  f"column); held-out evaluation every {st['eval_every']} steps on {st['eval_prompts']} prompts x "
                  f"{st['eval_samples']} samples (temperature 1), {threads}.\n")
    md.append("**Commands** that re-make every finished run, built from each run's `bench.json` (run.py builds "
              "exactly the command the run recorded from these; `--dry_run` prints each one):\n\n"
              + commands_text(runs, runs_dir=runs_dir))
    if sweep.get("machine"):
        m = sweep["machine"]
        md.append(f"**Machine**: {m.get('cpu', '?')}, {m.get('cpu_count', '?')} CPUs, {m.get('platform', '?')}, "
                  f"torch {m.get('torch', '?')}, transformers {m.get('transformers', '?')}. Wall times are per run, "
                  "one run at a time; other jobs sharing the machine make them upper bounds.\n")
    md.append("## Table\n")
    md.append("Eval pass@1 is the mean over seeds at the last step (± sample std over seeds). 'To reach' is the first "
              "evaluation at which the seed-mean pass@1 reaches the baseline's final seed-mean pass@1 (in brackets: "
              "relative to the baseline's own count at that point); tokens and samples count every generated "
              "completion (replayed prefixes excluded). s/step is the median training step, evaluation excluded.\n")
    md.append(results_table(order, aggs) if order else "No runs found.\n")
    md.append("## Against the baseline, paired by seed\n")
    md.append(f"Each difference is taken per seed (config minus its baseline, same seed) and summarised by its mean "
              f"and 95% t-interval over the seeds both finished; ⚠ marks a half-width above the precision target "
              f"{TARGET_HALF}. Hard / easy: held-out pass@1 on the problems of that difficulty level (when the runs "
              f"log it). Equal generated tokens: per seed, both runs' pass@1 read off their eval curves at the same "
              f"token spend (the smaller of the two runs' totals, interpolated between evaluations; > 0: the config "
              f"scores more for the same generation cost). Tokens to reach: per seed, generated tokens until the "
              f"eval curve reaches the baseline's final seed-mean pass@1 (interpolated between evaluations) over "
              f"the baseline's own tokens to first reach that score (< 1: cheaper); the interval is over the seeds "
              f"that reached it. That ratio is a threshold crossing near the top of flattening curves, so an eval's "
              f"noise (about ±0.01 pass@1) moves it by tens of steps: its intervals are far wider than "
              f"±{TARGET_HALF} at any seed count this machine can afford (the cell says how many the same spread "
              f"would need), and the equal-tokens difference answers the same question on the pass@1 scale.\n")
    md.append(difference_table(order, aggs) if order else "No runs found.\n")
    md.append("\nConfigs:\n")
    for n in order:
        c = aggs[n].cfg
        md.append(f"- `{n}` ({c.label}): `{c.script} {' '.join(c.flags)}`"
                  + (f", baseline `{c.baseline}`" if c.baseline else ", a baseline")
                  + (f"; {c.note}" if c.note else ""))
    md.append("")
    md.append("## The papers' claims: verdicts\n")
    md.append(VERDICT_RULES)
    md.append(claims(aggs))
    md.append("## The two data regimes, per config\n")
    md.append("Each config on the sweep's 256-prompt pool and on the 2,048-prompt pool (32 prompts a step return to a "
              "prompt about every 8 steps on the first, every 64 on the second). Final pass@1 is held-out (mean ± std "
              "over seeds); the train − held-out gap is pass@1 on a fixed sample of training-pool prompts minus "
              "held-out pass@1 at the final evaluation, seed mean over the seeds that log it (in brackets; '-': runs "
              "made before `eval_train_pass@1` was logged). The last column is the pool's own effect, paired by "
              "seed.\n")
    md.append(regime_table(order, aggs))
    md.append("### Mechanism metrics, both pools\n")
    md.append(mechanism_tables(order, aggs))
    md.append("## Plots\n")
    md.append(plot_note)
    captions = {"pass1_vs_tokens.png": "Eval pass@1 vs generated tokens",
                "pass1_vs_wall.png": "Eval pass@1 vs training wall time",
                "zero_var.png": "Zero-variance group fraction over steps",
                "mechanisms.png": "Mechanism metrics over steps",
                "pass1_by_difficulty.png": "Held-out pass@1 on hard and easy problems vs step"}
    for p in pngs:
        md.append(f"![{captions.get(p, p)}]({p})\n")
    if doc_pngs:
        md.append("Per method, both pools (the docs pages' figures; held-out pass@1 solid, training-pool prompts "
                  "dashed):\n")
        for p in doc_pngs:
            md.append(f"![{p.stem}.py: learning curves, both pools]({Path(os.path.relpath(p, out_dir)).as_posix()})\n")
    floor = out_dir / "floor.md"
    md.append("## Throughput against the floor\n")
    md.append(floor.read_text() + "\n" if floor.exists() else
              "Not measured yet: `python benchmarks/floor.py` writes `floor.md` here.\n")
    incomplete = [(n, r) for n in order for r in aggs[n].unfinished]
    if incomplete:
        md.append("## Unfinished runs (not in the table)\n")
        for n, r in incomplete:
            last = r.rows[-1]["step"] if r.rows else 0
            md.append(f"- `{n}` seed {r.seed}: at step {last}/{r.max_steps}")
        md.append("")
    md.append("## Commentary\n")
    comm = out_dir / "commentary.md"
    md.append(comm.read_text() if comm.exists() else
              f"No commentary yet (write it in `{_rel(comm)}`; it is pasted here on every regeneration).\n")
    path = out_dir / "README.md"
    path.write_text("\n".join(md))
    return path


def main(args: Args) -> None:
    runs_dir = Path(args.runs_dir) if args.runs_dir else ROOT / "benchmarks" / "runs"
    out_dir = Path(args.out_dir) if args.out_dir else ROOT / "benchmarks" / "results"
    if not runs_dir.exists():
        raise SystemExit(f"--runs_dir {runs_dir}: does not exist (run benchmarks/run.py first)")
    default_out = ROOT / "benchmarks" / "results"
    ours = runs_dir.resolve() == RUNS_DIR and out_dir.resolve() == default_out
    if args.write_docs or ours:  # the docs' numbers come from the committed runs only
        runs = load_runs(RUNS_DIR)
        written = write_doc_blocks(runs, build_aggs(runs)[1])
        print("docs' generated blocks: " + (", ".join(_rel(p) for p in written) or "all current"))
        if args.write_docs:
            return
    figures_dir = (Path(args.figures_dir) if args.figures_dir else
                   ROOT / "docs" / "figures" if out_dir.resolve() == default_out else out_dir / "figures")
    path = write_report(runs_dir, out_dir, args.plots, figures_dir)
    print(f"wrote {path}")
    docs = [figures_dir / f"{script}.png" for script in DOC_FIGURES]
    for p in sorted(out_dir.glob("*.png")) + [p for p in docs if p.exists()]:
        print(f"wrote {p}")


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
