"""Reinforce-Ada-Est: the discounted Beta estimator, the budget allocation, the weighted advantage,
and the script end to end (recurring prompts, estimator state across an exact resume)."""

import json
import math
import random

import pytest
from conftest import run_main, run_script

from ada_est import (
    Args,
    allocate_budget,
    allocation_weights,
    est_advantages,
    estimate,
    update_counts,
)
from common.run.flags import parse_args


def test_estimator_worked_example():
    assert estimate(None, 1.0, 16.0) == pytest.approx(1 / 17)  # unseen prompt: the prior mean
    c = update_counts(None, 8, 2, lam=0.9)  # first visit: 2 of 8 right
    assert c == (8.0, 2.0) and estimate(c, 1.0, 16.0) == pytest.approx(3 / 25)
    c = update_counts(c, 4, 0, lam=0.9)  # second visit: 0 of 4; old counts decay by lambda
    assert c == pytest.approx((0.9 * 8 + 4, 0.9 * 2)) and estimate(c, 1.0, 16.0) == pytest.approx(
        2.8 / 28.2
    )
    assert (
        estimate(update_counts(None, 4, 0, 0.9), 1.0, 16.0) > 0
    )  # zero successes never give p_hat = 0


def test_allocation_weights_favour_hard_prompts():
    hyb = allocation_weights([0.01, 0.25, 0.99], "hybrid", 0.0)
    imp = allocation_weights([0.01, 0.25, 0.99], "implicit", 0.0)
    assert hyb == pytest.approx([10.0, 2.0, 1 / math.sqrt(0.99)])
    assert imp == pytest.approx([100.0, 4.0, 1 / 0.99])


def test_allocation_proportional_bounded_and_exact():
    assert allocate_budget([1, 2, 3, 4], 20, 1, 32) == [
        2,
        4,
        6,
        8,
    ]  # no bound binds: exactly proportional
    # the heavy prompt hits n_max; the rest share what is left (8/3 each), remainders to the earlier prompts
    assert allocate_budget([1, 1, 1, 100], 16, 2, 8) == [3, 3, 2, 8]
    assert allocate_budget([1, 1000], 10, 2, 32) == [2, 8]  # the light prompt is held at n_min
    rng = random.Random(0)
    for _ in range(300):
        k = rng.randint(1, 40)
        n_min = rng.randint(1, 4)
        n_max = rng.randint(n_min, 40)
        total = rng.randint(n_min * k, n_max * k)
        w = [rng.choice([rng.uniform(0.5, 2.0), rng.uniform(1.0, 50.0)]) for _ in range(k)]
        a = allocate_budget(w, total, n_min, n_max)
        assert sum(a) == total and all(n_min <= x <= n_max for x in a)
        assert all(
            a[i] >= a[j] for i in range(k) for j in range(k) if w[i] > w[j]
        )  # harder never gets fewer
    with pytest.raises(ValueError):
        allocate_budget([1, 1], 100, 2, 32)


def test_advantage_worked_example():
    adv, alpha = est_advantages([1.0, 0.0, 0.0, 0.0], "hybrid", 0.01)
    assert alpha == pytest.approx(1 / math.sqrt(0.26))
    assert adv == pytest.approx([0.75 * alpha, -0.25 * alpha, -0.25 * alpha, -0.25 * alpha])
    adv, alpha = est_advantages([1.0, 0.0, 0.0, 0.0], "implicit", 0.01)
    assert alpha == 1.0 and adv == pytest.approx([0.75, -0.25, -0.25, -0.25])
    # an easy prompt's advantages are scaled down relative to a hard one's
    assert (
        est_advantages([1.0, 1.0, 1.0, 0.0], "hybrid", 0.01)[1]
        < est_advantages([1.0, 0, 0, 0], "hybrid", 0.01)[1]
    )
    assert est_advantages([0.0, 0.0], "hybrid", 0.01)[0] == [0.0, 0.0]


def test_args_validation():
    assert (
        Args().budget() == 8 * 32 and Args().prompt_pool > 0
    )  # the default task makes prompts recur
    assert Args().warmup_steps == 10  # the paper's 10-step warm-up (Sec. 4)
    with pytest.raises(SystemExit, match="--total_budget 1280: must lie in"):
        Args(total_budget=32 * 40).validate()  # more than n_max per prompt
    with pytest.raises(SystemExit, match=r"--lam 0.0: must be in \(0, 1\]"):
        parse_args(Args, ["--lam", "0"])


def test_every_flag_is_documented():
    from dataclasses import fields

    from common.run.flag_help import field_docs

    docs = field_docs(Args)
    assert not [f.name for f in fields(Args) if not docs.get(f.name)]
    out = run_script(["ada_est.py", "--help"]).stdout
    assert all(f"--{f.name}" in out for f in fields(Args))


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time_", "time/"))} for r in rows]


