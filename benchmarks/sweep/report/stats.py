"""Statistics over seeds, from `scipy.stats`: the 95% t-interval of a mean (paired by seed where two configs are
compared), the F-test interval of a ratio of seed-to-seed spreads, the seeds a target precision would need, the
binomial floor of a calibration error, and the number formats the tables share."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional

from scipy import stats

from benchmarks.sweep.report.curves import Agg, cost_to_reach, eval_curve, value_at

TARGET_HALF = 0.03  # the precision target: a 95% interval of at most about +-0.03
PROS_TRIALS = 4  # pros_ppo.py's rollouts per query (--num_generations); no config changes it


def t975(dof: int) -> float:
    """The two-sided 95% quantile of Student's t with `dof` degrees of freedom."""
    return float(stats.t.ppf(0.975, dof))


def f_quantile(prob: float, dof1: int, dof2: int) -> float:
    """The `prob` quantile of the F distribution with (dof1, dof2) degrees of freedom."""
    return float(stats.f.ppf(prob, dof1, dof2))


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
    return Interval(
        statistics.fmean(values),
        t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)),
        len(values),
    )


def std_ratio_interval(xs: list[float], ys: list[float]) -> Optional[tuple[float, float, float]]:
    """std(xs) / std(ys) with its 95% interval (F test on the variance ratio, normal seeds); None under 2 each."""
    if len(xs) < 2 or len(ys) < 2 or statistics.stdev(ys) == 0:
        return None
    ratio = statistics.variance(xs) / statistics.variance(ys)
    dx, dy = len(xs) - 1, len(ys) - 1
    return (
        math.sqrt(ratio),
        math.sqrt(ratio / f_quantile(0.975, dx, dy)),
        math.sqrt(ratio * f_quantile(0.975, dy, dx)),
    )


def over_seeds(aggs: dict[str, Agg], name: str, value) -> Optional[Interval]:
    """Interval of value(run) over a config's finished runs (runs where it is None left out)."""
    agg = aggs.get(name)
    vals = [v for v in (value(r) for r in agg.finished) if v is not None] if agg else []
    return t_interval(vals)


def paired(
    aggs: dict[str, Agg], name: str, other: str, value, ratio: bool = False
) -> Optional[Interval]:
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


def reach_ratios(
    aggs: dict[str, Agg], name: str, xkey: str = "gen_tokens"
) -> tuple[Optional[Interval], int, int]:
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
        cost, denom = (
            cost_to_reach(eval_curve(run.rows), base.final[0], xkey),
            spent.get(run.seed, mean_spent),
        )
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
    return max(iv.n, math.ceil((stats.norm.ppf(0.975) * sd / target) ** 2))


def binomial_abs_floor(p: float, n: int = PROS_TRIALS) -> float:
    """E|p - s/n| for s ~ Binomial(n, p): what |θ̂ - s/n| averages for a perfectly calibrated θ̂ = p."""
    return float(sum(stats.binom.pmf(s, n, p) * abs(p - s / n) for s in range(n + 1)))


def si(x: Optional[float]) -> str:
    """A count with a k / M / G suffix ('-' for None)."""
    if x is None:
        return "-"
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{suf}"
    return f"{x:.0f}"


def fmt(x: Optional[float], nd: int = 3) -> str:
    """`nd` decimals ('-' for None)."""
    return "-" if x is None else f"{x:.{nd}f}"


def iv_text(
    iv: Optional[Interval], nd: int = 3, sign: str = "+", target: Optional[float] = None
) -> str:
    """An interval's `Interval.text` ('-' for None)."""
    return "-" if iv is None else iv.text(nd, sign, target)


def seeds_of(iv: Optional[Interval]) -> int:
    """The values behind an interval (0 for None)."""
    return iv.n if iv else 0
