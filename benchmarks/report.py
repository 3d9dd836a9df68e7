"""Turn the benchmark runs into `benchmarks/results/README.md` (table, mechanism metrics) and PNG plots.

    python benchmarks/report.py                              # benchmarks/runs -> benchmarks/results
    python benchmarks/report.py --runs_dir benchmarks/runs-quick --out_dir benchmarks/results-quick

Only finished runs (final step with its evaluation) enter the table and plots; the others are listed.
Human commentary lives in `<out_dir>/commentary.md` and is pasted into the page (never overwritten).
Plots need matplotlib (`pip install -r benchmarks/requirements.txt`); without it the page is written
without them and says so.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

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


def eval_curve(rows: list[dict]) -> list[dict]:
    """One point per evaluation: step, pass@1, pass@k, cumulative generated tokens / samples / wall time."""
    walls = step_walls(rows)
    pts, tokens, samples = [], 0, 0
    for r in sorted(rows, key=lambda r: r.get("step", 0)):
        tokens = r.get("gen_tokens", tokens) or tokens
        samples = r.get("rollouts", samples) or samples
        if r.get("eval_pass@1") is None:
            continue
        k = [key for key in r if key.startswith("eval_pass@") and key != "eval_pass@1"]
        pts.append({"step": r["step"], "pass1": float(r["eval_pass@1"]),
                    "passk": float(r[k[0]]) if k and r[k[0]] is not None else None, "k": k[0][10:] if k else None,
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
        out.append({"step": s, "pass1": m, "pass1_std": sd, "passk": statistics.fmean(ks) if ks else None,
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


def mechanism_summary(runs: list[RunData], key: str) -> Optional[dict]:
    """Seed-mean of a metric over all training steps, over the first and over the last quarter of them."""
    per = []
    for r in runs:
        s = metric_series(r.rows, key)
        if not s:
            continue
        q = max(1, len(s) // 4)
        per.append((statistics.fmean(v for _, v in s), statistics.fmean(v for _, v in s[:q]),
                    statistics.fmean(v for _, v in s[-q:])))
    if not per:
        return None
    return {"mean": statistics.fmean(p[0] for p in per), "early": statistics.fmean(p[1] for p in per),
            "late": statistics.fmean(p[2] for p in per), "seeds": len(per)}


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


def _m(aggs: dict[str, Agg], cfg: str, key: str, part: str = "mean") -> Optional[float]:
    a = aggs.get(cfg)
    m = a.mechanism.get(key) if a else None
    if m is None and a is not None and a.finished:  # a metric not in the config's list: compute it on demand
        m = mechanism_summary(a.finished, key)
    return None if m is None else m[part]


def claims(aggs: dict[str, Agg]) -> str:
    """The papers' mechanism claims, each with the number measured here (or why there is none)."""
    g = lambda c, k, p="mean": _f(_m(aggs, c, k, p))  # noqa: E731
    out = []
    if "ra_rloo" in aggs:
        out.append(f"- **RA-RLOO: zero-variance groups ≈ 0 after splicing.** Fresh rollouts: "
                   f"{g('ra_rloo', 'frac_zero_var_groups')} of groups; after the splice (`ra_zero_var_frac_post`): "
                   f"{g('ra_rloo', 'ra_zero_var_frac_post')} (RLOO: {g('rloo', 'frac_zero_var_groups')}, no splice). "
                   "The splice only fires in groups without a fresh success, so all-pass groups remain.")
    if "ps_fixed" in aggs or "ps_adaptive" in aggs:
        out.append(f"- **PS: prefix-task pass rate near 0.5, more valid tasks per batch.** `ps_prefix_pass_rate`: "
                   f"fixed {g('ps_fixed', 'ps_prefix_pass_rate')} (first → last quarter "
                   f"{g('ps_fixed', 'ps_prefix_pass_rate', 'early')} → "
                   f"{g('ps_fixed', 'ps_prefix_pass_rate', 'late')}), "
                   f"adaptive {g('ps_adaptive', 'ps_prefix_pass_rate')} "
                   f"({g('ps_adaptive', 'ps_prefix_pass_rate', 'early')} → "
                   f"{g('ps_adaptive', 'ps_prefix_pass_rate', 'late')}). Groups with signal trained per step "
                   f"(`ps_trained_groups`): baseline {g('ps_off', 'ps_trained_groups')}, fixed "
                   f"{g('ps_fixed', 'ps_trained_groups')}, adaptive {g('ps_adaptive', 'ps_trained_groups')}.")
    for c in ("seq_pos", "seq_balance"):
        if c in aggs:
            out.append(f"- **{aggs[c].cfg.label}: more samples for hard prompts.** Samples per prompt "
                       f"(`ada_samples_per_prompt_mean`) {g(c, 'ada_samples_per_prompt_mean')} (first → last quarter "
                       f"{g(c, 'ada_samples_per_prompt_mean', 'early')} → "
                       f"{g(c, 'ada_samples_per_prompt_mean', 'late')}), "
                       f"per-step max {g(c, 'ada_samples_per_prompt_max')}; zero-variance groups in the update "
                       f"{g(c, 'ada_frac_zero_var_groups_post')} vs {g(c, 'frac_zero_var_groups')} for the first n "
                       f"samples (what GRPO-n would train on). The logs hold per-step aggregates, not per-prompt "
                       f"difficulty, so 'rising for hard prompts' is seen only through the max and the mean.")
    if "est" in aggs:
        out.append(f"- **EST: calibrated pass-rate estimates.** `est_calibration_error` "
                   f"{g('est', 'est_calibration_error', 'early')} → {g('est', 'est_calibration_error', 'late')} "
                   f"(first → last quarter); allocation per prompt min/max {g('est', 'est_alloc_min')} / "
                   f"{g('est', 'est_alloc_max')}.")
    if "ppo_pros" in aggs:
        out.append(f"- **PROS: calibration error falling over training.** `pros_calib_error` "
                   f"{g('ppo_pros', 'pros_calib_error', 'early')} → {g('ppo_pros', 'pros_calib_error', 'late')} "
                   f"(first → last quarter); share of augmented (child) queries in the batch "
                   f"{g('ppo_pros', 'pros_frac_children_in_batch')}.")
    return "\n".join(out) + "\n" if out else "No mechanism metrics yet.\n"


