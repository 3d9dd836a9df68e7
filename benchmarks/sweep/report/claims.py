"""The papers' claims and their verdict rules: one verdict per claim in each data regime (the sweep's 256-prompt pool
and the 2,048-prompt pool). `VERDICT_RULES` is the rule text the results page prints; the `verdict_*` functions apply
it to an interval; each judge below reads one claim's runs; `CLAIMS` is the list of claims, paper by paper, with the
configs each compares and its judge; `claim_rows` gives each claim's verdict and measured effect in one regime."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Optional

from benchmarks.sweep.configs import BY_NAME
from benchmarks.sweep.report.curves import (
    LEVELS,
    Agg,
    final_value,
    median_step_s,
    metric_series,
    run_summary,
)
from benchmarks.sweep.report.load import POOL256, Regime, base_name
from benchmarks.sweep.report.stats import (
    TARGET_HALF,
    Interval,
    fmt,
    iv_text,
    over_seeds,
    paired,
    reach_ratios,
    seeds_of,
    std_ratio_interval,
)

REPRODUCED, WORSE, INCONCLUSIVE = "reproduced", "worse", "inconclusive"
OUTSIDE = "outside the band"
CANNOT_RESOLVE = "cannot resolve at this precision"
NO_RUNS = "inconclusive (no runs)"
NOT_LOGGED = "inconclusive (not logged)"
RULES_LINK = "benchmarks/sweep/results/README.md#the-papers-claims-verdicts"  # the rules, from the repository root


def no_gain(margin_text: str) -> str:
    """The verdict of a gain ruled out at the claim's margin but not ruled out as positive."""
    return f"no gain as large as {margin_text}"


REGIME_RULE = """Each claim has a row per data regime: the sweep's 256-prompt pool, and the 2,048-prompt pool
(the same configs with `--prompt_pool 2048`, each paired with its baseline on that pool: run.py's `_pool2048`
twins; 'no 2,048-pool config' where run.py has none). """
RULES_HEAD = "Every interval is a 95% t-interval over seeds (paired by seed where two configs are compared).\n"
RULES_BODY = f"""The last two columns give each compared config's training-prompt minus held-out
pass@1 at the final evaluation (seed mean; in brackets the seeds that log `eval_train_pass@1`, '-' for runs made
before it was logged): a large gap with no held-out gain says the method fits the pool's prompts, not the task.
- **'X beats Y'** (interval of X - Y), in this order: *reproduced* if it lies above 0 (where the paper states its
  effect and the interval holds it, the cell says so); *worse* if it lies below 0; *cannot resolve at this
  precision* if it holds 0 and the paper reports an effect smaller than m or than the interval's half-width (what
  these seeds can resolve: such an interval cannot tell the paper's effect from 0, so it neither reproduces nor
  refutes it); *no gain as large as m* if it lies below the claim's margin m (a gain smaller than m is not ruled
  out); else *inconclusive*. An interval that excludes 0 has resolved the sign, however small the paper's effect.
  m = {TARGET_HALF} for pass@1 (the precision target; ⚠ marks a half-width above it), 1 group for trained groups
  per batch, 1 sample for samples per prompt, 0 for a falling calibration error.
- **'X at least matches Y'** (interval of X - Y): *worse* if it lies below 0; *reproduced* if it lies above
  -{TARGET_HALF} (X is at most {TARGET_HALF} worse); else *inconclusive*.
- **'X is near v'** (interval of X): *reproduced* if it lies inside the stated band; *outside the band* if it lies
  outside it; else *inconclusive*. 'About equal time per step': the ratio's interval inside [0.9, 1.1].
- **'Fewer steps / tokens to the baseline's final pass@1'**: per seed, the steps (tokens) to reach the baseline's final
  seed-mean pass@1, interpolated between evaluations, over the baseline's own steps (tokens) to first reach it;
  the saving 1 - ratio is judged as 'X beats Y' with m = {TARGET_HALF}. Seeds that never reach it: *not reached
  (r/n seeds)* when they are at least half, *inconclusive* otherwise.
- **'Lower seed-to-seed spread'**: the ratio of the two configs' std of final pass@1 with its F-test interval:
  *reproduced* below 1, *worse* above 1, else *inconclusive*.
- Fewer than 2 (paired) seeds with the data: *runs pending (n seeds)*, no figure.
- *The mechanism never fired*: the method's own action (`ra_replay_fired_frac`, RA-RLOO's
  splice; `ps_prefix_tasks`, Prefix Sampling's prefix tasks) is 0 at every step of every run, so it
  ran as its baseline and no verdict on its claims is read, whatever the interval.
- At 95% each, about 1 interval in 20 misses its true value by chance alone, so about that share of the verdicts
  could read otherwise on other seeds.
"""
VERDICT_RULES = RULES_HEAD + REGIME_RULE + RULES_BODY
TASK_VERDICT_RULES = RULES_HEAD + RULES_BODY  # a task sweep: one data regime, the task's pool

