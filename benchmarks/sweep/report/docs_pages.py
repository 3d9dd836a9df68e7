"""The method pages' generated results (docs/<script>.md, block `results`): per data regime, the page's configs
with their learning and cost figures, its paper's claims with their verdicts, its mechanism metrics, and every
further figure its hand-written text quotes, with the commands that re-make its runs. `DOC_PAGES` says which configs,
claims and metrics each page shows."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Callable, Optional

from benchmarks.sweep.configs import BY_NAME
from benchmarks.sweep.report.claims import (
    ADA_PAPER,
    CLAIMS,
    PROS_PAPER,
    PS_PAPER,
    RA_PAPER,
    RULES_LINK,
    claim_rows,
    have_runs,
    summary_of,
)
from benchmarks.sweep.report.commands import commands_text
from benchmarks.sweep.report.curves import (
    LEVELS,
    Agg,
    eval_curve,
    final_value,
    gap_cell,
    mech_value,
    run_summary,
)
from benchmarks.sweep.report.load import (
    POOL256,
    POOL2048,
    REGIMES,
    WORD_FUNCS_RESULTS,
    WORD_PROBLEMS,
    WORD_RESULTS,
    Regime,
    RunData,
    page_baseline,
    page_baselines,
    recorded_settings,
)
from benchmarks.sweep.report.stats import equal_tokens_diffs, fmt, iv_text, over_seeds, paired
from benchmarks.sweep.report.tables import cell_text, mech_text


def _short(name: str) -> str:
    """A config's label without its pool."""
    return BY_NAME[name].label.replace(" (2048-prompt pool)", "")


def recorded_setting(aggs: dict[str, Agg], name: Optional[str], field: str):
    """A setting of a config's first finished run (its bench.json), None without one."""
    a = aggs.get(name or "")
    st = recorded_settings(a.finished[0]) if a and a.finished else None
    return getattr(st, field) if st else None


def _mean_over(aggs: dict[str, Agg], name: str, value) -> Optional[float]:
    iv = over_seeds(aggs, name, value)
    return iv.mean if iv else None


def _pair(aggs: dict[str, Agg], a: str, b: str, value=final_value, nd: int = 3) -> str:
    iv = paired(aggs, a, b, value)
    return "-" if iv is None else f"{iv_text(iv, nd)} ({iv.n} paired seeds)"


def _level(key: str):
    return lambda run: final_value(run, key)


def _at_step(step: int):
    """A run's held-out pass@1 at one evaluation step (None when it has none there)."""
    return lambda run: next((p["pass1"] for p in eval_curve(run.rows) if p["step"] == step), None)


