"""Pólya-Gamma draws and the PROS two-layer Gibbs sampler against closed forms and numerical quadrature."""

import numpy as np
import pytest

from common.rl.gibbs import _PI2, pg_gibbs, pg_moment_sums, sample_pg, update_counts


def pg_mean(b, c) -> np.ndarray:
    """E PG(b, c) = b tanh(c/2) / (2c), b/4 at c = 0."""
    return np.asarray(b, dtype=np.float64) * pg_moment_sums(c)[0] / (2 * _PI2)


def pg_var(b, c) -> np.ndarray:
    """Var PG(b, c) = b (sinh c - c) / (4 c³ cosh²(c/2)), b/24 at c = 0."""
    return np.asarray(b, dtype=np.float64) * pg_moment_sums(c)[1] / (4 * _PI2**2)


@pytest.mark.parametrize(
    "b,c", [(1.0, 0.0), (0.5, 1.3), (2.7, -3.0), (10.0, 0.2), (0.1, 5.0), (35.5, 2.0), (3.3, 0.004)]
)
def test_pg_mean_and_variance_within_sampling_error(b, c):
    rng = np.random.default_rng(0)
    n = 200_000
    x = sample_pg(np.full(n, b), np.full(n, c), rng)
    mean, var = pg_mean(b, c), pg_var(b, c)
    if c == 0:
        assert mean == pytest.approx(b / 4) and var == pytest.approx(b / 24)
    else:
        assert mean == pytest.approx(b * np.tanh(c / 2) / (2 * c))
    se_mean = np.sqrt(var / n)
    m4 = np.mean((x - x.mean()) ** 4)
    se_var = np.sqrt((m4 - x.var() ** 2) / n)
    assert abs(x.mean() - mean) < 5 * se_mean
    assert abs(x.var() - var) < 5 * se_var
    assert (x > 0).all()


def test_pg_b_zero_is_zero_and_shape_matches_a_long_series():
    rng = np.random.default_rng(1)
    assert (sample_pg(np.zeros(100), rng.normal(size=100), rng) == 0).all()
    # the moment-matched remainder changes the distribution's shape negligibly: compare quantiles with a
    # 400-term plain series (whose own truncation bias, ~0.1% of the mean, is far below the tolerance)
    b, c, n = 1.7, 1.1, 40_000
    ours = sample_pg(np.full(n, b), np.full(n, c), rng, terms=5)
    k = np.arange(1, 401)
    d = (k - 0.5) ** 2 + (c / (2 * np.pi)) ** 2
    ref = (rng.standard_gamma(b, size=(n, 400)) / d).sum(-1) / (2 * np.pi**2)
    q = [0.05, 0.25, 0.5, 0.75, 0.95]
    assert np.quantile(ours, q) == pytest.approx(np.quantile(ref, q), rel=0.03)


def _logpost_terms(psi, s, n):
    return s * -np.logaddexp(0, -psi) + (n - s) * -np.logaddexp(0, psi)


def _chains(parent_one, s_one, n_one, copies, mu0, tau0, sigma, sweeps=300, burn=50, seed=0):
    """Many independent copies of a small tree run in parallel (one vectorised call); mean over draws."""
    m = len(parent_one)
    parent = np.concatenate(
        [
            np.where(np.asarray(parent_one) >= 0, np.asarray(parent_one) + i * m, -1)
            for i in range(copies)
        ]
    )
    s, n = np.tile(s_one, copies), np.tile(n_one, copies)
    rng = np.random.default_rng(seed)
    psi = np.zeros(m * copies)
    draws = []
    for t in range(sweeps):
        psi, _ = pg_gibbs(psi, parent, s, n, mu0, tau0, sigma, 1, rng)
        if t >= burn:
            draws.append(psi.reshape(copies, m))
    d = np.stack(draws)  # [T, copies, m]
    per_chain = d.mean(
        0
    )  # chains are independent: the spread of their means gives the standard error
    return per_chain.mean(0), per_chain.std(0) / np.sqrt(copies)


def test_single_root_matches_quadrature_with_real_counts():
    mu0, tau0, s, n = 0.5, 1.5, 3.4, 9.1  # forgotten counts are real numbers
    g = np.linspace(-12, 12, 48001)
    lp = -((g - mu0) ** 2) / (2 * tau0**2) + _logpost_terms(g, s, n)
    w = np.exp(lp - lp.max())
    exact = (w * g).sum() / w.sum()
    est, se = _chains([-1], [s], [n], copies=2000, mu0=mu0, tau0=tau0, sigma=1.0)
    assert abs(est[0] - exact) < max(5 * se[0], 0.01)
    assert exact < mu0 - 0.3  # the data (37% successes) pulled it well below the prior mean


def test_root_and_child_match_two_dimensional_quadrature():
    mu0, tau0, sigma = 0.0, 2.0, 0.7
    s_r, n_r, s_c, n_c = (
        1.0,
        6.0,
        7.5,
        8.0,
    )  # a weak root, a strong child: the child pulls the root up
    g = np.linspace(-9, 9, 901)
    pr, pc = np.meshgrid(g, g, indexing="ij")
    lp = (
        -((pr - mu0) ** 2) / (2 * tau0**2)
        - (pc - pr) ** 2 / (2 * sigma**2)
        + _logpost_terms(pr, s_r, n_r)
        + _logpost_terms(pc, s_c, n_c)
    )
    w = np.exp(lp - lp.max())
    w /= w.sum()
    exact_r, exact_c = (w * pr).sum(), (w * pc).sum()
    est, se = _chains([-1, 0], [s_r, s_c], [n_r, n_c], copies=2000, mu0=mu0, tau0=tau0, sigma=sigma)
    assert abs(est[0] - exact_r) < max(5 * se[0], 0.015)
    assert abs(est[1] - exact_c) < max(5 * se[1], 0.015)
    # without the child the root's posterior mean would be far lower: the hierarchy shares strength
    lp_alone = -((g - mu0) ** 2) / (2 * tau0**2) + _logpost_terms(g, s_r, n_r)
    wa = np.exp(lp_alone - lp_alone.max())
    assert exact_r > (wa * g).sum() / wa.sum() + 0.3


