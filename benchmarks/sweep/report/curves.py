"""Curves from the runs' rows: each run's held-out evaluations (pass@1 overall, by difficulty level and on training
prompts, pass@k, cumulative tokens, samples and wall time), the training metrics' step series and their means over
steps, the seed-mean curve and per-config aggregate (`Agg`), and reading a curve at a score or a token budget."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional

from benchmarks.sweep.configs import BY_NAME, CONFIGS, Config
from benchmarks.sweep.report.load import RunData


def _number(v) -> Optional[float]:
    return (
        float(v)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        else None
    )


# A report reads each run's final value and metric means thousands of times (every claim, table
# and docs block): kept per (rows, key), while that rows list is alive and unchanged in length.
_MEMO: dict[tuple[int, str, str], tuple[list, int, object]] = {}


def _memo(kind: str, rows: list[dict], key: str, compute):
    slot = (id(rows), kind, key)
    hit = _MEMO.get(slot)
    if hit is not None and hit[0] is rows and hit[1] == len(rows):
        return hit[2]
    value = compute()
    _MEMO[slot] = (rows, len(rows), value)
    return value


def step_walls(rows: list[dict]) -> dict[int, float]:
    """Training wall time of every step, held-out evaluation excluded: an evaluating row's time_step_s
    includes the evaluation, so it is replaced by its generation + training time plus the run's median
    book-keeping (time_step_s - gen - train on non-evaluating rows)."""
    train = [r for r in rows if r.get("step", 0) >= 1 and _number(r.get("time_step_s")) is not None]
    plain = [r for r in train if r.get("eval_pass@1") is None]
    over = [
        r["time_step_s"] - (r.get("time_gen_s") or 0.0) - (r.get("time_train_s") or 0.0)
        for r in plain
    ]
    extra = statistics.median(over) if over else 0.0
    out = {}
    for r in train:
        if r.get("eval_pass@1") is None:
            out[r["step"]] = r["time_step_s"]
        else:
            out[r["step"]] = (
                (r.get("time_gen_s") or 0.0) + (r.get("time_train_s") or 0.0) + max(0.0, extra)
            )
    return out


LEVELS = (
    "easy",
    "mid",
    "hard",
)  # eval_pass@1_<level>: held-out pass@1 by difficulty level (newer runs only)


def _largest_k(row: dict) -> Optional[str]:
    """The largest k of the row's eval_pass@k (k > 1; eval_pass@1_<level> and eval_paper_* are not pass@k)."""
    ks = [
        int(key[10:])
        for key in row
        if key.startswith("eval_pass@") and key[10:].isdigit() and key != "eval_pass@1"
    ]
    return str(max(ks)) if ks else None


def eval_curve(rows: list[dict]) -> list[dict]:
    """One point per evaluation: step, pass@1 (all, and by difficulty level when logged), pass@k,
    pass@1 on training-pool prompts (None in runs that do not log it), cumulative generated tokens /
    samples / wall time. Read only: the same list is returned for the same rows."""
    return _memo("curve", rows, "", lambda: _eval_curve(rows))


def _eval_curve(rows: list[dict]) -> list[dict]:
    walls = step_walls(rows)
    pts, tokens, samples = [], 0, 0
    for r in sorted(rows, key=lambda r: r.get("step", 0)):
        tokens = r.get("gen_tokens", tokens) or tokens
        samples = r.get("rollouts", samples) or samples
        if r.get("eval_pass@1") is None:
            continue
        k = _largest_k(r)
        pts.append(
            {
                "step": r["step"],
                "pass1": float(r["eval_pass@1"]),
                "passk": _number(r.get(f"eval_pass@{k}")) if k else None,
                "k": k,
                **{level: _number(r.get(f"eval_pass@1_{level}")) for level in LEVELS},
                "paper4": _number(
                    r.get("eval_paper_pass@4")
                ),  # ra_rloo.py: the RA-RLOO paper's own metric
                "train1": _number(
                    r.get("eval_train_pass@1")
                ),  # the same evaluation on training-pool prompts
                "gen_tokens": tokens if r["step"] > 0 else 0,
                "rollouts": samples if r["step"] > 0 else 0,
                "wall_s": sum(w for s, w in walls.items() if s <= r["step"]),
            }
        )
    return pts