DECIDED = (
    REPRODUCED,
    WORSE,
    OUTSIDE,
    INCONCLUSIVE,
)  # verdicts drawn from an interval (no-gain ones too)


def judged(verdict: str) -> bool:
    """A verdict read off an interval (not pending, not missing, not 'cannot resolve')."""
    return verdict in DECIDED or verdict.startswith(
        ("no gain as large as", "not reached (", f"{REPRODUCED} (")
    )


def holds_paper(paper_effect: float) -> str:
    """The 'reproduced' verdict of an interval that holds the paper's own effect."""
    return f"{REPRODUCED} (the interval holds the paper's {paper_effect:+g})"


def _few(iv: Optional[Interval]) -> Optional[str]:
    if iv is None:
        return NO_RUNS
    return "inconclusive (1 seed)" if iv.half is None else None


def verdict_greater(
    iv: Optional[Interval],
    margin: float,
    margin_text: Optional[str] = None,
    paper_effect: Optional[float] = None,
) -> str:
    """'X beats Y' on the interval of X - Y; `paper_effect`, the gain the paper reports, when it states one."""
    if _few(iv):
        return _few(iv)
    if iv.lo > 0:  # the sign is resolved, however small the paper's effect
        return (
            holds_paper(paper_effect)
            if paper_effect is not None and iv.lo <= paper_effect <= iv.hi
            else REPRODUCED
        )
    if iv.hi < 0:
        return WORSE
    if paper_effect is not None and (paper_effect < margin or paper_effect < iv.half):
        return CANNOT_RESOLVE
    return no_gain(margin_text or f"{margin:g}") if iv.hi < margin else INCONCLUSIVE


def verdict_not_below(iv: Optional[Interval], margin: float) -> str:
    """'X at least matches Y' on the interval of X - Y: non-inferiority within the margin."""
    if _few(iv):
        return _few(iv)
    return WORSE if iv.hi < 0 else REPRODUCED if iv.lo > -margin else INCONCLUSIVE


def verdict_within(iv: Optional[Interval], low: float, high: float) -> str:
    """'X is in [low, high]' on the interval of X."""
    if _few(iv):
        return _few(iv)
    if low <= iv.lo and iv.hi <= high:
        return REPRODUCED
    return OUTSIDE if iv.hi < low or iv.lo > high else INCONCLUSIVE


def brief(iv: Optional[Interval], nd: int = 3, sign: str = "+", unit: str = "") -> str:
    """`mean [lo, hi]` (no half-width, no flag): the effect shown beside a verdict."""
    if iv is None:
        return "-"
    if iv.half is None:
        return f"{iv.mean:{sign}.{nd}f}{unit} (1 seed)"
    return f"{iv.mean:{sign}.{nd}f} [{iv.lo:{sign}.{nd}f}, {iv.hi:{sign}.{nd}f}]{unit}"