def test_roots_with_different_numbers_of_children_in_one_sweep():
    # vectorised sums over children: a root with 3 children vs a root with none, same own data
    parent = np.array([-1, 0, 0, 0, -1])
    s = np.array([2.0, 8.0, 8.0, 8.0, 2.0])
    n = np.array([4.0, 8.0, 8.0, 8.0, 4.0])
    est, _ = _chains(parent, s, n, copies=300, mu0=0.0, tau0=2.0, sigma=1.0, sweeps=200)
    assert est[0] > est[4] + 0.5
    with pytest.raises(ValueError):
        pg_gibbs(
            np.zeros(3),
            np.array([-1, 0, 1]),
            np.zeros(3),
            np.zeros(3),
            0,
            1,
            1,
            1,
            np.random.default_rng(0),
        )


def test_forgetting_shifts_the_estimate_toward_recent_data():
    def posterior_theta(forget):
        s, n = np.zeros(1), np.zeros(1)
        for succ in [0, 0, 0, 0, 0, 0, 4, 4, 4]:  # the node used to fail, now it passes
            s, n = update_counts(s, n, [0], [succ], [4], forget)
        est, _ = _chains([-1], s, n, copies=1000, mu0=0.0, tau0=2.0, sigma=1.0, sweeps=150, seed=3)
        return 1 / (1 + np.exp(-est[0])), s[0] / n[0]

    theta_keep, ratio_keep = posterior_theta(1.0)
    theta_forget, ratio_forget = posterior_theta(0.5)
    assert ratio_keep == pytest.approx(12 / 36) and ratio_forget > 0.8
    assert theta_forget > theta_keep + 0.25
    s, n = update_counts(
        np.array([2.0, 1.0]), np.array([4.0, 2.0]), [1, 1], [1.0, 0.0], [1.0, 1.0], 0.5
    )
    assert s.tolist() == [1.0, 1.5] and n.tolist() == [
        2.0,
        3.0,
    ]  # all counts decay; repeats accumulate


def test_forgetting_on_visit_decays_only_the_observed_nodes():
    s0, n0 = np.array([2.0, 1.0, 3.0]), np.array([4.0, 2.0, 6.0])
    s, n = update_counts(s0, n0, [1, 1], [1.0, 0.0], [1.0, 1.0], 0.5, "visit")
    assert s.tolist() == [2.0, 1.5, 3.0] and n.tolist() == [
        4.0,
        3.0,
        6.0,
    ]  # node 1 decays once, the rest keep
    assert s0.tolist() == [2.0, 1.0, 3.0]  # inputs untouched
    # fifty iterations without a visit: `iteration` keeps 0.95^50 = 8% of a node's counts, `visit` all of them
    si, ni, sv, nv = s0, n0, s0, n0
    for _ in range(50):
        si, ni = update_counts(si, ni, [0], [1.0], [4.0], 0.95)
        sv, nv = update_counts(sv, nv, [0], [1.0], [4.0], 0.95, "visit")
    assert ni[2] == pytest.approx(6.0 * 0.95**50) and nv[2] == 6.0 and nv[1] == 2.0
    assert ni[0] == pytest.approx(
        nv[0]
    )  # a node visited every iteration decays the same either way
    with pytest.raises(ValueError, match="forget_on"):
        update_counts(s0, n0, [0], [1.0], [1.0], 0.5, "never")


def test_default_terms_keep_the_lower_tail_at_small_b():
    # b = 0.3, c = 10: with 4 exact terms the 1% quantile is ~8% too low (the remainder is 24% of the mean and its
    # Gamma shape is too heavy near 0); the default (8 terms) stays within 3% of a 200-term series
    rng = np.random.default_rng(0)
    b, c = np.full(200_000, 0.3), np.full(200_000, 10.0)
    reference = np.quantile(sample_pg(b, c, rng, terms=200), 0.01)
    assert abs(np.quantile(sample_pg(b, c, rng), 0.01) / reference - 1) < 0.03
    assert np.quantile(sample_pg(b, c, rng, terms=4), 0.01) / reference - 1 < -0.05


def test_calibration_excess_removes_the_sampling_floor():
    """|θ̂ - s/n| of a perfectly calibrated model still averages ~0.2 at n = 4; the excess over its expectation is ~0,
    and a model that calls mostly-failing nodes 50/50 shows a clear excess."""
    from common.rl.gibbs import calibration_excess

    rng = np.random.default_rng(0)
    theta = rng.uniform(0, 1, 20000)
    successes = rng.binomial(4, theta)
    assert np.mean(np.abs(theta - successes / 4)) > 0.15
    assert abs(calibration_excess(theta, successes, 4)) < 0.01
    assert calibration_excess(np.full(20000, 0.5), rng.binomial(4, 0.05, 20000), 4) > 0.2