def metric_series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [
        (r["step"], _number(r.get(key)))
        for r in rows
        if r.get("step", 0) >= 1 and _number(r.get(key)) is not None
    ]


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
        out.append(
            {
                "step": s,
                "pass1": m,
                "pass1_std": sd,
                "passk": statistics.fmean(ks) if ks else None,
                # a level's mean only where every seed logged it
                **{
                    level: statistics.fmean(v) if len(v) == len(pts) else None
                    for level, v in levels.items()
                },
                "k": pts[0]["k"],
                "gen_tokens": statistics.fmean(p["gen_tokens"] for p in pts),
                "rollouts": statistics.fmean(p["rollouts"] for p in pts),
                "wall_s": statistics.fmean(p["wall_s"] for p in pts),
            }
        )
    return out


def reach(curve: list[dict], target: float) -> Optional[dict]:
    """The first point of a (seed-mean) curve whose pass@1 reaches `target`, or None."""
    for p in curve:
        if p["pass1"] >= target - 1e-12:
            return p
    return None


def run_summary(run: RunData, key: str) -> Optional[dict]:
    """One run's mean of a training metric over all steps, over the first and over the last quarter of them."""
    summary = _memo("summary", run.rows, key, lambda: _run_summary(run, key))
    return dict(summary) if summary is not None else None


def _run_summary(run: RunData, key: str) -> Optional[dict]:
    series = metric_series(run.rows, key)
    if not series:
        return None
    quarter = max(1, len(series) // 4)
    return {
        "mean": statistics.fmean(v for _, v in series),
        "early": statistics.fmean(v for _, v in series[:quarter]),
        "late": statistics.fmean(v for _, v in series[-quarter:]),
    }


def mechanism_summary(runs: list[RunData], key: str) -> Optional[dict]:
    """Seed-mean of a metric over all training steps, over the first and over the last quarter of them."""
    per = [m for m in (run_summary(r, key) for r in runs) if m is not None]
    if not per:
        return None
    return {
        **{part: statistics.fmean(m[part] for m in per) for part in ("mean", "early", "late")},
        "seeds": len(per),
    }


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


def value_at(
    curve: list[dict], x: float, xkey: str = "gen_tokens", key: str = "pass1"
) -> Optional[float]:
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
    """A config's runs over seeds, summarised."""

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
    """One config's finished and unfinished runs, seed-mean curve, final pass@1, median times and mechanism means."""
    fin = [runs[s] for s in sorted(runs) if runs[s].finished]
    unf = [runs[s] for s in sorted(runs) if not runs[s].finished]
    curve = mean_curve(fin)
    finals = [eval_curve(r.rows)[-1] for r in fin]
    final = _mean_std([p["pass1"] for p in finals]) if finals else None
    starts = [c[0]["pass1"] for c in (eval_curve(r.rows) for r in fin) if c and c[0]["step"] == 0]
    ks = [p["passk"] for p in finals if p["passk"] is not None]

    def med(key):
        vals = [
            statistics.median(v)
            for v in (
                [
                    _number(x.get(key))
                    for x in r.rows
                    if x.get("step", 0) >= 1
                    and x.get("eval_pass@1") is None
                    and _number(x.get(key)) is not None
                ]
                for r in fin
            )
            if v
        ]
        return statistics.fmean(vals) if vals else None

    return Agg(
        cfg,
        fin,
        unf,
        curve,
        final,
        statistics.fmean(starts) if starts else None,
        statistics.fmean(ks) if ks else None,
        finals[0]["k"] if finals else None,
        med("time_step_s"),
        med("time_gen_s"),
        med("time_train_s"),
        {k: mechanism_summary(fin, k) for k in cfg.mechanism},
    )


def build_aggs(
    runs: dict[str, dict[int, RunData]], configs: Optional[dict[str, Config]] = None
) -> tuple[list[str], dict[str, Agg]]:
    """(configs in the harness's order, unknown ones last; {config: its aggregate}); `configs`: the
    configs as the runs ran them (a task sweep's), default the harness's."""
    configs = configs or BY_NAME
    order = [c.name for c in CONFIGS if c.name in runs] + sorted(
        n for n in runs if n not in BY_NAME
    )
    aggs = {}
    for n in order:
        cfg = configs.get(n) or BY_NAME.get(n) or Config(n, "?", (), n)
        aggs[n] = aggregate(cfg, runs[n])
    return order, aggs


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


def mech_value(aggs: dict[str, Agg], cfg: str, key: str, part: str = "mean") -> Optional[float]:
    """A config's training metric averaged over steps (`part`: mean, early, late; seed mean), None when not logged."""
    a = aggs.get(cfg)
    m = a.mechanism.get(key) if a else None
    if (
        m is None and a is not None and a.finished
    ):  # a metric not in the config's list: compute it on demand
        m = mechanism_summary(a.finished, key)
    return None if m is None else m[part]
