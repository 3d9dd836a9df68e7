"""A problem small enough to enumerate, and each method's update on it.

Every prompt x has a tabular softmax policy over a tree of `depth` steps with `branch` actions per
step (depth 1: a plain softmax over `branch` responses), and a fixed 0/1 reward per leaf, so its
pass rate p_x(theta) and every objective E_x[f(p_x)] have a closed form whose gradient autograd
gives exactly (`Toy.target`). A method's update is one step of the method built from its script's
own functions (advantages, splicing and importance weights, rounds and downsampling, budgets, the
batch, prefix routing and masking, the query tree) and the script's own loss function over its
normaliser, differentiated by `backward` through the tabular policy (`Toy.update`; pi_old = pi_theta
by default: one epoch, every PPO ratio is 1). `monte_carlo` averages many independent steps; where
the expectation has a closed form or a finite enumeration, the functions at the end compute it.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import numpy as np
import torch

import ada_est
import ada_seq
import pros_ppo
import ps_grpo
import ra_rloo
from common.rl.ada import success_threshold
from common.rl.advantages import grpo_advantages
from common.rl.episode import Episode
from common.rl.losses import clipped_surrogate
from common.tasks.loading import PromptSampler

OBJECTIVES = {
    "p": lambda p: p,
    "log p": torch.log,
    "sqrt p": torch.sqrt,
    # its derivative is 1 / sqrt(p (1 - p)), the weight Appendix B's advantage (r - p) / std
    # gives at a fixed group size with the population std (a corollary; the paper does not state it)
    "2 arcsin sqrt p": lambda p: 2 * torch.asin(torch.sqrt(p)),
}


class Toy:
    """P prompts, each a tree of `depth` steps with `branch` actions; logits theta [P, nodes,
    branch] (float64) chosen so that prompt x passes with probability `pass_rates[x]`."""

    def __init__(
        self, pass_rates, depth: int = 1, branch: int = 6, correct: int = 2, seed: int = 0
    ):
        self.P, self.T, self.B = len(pass_rates), depth, branch
        self.leaves = branch**depth
        self.offsets = [sum(branch**i for i in range(d)) for d in range(depth + 1)]
        self.nodes = self.offsets[-1]
        leaf = np.arange(self.leaves)
        # per step d: the node each leaf passes through and the action taken there
        self.node_of = np.stack(
            [self.offsets[d] + leaf // branch ** (depth - d) for d in range(depth)]
        )
        self.action_of = np.stack(
            [(leaf // branch ** (depth - d - 1)) % branch for d in range(depth)]
        )
        rng = np.random.default_rng(seed)
        self.rewards = np.zeros((self.P, self.leaves))
        theta = np.zeros((self.P, self.nodes, branch))
        for x, target in enumerate(pass_rates):
            self.rewards[x, rng.choice(self.leaves, size=correct, replace=False)] = 1.0
            noise = rng.normal(0.0, 0.5, size=(self.nodes, branch))
            # a child's share of winning leaves under the uniform policy steers the logits
            value = np.zeros((self.nodes, branch))
            for d in range(depth):
                span = branch ** (depth - d - 1)
                for node in range(branch**d):
                    for a in range(branch):
                        first = (node * branch + a) * span
                        value[self.offsets[d] + node, a] = self.rewards[
                            x, first : first + span
                        ].mean()
            lo, hi = -30.0, 30.0
            for _ in range(100):
                mid = (lo + hi) / 2
                theta[x] = noise + mid * value
                lo, hi = (
                    (mid, hi) if self.pass_rates(torch.tensor(theta))[x] < target else (lo, mid)
                )
        self.theta = torch.tensor(theta)
        self.set_policy(self.theta)

    def set_policy(self, theta: torch.Tensor) -> None:
        self.pi = torch.softmax(theta, -1).numpy()
        self.leaf_p = self.leaf_probs(theta).numpy()
        self.p = (self.leaf_p * self.rewards).sum(-1)

    def leaf_logp(self, theta: torch.Tensor) -> torch.Tensor:
        logpi = torch.log_softmax(theta, -1)
        return sum(logpi[:, self.node_of[d], self.action_of[d]] for d in range(self.T))

    def leaf_probs(self, theta: torch.Tensor) -> torch.Tensor:
        return self.leaf_logp(theta).exp()

    def pass_rates(self, theta: torch.Tensor) -> torch.Tensor:
        return (self.leaf_probs(theta) * torch.as_tensor(self.rewards)).sum(-1)

    def target(self, objective: str) -> np.ndarray:
        """The exact gradient of E_x[f(p_x)] (mean over the prompts) at theta, flat."""
        theta = self.theta.clone().requires_grad_(True)
        OBJECTIVES[objective](self.pass_rates(theta)).mean().backward()
        return theta.grad.numpy().ravel().copy()

    def first_step(self) -> np.ndarray:
        """Flat bool: the logits of each prompt's first step (the root node), which a replayed
        prefix never reaches."""
        keep = np.zeros(self.theta.shape, bool)
        keep[:, 0] = True
        return keep.ravel()

    def grad_p(self) -> np.ndarray:
        """[P, D]: each prompt's grad p_x (zero outside its own logits)."""
        theta = self.theta.clone().requires_grad_(True)
        rows = []
        for x in range(self.P):
            (g,) = torch.autograd.grad(self.pass_rates(theta)[x], theta)
            rows.append(g.numpy().ravel())
        return np.stack(rows)

    # ---- sampling and the scripts' losses ----
    def sample(self, x: int, n: int, rng, prefix: tuple = ()) -> np.ndarray:
        """n leaves of prompt x drawn from pi given the replayed `prefix` of actions."""
        span = self.B ** (self.T - len(prefix))
        first = sum(a * self.B ** (self.T - 1 - i) for i, a in enumerate(prefix))
        probs = self.leaf_p[x, first : first + span]
        return first + rng.choice(span, size=n, p=probs / probs.sum())

    def actions(self, leaf: int) -> list[int]:
        return [int(self.action_of[d, leaf]) for d in range(self.T)]

    def leaf(self, actions) -> int:
        return int(sum(a * self.B ** (self.T - 1 - i) for i, a in enumerate(actions)))

    def token_logp(self, theta: torch.Tensor, xs, leaves) -> torch.Tensor:
        """[rows, T]: log pi of each step's action (a step is one token) of each row's leaf."""
        xs, leaves = np.asarray(xs, int), np.asarray(leaves, int)
        logpi = torch.log_softmax(theta, -1)
        steps = [
            logpi[xs, self.node_of[d, leaves], self.action_of[d, leaves]] for d in range(self.T)
        ]
        return torch.stack(steps, 1)

    def update(self, xs, leaves, loss, mask=None, old_theta=None) -> np.ndarray:
        """The step a script's loss takes on the tabular policy: -grad of `loss(logp, old_logp,
        mask)` at theta by its backward, [P, nodes, B]. logp [rows, T] is each row's per-step log pi
        (the graph), old_logp the sampler's (`old_theta`; by default logp detached: one epoch, every
        ratio 1), mask [rows, T] (default: every step trained)."""
        theta = self.theta.clone().requires_grad_(True)
        if len(xs) == 0:
            return np.zeros(tuple(theta.shape))
        logp = self.token_logp(theta, xs, leaves)
        old_logp = logp.detach() if old_theta is None else self.token_logp(old_theta, xs, leaves)
        mask = torch.ones_like(logp) if mask is None else torch.as_tensor(mask, dtype=logp.dtype)
        value = loss(logp, old_logp, mask)
        if not value.requires_grad:  # nothing trained: no gradient
            return np.zeros(tuple(theta.shape))
        value.backward()
        return -theta.grad.numpy()


