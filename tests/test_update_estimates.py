"""What each method's update estimates, on the enumerable toy problem (benchmarks/estimates): each
paper's unbiasedness claim at a fixed seed within its interval, and where the bias is by design the
relation the paper describes. Seconds on one core: no model, no generation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.estimates import table
from benchmarks.estimates import toy as T
from common.rl.advantages import grpo_advantages

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
    adv = lambda r: grpo_advantages(r, True)  # noqa: E731
    exact = sum(T.group_weight(p, n, adv) * g for p, g in zip(flat.p, flat.grad_p())) / (
        flat.P * n * flat.T
    )
    est = T.monte_carlo(T.grpo_step(flat, n, scale=True), 3000, seed=0)
    assert unbiased(est.compare(exact, const=1.0)), est.compare(exact, const=1.0)
    # Appendix B: the std makes the weight 1 / sqrt(p (1 - p)); with the group's own std it only
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