@dataclass
class Claim:
    paper: str
    claim: str
    verdict: str
    measured: str
    regime: str = POOL256.label
    configs: tuple[
        str, ...
    ] = ()  # the configs judged (their train - held-out gaps go beside the verdict)
    seeds: int = 0  # seeds with the data (paired where two configs are compared)
    effect: str = ""  # the judged quantity, `mean [lo, hi]`, shown beside the verdict


def have_runs(aggs: dict[str, Agg], *names: str) -> bool:
    """Every named config has a finished run."""
    return all(n in aggs and aggs[n].finished for n in names)


def summary_of(key: str, part: str = "mean"):
    """run -> that run's training metric `key` averaged over steps (`part`: mean, early, late; None unlogged)."""
    return lambda run: (run_summary(run, key) or {}).get(part)


def _paired_seeds(aggs: dict[str, Agg], *names: str) -> int:
    return len(
        set.intersection(
            *({r.seed for r in aggs[n].finished} if n in aggs else set() for n in names)
        )
    )


# A judge reads the runs of one regime's configs: judge(aggs, regime, *config names) -> (verdict, measured text,
# seeds with the data, the judged effect in brief). The config names are that regime's; the regime gives its other
# configs for context.


def _beats(key: str = "pass1", metric: str = "pass@1", paper_effect: Optional[float] = None):
    """'name beats other' on a final held-out evaluation (default pass@1), paired by seed; `paper_effect`: the gain
    the paper reports on that metric, when it states one."""

    def judge(aggs, r, name, other):
        iv = paired(aggs, name, other, lambda run: final_value(run, key))
        return (
            verdict_greater(iv, TARGET_HALF, paper_effect=paper_effect),
            f"final {metric} `{name}` - `{other}`: "
            f"{iv_text(iv, target=TARGET_HALF)} ({seeds_of(iv)} paired seeds)",
            seeds_of(iv),
            brief(iv),
        )

    return judge


def _fewer_to_reach(xkey: str):
    """'fewer steps (tokens) than the baseline to the baseline's final pass@1', per seed (see reach_ratios)."""

    def judge(aggs, r, name, base):
        both = _paired_seeds(aggs, name, base)
        if not both:
            return NO_RUNS, "", 0, "-"
        iv, reached, seeds = reach_ratios(aggs, name, xkey)
        what = (
            f"{xkey.replace('gen_tokens', 'tokens').replace('step', 'steps')} to `{base}`'s final pass@1 "
            f"{aggs[base].final[0]:.3f}, over `{base}`'s own to reach it: {iv_text(iv, sign='')} "
            f"(reached in {reached}/{seeds} seeds)"
        )
        effect = f"ratio {brief(iv, 2, '')}"
        if reached < seeds:  # the interval would cover the seeds that got there only
            return (
                (
                    f"not reached ({reached}/{seeds} seeds)"
                    if 2 * reached <= seeds
                    else INCONCLUSIVE
                ),
                what,
                both,
                effect,
            )
        saving = Interval(1.0 - iv.mean, iv.half, iv.n)
        return (
            verdict_greater(saving, TARGET_HALF, f"{TARGET_HALF:g} of the steps"),
            what,
            both,
            effect,
        )

    return judge


def _time_equal(aggs, r, name, other):
    iv = paired(aggs, name, other, median_step_s, ratio=True)
    return (
        verdict_within(iv, 0.9, 1.1),
        f"median s/step (evaluation excluded) `{name}` / `{other}`: "
        f"{iv_text(iv, 2, '')} (band [0.9, 1.1])",
        seeds_of(iv),
        f"ratio {brief(iv, 2, '')}",
    )


def _ra_no_success(aggs, r, ra, rloo):
    # the paper's degenerate group has no rollout with reward 1.0 (its Sec. 1: ~57% -> ~0% after the splice); runs
    # that do not log `ra_no_success_frac_post` are left out
    post = over_seeds(aggs, ra, summary_of("ra_no_success_frac_post"))
    base = over_seeds(aggs, rloo, summary_of("ra_no_success_frac_post"))
    return (
        verdict_within(post, -math.inf, 0.05),
        f"mean over steps after the splice {iv_text(post, sign='')} "
        f"({seeds_of(post)} seeds log it); RLOO (no splice) {iv_text(base, sign='')}",
        seeds_of(post),
        brief(post, sign=""),
    )