def group_weight(p: float, n: int, advantages) -> float:
    """The exact expected update of one group of n rollouts, as a multiple of grad p: for 0/1
    rewards E[sum_i A_i grad log pi(y_i)] = w(p) grad p with w(p) = E[sum_i A_i (r_i / p - (1 - r_i)
    / (1 - p))] (a success's score averages grad p / p, a failure's -grad p / (1 - p)), summed here
    over the number of successes s with `advantages` ([1, n] rewards -> [1, n]) itself."""
    total = 0.0
    for s in range(n + 1):
        rewards = torch.tensor([[1.0] * s + [0.0] * (n - s)], dtype=torch.float64)
        adv = advantages(rewards)[0].numpy()
        score = rewards[0].numpy() / p - (1 - rewards[0].numpy()) / (1 - p)
        total += math.comb(n, s) * p**s * (1 - p) ** (n - s) * float(adv @ score)
    return total


@dataclass
class Estimate:
    """Many independent steps' updates: their mean and, for intervals, batch means."""

    mean: np.ndarray
    batch_means: np.ndarray  # [batches, D]
    se: np.ndarray  # per coordinate
    var: float  # trace of the per-step covariance
    rollouts: float  # mean rollouts per step

    def compare(self, target: np.ndarray, const: float | None = None, seed: int = 0) -> dict:
        """Against c x target: `scale` = <g, t> / (c |t|^2) (1 when the update matches the target
        along it), `rel_bias` = |E g - c t| / |c t| with the noise's share of |g - c t|^2 taken out
        (sum of se^2), `cos`, each bias-corrected with a 95% basic-bootstrap interval over the batch
        means (a resampled mean carries the noise twice: its own share is taken out twice);
        `max_z`: the largest per-coordinate |g - c t| / se. c: `const`, or the least-squares scale
        (then rel_bias measures the direction only)."""
        noise = float((self.se**2).sum())

        def stats(g, extra):
            c = const if const is not None else float(g @ target / (target @ target))
            miss = float(((g - c * target) ** 2).sum()) - extra * noise
            return (
                float(g @ target / (c * (target @ target))),
                math.sqrt(max(miss, 0.0)) / float(np.linalg.norm(c * target)),
                float(g @ target / (np.linalg.norm(g) * np.linalg.norm(target))),
            )

        raw = np.array(stats(self.mean, 1))
        rng = np.random.default_rng(seed)
        k = len(self.batch_means)
        boot = np.array(
            [stats(self.batch_means[rng.integers(0, k, k)].mean(0), 2) for _ in range(400)]
        )
        q_lo, q_hi = np.percentile(boot, [2.5, 97.5], axis=0)
        # the bootstrap's bias correction (noise lowers a cosine) and basic intervals
        point = 2 * raw - boot.mean(0)
        lo, hi = 2 * raw - q_hi, 2 * raw - q_lo
        point[1], lo[1], hi[1] = max(point[1], 0.0), max(lo[1], 0.0), max(hi[1], 0.0)
        point[2], hi[2] = min(point[2], 1.0), min(hi[2], 1.0)
        c = const if const is not None else float(self.mean @ target / (target @ target))
        live = self.se > 0
        z = np.abs(self.mean - c * target)[live] / self.se[live]
        out = {"max_z": float(z.max()) if z.size else 0.0}
        for i, name in enumerate(("scale", "rel_bias", "cos")):
            out[name] = float(point[i])
            out[name + "_ci"] = (float(lo[i]), float(hi[i]))
        return out

    def restrict(self, keep: np.ndarray) -> Estimate:
        """The same steps seen on the coordinates where `keep` (flat bool) is true."""
        return Estimate(
            self.mean[keep], self.batch_means[:, keep], self.se[keep], self.var, self.rollouts
        )

    def prompt_weights(self, grad_p: np.ndarray) -> np.ndarray:
        """Per prompt x, the update's component along grad p_x as a multiple of it: the weight
        w_x of sum_x w_x grad p_x, which is the whole expected update where each prompt's
        responses are exchangeable given their reward (no prefix, no stale replay)."""
        return (grad_p @ self.mean) / (grad_p**2).sum(1)

    def relative_weights(self, grad_p: np.ndarray, ref: int, seed: int = 0) -> tuple:
        """`prompt_weights` / that of prompt `ref`, with a 95% bootstrap interval over the batch
        means: (point [P], low [P], high [P])."""
        norm = (grad_p**2).sum(1)

        def rel(g):
            w = (grad_p @ g) / norm
            return w / w[ref]

        rng = np.random.default_rng(seed)
        k = len(self.batch_means)
        boot = np.array([rel(self.batch_means[rng.integers(0, k, k)].mean(0)) for _ in range(400)])
        lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
        return rel(self.mean), lo, hi


