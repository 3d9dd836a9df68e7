"""Every script logs the same core metrics under the same names, each computed from the step's reduced sums."""

import json
import math

import pytest

CORE = {
    "step",
    "rollouts",
    "gen_tokens",
    "reward_mean",
    "reward_std",
    "pass_rate",
    "frac_zero_var_groups",
    "completion_len_mean",
    "clipped_ratio",
    "loss",
    "kl",
    "entropy",
    "grad_norm",
    "lr",
    "time_step_s",
    "time_gen_s",
    "time_train_s",
    "sampler_logp_diff",
    "num_threads",
}
# script, optimizer steps per training step (the warm-up schedule advances once per optimizer step)
SCRIPTS = [
    ("ra_rloo.py", 1),
    ("ada_seq.py", 1),
    ("ada_est.py", 1),
    ("ps_grpo.py", 1),
    ("pros_ppo.py", 4),
]


@pytest.mark.parametrize("script,opt_steps", SCRIPTS, ids=[s for s, _ in SCRIPTS])
def test_core_metrics_are_logged_and_consistent(short_run, script, opt_steps):
    out, _ = short_run(
        script
    )  # conftest: 3 steps of 8 prompts, lr 1e-4 with a 5-step warm-up, 16-token answers
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = rows[1:]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["num_threads"] for r in rows] == [
        1
    ] * 4  # --num_threads 1 (conftest), in every row, step 0 too
    previous = {"rollouts": 0, "gen_tokens": 0}
    for r in steps:
        assert CORE <= set(r), CORE - set(r)
        new_rollouts, new_tokens = (
            r["rollouts"] - previous["rollouts"],
            r["gen_tokens"] - previous["gen_tokens"],
        )
        assert new_rollouts > 0 and r["completion_len_mean"] == pytest.approx(
            new_tokens / new_rollouts
        )
        assert 0.0 <= r["clipped_ratio"] <= 1.0 and 0.0 <= r["frac_zero_var_groups"] <= 1.0
        # binary rewards: the standard deviation of a 0/1 variable with mean m is sqrt(m (1 - m))
        m = r["reward_mean"]
        assert r["pass_rate"] == pytest.approx(m) and r["reward_std"] == pytest.approx(
            math.sqrt(m * (1 - m))
        )
        assert math.isfinite(r["grad_norm"]) and r["grad_norm"] >= 0.0
        assert r["lr"] == pytest.approx(
            1e-4 * min(1.0, (r["step"] * opt_steps + 1) / 5)
        )  # linear warm-up
        previous = r
    assert any(
        0.0 < r["clipped_ratio"] < 1.0 for r in steps
    )  # truncation is measured, not a constant
    if any(
        r["frac_zero_var_groups"] < 1.0 for r in steps
    ):  # some group had a reward signal: a gradient follows
        assert any(r["grad_norm"] > 0.0 for r in steps)