# ----------------------------------------------------------------------------------------------------
# Plots (matplotlib imported only here)
# ----------------------------------------------------------------------------------------------------

STYLE = {  # colour by family; baselines dashed
    "grpo_n4": ("#7f7f7f", "--"), "grpo_n8": ("#222222", "--"), "rloo": ("#1f77b4", "--"),
    "ra_rloo": ("#1f77b4", "-"), "ps_off": ("#2ca02c", "--"), "ps_fixed": ("#2ca02c", "-"),
    "ps_adaptive": ("#98df8a", "-"), "seq_pos": ("#ff7f0e", "-"), "seq_balance": ("#d62728", "-"),
    "est": ("#9467bd", "-"), "ppo": ("#8c564b", "--"), "ppo_pros": ("#e377c2", "-"),
    "ppo_pros_random": ("#e377c2", ":"), "grpo_k4": ("#17becf", "--"), "grpo_pros": ("#17becf", "-"),
}


def _style(name: str, i: int) -> tuple[str, str]:
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
            ax.plot(xs, ys, ls, color=color, marker="o", ms=3, lw=1.6, label=f"{a.cfg.label} ({len(a.finished)})")
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


def write_report(runs_dir: Path, out_dir: Path, plots: bool = True) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = load_runs(runs_dir)
    order, aggs = build_aggs(runs)
    sweep_path = runs_dir / "sweep.json"
    sweep = json.loads(sweep_path.read_text()) if sweep_path.exists() else {}
    pngs, plot_note = [], ""
    if plots and any(a.curve for a in aggs.values()):
        try:
            pngs = make_plots(order, aggs, out_dir)
        except ImportError:
            plot_note = "Plots skipped: matplotlib is not installed (`pip install -r benchmarks/requirements.txt`).\n"
    elif plots:
        plot_note = "No finished run to plot.\n"

    md = ["# Benchmark results\n",
          (f"Generated by `python benchmarks/report.py` from `{_rel(runs_dir)}` on "
           f"{time.strftime('%Y-%m-%d %H:%M')}. Only finished runs are counted.\n")]
    st = sweep.get("settings")
    if st:
        md.append(f"**Setting** (every config): {st['max_steps']} steps x {st['prompts_per_step']} prompts "
                  "from a pool of "
                  f"{st['prompt_pool'] or 'all'} training prompts, completions <= {st['max_new_tokens']} tokens, "
                  f"lr {st['learning_rate'] or 'script default'}, base policy `{st['model_name_or_path']}`, seeds "
                  f"{_seeds_seen(runs_dir)} (per config: the table's `seeds` column); held-out evaluation every "
                  f"{st['eval_every']} steps on {st['eval_prompts']} prompts x "
                  f"{st['eval_samples']} samples (temperature 1), {st['num_threads']} torch threads per run.\n")
    if sweep.get("invocations"):
        cmds = list(dict.fromkeys(i["command"] for i in sweep["invocations"]))
        md.append("**Command(s)** that produced the runs:\n\n```bash\n" + "\n".join(cmds) + "\n```\n")
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
    md.append("\nConfigs:\n")
    for n in order:
        c = aggs[n].cfg
        md.append(f"- `{n}` ({c.label}): `{c.script} {' '.join(c.flags)}`"
                  + (f", baseline `{c.baseline}`" if c.baseline else ", a baseline")
                  + (f"; {c.note}" if c.note else ""))
    md.append("")
    md.append("## The papers' mechanism claims, measured\n")
    md.append(claims(aggs))
    md.append("## Plots\n")
    md.append(plot_note)
    captions = {"pass1_vs_tokens.png": "Eval pass@1 vs generated tokens",
                "pass1_vs_wall.png": "Eval pass@1 vs training wall time",
                "zero_var.png": "Zero-variance group fraction over steps",
                "mechanisms.png": "Mechanism metrics over steps"}
    for p in pngs:
        md.append(f"![{captions.get(p, p)}]({p})\n")
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
    path = write_report(runs_dir, out_dir, args.plots)
    print(f"wrote {path}")
    for p in sorted(out_dir.glob("*.png")):
        print(f"wrote {p}")


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