def monte_carlo(step, steps: int, seed: int, batches: int = 40) -> Estimate:
    """`steps` independent calls of step(rng) -> (update [P, nodes, B], rollouts); numpy's and
    Python's generators (the scripts' draws use `random`) seeded from `seed`."""
    rng = np.random.default_rng(seed)
    random.seed(seed)
    rows, rollouts = [], 0
    for _ in range(steps):
        g, n = step(rng)
        rows.append(g.ravel())
        rollouts += n
    g = np.stack(rows)
    usable = steps // batches * batches
    batch_means = g[:usable].reshape(batches, -1, g.shape[1]).mean(1)
    centred = g - g.mean(0)
    return Estimate(
        mean=g.mean(0),
        batch_means=batch_means,
        se=g.std(0) / math.sqrt(steps),
        var=float((centred**2).sum(1).mean()),
        rollouts=rollouts / steps,
    )


# ---------------- the methods' updates, one step each ----------------

# what rank_mean / reduce_sums / minibatch_divisors read of the accelerator: one process
ONE_PROCESS = SimpleNamespace(num_processes=1, process_index=0)


def rloo_loss(normaliser: float, w_max: float | None = None, logp_old=None, correct=None):
    """ra_rloo's loss on the toy's rows: the sequence log-prob, [RA-RLOO] `weigh_replays` where
    `logp_old` (per row, NaN: fresh) says a row is a replay, the policy-gradient sum with the
    sampler correction's weight per token (`correct(trainer_logp)`; None: 1) and `rloo_loss` (no
    KL: beta x 0)."""

    def loss(advantages):
        def of(logp, old_logp, mask):
            seq_logp = (logp * mask).sum(-1)
            adv = advantages
            if logp_old is not None:
                is_replay = ~torch.isnan(logp_old)
                adv, _ = ra_rloo.weigh_replays(adv, is_replay, seq_logp, logp_old, w_max)
            sampler_weight = 1.0 if correct is None else correct(logp.detach())
            pg_sum = -(adv * (logp * mask * sampler_weight).sum(-1)).sum()
            return ra_rloo.rloo_loss(pg_sum, 0.0, 0.0, normaliser)

        return of

    return loss


