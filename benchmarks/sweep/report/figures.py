"""The PNG figures: the results page's plots (held-out pass@1 against generated tokens and wall time, zero-variance
groups, the mechanism metrics, pass@1 by difficulty) and each method page's learning curves, docs/figures/<script>.png
(one panel per data regime). matplotlib is imported inside the drawing functions only, so the rest of the report runs
without it."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.sweep.configs import BY_NAME, CONFIGS
from benchmarks.sweep.report.curves import Agg, eval_curve, metric_series
from benchmarks.sweep.report.load import REGIMES, RunData, base_name, page_baselines

STYLE = {  # colour by family; baselines dashed
    "grpo_n4": ("#7f7f7f", "--"),
    "grpo_n8": ("#222222", "--"),
    "rloo": ("#1f77b4", "--"),
    "ra_rloo": ("#1f77b4", "-"),
    "ps_off": ("#2ca02c", "--"),
    "ps_fixed": ("#2ca02c", "-"),
    "ps_adaptive": ("#98df8a", "-"),
    "ps_adaptive_reset": ("#98df8a", ":"),
    "seq_pos": ("#ff7f0e", "-"),
    "seq_balance": ("#d62728", "-"),
    "est": ("#9467bd", "-"),
    "est_pool2048": ("#9467bd", ":"),
    "grpo_n8_pool2048": ("#222222", ":"),
    "ppo": ("#8c564b", "--"),
    "ppo_pros": ("#e377c2", "-"),
    "ppo_pros_random": ("#e377c2", ":"),
    "grpo_k4": ("#17becf", "--"),
    "grpo_pros": ("#17becf", "-"),
    "dr_grpo_n4": ("#7f7f7f", ":"),
    "grpo_n16": ("#000000", "-."),
    "dapo_n4": ("#bcbd22", "--"),
}


BASELINES = {
    c.baseline for c in CONFIGS if c.baseline
}  # the configs another is measured against: dashed, labelled


def _style(name: str, i: int) -> tuple[str, str]:
    if (
        name not in STYLE and base_name(name) in STYLE
    ):  # a 2,048-pool twin: its config's colour, dotted
        return STYLE[base_name(name)][0], ":"
    return STYLE.get(name, (f"C{i % 10}", "-"))


def _smooth(ys: list[float], w: int) -> list[float]:
    out = []
    for i in range(len(ys)):
        win = ys[max(0, i - w + 1) : i + 1]
        out.append(sum(win) / len(win))
    return out


def _mean_metric(runs: list[RunData], key: str) -> tuple[list[int], list[float]]:
    per = [dict(metric_series(r.rows, key)) for r in runs]
    per = [p for p in per if p]
    if not per:
        return [], []
    steps = sorted(set.intersection(*(set(p) for p in per)))
    return steps, [statistics.fmean(p[s] for p in per) for s in steps]


def _difficulty_configs(order: list[str], aggs: dict[str, Agg]) -> list[str]:
    """The configs whose evaluations log held-out pass@1 by difficulty level."""
    return [
        n
        for n in order
        if aggs[n].curve
        and any(p["hard"] is not None or p["easy"] is not None for p in aggs[n].curve)
    ]


def plot_names(order: list[str], aggs: dict[str, Agg]) -> list[str]:
    """The file names `make_plots` writes for these configs, without drawing them."""
    names = ["pass1_vs_tokens.png", "pass1_vs_wall.png", "zero_var.png", "mechanisms.png"]
    return names + (["pass1_by_difficulty.png"] if _difficulty_configs(order, aggs) else [])


def doc_figure_paths(figures_dir: Path) -> list[Path]:
    """The paths `make_doc_figures` writes, without drawing them."""
    return [figures_dir / f"{script}.png" for script in DOC_FIGURES]


def make_plots(order: list[str], aggs: dict[str, Agg], out_dir: Path) -> list[str]:
    """Write the PNGs; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    have = [n for n in order if aggs[n].curve]

    for xkey, fname, xlabel in (
        ("gen_tokens", "pass1_vs_tokens.png", "generated tokens (cumulative)"),
        ("wall_s", "pass1_vs_wall.png", "training wall time, s (evaluation excluded)"),
    ):
        fig, ax = plt.subplots(figsize=(10, 5.5))
        for i, n in enumerate(have):
            a, (color, ls) = aggs[n], _style(n, i)
            xs = [p[xkey] for p in a.curve]
            ys = [p["pass1"] for p in a.curve]
            sd = [p["pass1_std"] for p in a.curve]
            mark = " (baseline)" if n in BASELINES else ""
            ax.plot(
                xs,
                ys,
                ls,
                color=color,
                marker="o",
                ms=3,
                lw=1.6,
                label=f"{a.cfg.label}{mark} ({len(a.finished)})",
            )
            if len(a.finished) > 1:
                ax.fill_between(
                    xs,
                    [y - s for y, s in zip(ys, sd)],
                    [y + s for y, s in zip(ys, sd)],
                    color=color,
                    alpha=0.12,
                    lw=0,
                )
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
    post_key = {
        "ra_rloo": "ra_zero_var_frac_post",
        "seq_pos": "ada_frac_zero_var_groups_post",
        "seq_balance": "ada_frac_zero_var_groups_post",
    }
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
                axes[1].plot(
                    steps,
                    _smooth(ys, w),
                    ls,
                    color=color,
                    lw=1.4,
                    label=f"{a.cfg.label}: {post_key[n]}",
                )
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
    panels = [
        (
            "PS: prefix-task pass rate (target 0.5)",
            [("ps_fixed", "ps_prefix_pass_rate"), ("ps_adaptive", "ps_prefix_pass_rate")],
            0.5,
        ),
        (
            "Ada-Seq: samples per prompt (mean, max)",
            [
                ("seq_pos", "ada_samples_per_prompt_mean"),
                ("seq_balance", "ada_samples_per_prompt_mean"),
                ("seq_pos", "ada_samples_per_prompt_max"),
                ("seq_balance", "ada_samples_per_prompt_max"),
            ],
            None,
        ),
        (
            "calibration error of the pass-rate model",
            [("est", "est_calibration_error"), ("ppo_pros", "pros_calib_error")],
            None,
        ),
        (
            "RA-RLOO: zero-variance groups before / after the splice",
            [("ra_rloo", "frac_zero_var_groups"), ("ra_rloo", "ra_zero_var_frac_post")],
            0.0,
        ),
    ]
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
            ax.plot(
                steps,
                _smooth(ys, max(1, len(steps) // 20)),
                ls,
                color=color,
                lw=1.4,
                label=f"{aggs[cfg].cfg.label}: {key}",
            )
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
    levels = _difficulty_configs(order, aggs)
    if levels:
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
        for ax, level in zip(axes, ("hard", "easy")):
            for i, n in enumerate(levels):
                pts = [p for p in aggs[n].curve if p[level] is not None]
                if pts:
                    color, ls = _style(n, i)
                    ax.plot(
                        [p["step"] for p in pts],
                        [p[level] for p in pts],
                        ls,
                        color=color,
                        marker="o",
                        ms=3,
                        lw=1.4,
                        label=aggs[n].cfg.label,
                    )
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
    per = [
        {p["step"]: p["train1"] for p in eval_curve(r.rows) if p["train1"] is not None}
        for r in runs
    ]
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
                color, label = (
                    f"C{i % 10}",
                    f"{BY_NAME[name].label.replace(' (2048-prompt pool)', '')}",
                )
                base = name in page_baselines(r, configs)
                label += " (baseline)" if base else ""
                xs, ys = [p["step"] for p in a.curve], [p["pass1"] for p in a.curve]
                ax.plot(
                    xs,
                    ys,
                    "-",
                    color=color,
                    marker="s" if base else "o",
                    ms=3,
                    lw=2.4 if base else 1.6,
                    label=f"{label}: held-out ({len(a.finished)})",
                )
                if len(a.finished) > 1:
                    sd = [p["pass1_std"] for p in a.curve]
                    ax.fill_between(
                        xs,
                        [y - d for y, d in zip(ys, sd)],
                        [y + d for y, d in zip(ys, sd)],
                        color=color,
                        alpha=0.12,
                        lw=0,
                    )
                steps, train, n = train_curve(a.finished)
                if steps:
                    ax.plot(
                        steps,
                        train,
                        "--",
                        color=color,
                        lw=1.2,
                        label=f"{label}: training prompts ({n})",
                    )
                drawn += 1
            ax.set_title(f"{r.label}-prompt pool")
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if drawn:
                ax.legend(fontsize=7)
            else:
                missing = all(r.name(b) is None for b in configs)
                ax.text(
                    0.5,
                    0.5,
                    f"no {r.label}-pool config" if missing else "runs pending",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
        axes[0].set_ylabel("pass@1 (mean over seeds, band ± std)")
        fig.suptitle(
            f"{script}.py: held-out pass@1 (solid) and pass@1 on training-pool prompts (dashed); "
            "baselines thick, squares; legend: seeds"
        )
        fig.tight_layout()
        path = figures_dir / f"{script}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