def _ra_zero_var(aggs, r, ra, rloo):
    post = over_seeds(aggs, ra, summary_of("ra_zero_var_frac_post"))
    late = over_seeds(aggs, ra, summary_of("ra_zero_var_frac_post", "late"))
    fresh = over_seeds(aggs, ra, summary_of("frac_zero_var_groups"))
    base = over_seeds(aggs, rloo, summary_of("frac_zero_var_groups"))
    return (
        verdict_within(post, -math.inf, 0.05),
        f"mean over steps after the splice {iv_text(post, sign='')} (last quarter {iv_text(late, sign='')}); "
        f"fresh groups before it {iv_text(fresh, sign='')}; RLOO's fresh groups {iv_text(base, sign='')}. The "
        "splice fires only in groups without a fresh success: all-pass groups remain",
        seeds_of(post),
        brief(post, sign=""),
    )


def _spread(aggs, r, name, other):
    xs, ys = (
        [final_value(x) for x in aggs[n].finished] if n in aggs else [] for n in (name, other)
    )
    ratio = std_ratio_interval(xs, ys)
    seeds = min(len(xs), len(ys))
    if ratio is None:
        return INCONCLUSIVE, f"no spread in `{other}`'s {len(ys)} seeds", seeds, "-"
    verdict = REPRODUCED if ratio[2] < 1 else WORSE if ratio[1] > 1 else INCONCLUSIVE
    effect = f"ratio {ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}]"
    return (
        verdict,
        f"std over seeds {statistics.stdev(xs):.4f} ({len(xs)} seeds) vs {statistics.stdev(ys):.4f} "
        f"({len(ys)}): {effect}",
        seeds,
        effect,
    )


def _ps_rate(aggs, r, name):
    rate = over_seeds(aggs, name, summary_of("ps_prefix_pass_rate"))
    late = over_seeds(aggs, name, summary_of("ps_prefix_pass_rate", "late"))
    fixed = r.name("ps_fixed")
    text = (
        f"`ps_prefix_pass_rate` adaptive {iv_text(rate, sign='')} (last quarter {iv_text(late, sign='')}); "
        "fixed ratios "
    ) + (
        iv_text(over_seeds(aggs, fixed, summary_of("ps_prefix_pass_rate")), sign="")
        if fixed
        else f"no {r.label}-pool config"
    )
    return verdict_within(rate, 0.4, 0.6), text, seeds_of(rate), brief(rate, sign="")


def _ps_groups(aggs, r, name, base):
    iv = paired(aggs, name, base, summary_of("ps_trained_groups"))
    ref = over_seeds(aggs, base, summary_of("ps_trained_groups"))
    return (
        verdict_greater(iv, 1.0, "1 group"),
        f"`ps_trained_groups` per step, difference {iv_text(iv, 2)} "
        f"(baseline {iv_text(ref, 2, '')})",
        seeds_of(iv),
        brief(iv, 2, unit=" groups"),
    )


def _ada_matches(aggs, r, balance, n16):
    iv = paired(aggs, balance, n16, final_value)
    train = {n: aggs[n].train_s for n in (balance, r.name("grpo_n4"), n16) if n in aggs}
    return (
        verdict_not_below(iv, TARGET_HALF),
        f"final pass@1 `{balance}` - `{n16}`: {iv_text(iv, target=TARGET_HALF)}; the update trains on 4 vs 16 "
        "samples per prompt (measured training s/step: "
        + ", ".join(f"{n} {fmt(v, 2)}" for n, v in train.items())
        + ")",
        seeds_of(iv),
        brief(iv),
    )