def rloo_step(toy: Toy, k: int = 4, advantages=ra_rloo.rloo_advantages):
    """RLOO (ra_rloo.py --replay none): k rollouts per prompt, leave-one-out advantages."""
    loss = rloo_loss(ra_rloo.rloo_normaliser(toy.P, k, 1, toy.T))

    def step(rng):
        leaves = np.stack([toy.sample(x, k, rng) for x in range(toy.P)])
        rewards = torch.tensor(toy.rewards[np.arange(toy.P)[:, None], leaves])
        adv = advantages(rewards).flatten()
        xs = np.repeat(np.arange(toy.P), k)
        return toy.update(xs, leaves.ravel(), loss(adv)), toy.P * k

    return step


def ra_rloo_step(
    toy: Toy,
    w_max: float,
    staleness: float,
    k: int = 4,
    mode: str = "on_demand",
    capacity: int = 16,
    stale_seed: int = 1234,
):
    """RA-RLOO: each prompt's FIFO holds `capacity` successes drawn from a stale policy pi_old
    (theta + staleness x fixed noise, the noise drawn from `stale_seed`) with their log pi_old;
    `splice_replays` puts one into the groups that need it, `weigh_replays` weighs it by
    min(pi / pi_old, w_max) inside the loss."""
    noise = np.random.default_rng(stale_seed).normal(size=toy.theta.shape)
    old_leaf_logp = toy.leaf_logp(toy.theta + staleness * torch.tensor(noise)).numpy()
    old_success = np.exp(old_leaf_logp) * toy.rewards
    old_success /= old_success.sum(-1, keepdims=True)
    normaliser = ra_rloo.rloo_normaliser(toy.P, k, 1, toy.T)

    def step(rng):
        buffers = {}
        for x in range(toy.P):
            stored = rng.choice(toy.leaves, size=capacity, p=old_success[x])
            entries = [
                (np.asarray(toy.actions(y), np.int32), old_leaf_logp[x, y], 1.0) for y in stored
            ]
            buffers[x] = deque(entries, maxlen=capacity)
        leaves = np.stack([toy.sample(x, k, rng) for x in range(toy.P)])
        rewards = torch.tensor(toy.rewards[np.arange(toy.P)[:, None], leaves])
        completions = [toy.actions(y) for y in leaves.ravel()]
        fresh_success = rewards > 0.5
        logp_old = ra_rloo.splice_replays(
            list(range(toy.P)), completions, rewards, fresh_success, buffers, mode, random
        )
        flat = np.array([toy.leaf(c) for c in completions])
        xs = np.repeat(np.arange(toy.P), k)
        adv = ra_rloo.rloo_advantages(rewards).flatten()
        loss = rloo_loss(normaliser, w_max, logp_old.flatten().double())
        # the fresh rollouts drawn (a replaced one was drawn too)
        return toy.update(xs, flat, loss(adv)), toy.P * k

    return step


def splice_weight(p: float, k: int = 4, mode: str = "on_demand") -> float:
    """RA-RLOO's exact expected update of one group with an on-policy buffer (its successes drawn
    from pi given success, log pi_old = log pi: w = 1), as a multiple of grad p (`group_weight`'s
    argument): every pattern of the k fresh rewards, spliced by `splice_replays`, advantages by
    `rloo_advantages` and `weigh_replays`; a replay scores as a success."""
    total = 0.0
    for pattern in range(2**k):
        fresh = [float(pattern >> i & 1) for i in range(k)]
        prob = math.prod(p if r else 1 - p for r in fresh)
        rewards = torch.tensor([fresh], dtype=torch.float64)
        buffers = {0: deque([(np.zeros(1, np.int32), 0.0, 1.0)])}
        completions = [[0] for _ in range(k)]
        logp_old = ra_rloo.splice_replays(
            [0], completions, rewards, rewards > 0.5, buffers, mode, random
        )[0].double()
        is_replay = ~torch.isnan(logp_old)
        adv = ra_rloo.rloo_advantages(rewards)[0]
        adv, _ = ra_rloo.weigh_replays(adv, is_replay, logp_old.nan_to_num(0.0), logp_old, 5.0)
        score = rewards[0] / p - (1 - rewards[0]) / (1 - p)
        total += prob * float(adv @ score)
    return total