def doc_config_table(aggs: dict[str, Agg], r: Regime, configs: tuple[str, ...]) -> str:
    base_set = page_baselines(r, configs)
    head = (
        "| config | seeds | held-out pass@1, start → end (± std) | pass@k at the end | easy / mid / hard at the "
        "end | Δ pass@1 vs baseline [95% CI] | Δ at equal generated tokens | s/step (gen / train) | "
        "train − held-out gap (seeds) |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for b in configs:
        name = r.name(b)
        a = aggs.get(name) if name else None
        if a is None or a.final is None:
            continue
        label = f"{_short(name)} (`{name}`)" + (" (baseline)" if name in base_set else "")
        spread = f" ± {a.final[1]:.3f}" if len(a.finished) > 1 else ""
        levels = " / ".join(fmt(_mean_over(aggs, name, _level(lv))) for lv in LEVELS)
        base = page_baseline(r, b)
        if base and base in aggs and aggs[base].final is not None:
            diff = f"{_pair(aggs, name, base)} vs `{base}`"
            tokens = iv_text(equal_tokens_diffs(aggs, name)) if base == a.cfg.baseline else "-"
        else:
            diff, tokens = "-", "-"
        lines.append(
            f"| {label} | {len(a.finished)} | {fmt(a.start)} → {a.final[0]:.3f}{spread} | "
            f"{fmt(a.passk)}{f' (k={a.k})' if a.k else ''} | {levels} | {diff} | {tokens} | "
            f"{fmt(a.step_s, 2)} ({fmt(a.gen_s, 2)} / {fmt(a.train_s, 2)}) | {gap_cell(aggs, name, False)} |"
        )
    return (
        "\n".join(lines) + "\n"
        if len(lines) > 1
        else f"No finished runs on the {r.label}-prompt pool.\n"
    )


def doc_metric_table(
    aggs: dict[str, Agg], r: Regime, configs: tuple[str, ...], keys: tuple[str, ...]
) -> str:
    """Each metric's seed-mean over training steps (first → last quarter), over the finished seeds that log it."""
    lines = [
        "| config | " + " | ".join(f"`{k}`" for k in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for b in configs:
        name = r.name(b)
        a = aggs.get(name) if name else None
        if a is None or not a.finished:
            continue
        cells = [mech_text(a.finished, k, len(a.finished)) for k in keys]
        if any(c != "-" for c in cells):
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def doc_claims(
    aggs: dict[str, Agg], r: Regime, configs: tuple[str, ...], papers: tuple[str, ...]
) -> str:
    rows = [
        c
        for spec, c in zip(CLAIMS, claim_rows(aggs, r))
        if spec.paper in papers
        and all(n in configs for n in spec.configs)
        and c.verdict != f"no {r.label}-pool config"
    ]  # a claim without this pool's configs: nothing to show
    if not rows:
        return ""
    return (
        f"Verdicts by the rules of [the results page](../{RULES_LINK}):\n\n| claim | verdict | measured |\n"
        "|---|---|---|\n"
        + "\n".join(
            f"| {cell_text(c.claim)} | **{c.verdict}** | {cell_text(c.measured)} |" for c in rows
        )
        + "\n"
    )


# Figures each page's text quotes beyond its tables: (aggs, regime) -> bullet lines


def _ada_seq_facts(aggs: dict[str, Agg], r: Regime) -> list[str]:
    n4, out = r.name("grpo_n4"), []
    if r.name("dr_grpo_n4") and have_runs(aggs, r.name("dr_grpo_n4"), n4):
        ratio = paired(aggs, n4, r.name("dr_grpo_n4"), summary_of("grad_norm"), ratio=True)
        out.append(
            f"The std in GRPO-n4's advantage (GRPO-n4 over Dr. GRPO-n4, mean `grad_norm` over steps, paired "
            f"ratio): {iv_text(ratio, 2, '')}; the final pass@1 difference is in the table."
        )
    lengths = [
        (n, mech_value(aggs, r.name(n), "completion_len_mean"))
        for n in ("grpo_n4", "seq_pos", "seq_balance", "dapo_n4", "grpo_n16")
        if r.name(n)
    ]
    lengths = [(n, v) for n, v in lengths if v is not None]
    cap = recorded_setting(aggs, n4, "max_completion_length")
    if lengths and cap:
        lo, hi = min(v for _, v in lengths), max(v for _, v in lengths)
        out.append(
            f"Completion length (`completion_len_mean`, mean over steps and seeds, of {cap} tokens): "
            + ", ".join(f"{_short(n)} {v:.1f}" for n, v in lengths)
            + f": the constant normaliser gives {lo / cap:.2f}-{hi / cap:.2f}x token-mean's step."
        )
    dapo = r.name("dapo_n4")
    if dapo and have_runs(aggs, dapo):

        def part_fill(part):
            def value(run):  # trained groups over the run's prompts per step
                m, st = run_summary(run, "dapo_kept_groups"), recorded_settings(run)
                return m[part] / st.prompts_per_step if m and st else None

            return value

        fill = {part: over_seeds(aggs, dapo, part_fill(part)) for part in ("mean", "early", "late")}
        rounds = mech_value(aggs, dapo, "dapo_rounds")
        out.append(
            f"DAPO's batch fill (trained groups / prompts_per_step: `dapo_kept_groups` / "
            f"{recorded_setting(aggs, dapo, 'prompts_per_step')}, what `dapo_batch_fill` logs): mean "
            f"{iv_text(fill['mean'], sign='')}, first quarter {iv_text(fill['early'], sign='')}, last quarter "
            f"{iv_text(fill['late'], sign='')}; extra rounds per step "
            f"(`dapo_rounds`) {fmt(rounds, 2)}. A partial batch keeps a full batch's normaliser, so its step is "
            "that fraction of a full one."
        )
    pairs = [
        ("seq_balance", "grpo_n4", "easy"),
        ("seq_balance", "grpo_n4", "mid"),
        ("seq_pos", "grpo_n4", "mid"),
        ("dapo_n4", "grpo_n4", "mid"),
        ("grpo_n16", "seq_balance", "mid"),
        ("grpo_n16", "seq_balance", "hard"),
    ]
    diffs = [
        f"{_short(r.name(a))} − {_short(r.name(b))} {lv} {_pair(aggs, r.name(a), r.name(b), _level(lv))}"
        for a, b, lv in pairs
        if r.name(a) and r.name(b) and have_runs(aggs, r.name(a), r.name(b))
    ]
    if diffs:
        out.append("Final held-out pass@1 by level, paired: " + "; ".join(diffs) + ".")
    return out


def _ada_est_facts(aggs: dict[str, Agg], r: Regime) -> list[str]:
    est, n8, out = r.name("est"), r.name("grpo_n8"), []
    if not (est and n8 and have_runs(aggs, est, n8)):
        return out
    steps = sorted({p["step"] for p in aggs[est].curve} & {p["step"] for p in aggs[n8].curve})
    by_step = [(s, paired(aggs, est, n8, _at_step(s))) for s in steps if s > 0]
    out.append(
        "EST − GRPO-n8, held-out pass@1 at each evaluation (paired mean): "
        + ", ".join(f"step {s} {iv.mean:+.3f}" for s, iv in by_step if iv)
        + "."
    )
    out.append(
        f"By level at the end, EST − GRPO-n8: easy {_pair(aggs, est, n8, _level('easy'))}; mid "
        f"{_pair(aggs, est, n8, _level('mid'))}; hard {_pair(aggs, est, n8, _level('hard'))}."
    )
    if r is POOL2048:
        for name in ("est", "grpo_n8"):
            small, large = POOL256.name(name), r.name(name)
            out.append(
                f"The pool's own effect on {_short(large)} (final pass@1, 2,048 − 256 pool): "
                f"{_pair(aggs, large, small)}."
            )
    return out


def _pros_facts(aggs: dict[str, Agg], r: Regime) -> list[str]:
    out = []
    peaks = []
    for b in ("ppo", "ppo_pros", "grpo_k4", "grpo_pros"):
        a = aggs.get(r.name(b) or "")
        if a and a.curve:
            top = max(a.curve, key=lambda p: p["pass1"])
            peaks.append(
                f"{_short(a.cfg.name)} {top['pass1']:.3f} at step {top['step']} (ends {a.final[0]:.3f})"
            )
    if peaks:
        out.append("Seed-mean held-out pass@1 at its peak: " + "; ".join(peaks) + ".")
    shares = []
    for b in ("ppo_pros", "grpo_pros"):
        name = r.name(b)
        gibbs = mech_value(aggs, name, "pros_gibbs_s") if name else None
        if gibbs is not None and aggs[name].step_s:
            shares.append(
                f"{_short(name)} {gibbs * 1000:.0f} ms of a {aggs[name].step_s:.2f} s iteration "
                f"({100 * gibbs / aggs[name].step_s:.1f}%)"
            )
    if shares:
        out.append(
            "Gibbs sweeps (`pros_gibbs_s`, mean over iterations, against the median s/step): "
            + "; ".join(shares)
            + "."
        )
    visit, every = r.name("ppo_pros_visit"), r.name("ppo_pros")
    if visit and have_runs(aggs, visit, every):
        out.append(
            f"Forgetting on a revisit − every iteration (PPO+PROS), final pass@1: {_pair(aggs, visit, every)}."
        )
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
    "ra_rloo": DocPage(
        ("rloo", "ra_rloo"),
        (RA_PAPER,),
        (
            "frac_zero_var_groups",
            "ra_zero_var_frac_post",
            "ra_no_success_frac_post",
            "ra_replay_fired_frac",
            "ra_is_weight_mean",
        ),
    ),
    "ps_grpo": DocPage(
        ("ps_off", "ps_fixed", "ps_adaptive", "ps_adaptive_reset"),
        (PS_PAPER,),
        (
            "ps_trained_groups",
            "ps_prefix_pass_rate",
            "ps_ratio_hard",
            "ps_ratio_easy",
            "ps_solve_partial",
        ),
        setting=" Multi-turn mode: the PS rows start from the multi-turn warm-up and are evaluated as "
        "whole episodes, so they compare with each other only.",
    ),
    "pros_ppo": DocPage(
        ("ppo", "ppo_pros", "ppo_pros_random", "ppo_pros_visit", "grpo_k4", "grpo_pros"),
        (PROS_PAPER,),
        (
            "reward_mean",
            "frac_zero_var_groups",
            "pros_frac_children_in_batch",
            "pros_calib_error",
            "pros_calib_excess",
            "pros_frac_zero_var_picks",
            "pros_frac_zero_var_stream",
            "pros_pick_trials_mean",
        ),
        _pros_facts,
    ),
    "ada_seq": DocPage(
        ("grpo_n4", "dr_grpo_n4", "grpo_n8", "grpo_n16", "dapo_n4", "seq_pos", "seq_balance"),
        (ADA_PAPER,),
        (
            "frac_zero_var_groups",
            "ada_inference_cost_rel",
            "ada_samples_per_prompt_mean",
            "ada_adv_mean_trained_easy",
            "ada_adv_mean_trained_mid",
            "ada_adv_mean_trained_hard",
            "dapo_kept_groups",
        ),
        _ada_seq_facts,
    ),
    "ada_est": DocPage(
        ("grpo_n8", "est"),
        (ADA_PAPER,),
        (
            "est_calibration_error",
            "est_alloc_min",
            "est_alloc_max",
            "est_p_hat_mean",
            "frac_zero_var_groups",
        ),
        _ada_est_facts,
    ),
}


def side_by_side_claims(
    aggs: dict[str, Agg],
    word: dict[str, Agg],
    configs: tuple[str, ...],
    papers: tuple[str, ...],
    funcs: Optional[dict[str, Agg]] = None,
) -> str:
    """The page's claims with their verdict on each Countdown pool and on the word-problem task (and,
    where its configs ran, on the word-problem task with reward functions: `funcs`)."""
    funcs = {n: a for n, a in (funcs or {}).items() if n in configs and a.finished}
    per = [claim_rows(aggs, r) for r in REGIMES] + [claim_rows(word, WORD_PROBLEMS)]
    if funcs:
        per.append(claim_rows(funcs, WORD_PROBLEMS))
    lines = [
        "| claim | Countdown, 256-prompt pool | Countdown, 2,048-prompt pool | word problems |"
        + (f" [word problems, reward functions](../{WORD_FUNCS_RESULTS}) |" if funcs else ""),
        "|---|---|---|---|" + ("---|" if funcs else ""),
    ]
    for spec, *cells in zip(CLAIMS, *per):
        if spec.paper in papers and all(n in configs for n in spec.configs):
            lines.append(
                f"| {cell_text(spec.claim)} | "
                + " | ".join(
                    f"{c.verdict}: {cell_text(c.effect)}"
                    if c.effect and c.effect != "-"
                    else c.verdict
                    for c in cells
                )
                + " |"
            )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def word_problem_section(word: dict[str, Agg], page: DocPage) -> list[str]:
    """The page's configs on the word-problem task (benchmarks/sweep/tasks/word_problems.yaml)."""
    first = next(
        (a.finished[0] for b in page.configs for a in [word.get(b)] if a and a.finished), None
    )
    st = recorded_settings(first) if first else None
    out = [
        "### Word problems\n",
        wrap(
            "The second task: the word-problem base and data of `benchmarks/sweep/word_problems.py` "
            "through the real path (a model directory, `.jsonl` files, the chat template, the built-in "
            "math reward), run by `python benchmarks/sweep/run.py --task "
            "benchmarks/sweep/tasks/word_problems.yaml` ([all configs](../"
            + WORD_RESULTS
            + ")): "
            + (
                f"{st.max_steps} steps of {st.prompts_per_step} prompts from a pool of "
                f"{st.prompt_pool}, lr {st.learning_rate}, held-out evaluation every {st.eval_steps} "
                f"steps on {st.eval_prompts} prompts x {st.eval_samples} samples."
                if st
                else "no finished run yet."
            )
        )
        + "\n",
    ]
    if st:
        out.append(doc_config_table(word, WORD_PROBLEMS, page.configs))
        metrics = doc_metric_table(word, WORD_PROBLEMS, page.configs, page.metrics)
        if metrics:
            out.append("Mechanism metrics on word problems:\n")
            out.append(metrics)
    return out


def method_block(
    runs: dict[str, dict[int, RunData]],
    aggs: dict[str, Agg],
    page: DocPage,
    word: Optional[dict[str, Agg]] = None,
    funcs: Optional[dict[str, Agg]] = None,
) -> str:
    names = [n for b in page.configs for r in REGIMES for n in [r.name(b)] if n]
    first = next((a.finished[0] for n in names for a in [aggs.get(n)] if a and a.finished), None)
    st = recorded_settings(first) if first else None
    setting = (
        f"{st.max_steps} steps of {st.prompts_per_step} prompts, answers <= {st.max_completion_length} tokens, lr "
        f"{st.learning_rate} with a {st.warmup_steps}-step warm-up, held-out evaluation every {st.eval_steps} "
        f"steps on {st.eval_prompts} prompts x {st.eval_samples} samples"
        if st
        else "no finished run yet"
    )
    out = [
        f"Every figure below is computed by `benchmarks/sweep/report.py` from the committed runs "
        f"(`benchmarks/sweep/runs/`): "
        f"{setting}; Δ columns are paired by seed with 95% t-intervals "
        "(the setting and the statistics: [benchmark.md](benchmark.md); all configs: [the results page]"
        f"(../benchmarks/sweep/results/README.md)).{page.setting} These commands re-make the rows:",
        commands_text(runs, names),
    ]
    for r in REGIMES:
        out.append(f"### {r.label}-prompt pool\n")
        out.append(doc_config_table(aggs, r, page.configs))
        claims_md = doc_claims(aggs, r, page.configs, page.papers)
        if claims_md:
            out.append(claims_md)
        metrics = doc_metric_table(aggs, r, page.configs, page.metrics)
        if metrics:
            out.append(
                "Mechanism metrics, mean over training steps (first → last quarter), over the seeds that "
                "log them:\n"
            )
            out.append(metrics)
        facts = page.facts(aggs, r) if page.facts else []
        if facts:
            out.append("\n".join(wrap(f, "- ") for f in facts) + "\n")
    word = word or {}
    out += word_problem_section(word, page)
    both = side_by_side_claims(aggs, word, page.configs, page.papers, funcs)
    if both:
        out.append("### Both tasks, side by side\n")
        out.append(both)
    out[0] = wrap(out[0]) + "\n"
    return "\n".join(out)


def wrap(text: str, first: str = "") -> str:
    """A generated paragraph or bullet wrapped at 120 characters, as the hand-written docs are."""
    return textwrap.fill(
        text,
        120,
        initial_indent=first,
        subsequent_indent=" " * len(first),
        break_long_words=False,
        break_on_hyphens=False,
    )