def _allocation(high: str, low: str):
    """Reinforce-Ada's samples per prompt: `high`-level prompts get more than `low`-level ones."""
    parts = {level: summary_of(f"ada_samples_per_prompt_{level}") for level in LEVELS}

    def gap(run):
        h, lo = parts[high](run), parts[low](run)
        return None if h is None or lo is None else h - lo

    def judge(aggs, r, name):
        iv = over_seeds(aggs, name, gap)
        if iv is None:
            return (
                NOT_LOGGED,
                "no per-difficulty metric (`ada_samples_per_prompt_<level>`): the task's prompts "
                "carry no difficulty level (only the embedded Countdown task's do)",
                0,
                "-",
            )
        per = {level: over_seeds(aggs, name, fn) for level, fn in parts.items()}
        spp = {
            part: over_seeds(aggs, name, summary_of("ada_samples_per_prompt_mean", part))
            for part in ("early", "late")
        }
        context = (
            "samples per prompt, mean over steps: "
            + ", ".join(f"{lv} {iv_text(v, 1, '')}" for lv, v in per.items())
            + f"; all prompts {iv_text(spp['early'], 1, '')} (first quarter) → "
            f"{iv_text(spp['late'], 1, '')} (last)"
        )
        return (
            verdict_greater(iv, 1.0, "1 sample"),
            f"{high} - {low} samples per prompt {iv_text(iv, 2)}; {context}",
            iv.n,
            brief(iv, 2, unit=" samples"),
        )

    return judge


def _calib_falls(aggs, r, name):
    early, late = summary_of("pros_calib_error", "early"), summary_of("pros_calib_error", "late")
    iv = over_seeds(
        aggs,
        name,
        lambda run: None if early(run) is None or late(run) is None else early(run) - late(run),
    )
    means = [over_seeds(aggs, name, fn) for fn in (early, late)]
    text = f"`pros_calib_error` {iv_text(means[0], sign='')} → {iv_text(means[1], sign='')}, fall {iv_text(iv)}"
    excess = [
        over_seeds(aggs, name, summary_of("pros_calib_excess", part)) for part in ("early", "late")
    ]
    if excess[0] is not None:  # the error above its sampling floor (see the mechanism tables)
        text += f"; `pros_calib_excess` {iv_text(excess[0])} → {iv_text(excess[1])} ({excess[0].n} seeds log it)"
    return (
        (verdict_greater(iv, 0.0) if iv else "inconclusive (not logged)"),
        text,
        seeds_of(iv),
        f"fall {brief(iv)}",
    )


@dataclass(frozen=True)
class ClaimSpec:
    paper: str
    claim: str
    configs: tuple[str, ...]  # 256-pool names: each regime judges their twins
    judge: Callable[..., tuple[str, str, int, str]]


def _label(name: str) -> str:
    """A config's label in a claim (both tasks read it: Prefix Sampling runs multi-turn on Countdown,
    as text on a text task)."""
    return BY_NAME[name].label.replace(", multi-turn", "")