def ada_seq_args(n: int, m: int, max_rounds: int, **flags):
    return ada_seq.Args(num_generations=n, round_repeat=m, max_rounds=max_rounds, **flags)


def ada_loss(surrogate_loss, normaliser: float, args):
    """ada_seq's / ada_est's loss on the toy's rows: `clipped_surrogate` over the trained tokens
    and the script's loss function (`seq_loss`, `est_loss`), no entropy or KL term (sums of 0)."""

    def loss(advantages):
        def of(logp, old_logp, mask):
            per_token, _ = clipped_surrogate(
                logp, old_logp, advantages[:, None], args.epsilon, args.epsilon_high
            )
            surrogate_sum = (per_token * mask).sum()
            return surrogate_loss(surrogate_sum, 0.0, 0.0, args.entropy_coef, args.beta, normaliser)

        return of

    return loss


def ada_seq_step(
    toy: Toy,
    n: int = 4,
    m: int = 8,
    max_rounds: int = 4,
    rule: str = "balanced",
    weight: str = "none",
    scale: bool = False,
    unfinished: str = "balanced",
):
    """Reinforce-Ada-Seq: `multi_round_sampling` with `exit_reached`, `pool_advantages` (each pool
    downsampled to n, `global_advantages` from the pool), the clipped surrogate and `seq_loss` over
    `seq_normaliser` (prompts x n x max tokens)."""
    args = ada_seq_args(
        n,
        m,
        max_rounds,
        exit_condition=rule,
        prompt_weight=weight,
        scale_rewards=scale,
        unfinished_downsample=unfinished,
    )
    k_pos, k_neg = args.quotas()
    threshold = success_threshold(args)
    done = partial(ada_seq.exit_reached, rule=rule, k_pos=k_pos, k_neg=k_neg, threshold=threshold)
    loss = ada_loss(ada_seq.seq_loss, ada_seq.seq_normaliser(toy.P, n, 1, toy.T), args)

    def step(rng):
        drawn = [[] for _ in range(toy.P)]

        def sample_round(active, size):
            out = []
            for x in active:
                leaves = toy.sample(x, size, rng)
                drawn[x] += leaves.tolist()
                out.append(toy.rewards[x, leaves].tolist())
            return out

        pools, exit_rounds = ada_seq.multi_round_sampling(toy.P, sample_round, done, max_rounds, m)
        train_ids = list(range(toy.P))
        keeps, _, adv = ada_seq.pool_advantages(train_ids, pools, exit_rounds, n, threshold, args)
        xs = [x for x, keep in zip(train_ids, keeps) for _ in keep]
        leaves = [drawn[x][j] for x, keep in zip(train_ids, keeps) for j in keep]
        return toy.update(xs, leaves, loss(torch.tensor(adv))), sum(map(len, pools))

    return step


def grpo_step(toy: Toy, n: int = 4, scale: bool = True):
    """GRPO-n (ada_seq.py --max_rounds 1 --round_repeat n): one round of n, every response kept,
    advantages from the group (`global_advantages`, std-scaled with `scale`)."""
    return ada_seq_step(toy, n, n, 1, scale=scale)


def grpo_advantages_of(scale: bool = True):
    """GRPO-n's advantages as ada_seq computes them (one pool = the group), [1, n] -> [1, n]:
    `group_weight`'s argument."""

    def advantages(rewards):
        group = rewards[0].tolist()
        adv = ada_seq.global_advantages(group, group, 0.5, scale, "none")
        return torch.tensor([adv], dtype=torch.float64)

    return advantages


def ada_seq_weight(p: float, args) -> float:
    """Reinforce-Ada-Seq's exact expected update of one prompt, as a multiple of grad p: the rounds
    as a chain over the pool's (successes, size), stopped by `exit_reached`, then the kept counts
    (`downsample`) and `global_advantages` of the final pool; a kept success scores grad p / p, a
    kept failure -grad p / (1 - p) (responses are exchangeable given their reward)."""
    n, m, threshold = args.num_generations, args.round_repeat, success_threshold(args)
    k_pos, k_neg = args.quotas()
    active, final = {0: 1.0}, {}
    for r in range(1, args.max_rounds + 1):
        grown = {}
        for s, prob in active.items():
            for new in range(m + 1):
                grown[s + new] = grown.get(s + new, 0.0) + prob * math.comb(m, new) * p**new * (
                    1 - p
                ) ** (m - new)
        active = {}
        for s, prob in grown.items():
            pool = [1.0] * s + [0.0] * (r * m - s)
            if ada_seq.exit_reached(pool, args.exit_condition, k_pos, k_neg, threshold):
                final[(s, r * m, True)] = prob
            elif r == args.max_rounds:
                final[(s, r * m, False)] = prob
            else:
                active[s] = prob
    total = 0.0
    for (s, size, finished), prob in final.items():
        pool = [1.0] * s + [0.0] * (size - s)
        rule = "balanced" if finished else args.unfinished_downsample
        kept = [pool[j] for j in ada_seq.downsample(pool, n, threshold, random, rule)]
        adv = ada_seq.global_advantages(
            kept, pool, threshold, args.scale_rewards, args.prompt_weight
        )
        total += prob * sum(a * (r / p - (1 - r) / (1 - p)) for a, r in zip(adv, kept))
    return total


