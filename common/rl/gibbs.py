"""Pólya-Gamma draws and the Gibbs sampler of PROS's two-layer logit-normal pass-rate model.

Model (PROS Section 4): θ = σ(ψ), ψ_root ~ N(μ0, τ0²), ψ_child | ψ_root ~ N(ψ_root, σ²), s successes
of n trials per node (real-valued counts under exponential forgetting, `update_counts`). With ω ~
PG(n, ψ) and κ = s - n/2 (Polson, Scott & Windle 2013) every conditional is Gaussian (PROS
Propositions 4.1/4.2): ψ_child | ψ_root, ω:  V = 1/(1/σ² + ω),  m = V (ψ_root/σ² + κ) ψ_root |
children, ω: V0 = 1/(1/τ0² + C/σ² + ω_root),  m0 = V0 (μ0/τ0² + Σ_children ψ_child/σ² + κ_root) A
sweep draws all ω, then all children, then all roots, each block vectorised over the tree (numpy).

PG(b, c), real b >= 0 (`sample_pg`): ω = 1/(2π²) Σ_{k>=1} g_k / d_k, d_k = (k - 1/2)² + c²/(4π²),
g_k ~ Gamma(b, 1). The first `terms` g_k are drawn exactly; the remainder Σ_{k>terms} is one Gamma
variable with the remainder's exact mean b·S1 and variance b·S2 (S1 = Σ_{k>terms} 1/d_k, S2 = Σ
1/d_k², closed-form totals minus the first terms), so every draw's mean and variance are exact, only
the remainder's shape is approximated. At terms=4 the remainder is 5% of the mean at c = 0, 24% at
|c| = 10, and at b = 0.3 (forgetting makes small b common) the 1% quantile was 4-8% low against a
400-term series (100k draws, c in {0, 5, 10}); with 8 terms (default) all within 1.4%. PG(0) = 0.
"""

from __future__ import annotations

import numpy as np

_PI2 = np.pi**2