RA_PAPER, PS_PAPER, ADA_PAPER, PROS_PAPER = "RA-RLOO", "Prefix Sampling", "Reinforce-Ada", "PROS"
# The paper (Reinforce-Ada, SEQ variants): "both strategies ensure that difficult prompts (low p_i) receive more
# samples"; SEQ-BALANCE "further emphasizes collecting failure cases", i.e. prompts with pass rates near 0 or 1. So
# hard is compared with mid for both variants, and SEQ-BALANCE's easy prompts are expected high too (they rarely give
# the n/2 failures its exit needs): comparing hard with easy would test a claim the paper does not make.
CLAIMS: tuple[ClaimSpec, ...] = (
    ClaimSpec(
        RA_PAPER,
        "Splicing leaves no group without a success (`ra_no_success_frac_post` <= 0.05; the paper: ~57% → ~0%)",
        ("ra_rloo", "rloo"),
        _ra_no_success,
    ),
    ClaimSpec(
        RA_PAPER,
        "Splicing stored successes leaves about no zero-variance groups (`ra_zero_var_frac_post` <= 0.05)",
        ("ra_rloo", "rloo"),
        _ra_zero_var,
    ),
    ClaimSpec(
        RA_PAPER, "RA-RLOO beats RLOO (final held-out pass@1)", ("ra_rloo", "rloo"), _beats()
    ),
    ClaimSpec(
        RA_PAPER,
        "RA-RLOO beats RLOO on the paper's metric (pass@4 of 8 samples at T 0.6, top-p 0.95, top-k "
        "20; the paper: +0.023, p ≈ 0.10 at 3 seeds)",
        ("ra_rloo", "rloo"),
        _beats("paper4", "`eval_paper_pass@4`", paper_effect=0.023),
    ),
    ClaimSpec(
        RA_PAPER,
        "Lower seed-to-seed spread of final pass@1 than RLOO",
        ("ra_rloo", "rloo"),
        _spread,
    ),
    # `ps_adaptive` is the paper's controller (one EMA), `ps_adaptive_reset` our variant (the EMA restarted)
    *(
        ClaimSpec(
            PS_PAPER,
            f"The adaptive controller ({which}) keeps the prefix-task pass rate near 0.5 (mean over "
            "steps in [0.4, 0.6])",
            (name,),
            _ps_rate,
        )
        for name, which in (
            ("ps_adaptive", "the paper's controller"),
            ("ps_adaptive_reset", "our EMA-reset variant"),
        )
    ),
    *(
        spec
        for name in ("ps_fixed", "ps_adaptive", "ps_adaptive_reset")
        for spec in (
            ClaimSpec(
                PS_PAPER,
                f"{_label(name)}: more valid (trained) tasks per batch than the baseline",
                (name, "ps_off"),
                _ps_groups,
            ),
            ClaimSpec(
                PS_PAPER,
                f"{_label(name)}: fewer steps to the baseline's final pass@1",
                (name, "ps_off"),
                _fewer_to_reach("step"),
            ),
        )
    ),
    ClaimSpec(
        ADA_PAPER,
        "SEQ-BALANCE at least matches GRPO-n16's final pass@1 while training on 4 samples per prompt "
        "(GRPO-n4)",
        ("seq_balance", "grpo_n16"),
        _ada_matches,
    ),
    ClaimSpec(
        ADA_PAPER,
        "SEQ-POS draws more samples for hard prompts than for mid-difficulty ones",
        ("seq_pos",),
        _allocation("hard", "mid"),
    ),
    ClaimSpec(
        ADA_PAPER,
        "SEQ-BALANCE draws more samples for hard prompts than for mid-difficulty ones",
        ("seq_balance",),
        _allocation("hard", "mid"),
    ),
    ClaimSpec(
        ADA_PAPER,
        "SEQ-BALANCE also draws more samples for easy prompts (pass rate near 1) than for "
        "mid-difficulty ones: it collects failures",
        ("seq_balance",),
        _allocation("easy", "mid"),
    ),
    *(
        spec
        for name in ("seq_balance", "seq_pos")
        for spec in (
            ClaimSpec(
                ADA_PAPER,
                f"{_label(name)} beats GRPO-n4, the same update size (final pass@1)",
                (name, "grpo_n4"),
                _beats(),
            ),
            ClaimSpec(
                ADA_PAPER,
                f"DAPO dynamic sampling ends below {_label(name)} (final pass@1)",
                (name, "dapo_n4"),
                _beats(),
            ),
        )
    ),
    ClaimSpec(
        ADA_PAPER,
        "EST beats GRPO-n8, the same inference budget (final pass@1)",
        ("est", "grpo_n8"),
        _beats(),
    ),
    ClaimSpec(PROS_PAPER, "PPO+PROS beats PPO (final pass@1)", ("ppo_pros", "ppo"), _beats()),
    ClaimSpec(
        PROS_PAPER, "GRPO+PROS beats GRPO (final pass@1)", ("grpo_pros", "grpo_k4"), _beats()
    ),
    ClaimSpec(
        PROS_PAPER,
        "PPO+PROS takes about the time per step of `ppo`",
        ("ppo_pros", "ppo"),
        _time_equal,
    ),
    ClaimSpec(
        PROS_PAPER,
        "GRPO+PROS takes about the time per step of `grpo_k4`",
        ("grpo_pros", "grpo_k4"),
        _time_equal,
    ),
    ClaimSpec(
        PROS_PAPER,
        "Bayesian selection beats random selection (final pass@1)",
        ("ppo_pros", "ppo_pros_random"),
        _beats(),
    ),
    ClaimSpec(
        PROS_PAPER,
        "The pass-rate model's calibration error falls over training (PPO+PROS, first vs last quarter)",
        ("ppo_pros",),
        _calib_falls,
    ),
)


