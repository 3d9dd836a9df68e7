"""The results page's tables: configs with their learning and cost figures, the paired differences to each config's
baseline, the two data regimes side by side, the mechanism metrics of both pools, and the claims' verdicts."""

from __future__ import annotations

import statistics

from benchmarks.sweep.configs import BY_NAME, CONFIGS
from benchmarks.sweep.report.claims import claim_rows, have_runs, pending
from benchmarks.sweep.report.curves import (
    Agg,
    eval_curve,
    final_value,
    gap_cell,
    mech_value,
    mechanism_summary,
    metric_series,
    reach,
)
from benchmarks.sweep.report.load import REGIMES, Regime, RunData, base_name, flag_value
from benchmarks.sweep.report.stats import (
    PROS_TRIALS,
    TARGET_HALF,
    binomial_abs_floor,
    equal_tokens_diffs,
    fmt,
    iv_text,
    paired,
    reach_ratios,
    seeds_for,
    si,
)


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
    if (
        hit["step"] == 0
    ):  # the target is at or below the starting policy: "reaching" it says nothing
        return label, "target <= step 0", "-"
    tok, smp = si(hit["gen_tokens"]), si(hit["rollouts"])
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
    head = (
        "| config | seeds | eval pass@1 start → end (mean ± std) | pass@k end | baseline target | "
        "generated tokens to reach it | samples to reach it | s/step (gen / train) | mechanism: mean over steps "
        "(first → last quarter) |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name in order:
        a = aggs[name]
        seeds = f"{len(a.finished)}" + (
            f" (+{len(a.unfinished)} unfinished)" if a.unfinished else ""
        )
        if a.final is None:
            lines.append(f"| {a.cfg.label} (`{name}`) | {seeds} | no finished run | | | | | | |")
            continue
        spread = f" ± {a.final[1]:.3f}" if len(a.finished) > 1 else " (1 seed)"
        pass1 = f"{fmt(a.start)} → **{a.final[0]:.3f}**{spread}"
        passk = f"{fmt(a.passk)} (k={a.k})" if a.passk is not None else "-"
        tgt, tok, smp = reach_cells(a, aggs)
        step = f"{fmt(a.step_s, 2)} ({fmt(a.gen_s, 2)} / {fmt(a.train_s, 2)})"
        lines.append(
            f"| {a.cfg.label} (`{name}`) | {seeds} | {pass1} | {passk} | {tgt} | {tok} | {smp} | {step} | "
            f"{mech_cell(a)} |"
        )
    return head + "\n".join(lines) + "\n"


def _level_cell(a: Agg, level: str) -> str:
    vals = [v for v in (final_value(r, level) for r in a.finished) if v is not None]
    if not vals:
        return "-"
    return f"{statistics.fmean(vals):.3f}" + (
        f" ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else ""
    )


def difference_table(order: list[str], aggs: dict[str, Agg]) -> str:
    """Per config: final pass@1 (all, hard, easy) and the paired differences to its baseline with 95% intervals."""
    head = (
        "| config | baseline | paired seeds | final pass@1 (mean ± std) | hard | easy | Δ pass@1 vs baseline "
        "[95% CI] ±half | Δ hard | Δ easy | Δ pass@1 at equal generated tokens [95% CI] | tokens to the "
        "baseline's final pass@1 / baseline's tokens [95% CI] (seeds reaching it) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name in order:
        a = aggs[name]
        if a.final is None:
            continue
        final = f"{a.final[0]:.3f}" + (
            f" ± {a.final[1]:.3f}" if len(a.finished) > 1 else " (1 seed)"
        )
        cells = [
            f"{a.cfg.label} (`{name}`)",
            "-",
            "-",
            final,
            _level_cell(a, "hard"),
            _level_cell(a, "easy"),
        ]
        base = a.cfg.baseline
        if base is None or base not in aggs or aggs[base].final is None:
            cells[1] = f"`{base}`: no finished run" if base else "(a baseline)"
            lines.append("| " + " | ".join(cells + ["-"] * 5) + " |")
            continue
        diffs = [
            paired(aggs, name, base, lambda run, key=key: final_value(run, key))
            for key in ("pass1", "hard", "easy")
        ]
        ratio, reached, seeds = reach_ratios(aggs, name, "gen_tokens")
        cells[1], cells[2] = f"`{base}`", str(diffs[0].n if diffs[0] else 0)
        cells += [iv_text(iv, target=TARGET_HALF) for iv in diffs]
        cells.append(iv_text(equal_tokens_diffs(aggs, name), target=TARGET_HALF))
        need = seeds_for(ratio) if ratio and ratio.half and ratio.half > TARGET_HALF else None
        cells.append(
            f"{iv_text(ratio, 2, '', TARGET_HALF)} ({reached}/{seeds})"
            + (
                f"; ±{TARGET_HALF} needs {f'~{need}' if need <= 1000 else '> 1000'} seeds"
                if need
                else ""
            )
        )
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def _bases(order: list[str]) -> list[str]:
    """The 256-pool names of the harness's configs with runs in either regime, plus the 2,048-only configs whose
    baseline has runs (so that they show as pending), in the harness's order."""
    have, out = {base_name(n) for n in order}, []
    for c in CONFIGS:
        b = base_name(c.name)
        if b not in out and (
            b in have or (b not in BY_NAME and c.baseline and base_name(c.baseline) in have)
        ):
            out.append(b)
    return out


def regime_table(order: list[str], aggs: dict[str, Agg]) -> str:
    """Per config: each pool's finished seeds, final held-out pass@1 and train - held-out gap, and the pool's own
    effect on final held-out pass@1 (2,048 minus 256, paired by seed)."""
    head = (
        "| config | 256: seeds | 256: final held-out pass@1 | 256: train − held-out gap (seeds) | 2,048: seeds | "
        "2,048: final held-out pass@1 | 2,048: train − held-out gap (seeds) | held-out pass@1, 2,048 − 256 pool "
        "[95% CI] (paired seeds) |\n|---|---|---|---|---|---|---|---|\n"
    )
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
                cells += [
                    pending(0)
                    + (f" (+{len(a.unfinished)} unfinished)" if a and a.unfinished else ""),
                    "-",
                    "-",
                ]
            else:
                spread = f" ± {a.final[1]:.3f}" if len(a.finished) > 1 else ""
                cells += [
                    str(len(a.finished)),
                    f"{a.final[0]:.3f}{spread}",
                    gap_cell(aggs, name, with_name=False),
                ]
        if None in names:
            cells.append("-")
        else:
            iv = paired(aggs, names[1], names[0], final_value)
            n = iv.n if iv else 0
            cells.append(pending(n) if n < 2 else f"{iv_text(iv, target=TARGET_HALF)} ({n})")
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n" if lines else "No runs of the harness's configs.\n"


# the mechanism metrics of the two-regime comparison: (family, its scripts, metrics, which of its configs log them)
NEW_MECHANISM = (
    (
        "Reinforce-Ada",
        ("ada_seq.py", "ada_est.py"),
        (
            "ada_trained_responses",
            "ada_adv_mean_trained",
            "ada_adv_mean_trained_easy",
            "ada_adv_mean_trained_mid",
            "ada_adv_mean_trained_hard",
        ),
        lambda cfg: True,
    ),
    (
        "PROS",
        ("pros_ppo.py",),
        (
            "pros_calib_error",
            "pros_calib_excess",
            "pros_frac_zero_var_picks",
            "pros_frac_zero_var_stream",
            "pros_pick_trials_mean",
            "pros_pick_root_frac",
        ),
        lambda cfg: flag_value(list(cfg.flags), "--pros") not in (None, "off"),
    ),  # PROS off logs none of them
)


def g3(x: float) -> str:
    """3 significant digits, rounded to 0.001 first: a group-centred mean of 1e-18 is 0."""
    return f"{round(x, 3) + 0.0:.3g}"


def mech_text(runs: list[RunData], key: str, seeds: int) -> str:
    """A metric's seed-mean over steps (first → last quarter); '[k of n seeds]' when fewer than `seeds` runs log it."""
    m = mechanism_summary(runs, key)
    if m is None:
        return "-"
    fewer = f" [{m['seeds']} of {seeds} seeds]" if m["seeds"] < seeds else ""
    return f"{g3(m['mean'])} ({g3(m['early'])} → {g3(m['late'])}){fewer}"


def mechanism_tables(
    order: list[str], aggs: dict[str, Agg], regimes: tuple[Regime, ...] = REGIMES
) -> str:
    """Per family, per config and pool: each metric's seed-mean over steps (first → last quarter), over the
    finished seeds that log it."""
    out = []
    for family, scripts, keys, logs in NEW_MECHANISM:
        rows = []
        for base in _bases(order):
            for r in regimes:
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
                    cells.append(mech_text(logging, key, len(logging)))
                rows.append("| " + " | ".join(cells) + " |")
        if rows:
            out.append(
                f"**{family}** (mean over steps, first → last quarter; seeds: finished runs that log them / "
                f"finished runs)\n\n| config | pool | seeds | "
                + " | ".join(f"`{k}`" for k in keys)
                + " |\n|"
                + "---|" * (3 + len(keys))
                + "\n"
                + "\n".join(rows)
                + "\n"
            )
    lo, hi = binomial_abs_floor(0.5), binomial_abs_floor(0.4)
    out.append(
        f"`pros_calib_error` is the mean |θ̂ - s/n| over the pool's picks (θ̂: the model's pass rate at "
        f"selection; s of n = {PROS_TRIALS} rollouts succeed). Sampling noise alone gives it a floor, "
        f"E|p - Binomial({PROS_TRIALS}, p)/{PROS_TRIALS}| = {lo:.2f}-{hi:.2f} for p in 0.4-0.5 and 0 at p in "
        "{0, 1}: picks near a 0.5 pass rate (what the Bayesian selection aims for) score worse than all-pass "
        "or all-fail picks however well the model knows them, so `pros_calib_error` cannot rank Bayesian "
        "against random picks. `pros_calib_excess` subtracts that floor (its expectation for s ~ "
        "Binomial(n, θ̂)): about 0 for a calibrated model at any pass rate, > 0 when the observed rates sit "
        "further from θ̂ than sampling noise explains.\n"
    )
    return "\n".join(out)


def cell_text(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|")


def claims_table(
    aggs: dict[str, Agg], regimes: tuple[Regime, ...] = REGIMES, only: set | None = None
) -> str:
    """One table per paper: each claim's row in each regime, with the compared configs' train - held-out gaps;
    `only`: the claims that read these configs alone (an environment sweep's)."""
    per_regime = [claim_rows(aggs, r) for r in regimes]
    if only is not None:
        per_regime = [[c for c in rows if set(c.configs) <= only] for rows in per_regime]
    head = (
        "| claim | pool | verdict | measured | train − held-out gap: first config (seeds) | second config |\n"
        "|---|---|---|---|---|---|"
    )
    out, paper = [], None
    for rows in zip(*per_regime):
        if rows[0].paper != paper:
            paper = rows[0].paper
            out += [f"\n**{paper}**\n", head]
        for j, c in enumerate(rows):
            gaps = [gap_cell(aggs, n) for n in c.configs[:2]] + ["-"] * (2 - len(c.configs[:2]))
            out.append(
                f"| {cell_text(c.claim) if j == 0 else '″'} | {c.regime} | **{c.verdict}** | "
                f"{cell_text(c.measured)} | "
                f"{gaps[0]} | {gaps[1]} |"
            )
    for r in (
        regimes
    ):  # EST (Reinforce-Ada's estimator variant): no claim of its own here, its mechanism only
        est = r.name("est")
        if est and have_runs(aggs, est):
            g = lambda k, part: fmt(mech_value(aggs, est, k, part))  # noqa: E731
            out.append(
                f"\n*Not a claim*: EST on the {r.label} pool, `est_calibration_error` "
                f"{g('est_calibration_error', 'early')} → {g('est_calibration_error', 'late')} (first → last "
                f"quarter); allocation per prompt min/max {g('est_alloc_min', 'mean')} / "
                f"{g('est_alloc_max', 'mean')}."
            )
    return "\n".join(out).lstrip("\n") + "\n"


def cost_table(order: list[str], aggs: dict[str, Agg]) -> str:
    """Per config, what a run costs (seed means): wall time as its runner measured it (start-up and
    evaluations included), generated tokens and samples (replayed prefixes excluded), training steps
    (batches), and the final held-out pass@1 beside them."""
    head = (
        "| config | seeds | wall time per run | generated tokens | generated samples | training steps "
        "| final held-out pass@1 |\n|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name in order:
        a = aggs[name]
        if not a.finished:
            continue
        walls = [r.meta.get("wall_s") for r in a.finished if r.meta.get("wall_s")]
        ends = [eval_curve(r.rows)[-1] for r in a.finished]
        wall = f"{statistics.fmean(walls) / 60:.1f} min" if walls else "-"
        tokens = statistics.fmean(e["gen_tokens"] for e in ends)
        samples = statistics.fmean(e["rollouts"] for e in ends)
        updates = statistics.fmean(r.rows[-1]["step"] for r in a.finished)
        lines.append(
            f"| {a.cfg.label} (`{name}`) | {len(a.finished)} | {wall} | {tokens:,.0f} | "
            f"{samples:,.0f} | {updates:.0f} | {a.final[0]:.3f} |"
        )
    return head + "\n".join(lines) + "\n" if lines else "No finished runs.\n"
