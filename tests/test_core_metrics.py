"""Every script logs the same core metrics under the same names, each computed from the step's reduced sums."""

import json
import math
import random
import time

import pytest
import torch

from common.run.step_metrics import PHASES

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
# the step's split: its phases and the rest add up to time_step_s
TIME_SPLIT = [f"time/{name}_s" for name in PHASES] + ["time/other_s"]
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
        assert set(TIME_SPLIT) <= set(r), set(TIME_SPLIT) - set(r)
        assert all(r[key] >= 0.0 for key in TIME_SPLIT), {key: r[key] for key in TIME_SPLIT}
        assert sum(r[key] for key in TIME_SPLIT) == pytest.approx(r["time_step_s"], abs=1e-9)
        assert r["time/gen_s"] > 0.0 and r["time/update_s"] > 0.0
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


class _OneRank:
    num_processes = 1
    device = torch.device("cpu")


class _NoRewardKeys:
    def metrics(self, accelerator) -> dict:
        return {}


@pytest.mark.parametrize("script,opt_steps", SCRIPTS, ids=[s for s, _ in SCRIPTS])
def test_every_optimizer_steps_on_gradients_clipped_to_max_grad_norm(short_run, script, opt_steps):
    """The gradients each optimizer step sees (the short run's spy, conftest.THREAD_SPY) have a
    total norm of at most --max_grad_norm, while the logged `grad_norm` (the norm before clipping)
    exceeds it: clipping acts, before the step. pros_ppo's critic steps its own optimizer under
    the same bound."""
    from conftest import SHORT_RUN

    out, stdout = short_run(script)
    max_norm = float(SHORT_RUN[SHORT_RUN.index("--max_grad_norm") + 1])
    steps = json.loads(stdout.split("OPTIMIZER_STEPS", 1)[1].strip().splitlines()[0])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    assert max(r["grad_norm"] for r in rows) > 10 * max_norm
    optimizers = 2 if script == "pros_ppo.py" else 1
    assert sorted({i for i, _ in steps}) == list(range(optimizers))
    policy_steps = [norm for i, norm in steps if i == 0]
    assert len(policy_steps) == len(rows) * opt_steps
    # clip_grad_norm_ scales by max_norm / (norm + 1e-6): at most max_norm, up to float32 rounding
    over = [norm for _, norm in steps if norm > max_norm * (1 + 1e-5)]
    assert not over, f"optimizer steps on gradient norms {over} > --max_grad_norm {max_norm}"
    assert max(policy_steps) > 0.5 * max_norm  # the spy saw real gradients, clipped


def test_micro_batch_sums_added_up_equal_python_sums_of_items_bit_for_bit():
    """`add_up` of one dict per micro-batch reproduces the float64 sum of `.item()`s in loop order,
    and `step_totals` + `step_metrics` carry it to the row."""
    from common.run.step_metrics import StepClock, add_up, step_metrics, step_totals

    rng = random.Random(0)
    values = [torch.tensor([rng.uniform(-1e3, 1e3) for _ in range(7)]).sum() for _ in range(50)]
    by_items = 0.0
    for value in values:
        by_items += value.item()
    assert add_up([{"loss_sum": value} for value in values])["loss_sum"] == by_items
    clock = StepClock(torch.device("cpu"))
    totals = step_totals(_OneRank(), clock, {"rollouts": 50}, [{"loss_sum": v} for v in values])
    counters = {"rollouts": 0, "gen_tokens": 0}
    new = step_metrics(1, totals, counters, [], 0.1, _NoRewardKeys(), _OneRank(), "rollouts")
    assert totals["loss_sum"] == by_items and new["loss"] == by_items / 50
    assert new["rollouts"] == 50 and math.isnan(new["grad_norm"])
    assert counters == {"rollouts": 50, "gen_tokens": 0}


def test_the_step_clock_adds_up_to_the_step_and_its_phases_do_not_nest():
    from common.run.step_metrics import StepClock

    clock = StepClock(torch.device("cpu"))
    with clock.timing("gen"):
        time.sleep(0.01)
    with pytest.raises(ValueError, match="phase 'sampling': one of gen"):
        clock.timing("sampling").__enter__()
    with pytest.raises(RuntimeError, match="phase 'reward' entered inside phase 'gen'"):
        with clock.timing("gen"):
            with clock.timing("reward"):
                pass
    times = clock.times()
    assert times["time/gen_s"] >= 0.01 and times["time/eval_s"] == 0
    assert sum(times[key] for key in TIME_SPLIT) == pytest.approx(times["time_step_s"], abs=1e-12)