# Judges of an outcome (final held-out pass@1 or pass@k, steps to the baseline's final pass@1, spread over seeds); the
# others judge a mechanism (what the method changes in a step: its splice, rates, samples, time, calibration)
OUTCOME_JUDGES = ("_beats", "_fewer_to_reach", "_ada_matches", "_spread")


def is_outcome(spec: ClaimSpec) -> bool:
    return spec.judge.__qualname__.split(".")[0] in OUTCOME_JUDGES


def pending(seeds: int) -> str:
    """The verdict under 2 seeds with the data."""
    return f"runs pending ({seeds} seed{'' if seeds == 1 else 's'})"


def _seeds_text(aggs: dict[str, Agg], name: str) -> str:
    a = aggs.get(name)
    fin, unf = (len(a.finished), len(a.unfinished)) if a else (0, 0)
    return f"`{name}` {fin} finished seed{'' if fin == 1 else 's'}" + (
        f" (+{unf} unfinished)" if unf else ""
    )


# A config's metric that is 0 in every step of a run whose mechanism never acted (RA-RLOO never
# spliced, Prefix Sampling never made a prefix task): then the config ran as its baseline, and a
# verdict on it says so
FIRED = {
    "ra_rloo": "ra_replay_fired_frac",
    "ps_fixed": "ps_prefix_tasks",
    "ps_adaptive": "ps_prefix_tasks",
    "ps_adaptive_reset": "ps_prefix_tasks",
}


def never_fired(aggs: dict[str, Agg], name: str) -> Optional[str]:
    """'the mechanism never fired (...)' when `name`'s finished runs log its firing metric as 0
    at every step, else None."""
    key = FIRED.get(base_name(name))
    runs = aggs[name].finished if name in aggs and key else []
    series = [metric_series(r.rows, key) for r in runs]
    if not series or not all(series) or any(v != 0 for s in series for _, v in s):
        return None
    return f"the mechanism never fired (`{key}` 0 at every step of {len(runs)} run(s))"


def claim_rows(aggs: dict[str, Agg], regime: Regime = POOL256) -> list[Claim]:
    """The papers' claims in one regime, in CLAIMS order, each with its verdict and the measured effect; under 2
    (paired) seeds with the data the verdict is 'runs pending' and no figure is given."""
    out = []
    for spec in CLAIMS:
        names = tuple(regime.name(n) for n in spec.configs)
        if None in names:
            missing = ", ".join(f"`{n}`" for n, twin in zip(spec.configs, names) if twin is None)
            out.append(
                Claim(
                    spec.paper,
                    spec.claim,
                    f"no {regime.label}-pool config",
                    f"benchmarks/sweep/run.py has no {regime.label}-pool config for {missing}",
                    regime.label,
                )
            )
            continue
        verdict, measured, seeds, effect = spec.judge(aggs, regime, *names)
        idle = never_fired(aggs, names[0])
        if (
            idle
        ):  # the method ran as its baseline: no verdict on its claims reads a gain or its absence
            out.append(
                Claim(spec.paper, spec.claim, idle, measured, regime.label, names, seeds, effect)
            )
            continue
        if seeds < 2 and not verdict.startswith(NOT_LOGGED):  # runs that cannot tell: say why
            verdict, measured, effect = (
                pending(seeds),
                "; ".join(_seeds_text(aggs, n) for n in names),
                "-",
            )
        out.append(
            Claim(spec.paper, spec.claim, verdict, measured, regime.label, names, seeds, effect)
        )
    return out