def pg_moment_sums(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_k 1/d_k, Σ_k 1/d_k²) over all k >= 1, d_k = (k-1/2)² + c²/(4π²); so E PG(b,c) =
    b·S1/(2π²), Var = b·S2/(4π⁴).

    S1 = π² tanh(c/2)/c and S2 = π⁴ (2 tanh(c/2) - c sech²(c/2)) / c³; series near c = 0 avoid
    cancellation.
    """
    c = np.abs(np.asarray(c, dtype=np.float64))
    small = c < 1e-2
    cs = np.where(small, 1.0, c)  # placeholder where the series is used
    s1 = np.where(small, _PI2 * (0.5 - c**2 / 24 + c**4 / 240), _PI2 * np.tanh(cs / 2) / cs)
    sech2 = 1.0 / np.cosh(np.minimum(cs / 2, 350.0)) ** 2  # underflows gracefully to 0 for large c
    s2 = np.where(
        small,
        _PI2**2 * (1 / 6 - c**2 / 30 + 17 * c**4 / 3360),
        _PI2**2 * (2 * np.tanh(cs / 2) - cs * sech2) / cs**3,
    )
    return s1, s2


def sample_pg(b, c, rng: np.random.Generator, terms: int = 8) -> np.ndarray:
    """ω ~ PG(b, c) elementwise (b >= 0, c real): truncated series + moment-matched Gamma remainder
    (module doc)."""
    b, c = np.broadcast_arrays(np.asarray(b, dtype=np.float64), np.asarray(c, dtype=np.float64))
    if np.any(b < 0) or terms < 1:
        raise ValueError(f"PG(b, c) needs b >= 0 and terms >= 1 (terms={terms})")
    k = np.arange(1, terms + 1, dtype=np.float64)
    inv_d = 1.0 / ((k - 0.5) ** 2 + (c[..., None] / (2 * np.pi)) ** 2)  # 1/d_k, [..., terms]
    g = rng.standard_gamma(np.broadcast_to(b[..., None], inv_d.shape))  # Gamma(0) = 0 exactly
    head = (g * inv_d).sum(-1)
    s1, s2 = pg_moment_sums(c)
    t1 = np.maximum(s1 - inv_d.sum(-1), 1e-300)  # remainder sums Σ_{k>terms}
    t2 = np.maximum(s2 - (inv_d * inv_d).sum(-1), 1e-300)
    shape = b * t1 * t1 / t2  # Gamma(shape, scale) with mean b·t1 and variance b·t2
    tail = rng.standard_gamma(shape) * (t2 / t1)
    return np.where(b > 0, (head + tail) / (2 * _PI2), 0.0)


def update_counts(
    s: np.ndarray, n: np.ndarray, nodes, succ, trials, forget: float, forget_on: str = "iteration"
) -> tuple[np.ndarray, np.ndarray]:
    """Exponential forgetting (PROS Section 4: λ applied "to historical counts before merging with
    new observations"), then this step's observations (successes `succ` of `trials` at `nodes`,
    repeats allowed) are added. `iteration`: every node's counts are multiplied by λ = `forget`
    (once per call); `visit`: only the counts of the nodes observed now (once each, however many
    repeats). Returns new arrays."""
    if not 0 < forget <= 1:
        raise ValueError("forget must be in (0, 1]")
    if forget_on == "iteration":
        s, n = s * forget, n * forget
    elif forget_on == "visit":
        seen = np.unique(np.asarray(nodes, dtype=np.int64))
        s, n = s.copy(), n.copy()
        s[seen] *= forget
        n[seen] *= forget
    else:
        raise ValueError(f"forget_on must be 'iteration' or 'visit', got {forget_on!r}")
    np.add.at(s, np.asarray(nodes, dtype=np.int64), np.asarray(succ, dtype=np.float64))
    np.add.at(n, np.asarray(nodes, dtype=np.int64), np.asarray(trials, dtype=np.float64))
    return s, n


def pg_gibbs(
    psi: np.ndarray,
    parent: np.ndarray,
    s: np.ndarray,
    n: np.ndarray,
    mu0: float,
    tau0: float,
    sigma: float,
    sweeps: int,
    rng: np.random.Generator,
    terms: int = 8,
) -> tuple[np.ndarray, np.ndarray]:
    """Run `sweeps` Gibbs sweeps of the two-layer model from state `psi` (module doc for the
    conditionals).

    parent[i] = -1 for a root, else the index of i's root (two layers: a root's parent is always
    -1). Returns (the final state ψ, the mean of σ(ψ) over the sweeps: a Monte Carlo posterior-mean
    estimate θ̂).
    """
    psi = np.array(psi, dtype=np.float64, copy=True)
    parent = np.asarray(parent, dtype=np.int64)
    s, n = np.asarray(s, dtype=np.float64), np.asarray(n, dtype=np.float64)
    num = len(psi)
    ch = np.flatnonzero(parent >= 0)
    rt = np.flatnonzero(parent < 0)
    par = parent[ch]
    if len(ch) and np.any(parent[par] >= 0):
        raise ValueError("pg_gibbs: a child's parent must be a root (two-layer tree)")
    n_child = np.bincount(par, minlength=num)[rt].astype(np.float64)
    kappa = s - n / 2
    inv_s2, inv_t2 = 1.0 / sigma**2, 1.0 / tau0**2
    theta_sum = np.zeros(num)
    # PG(0, c) = 0 exactly: never-observed nodes (new children) need no draw
    seen = np.flatnonzero(n > 0)
    omega = np.zeros(num)
    for _ in range(sweeps):
        omega[seen] = sample_pg(n[seen], psi[seen], rng, terms)
        # children | root, ω   (Prop. 4.1)
        v = 1.0 / (inv_s2 + omega[ch])
        psi[ch] = v * (psi[par] * inv_s2 + kappa[ch]) + np.sqrt(v) * rng.standard_normal(len(ch))
        # roots | children, ω  (Prop. 4.2)
        child_sum = np.bincount(par, weights=psi[ch], minlength=num)[rt]
        v0 = 1.0 / (inv_t2 + n_child * inv_s2 + omega[rt])
        psi[rt] = v0 * (mu0 * inv_t2 + child_sum * inv_s2 + kappa[rt]) + np.sqrt(
            v0
        ) * rng.standard_normal(len(rt))
        theta_sum += 1.0 / (1.0 + np.exp(-psi))
    return psi, theta_sum / max(1, sweeps)


def calibration_excess(theta_hat: list[float], successes: list[float], trials: int) -> float:
    """Mean over nodes of |θ̂ - s/n| minus its expectation when s ~ Binomial(n, θ̂): about 0 for a
    calibrated model at any n, > 0 when the observed rates sit further from θ̂ than sampling noise
    explains. |θ̂ - s/n| alone has a floor E|p - Bin(n, p)/n| set by n (at n = 4: 0.19-0.21 for p in
    0.4-0.5, 0 at p in {0, 1}), so it mostly measures how mixed the picked nodes are, not how well
    the model knows them."""
    from math import comb

    excess = []
    for theta, observed in zip(theta_hat, successes):
        floor = sum(
            comb(trials, s) * theta**s * (1 - theta) ** (trials - s) * abs(theta - s / trials)
            for s in range(trials + 1)
        )
        excess.append(abs(theta - observed / trials) - floor)
    return float(np.mean(excess))
