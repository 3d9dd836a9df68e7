"""What each method's update estimates, on the enumerable toy problem (benchmarks/estimates): each
paper's unbiasedness claim at a fixed seed within its interval, and where the bias is by design the
relation the paper describes. Seconds on one core: no model, no generation."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch

import pros_ppo
import ps_grpo
from benchmarks.estimates import ascent, table
from benchmarks.estimates import toy as T

# a coordinate more than this many standard errors off fails (24 coordinates: P(any) ~ 1e-4)
Z = 4.5


@pytest.fixture(scope="module")
def flat():
    return T.Toy(table.FLAT)


@pytest.fixture(scope="module")
def tree():
    return T.Toy(table.TREE, depth=3, branch=3, correct=6)


def unbiased(stats: dict) -> bool:
    lo, hi = stats["scale_ci"]
    return stats["max_z"] < Z and lo <= 1.0 <= hi


def test_rloo_is_unbiased_for_the_mean_pass_rate(flat):
    # E[update] = grad E_x[p] / max_completion_length: the leave-one-out baseline is independent of
    # the rollout it centres (a full-mean baseline gives (K - 1) / K of it)
    est = T.monte_carlo(T.rloo_step(flat), 3000, seed=0)
    stats = est.compare(flat.target("p"), const=1 / flat.T)
    assert unbiased(stats), stats


def test_dr_grpo_is_unbiased_up_to_its_constant(flat):
    # r - mean over n: (n - 1) / n of RLOO's update
    est = T.monte_carlo(T.grpo_step(flat, 4, scale=False), 3000, seed=0)
    stats = est.compare(flat.target("p"), const=3 / 4 / flat.T)
    assert unbiased(stats), stats


def test_grpo_std_estimates_its_enumerated_expectation_not_appendix_b_at_small_n(flat):
    n = 4
    # ada_seq's own advantages over one pool (GRPO-n: the group)
    adv = T.grpo_advantages_of(True)
    exact = sum(T.group_weight(p, n, adv) * g for p, g in zip(flat.p, flat.grad_p())) / (
        flat.P * n * flat.T
    )
    est = T.monte_carlo(T.grpo_step(flat, n, scale=True), 3000, seed=0)
    assert unbiased(est.compare(exact, const=1.0)), est.compare(exact, const=1.0)
    # Appendix B's advantage at a fixed n with the population std would weigh 1 / sqrt(p (1 - p))
    # (a corollary, not stated in the paper); with the group's own std it only
    # appears as n grows
    appendix_b = 1 / np.sqrt(flat.p * (1 - flat.p))
    for size, close in ((4, False), (256, True)):
        w = np.array([T.group_weight(p, size, adv) for p in flat.p])
        rel = (w / w[2]) / (appendix_b / appendix_b[2])
        assert np.allclose(rel, 1, atol=0.05) == close, (size, rel)
    w4 = np.array([T.group_weight(p, 4, adv) for p in flat.p])
    assert w4.max() / w4.min() < 1.1  # flat: GRPO-4 estimates grad E_x[p], whatever its std


def test_ra_rloo_tighter_clip_smaller_bias_and_on_demand_below_always(flat):
    # a buffer from a stale policy: some weights pi / pi_old above 5, some above 10; the same seed
    # draws the same rollouts and buffers, so only the clip differs between the runs
    target = flat.target("p")

    def bias(w_max, mode="on_demand"):
        step = T.ra_rloo_step(flat, w_max, table.STALENESS, mode=mode)
        return T.monte_carlo(step, 500, seed=0).compare(target, const=1 / flat.T)["rel_bias"]

    b1, b5, b10 = bias(1.0), bias(5.0), bias(10.0)
    assert b1 < b5 < b10, (b1, b5, b10)
    assert bias(5.0, "always") > b5


def test_ada_est_residual_weight_moves_the_update_toward_the_log_objective(flat):
    # the hybrid's weight on the rarest prompt (relative to p = 0.5) lies past what E[sqrt p] asks
    # (the budget alone) and short of E[log p]'s; without the residual weight it stays at sqrt's
    est = T.monte_carlo(T.ada_est_step(flat), 2000, seed=0)
    point, lo, hi = est.relative_weights(flat.grad_p(), 2)
    sqrt_asks, log_asks = table.asks("sqrt p")[0], table.asks("log p")[0]
    assert sqrt_asks < lo[0] and hi[0] < log_asks, (lo[0], hi[0])
    cos = {o: est.compare(flat.target(o))["cos"] for o in ("p", "log p")}
    assert cos["log p"] > cos["p"] + 0.1, cos


def test_ada_seq_balanced_weighs_both_ends_and_the_sec_3_2_weight_overshoots_log(flat):
    grad_p = flat.grad_p()
    balanced = T.monte_carlo(T.ada_seq_step(flat), 1000, seed=0)
    _, lo, hi = balanced.relative_weights(grad_p, 2)
    # symmetric in p and 1 - p (p = 0.15 and 0.85), both above the p = 0.5 prompt
    assert lo[1] > 1.5 and lo[3] > 1.5 and lo[1] < hi[3] and lo[3] < hi[1], (lo, hi)
    # Sec. 3.2's re-introduced 1 / p_hat on top of the balanced downsample: about 1 / p^2
    inv_p = T.monte_carlo(T.ada_seq_step(flat, weight="inv_p"), 1000, seed=0)
    _, lo, _ = inv_p.relative_weights(grad_p, 2)
    assert lo[0] > 2 * table.asks("log p")[0], lo


def test_ra_rloo_on_policy_splice_matches_its_enumeration(flat):
    # a buffer written by the current policy: w = 1, and the splice adds, in a group with no fresh
    # success, a success's score and takes the failures' baseline: w(p) = K + (1 - p)^K / (p (1 - p))
    k = 4
    weights = [T.splice_weight(p, k) for p in flat.p]
    closed = [k + (1 - p) ** k / (p * (1 - p)) for p in flat.p]
    assert np.allclose(weights, closed, rtol=1e-9), (weights, closed)
    exact = T.exact_update(flat, weights, 1 / (flat.P * k * flat.T))
    est = T.monte_carlo(T.ra_rloo_step(flat, 5.0, staleness=0.0), 3000, seed=0)
    stats = est.compare(exact, const=1.0)
    assert unbiased(stats), stats


@pytest.mark.parametrize("weight", ["none", "inv_p"])
def test_ada_seq_matches_its_exact_chain(flat, weight):
    # the rounds as a chain over the pool's successes, stopped by the exit rule, downsampled, with
    # the pool's advantages: the Monte Carlo of the script's loop function estimates it
    args = T.ada_seq_args(4, 8, 4, prompt_weight=weight, scale_rewards=False)
    weights = np.array([T.ada_seq_weight(p, args) for p in flat.p])
    rel = weights / weights[2]
    assert np.allclose(rel[1], rel[3]) == (weight == "none"), rel  # balanced: symmetric in p, 1 - p
    exact = T.exact_update(flat, weights, 1 / (flat.P * 4 * flat.T))
    est = T.monte_carlo(T.ada_seq_step(flat, weight=weight), 1500, seed=0)
    stats = est.compare(exact, const=1.0)
    assert unbiased(stats), stats


def test_ada_est_matches_its_enumeration(flat):
    # each prompt's N_x is fixed by the estimates: its group's expected update enumerates Bin(N_x, p)
    step = T.ada_est_step(flat)
    advantages = T.est_advantages_of(step.args)
    weights = [T.group_weight(p, size, advantages) for p, size in zip(flat.p, step.sizes)]
    exact = T.exact_update(flat, weights, 1 / (step.args.budget() * flat.T))
    stats = T.monte_carlo(step, 2000, seed=0).compare(exact, const=1.0)
    assert unbiased(stats), stats


@pytest.mark.parametrize("method", ["ps", "pros"])
def test_prefix_free_baselines_match_their_enumeration(tree, method):
    # no prefix task: the rejection and the token mean's divisor (PS), the token mean (PROS)
    if method == "ps":
        exact, step = T.ps_off_exact(tree, 8), T.ps_step(tree, False)
    else:
        exact, step = T.pros_off_exact(tree, 4), T.pros_step(tree, "off")
    stats = T.monte_carlo(step, 1500, seed=0).compare(exact, const=1.0)
    assert unbiased(stats), stats


@pytest.mark.parametrize("method", ["ps", "pros"])
def test_a_replayed_prefix_gets_no_gradient(tree, method):
    # one group replaying the first action toward its successes, every continuation once, and a
    # sampler that put less mass on that action: the ratio on the prefix token is past the clip, so
    # the rows with A > 0 are clipped there and those with A < 0 are not. Their advantages no longer
    # cancel on the prefix token: only its mask keeps the root's logits out of the update
    x = 1
    good = int(np.flatnonzero(tree.rewards[x])[0])
    first = tree.actions(good)[0]
    span = tree.B ** (tree.T - 1)
    leaves = first * span + np.arange(span)
    assert 0 < tree.rewards[x, leaves].sum() < span  # the group has signal
    old_theta = tree.theta.clone()
    old_theta[x, 0, first] -= 2.0
    if method == "ps":
        args = ps_grpo.Args(num_generations=span)
        task = ps_grpo.BatchTask(x, "hard", steps=[([first], [])], source_steps=tree.T)
        update = T.ps_update(tree, args, [task], [leaves], old_theta)
    else:
        args = pros_ppo.Args(adv="grpo", num_generations=span)
        query = pros_ppo.Query(x, prefix=(first,))
        update = T.pros_update(tree, args, [query], [leaves], old_theta)
    assert np.all(update[x, 0] == 0), update[x, 0]
    # the continuation's logits do move
    assert np.abs(update[x, 1:]).max() > 1e-3, update[x]


@pytest.mark.parametrize("method, steps", [("ps", 400), ("pros", 800)])
def test_prefix_tasks_bias_the_update_past_the_prefix_only(tree, method, steps):
    # a prefix task trains its node's pass rate: the whole update leaves grad E_x[p], the first
    # step's logits (which no prefix reaches) do not
    if method == "ps":
        on, off = T.ps_step(tree, True), T.ps_step(tree, False)
    else:
        on, off = T.pros_step(tree, "random"), T.pros_step(tree, "off")
    target, root = tree.target("p"), tree.first_step()
    est_on, est_off = T.monte_carlo(on, steps, seed=0), T.monte_carlo(off, steps, seed=0)
    # the direction's bias (best-fitting constant), noise taken out
    whole_on, whole_off = est_on.compare(target), est_off.compare(target)
    assert whole_on["rel_bias_ci"][0] > 0.05 > whole_off["rel_bias_ci"][0], (whole_on, whole_off)
    assert est_on.restrict(root).compare(target[root])["cos"] > 0.98


def test_the_pages_show_the_stored_table():
    results = json.loads(table.RESULTS.read_text())
    assert set(results["rows"]) == {row.key for row in table.ROWS}
    assert table.stale_pages(results) == []


def test_an_on_policy_buffer_reweighs_through_the_trigger_alone(flat):
    # every importance weight pi / pi_old is 1 (up to the stored log-probability's rounding): the
    # clip has nothing to clip, so w_max 1 and 5 give the same steps, and what bias remains is the trigger's reweighting (a splice into
    # a no-success group only), which puts the rarest prompt far above the p = 0.5 one
    def run(w_max):
        return T.monte_carlo(T.ra_rloo_step(flat, w_max, 0.0), 500, seed=0)

    one, five = run(1.0), run(5.0)
    assert np.allclose(one.mean, five.mean, rtol=1e-6, atol=1e-9)
    stats = five.compare(flat.target("p"), const=1 / flat.T)
    assert stats["rel_bias_ci"][0] > 0.5, stats
    _, lo, _ = five.relative_weights(flat.grad_p(), table.REF)
    assert lo[0] > 4.0, lo


def test_relative_mse_separates_bias_from_noise():
    # an unbiased update's MSE falls toward 0 as the budget grows; a biased one's stays at 1 - cos²
    target = np.array([1.0, 0.0])
    batches = np.zeros((40, 2))

    def estimate(mean, var):
        return T.Estimate(np.array(mean), batches, np.zeros(2), var, 16.0)

    unbiased_ = estimate([0.5, 0.0], 1.0)
    # one step (m = 1): 1 - 0.25 / (0.25 + 1); a hundred steps: 1 - 0.25 / (0.25 + 0.01)
    small, large = (table.relative_mse(unbiased_, target, 16.0, b) for b in (16.0, 1600.0))
    assert small == pytest.approx(0.8) and large == pytest.approx(1 / 26), (small, large)
    biased = estimate([1.0, 1.0], 0.0)
    assert table.relative_mse(biased, target, 16.0) == pytest.approx(0.5)
    # the trained column spends the budget on the trained rollouts: 4 a step buy 4x the steps
    columns = table.noise_columns(unbiased_, target, 4.0)
    assert columns["mse_generated"] == pytest.approx(0.2, abs=1e-3)
    assert columns["mse_trained"] == pytest.approx(1 - 0.25 / (0.25 + 1 / 64), abs=1e-3)


def test_ada_est_gap_ends_at_the_scripts_update(flat):
    # the decomposition's last stage (the step's own mean) is the script's expected update,
    # enumerated: it lies within the Monte Carlo interval of the hybrid's weights
    gap = table.ada_est_gap(flat)
    est = T.monte_carlo(T.ada_est_step(flat), 2000, seed=0)
    _, lo, hi = est.relative_weights(flat.grad_p(), table.REF)
    assert np.all(lo - 0.05 <= gap["own_mean"]) and np.all(gap["own_mean"] <= hi + 0.05)
    assert gap["log_p"][0] > gap["eps"][0] > gap["own_mean"][0]


@pytest.mark.parametrize("script", ["table.py", "ascent.py"])
def test_check_commands_pass_on_the_stored_figures(script):
    # the pages' generated blocks match results/*.json, as a user runs it (no sampling)
    path = table.ROOT / "benchmarks" / "estimates" / script
    done = subprocess.run(
        [sys.executable, str(path), "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_ascent_pages_show_the_stored_runs():
    results = json.loads(ascent.RESULTS.read_text())
    assert set(results["comparisons"]) == {c.page for c in ascent.COMPARISONS}
    assert ascent.stale_pages(results) == []


def test_ascent_reads_a_built_speed_up():
    # a method whose curve rises twice as fast as its baseline's reaches the baseline's
    # half-budget level in half the rollouts: ratio 2, interval above 1, "fewer"; a method that
    # never gets there reads so
    grid = np.linspace(0, 1000, 97)
    rng = np.random.default_rng(0)
    base = np.clip(grid / 1000, 0, 1) + rng.normal(0, 0.002, (8, grid.size))
    fast = np.clip(2 * grid / 1000, 0, 1) + rng.normal(0, 0.002, (8, grid.size))
    flat_ = np.full((8, grid.size), 0.1)
    curves = {"b": {"mean_p": base}, "m": {"mean_p": fast}, "s": {"mean_p": flat_}}
    for key in ("m@matched", "s@matched"):
        curves[key] = curves[key[0]]
    comparison = ascent.Comparison("page", "m", "b", "p", "", "", ("s",))
    compared = ascent.compare(curves, grid, comparison)
    # the target: the baseline's mean pass rate at half the budget
    assert compared["target"] == pytest.approx(0.5, abs=0.01)
    out = compared["arms"]
    assert out["m"]["ratio"] == pytest.approx(2.0, rel=0.05)
    assert out["m"]["ratio_ci"][0] > 1.0
    assert "fewer" in ascent.verdict_of(out["m"]["ratio"], *out["m"]["ratio_ci"])
    assert out["s"]["to_target"] == float("inf")
    assert "does not reach" in ascent.verdict_of(out["s"]["ratio"], *out["s"]["ratio_ci"])
    assert "more" in ascent.verdict_of(0.5, 0.4, 0.6)


def test_ascent_reads_where_the_curves_cross():
    # behind at the first checkpoint, level (intervals overlap) at the second, ahead at the
    # budget: the reading says the curves cross and names each checkpoint's side; an arm ahead
    # at every checkpoint reads so, without a crossing
    def cell(means, half):
        return {
            "mean": means,
            "low": [m - half for m in means],
            "high": [m + half for m in means],
        }

    results = {"budget": 1000}
    base = {"mean_p": cell([0.40, 0.53, 0.73], 0.01)}
    crossing = {"mean_p": cell([0.36, 0.532, 0.83], 0.002)}
    text = ascent.at_budget(results, crossing, base)
    assert "the curves cross" in text
    assert "behind at 250 (0.360 against 0.400)" in text
    assert "level at 500" in text
    assert "ahead at 1,000 (0.830 against 0.730)" in text
    assert "0.830 [0.828, 0.832] against the baseline's 0.730 [0.720, 0.740]" in text
    ahead = {"mean_p": cell([0.50, 0.63, 0.83], 0.002)}
    text = ascent.at_budget(results, ahead, base)
    assert "ahead of the baseline at every checkpoint" in text
    assert "cross" not in text


def test_ascent_training_raises_the_mean_pass_rate():
    # SGD on the script's update goes uphill: after 20 GRPO-4 steps on the ascent toy the exact
    # mean pass rate has risen well beyond what noise could give, and no prompt got worse by much
    start = T.Toy(ascent.FLAT)
    run = ascent.train(ascent.ARMS["grpo4"], start, 0, 32 * 4 * 20, ascent.LR["flat"])
    assert run["p"][-1].mean() > start.p.mean() + 0.05
    assert np.allclose(start.p, T.Toy(ascent.FLAT).p)  # the start was left untouched


def test_the_sampler_correction_recovers_the_on_policy_update_and_its_bounds_leave_a_bias(tree):
    # rollouts from a sampler whose logits are moved off the policy's (table.SAMPLER_GAP): the same
    # seed draws the same rollouts in every row, only the correction's weights differ
    target = tree.target("p")

    def stats(mode, clip_max=3.0):
        step = T.sampler_gap_step(tree, mode, clip_max, None, table.SAMPLER_GAP)
        return T.monte_carlo(step, 1000, seed=0).compare(target, const=1 / tree.T)

    uncorrected = stats(None)
    assert uncorrected["max_z"] > Z and uncorrected["rel_bias_ci"][0] > 0.3, uncorrected
    # the sequence ratio, untruncated: the on-policy expected update within its interval (its
    # heavy tail makes a coordinate's standard error unreliable at this many steps: no z test)
    full = stats("sequence_truncate", None)
    lo, hi = full["scale_ci"]
    assert lo <= 1.0 <= hi and full["rel_bias"] < 0.05, full
    bias = {mode: stats(mode)["rel_bias"] for mode in ("sequence_truncate", "sequence_mask")}
    bias |= {mode: stats(mode)["rel_bias"] for mode in ("token_truncate", "token_mask")}
    # at clip_max 3: the sequence modes keep a smaller bias than the token modes, all below none
    assert bias["sequence_truncate"] < bias["sequence_mask"] < bias["token_truncate"], bias
    assert max(bias.values()) < uncorrected["rel_bias"], (bias, uncorrected)


def test_the_scaling_page_shows_the_stored_sampler_rows():
    results = json.loads(table.SAMPLER_RESULTS.read_text())
    assert [key for key, *_ in table.SAMPLER_ROWS] == list(results["rows"])
    assert not table.sampler_stale(results)


def test_a_prefix_tasks_token_mean_counts_its_trained_tokens_only(tree):
    # DAPO's token mean divides by the trained tokens: a group replaying its first step trains
    # T - 1 tokens a rollout, so (ratio 1) its update is sum_i A_i grad log pi(continuation_i) over
    # n (T - 1), the replayed prefix in neither the sum nor the divisor
    x = 1
    first = tree.actions(int(np.flatnonzero(tree.rewards[x])[0]))[0]
    span = tree.B ** (tree.T - 1)
    leaves = first * span + np.arange(span)
    args = ps_grpo.Args(num_generations=span)
    task = ps_grpo.BatchTask(x, "hard", steps=[([first], [])], source_steps=tree.T)
    update = T.ps_update(tree, args, [task], [leaves])
    rewards = torch.tensor(tree.rewards[x, leaves])
    advantages = rewards - rewards.mean()
    theta = tree.theta.clone().requires_grad_(True)
    continuation = tree.token_logp(theta, [x] * span, leaves)[:, 1:].sum(1)
    (advantages @ continuation / (span * (tree.T - 1))).backward()
    assert np.abs(update).max() > 1e-3
    assert np.allclose(update, theta.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_each_stale_seed_draws_its_own_stale_policy(flat):
    # the staleness rows average over the stale policies of STALE_SEEDS: the same fresh draws give
    # the same step under one seed and another step under another (its buffers' log pi_old)
    def update(stale_seed):
        random.seed(0)
        step = T.ra_rloo_step(flat, 5.0, 1.0, stale_seed=stale_seed)
        return step(np.random.default_rng(0))[0]

    assert np.array_equal(update(1), update(1))
    assert not np.allclose(update(1), update(2))


def test_ascent_counts_generated_rollouts():
    # the curves' x axis: every step adds the rollouts it generated (GRPO-4: 4 per prompt)
    start = T.Toy(ascent.FLAT)
    per_step = len(ascent.FLAT) * 4
    run = ascent.train(ascent.ARMS["grpo4"], start, 0, 3 * per_step, ascent.LR["flat"])
    assert np.array_equal(run["rollouts"], per_step * np.arange(4)), run["rollouts"]
