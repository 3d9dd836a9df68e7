"""A problem small enough to enumerate, and each method's update on it.

Every prompt x has a tabular softmax policy over a tree of `depth` steps with `branch` actions per
step (depth 1: a plain softmax over `branch` responses), and a fixed 0/1 reward per leaf, so its
pass rate p_x(theta) and every objective E_x[f(p_x)] have a closed form whose gradient autograd
gives exactly (`Toy.target`). A method's update is one step of the method built from its script's
own functions (advantages, splicing and importance weights, rounds and downsampling, budgets, prefix
routing and masking, the query tree), divided by the script's normaliser: the gradient the script's
loss would take, with pi_old = pi_theta (one epoch: every PPO ratio is 1, so the clipped surrogate's
gradient is A x grad log pi). `monte_carlo` averages many independent steps.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

import ada_est
import ada_seq
import pros_ppo
import ps_grpo
import ra_rloo
from common.rl.advantages import grpo_advantages, zero_variance
from common.rl.episode import Episode

OBJECTIVES = {
    "p": lambda p: p,
    "log p": torch.log,
    "sqrt p": torch.sqrt,
    # Appendix B's weight 1 / sqrt(p (1 - p)) is this objective's derivative
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

    # ---- sampling and scores ----
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

    def add_scores(self, grad, xs, leaves, weights, start=None) -> None:
        """grad[x] += w x grad log pi(steps start.. of leaf | x) for each row (`weights` [rows], or
        [rows, depth]: one per step); a replayed prefix (its first `start` steps) gets no
        gradient."""
        xs, leaves = np.asarray(xs, int), np.asarray(leaves, int)
        weights = np.asarray(weights, float)
        start = np.zeros(len(xs), int) if start is None else np.asarray(start, int)
        for d in range(self.T):
            on = start <= d
            node, act = self.node_of[d, leaves[on]], self.action_of[d, leaves[on]]
            w = weights[on] if weights.ndim == 1 else weights[on, d]
            np.add.at(grad, (xs[on], node, act), w)
            np.add.at(grad, (xs[on], node), -w[:, None] * self.pi[xs[on], node])


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


def rloo_step(toy: Toy, k: int = 4, advantages=ra_rloo.rloo_advantages):
    """RLOO (ra_rloo.py --replay none): k rollouts per prompt, leave-one-out advantages."""
    norm = ra_rloo.rloo_normaliser(toy.P, k, 1, toy.T)

    def step(rng):
        leaves = np.stack([toy.sample(x, k, rng) for x in range(toy.P)])
        rewards = torch.tensor(toy.rewards[np.arange(toy.P)[:, None], leaves])
        adv = advantages(rewards).numpy()
        g = np.zeros_like(toy.pi)
        toy.add_scores(g, np.repeat(np.arange(toy.P), k), leaves.ravel(), adv.ravel() / norm)
        return g, toy.P * k

    return step


def ra_rloo_step(
    toy: Toy,
    w_max: float,
    staleness: float,
    k: int = 4,
    mode: str = "on_demand",
    capacity: int = 16,
    weights=ra_rloo.replay_weights,
):
    """RA-RLOO: each prompt's FIFO holds `capacity` successes drawn from a stale policy pi_old
    (theta + staleness x fixed noise) with their log pi_old; `splice_replays` puts one into the
    groups that need it, weighted by `replay_weights` (min(pi / pi_old, w_max))."""
    noise = np.random.default_rng(1234).normal(size=toy.theta.shape)
    old_leaf_logp = toy.leaf_logp(toy.theta + staleness * torch.tensor(noise)).numpy()
    leaf_logp = toy.leaf_logp(toy.theta).numpy()
    old_success = np.exp(old_leaf_logp) * toy.rewards
    old_success /= old_success.sum(-1, keepdims=True)
    norm = ra_rloo.rloo_normaliser(toy.P, k, 1, toy.T)

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
        seq_logp = torch.tensor(leaf_logp[xs, flat])
        adv = ra_rloo.rloo_advantages(rewards).flatten()
        rep = ~torch.isnan(logp_old.flatten())
        w = weights(seq_logp, logp_old.flatten(), w_max)
        adv = torch.where(rep, adv * w, adv).numpy()
        g = np.zeros_like(toy.pi)
        toy.add_scores(g, xs, flat, adv / norm)
        # the fresh rollouts drawn (a replaced one was drawn too)
        return g, toy.P * k

    return step


def grpo_step(toy: Toy, n: int = 4, scale: bool = True):
    """GRPO-n (ada_seq.py --max_rounds 1 --round_repeat n): `grpo_advantages` over the group,
    divided by ada_seq's constant (prompts x n x max tokens)."""
    norm = toy.P * n * toy.T

    def step(rng):
        leaves = np.stack([toy.sample(x, n, rng) for x in range(toy.P)])
        rewards = torch.tensor(toy.rewards[np.arange(toy.P)[:, None], leaves])
        adv = grpo_advantages(rewards, scale=scale).numpy()
        g = np.zeros_like(toy.pi)
        toy.add_scores(g, np.repeat(np.arange(toy.P), n), leaves.ravel(), adv.ravel() / norm)
        return g, toy.P * n

    return step


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
    """Reinforce-Ada-Seq: `multi_round_sampling` with `exit_reached`, `downsample` to n,
    `global_advantages` from the pool; ada_seq's constant normaliser (prompts x n x max tokens)."""
    args = ada_seq.Args(
        num_generations=n, round_repeat=m, max_rounds=max_rounds, exit_condition=rule
    )
    k_pos, k_neg = args.quotas()
    threshold = 0.5

    def done(rewards):
        return ada_seq.exit_reached(rewards, rule, k_pos, k_neg, threshold)

    norm = toy.P * n * toy.T

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
        g = np.zeros_like(toy.pi)
        for x in range(toy.P):
            kept_rule = "balanced" if exit_rounds[x] is not None else unfinished
            keep = ada_seq.downsample(pools[x], n, threshold, random, kept_rule)
            kept = [pools[x][j] for j in keep]
            adv = ada_seq.global_advantages(kept, pools[x], threshold, scale, weight)
            toy.add_scores(g, [x] * n, [drawn[x][j] for j in keep], np.array(adv) / norm)
        return g, sum(map(len, pools))

    return step


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
    `allocate_budget`), all N_x responses trained with `est_advantages`; ada_est's constant
    normaliser (total budget x max tokens)."""
    args = ada_est.Args(prompts_per_step=toy.P, weighting=weighting)
    counts = ada_est_counts(toy, args)
    p_hats = [ada_est.estimate(c, args.prior_alpha, args.prior_beta) for c in counts]
    weights = ada_est.allocation_weights(p_hats, args.weighting, args.eps)
    sizes = ada_est.allocate_budget(weights, args.budget(), args.n_min, args.n_max)
    norm = args.budget() * toy.T

    def step(rng):
        g = np.zeros_like(toy.pi)
        for x, size in enumerate(sizes):
            leaves = toy.sample(x, size, rng)
            adv, _ = advantages(toy.rewards[x, leaves].tolist(), weighting, args.eps, 0.5)
            toy.add_scores(g, [x] * size, leaves, np.array(adv) / norm)
        return g, sum(sizes)

    step.sizes = sizes
    step.p_hats = p_hats
    return step


def ps_step(toy: Toy, prefix_sampling: bool = True, n: int = 8, scale: bool = False):
    """Prefix Sampling on GRPO (ps_grpo.py): a step trains on the previous step's prefix tasks (at
    most max_prefix_frac of the batch) and fresh tasks. The previous step is drawn first: its fresh
    tasks are `route`d and too-hard / too-easy ones turned into prefix tasks by `make_prefix_task`.
    Groups with one reward are rejected, advantages `grpo_advantages` (r - mean), replayed steps get
    no gradient, and the loss is the DAPO token mean over the trained tokens."""
    args = ps_grpo.Args()
    cap = int(args.max_prefix_frac * toy.P)

    def rollouts(task, rng):
        prefix = [a[0] for a, _ in task.steps]
        leaves = toy.sample(task.prompt_id, n, rng, tuple(prefix))
        return leaves, toy.rewards[task.prompt_id, leaves]

    def fresh(rng):
        return [ps_grpo.BatchTask(int(x)) for x in rng.permutation(toy.P)]

    def episode(task, leaf):
        """The rollout as ps_grpo's environment records it: replayed turns get mask 0."""
        record = Episode(0)
        for d, a in enumerate(toy.actions(leaf)):
            record.add_turn([a], [], None if d < len(task.steps) else [0.0])
        return record

    # per replayed length K: the rollout's mask (the same for every leaf)
    masks = {K: episode(ps_grpo.BatchTask(0, steps=[None] * K), 0).mask for K in range(toy.T)}

    def step(rng):
        queue = []
        if prefix_sampling:
            for task in fresh(rng):
                leaves, rewards = rollouts(task, rng)
                path = ps_grpo.route(int(rewards.sum()), n, args.low, args.high)
                if path not in ("too_hard", "too_easy"):
                    continue
                category = "hard" if path == "too_hard" else "easy"
                episodes = [episode(task, y) for y in leaves]
                ratio = args.remaining_ratio if category == "hard" else args.prefix_ratio
                built = ps_grpo.make_prefix_task(
                    task, category, episodes, (rewards > 0.5).tolist(), ratio, args
                )
                if built is not None:
                    queue.append(built)
        tasks = queue[:cap] + fresh(rng)[: toy.P - min(cap, len(queue))]
        batch = [rollouts(task, rng) for task in tasks]
        rewards = torch.tensor(np.stack([r for _, r in batch]))
        keep = ~zero_variance(rewards)
        adv = grpo_advantages(rewards, scale=scale).numpy()
        rows = [(i, y) for i in np.flatnonzero(keep.numpy()) for y in batch[i][0]]
        mask = [masks[len(tasks[i].steps)] for i, _ in rows]
        # the DAPO token mean: the batch's trained (mask 1) tokens
        n_tok = sum(map(sum, mask))
        g = np.zeros_like(toy.pi)
        toy.add_scores(
            g,
            [tasks[i].prompt_id for i, _ in rows],
            [y for _, y in rows],
            adv[[i for i, _ in rows], np.tile(np.arange(n), len(rows) // n)] / n_tok,
            [m.index(1) for m in mask],
        )
        return g, len(tasks) * n

    return step


def pros_step(toy: Toy, pros: str = "random", k: int = 4, fresh_frac: float = 0.5):
    """PROS on GRPO (pros_ppo.py --adv grpo, one minibatch): the query tree holds the previous
    iteration's children (each correct rollout of a root cut at the entropy argmax by
    `child_candidates`); a batch takes ceil(fresh_frac P) roots from the stream and the rest by
    `select_nodes` (`random`: the paper's prefix-reuse ablation; `off`: roots only). GRPO
    advantages (`grpo_advantages`, std-scaled), the prefix gets no gradient, token mean."""
    entropy = -(toy.pi * np.log(toy.pi)).sum(-1)  # [P, nodes]

    def step(rng):
        tree = pros_ppo.QueryTree()
        stream = [int(x) for x in rng.permutation(toy.P)]
        n_stream = math.ceil(fresh_frac * toy.P) if pros != "off" else toy.P
        if pros != "off":
            for x in range(toy.P):
                tree.add(x, (), 0, 0.0)
                leaves = toy.sample(x, k, rng)
                correct = (toy.rewards[x, leaves] > 0.5).tolist()
                ents = [entropy[x, toy.node_of[:, y]] for y in leaves]
                cands = pros_ppo.child_candidates(
                    (), [toy.actions(y) for y in leaves], correct, ents, None, set(), 0.1
                )
                tree.add_children(x, cands, 0, 0.0)
        roots = stream[:n_stream]
        theta = np.full(len(tree), 0.5)
        picked = pros_ppo.select_nodes(
            theta,
            tree.pid,
            toy.P - n_stream,
            set(roots),
            "random",
            np.random.default_rng(rng.integers(1 << 31)),
        )
        queries = [(x, ()) for x in roots] + [(int(tree.pid[i]), tree.prefix[i]) for i in picked]
        batch = [toy.sample(x, k, rng, tuple(prefix)) for x, prefix in queries]
        rewards = torch.tensor(np.stack([toy.rewards[x, y] for (x, _), y in zip(queries, batch)]))
        adv = grpo_advantages(rewards).numpy()
        tokens = sum((toy.T - len(prefix)) * k for _, prefix in queries)
        g = np.zeros_like(toy.pi)
        for i, (x, prefix) in enumerate(queries):
            toy.add_scores(g, [x] * k, batch[i], adv[i] / tokens, [len(prefix)] * k)
        return g, len(queries) * k

    return step


def sampler_gap_step(
    toy: Toy,
    mode: str | None,
    clip_max: float | None = 3.0,
    clip_min: float | None = None,
    gap: float = 0.5,
    k: int = 4,
):
    """RLOO (ra_rloo.py's advantages and normaliser) whose rollouts come from a sampler that is not
    the policy: logits theta + gap x fixed N(0, 1) noise, as a generator's kernels differ from the
    trainer's. Each token's trainer and sampler log-probs go through the scripts' correction
    (`sampler_is_weights`, TRL's `mode` with its bounds; None: uncorrected, every weight 1), whose
    weights multiply each token's score."""
    from common.rl.sampler_correction import sampler_is_weights

    noise = np.random.default_rng(4321).normal(size=toy.theta.shape)
    sampler_theta = toy.theta + gap * torch.tensor(noise)
    sampler_leaf_p = toy.leaf_probs(sampler_theta).numpy()
    logpi = torch.log_softmax(toy.theta, -1).numpy()
    sampler_logpi = torch.log_softmax(sampler_theta, -1).numpy()
    norm = ra_rloo.rloo_normaliser(toy.P, k, 1, toy.T)

    def token_logps(table, xs, leaves):
        return torch.tensor(
            np.stack(
                [table[xs, toy.node_of[d, leaves], toy.action_of[d, leaves]] for d in range(toy.T)],
                -1,
            )
        )

    def step(rng):
        leaves = np.stack(
            [rng.choice(toy.leaves, size=k, p=sampler_leaf_p[x]) for x in range(toy.P)]
        )
        rewards = torch.tensor(toy.rewards[np.arange(toy.P)[:, None], leaves])
        adv = ra_rloo.rloo_advantages(rewards).numpy().ravel()
        xs, flat = np.repeat(np.arange(toy.P), k), leaves.ravel()
        weight = np.ones((len(flat), toy.T))
        if mode is not None:
            trainer, sampler = token_logps(logpi, xs, flat), token_logps(sampler_logpi, xs, flat)
            known = torch.ones_like(trainer)
            weight, _ = sampler_is_weights(trainer, sampler, known, mode, clip_min, clip_max)
            weight = weight.numpy()
        g = np.zeros_like(toy.pi)
        toy.add_scores(g, xs, flat, adv[:, None] * weight / norm)
        return g, toy.P * k

    return step