def test_recurring_prompts_and_exact_resume(random_model_dir, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    # 12 prompts, 8 per step: from step 2 on, the batch mixes prompts seen before with unseen ones. The
    # untrained test policy fails everything, so a prompt with history has p_hat below the prior mean
    # 1/17 and gets more of the budget than an unseen one.
    base = [
        "ada_est.py",
        "--model_name_or_path",
        random_model_dir,
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--prompt_pool",
        "12",
        "--prompts_per_step",
        "8",
        "--total_budget",
        "80",
        "--n_min",
        "2",
        "--n_max",
        "20",
        "--eval_prompts",
        "8",
        "--eval_samples",
        "4",
        "--max_completion_length",
        "20",
        "--num_threads",
        "1",
    ]
    run_main([*base, "--output_dir", str(full), "--max_steps", "4"])
    run_main([*base, "--output_dir", str(part), "--max_steps", "2"])  # "killed" after step 2
    run_main(
        [*base, "--output_dir", str(part), "--max_steps", "4", "--resume_from_checkpoint", "auto"]
    )
    a, b = _strip(_rows(full)), _strip(_rows(part))
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert a == b  # the per-prompt counts were restored: same estimates, allocations and losses
    rows = a[1:]
    # step 1: no history, every prompt at the prior mean, so the allocation is uniform
    assert (
        rows[0]["est_frac_prompts_with_history"] == 0.0 and rows[0]["est_calibration_error"] is None
    )
    assert rows[0]["est_p_hat_mean"] == pytest.approx(1 / 17)
    assert rows[0]["est_alloc_min"] == rows[0]["est_alloc_max"] == 10
    assert [r["est_prompts_tracked"] for r in rows][-1] == 12
    for i, r in enumerate(rows, start=1):
        assert (
            r["est_samples_step"] == 80 and r["rollouts"] == 80 * i
        )  # every generated sample is counted
        assert 2 <= r["est_alloc_min"] <= r["est_alloc_mean"] == 10 <= r["est_alloc_max"] <= 20
    later = rows[1:]
    assert all(
        r["est_frac_prompts_with_history"] > 0 and r["est_calibration_error"] is not None
        for r in later
    )
    assert all(
        r["est_p_hat_mean"] < 1 / 17 for r in later
    )  # failures seen before lower the estimate
    mixed = [r for r in later if r["est_frac_prompts_with_history"] < 1]
    assert mixed and all(
        r["est_alloc_max"] > r["est_alloc_min"] for r in mixed
    )  # history makes it uneven


SMALL = [
    "--prompt_pool",
    "8",
    "--prompts_per_step",
    "4",
    "--total_budget",
    "16",
    "--n_min",
    "2",
    "--n_max",
    "8",
    "--eval_prompts",
    "4",
    "--num_threads",
    "1",
]


def _main(out, extra):
    """ada_est.main in process."""
    import ada_est
    from common.run.flags import parse_args

    ada_est.main(parse_args(ada_est.Args, ["--output_dir", str(out), *SMALL, *extra]))
    return _rows(out)


def test_sample_log_pass_at_k_and_sampler_agreement(tiny_base, tmp_path, monkeypatch):
    from common.demo import countdown

    # an eval reward that varies with the text: greedy evaluation (--eval_temperature 0) gives 0 or 4 of 4 per prompt
    monkeypatch.setattr(countdown, "reward_binary", lambda text, answer: float(len(text) % 2))
    rows = _main(
        tmp_path,
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "1",
            "--eval_samples",
            "4",
            "--eval_temperature",
            "0",
            "--old_logprobs",
            "sampler",
            "--log_samples_per_kind",
            "3",
            "--max_completion_length",
            "16",
        ],
    )
    for r in rows:  # pass@k for every power of two up to --eval_samples; greedy: all k agree
        assert {"eval_pass@1", "eval_pass@2", "eval_pass@4"} <= set(r) and "eval_pass@3" not in r
        assert r["eval_pass@1"] == r["eval_pass@2"] == r["eval_pass@4"]
    # the HF generator scores with the weights being trained, in fp32: the trainer's first pass agrees
    assert rows[1]["sampler_logp_diff"] is not None and rows[1]["sampler_logp_diff"] < 1e-4
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert 1 <= len(samples) <= 3 and all(s["step"] == 1 and s["kind"] == "fresh" for s in samples)
    keys = {"prompt", "completion", "reward", "advantage", "truncated", "ada_budget", "ada_p_hat"}
    assert all(keys <= set(s) for s in samples)
    assert all(
        2 <= s["ada_budget"] <= 8 and s["ada_p_hat"] == pytest.approx(1 / 17) for s in samples
    )
    # without sampler log-probs (HF, one epoch: pi_old is the first pass itself) there is nothing to compare
    rows = _main(
        tmp_path / "auto",
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "1",
            "--eval_samples",
            "1",
            "--max_completion_length",
            "4",
            "--log_samples_every",
            "0",
        ],
    )
    assert (
        rows[1]["sampler_logp_diff"] is None and not (tmp_path / "auto" / "samples.jsonl").exists()
    )


def test_truncated_completions_get_reward_zero_and_optionally_no_gradient(
    tiny_base, tmp_path, monkeypatch
):
    from common.demo import countdown

    monkeypatch.setitem(
        countdown.REWARDS, "binary", lambda text, answer: 1.0
    )  # every finished completion succeeds
    base = [
        "--model_name_or_path",
        tiny_base,
        "--max_steps",
        "1",
        "--eval_samples",
        "1",
        "--max_completion_length",
        "2",
    ]
    plain = _main(tmp_path / "plain", base)[1]
    assert (
        plain["clipped_ratio"] == 1.0 and plain["reward_mean"] == 0.0 and plain["pass_rate"] == 0.0
    )
    assert plain["entropy"] > 0 and plain["grad_norm"] > 0  # the entropy bonus still trains on them
    masked = _main(tmp_path / "masked", [*base, "--mask_truncated_completions"])[1]
    assert masked["clipped_ratio"] == 1.0 and masked["reward_mean"] == 0.0
    assert (
        masked["loss"] == 0.0 and masked["entropy"] == 0.0 and masked["grad_norm"] == 0.0
    )  # no gradient at all