def ada_est_counts(toy: Toy, args, visits: int = 30) -> list:
    """Each prompt's estimator state after `visits` earlier visits at the current pass rates (the
    expected successes k_t = p x N_x each time), as `update_counts` would leave it."""
    counts = [None] * toy.P
    for _ in range(visits):
        p_hats = [ada_est.estimate(c, args.prior_alpha, args.prior_beta) for c in counts]
        weights = ada_est.allocation_weights(p_hats, args.weighting, args.eps)
        alloc = ada_est.allocate_budget(weights, args.budget(), args.n_min, args.n_max)
        counts = [
            ada_est.update_counts(c, size, toy.p[x] * size, args.lam)
            for x, (c, size) in enumerate(zip(counts, alloc))
        ]
    return counts


def ada_est_step(toy: Toy, weighting: str = "hybrid", advantages=ada_est.est_advantages):
    """Reinforce-Ada-Est: the budget from the estimates (`estimate`, `allocation_weights`,
    `allocate_budget`), all N_x responses trained with `est_advantages`, the clipped surrogate and
    `est_loss` over `est_normaliser` (total budget x max tokens)."""
    args = ada_est.Args(prompts_per_step=toy.P, weighting=weighting)
    counts = ada_est_counts(toy, args)
    p_hats = [ada_est.estimate(c, args.prior_alpha, args.prior_beta) for c in counts]
    weights = ada_est.allocation_weights(p_hats, args.weighting, args.eps)
    sizes = ada_est.allocate_budget(weights, args.budget(), args.n_min, args.n_max)
    threshold = success_threshold(args)
    loss = ada_loss(ada_est.est_loss, ada_est.est_normaliser(args.budget(), 1, toy.T), args)

    def step(rng):
        xs, leaves, adv = [], [], []
        for x, size in enumerate(sizes):
            drawn = toy.sample(x, size, rng)
            group_adv, _ = advantages(
                toy.rewards[x, drawn].tolist(), weighting, args.eps, threshold
            )
            xs += [x] * size
            leaves += drawn.tolist()
            adv += group_adv
        return toy.update(xs, leaves, loss(torch.tensor(adv))), sum(sizes)

    step.sizes = sizes
    step.p_hats = p_hats
    step.args = args
    return step


def est_advantages_of(args):
    """Ada-Est's advantages of one prompt's group, [1, N] -> [1, N]: `group_weight`'s argument."""

    def advantages(rewards):
        threshold = success_threshold(args)
        adv, _ = ada_est.est_advantages(rewards[0].tolist(), args.weighting, args.eps, threshold)
        return torch.tensor([adv], dtype=torch.float64)

    return advantages


def ps_episode(toy: Toy, task, leaf: int) -> Episode:
    """The rollout as ps_grpo's environment records it: one action token per step, the replayed
    prefix's turns with mask 0."""
    record = Episode(0)
    for d, a in enumerate(toy.actions(leaf)):
        record.add_turn([a], [], None if d < len(task.steps) else [0.0])
    return record


def ps_update(toy: Toy, args, tasks, batch, old_theta=None):
    """ps_grpo's update on one batch (`batch[i]`: task i's n leaves): `kept_advantages`, each kept
    rollout's episode mask, `ps_normaliser` and `ps_loss`."""
    rewards = torch.tensor(
        np.stack([toy.rewards[task.prompt_id, y] for task, y in zip(tasks, batch)])
    )
    _, advantages, trained_ids = ps_grpo.kept_advantages(rewards, args.scale_rewards)
    n = rewards.shape[1]
    xs = [tasks[i // n].prompt_id for i in trained_ids]
    leaves = [batch[i // n][i % n] for i in trained_ids]
    masks = [ps_episode(toy, tasks[i // n], leaf).mask for i, leaf in zip(trained_ids, leaves)]
    n_tokens = ps_grpo.ps_normaliser(masks, ONE_PROCESS)
    trained_advantages = advantages.flatten()[trained_ids]

    def loss(logp, old_logp, mask):
        eps = args.epsilon, args.epsilon_high
        return ps_grpo.ps_loss(logp, old_logp, trained_advantages, mask, n_tokens, *eps)[0]

    return toy.update(xs, leaves, loss, masks, old_theta)


def ps_step(toy: Toy, prefix_sampling: bool = True, n: int = 8, scale: bool = False):
    """Prefix Sampling on GRPO (ps_grpo.py): a step trains on the previous step's prefix tasks and
    fresh tasks (`assemble_batch`). The previous step is drawn first: its fresh tasks are `route`d
    and the skewed ones turned into prefix tasks (`prefix_tasks`). Then `ps_update`: rejection,
    r - mean advantages, replayed steps masked, the DAPO token mean."""
    args = ps_grpo.Args(
        prompts_per_step=toy.P,
        num_generations=n,
        prefix_sampling=prefix_sampling,
        scale_rewards=scale,
    )
    controllers = ps_grpo.make_controllers(args, None)

    def rollouts(task, rng):
        prefix = [a[0] for a, _ in task.steps]
        return toy.sample(task.prompt_id, n, rng, tuple(prefix))

    def step(rng):
        sampler = PromptSampler(toy.P, int(rng.integers(1 << 31)))
        previous = [ps_grpo.BatchTask(x) for x in sampler.next_ids(toy.P)]
        leaves = [rollouts(task, rng) for task in previous]
        rewards = np.stack([toy.rewards[task.prompt_id, y] for task, y in zip(previous, leaves)])
        success = torch.tensor(rewards > 0.5)
        routes = [ps_grpo.route(k, n, args.low, args.high) for k in success.sum(-1).tolist()]
        episodes = [
            ps_episode(toy, task, y) for task, group in zip(previous, leaves) for y in group
        ]
        built = ps_grpo.prefix_tasks(previous, routes, episodes, success, controllers, args)
        queue = [task for _, task in built]
        tasks, _ = ps_grpo.assemble_batch(
            queue, sampler.next_ids, args.prompts_per_step, args.max_prefix_frac
        )
        batch = [rollouts(task, rng) for task in tasks]
        return ps_update(toy, args, tasks, batch), len(tasks) * n

    return step


def pros_update(toy: Toy, args, queries, batch, old_theta=None):
    """pros_ppo's update (--adv grpo, one minibatch) on one batch (`batch[i]`: query i's k
    leaves): each query's prompt by `query_prompts` (a toy prompt has no token of its own, so what
    it holds is the replayed steps: context, mask 0), `outcome_advantages`, `minibatch_divisors`
    and `policy_loss`."""
    k = args.num_generations
    rewards = torch.tensor(np.stack([toy.rewards[q.prompt_id, y] for q, y in zip(queries, batch)]))
    prompts = [SimpleNamespace(prompt=None) for _ in queries]
    query_tokens = pros_ppo.query_prompts(lambda _: [], prompts, [list(q.prefix) for q in queries])
    xs = [q.prompt_id for q in queries for _ in range(k)]
    leaves = np.concatenate(batch)
    context = [len(tokens) for tokens in query_tokens for _ in range(k)]
    mask = torch.tensor([[float(d >= steps) for d in range(toy.T)] for steps in context])
    advantages = pros_ppo.outcome_advantages(rewards, mask)
    minibatch = list(range(len(xs)))
    policy_tokens, _ = pros_ppo.minibatch_divisors(minibatch, mask, mask, ONE_PROCESS)

    def loss(logp, old_logp, mb_mask):
        eps = args.epsilon, args.epsilon_high
        return pros_ppo.policy_loss(logp, old_logp, advantages, mb_mask, policy_tokens, *eps)[0]

    return toy.update(xs, leaves, loss, mask, old_theta)


def pros_step(toy: Toy, pros: str = "random", k: int = 4, fresh_frac: float = 0.5):
    """PROS on GRPO (pros_ppo.py --adv grpo, one minibatch): the query tree holds the previous
    iteration's children (each correct rollout of a root cut at the entropy argmax by
    `child_candidates`); `choose_batch` takes ceil(fresh_frac P) roots from the stream and the rest
    by `select_nodes` (`random`: the paper's prefix-reuse ablation; `off`: roots only, the
    script's `Query` per streamed prompt). Then `pros_update`."""
    args = pros_ppo.Args(
        adv="grpo", pros=pros, prompts_per_step=toy.P, num_generations=k, fresh_frac=fresh_frac
    )
    entropy = -(toy.pi * np.log(toy.pi)).sum(-1)  # [P, nodes]

    def step(rng):
        sampler = PromptSampler(toy.P, int(rng.integers(1 << 31)))
        if pros == "off":
            queries = [pros_ppo.Query(x) for x in sampler.next_ids(args.prompts_per_step)]
        else:
            tree = pros_ppo.QueryTree()
            for x in range(toy.P):
                tree.add(x, (), 0, args.prior_mu)
                leaves = toy.sample(x, k, rng)
                correct = (toy.rewards[x, leaves] > 0.5).tolist()
                ents = [entropy[x, toy.node_of[:, y]] for y in leaves]
                cands = pros_ppo.child_candidates(
                    (), [toy.actions(y) for y in leaves], correct, ents, None, set(), 0.1
                )
                tree.add_children(x, cands, 0, args.prior_mu)
            pros_rng = np.random.default_rng(rng.integers(1 << 31))
            queries = pros_ppo.choose_batch(tree, sampler, args, 1, pros_rng, toy.P)
        batch = [toy.sample(q.prompt_id, k, rng, tuple(q.prefix)) for q in queries]
        return pros_update(toy, args, queries, batch), len(queries) * k

    return step


# ---------------- exact expected updates, beside the Monte Carlo ----------------


def exact_update(toy: Toy, weights, scale: float = 1.0) -> np.ndarray:
    """sum_x weights[x] grad p_x x scale, flat: the expected update where each prompt's rollouts
    are exchangeable given their reward (no prefix, no stale replay)."""
    return scale * (np.asarray(weights)[:, None] * toy.grad_p()).sum(0)


def kept_share(p: float, n: int) -> float:
    """The chance that a group of n 0/1 rewards at pass rate p has two rewards (is not rejected)."""
    return 1 - p**n - (1 - p) ** n


def ps_off_exact(toy: Toy, n: int = 8, scale: bool = False) -> np.ndarray:
    """GRPO-n with rejection and the DAPO token mean (ps_grpo.py --prefix_sampling false), each
    prompt once per batch: its group's sum_i A_i grad log pi is independent of the other groups,
    whose kept count sets the token mean's divisor T n (1 + kept others). Both enumerated."""
    kept = [kept_share(p, n) for p in toy.p]
    weights = []
    for x, p in enumerate(toy.p):
        others = [kept[y] for y in range(toy.P) if y != x]
        divisor = 0.0
        for pattern in range(2 ** len(others)):
            prob, count = 1.0, 0
            for j, share in enumerate(others):
                hit = pattern >> j & 1
                prob *= share if hit else 1 - share
                count += hit
            divisor += prob / (toy.T * n * (1 + count))
        advantages = lambda r: ps_grpo.kept_advantages(r, scale)[1]  # noqa: E731
        weights.append(group_weight(p, n, advantages) * divisor)
    return exact_update(toy, weights)


def pros_off_exact(toy: Toy, k: int = 4) -> np.ndarray:
    """GRPO-k on the roots (pros_ppo.py --adv grpo --pros off), one minibatch: the token mean's
    divisor is every rollout's T tokens."""
    weights = [group_weight(p, k, grpo_advantages) for p in toy.p]
    return exact_update(toy, weights, 1 / (toy.P * k * toy.T))


def sampler_gap_step(
    toy: Toy,
    mode: str | None,
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
    gap: float = 0.5,
    k: int = 4,
):
    """RLOO (ra_rloo.py's advantages, normaliser and loss) whose rollouts come from a sampler that
    is not the policy: logits theta + gap x fixed N(0, 1) noise, as a generator's kernels differ
    from the trainer's. Each token's trainer and sampler log-probs go through the scripts'
    correction (`sampler_is_weights`, TRL's `mode` with its bounds; None: uncorrected, every weight
    1), whose weights multiply each token's term of the loss."""
    from common.rl.sampler_correction import sampler_is_weights

    noise = np.random.default_rng(4321).normal(size=toy.theta.shape)
    sampler_theta = toy.theta + gap * torch.tensor(noise)
    sampler_leaf_p = toy.leaf_probs(sampler_theta).numpy()
    normaliser = ra_rloo.rloo_normaliser(toy.P, k, 1, toy.T)

    def step(rng):
        leaves = np.stack(
            [rng.choice(toy.leaves, size=k, p=sampler_leaf_p[x]) for x in range(toy.P)]
        )
        rewards = torch.tensor(toy.rewards[np.arange(toy.P)[:, None], leaves])
        adv = ra_rloo.rloo_advantages(rewards).flatten()
        xs, flat = np.repeat(np.arange(toy.P), k), leaves.ravel()
        correct = None
        if mode is not None:
            sampler_logp = toy.token_logp(sampler_theta, xs, flat)

            def correct(trainer_logp):
                known = torch.ones_like(trainer_logp)
                bounds = clip_min, clip_max
                weight, _ = sampler_is_weights(trainer_logp, sampler_logp, known, mode, *bounds)
                return weight

        loss = rloo_loss(normaliser, correct=correct)
        return toy.update(xs, flat, loss(adv)), toy.P * k

    return step
