"""PROS (prefix reuse for on-policy sampling) on PPO, one file; `--adv grpo` runs it on GRPO
instead.

Paper: "PROS: Towards Compute-Efficient RLVR via Rollout Prefix Reuse", ICLR 2026 (OpenReview
lz1SRTcnUb). Docs: docs/pros_ppo.md.

The base is PPO for LLMs: a critic (the policy's backbone copied, plus a scalar head: `ValueModel`),
token-level GAE with the outcome reward on the last token, clipped policy and value losses, several
epochs over minibatches. PROS is a plug-in that changes only *which queries* are trained on:
  1. Augmented queries (Sec. 3): for every correct rollout y (total training reward >=
     --success_reward; T tokens, the first L inherited from the node's prefix) cut at t* = argmax of
     the policy's token entropy within [max(L, ⌈T/4⌉), ⌈3T/4⌉); with a critic, only among the top
     ⌈10%·(T - L)⌉ of the scored positions L..T-1 by value (none in the window: the window positions
     of highest value). Each distinct new q' = q + y[:t*] joins a two-layer tree as a child of q's
     root. A child is generated from q + prefix; only the continuation is trained (the prefix is
     part of the prompt, so it gets no gradient and no credit); its reward is scored on prefix +
     continuation.
  2. Hierarchical Bayesian selection (Sec. 4): θ = σ(ψ), ψ_root ~ N(μ0, τ0²), ψ_child ~ N(ψ_root,
     σ²), counts with exponential forgetting, Pólya-Gamma Gibbs sweeps (common/rl/gibbs.py); the
     batch takes the nodes whose current Gibbs draw θ̃ is nearest 0.5, at most one node per root.
[PROS] lines are the plug-in; `--pros off` (vanilla PPO / GRPO) runs none but no-ops marked "(also
in PPO / GRPO)". Departures from the paper (docs/pros_ppo.md says why): ⌈fresh_frac·P⌉ queries per
batch from the data stream, the rest from the pool; the pool is bounded (--pool_capacity); one node
per root per batch; Bernoulli rewards.

    python pros_ppo.py                 # PPO + PROS on the embedded Countdown default (CPU, minutes)
    python pros_ppo.py --pros off      # vanilla PPO (+ --adv grpo: vanilla GRPO)
    python pros_ppo.py --adv grpo      # GRPO + PROS
    python pros_ppo.py --pros random   # ablation: prefix reuse + random selection
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, ClassVar, Literal, Optional

import numpy as np
import torch

from common.distributed.ranks import (
    gather_list,
    gathered,
    micro_batches,
    my_slice,
    reduce_sums,
)
from common.generation.hf import SamplingConfig
from common.model.policy import autocast, library_bars_off
from common.rl.advantages import grpo_advantages, zero_variance
from common.rl.gibbs import calibration_excess, pg_gibbs, update_counts
from common.rl.logprobs import Forward
from common.rl.losses import clipped_surrogate, kl_k3
from common.rl.masking import right_align
from common.run.checkpoint import Checkpoints
from common.run.export import export_model
from common.run.flags import (
    DataFlags,
    EvalFlags,
    GenerationFlags,
    LogFlags,
    ModelFlags,
    OutputFlags,
    Range,
    RewardFlags,
    ScaleFlags,
    TrainingFlags,
    parse_args,
)
from common.run.logs import RunLog, first_of_each_kind
from common.run.process import GracefulStop, end_processes
from common.run.setup import (
    load_training_policy,
    make_compiled,
    make_generator,
    make_optimizer,
    make_reference,
    make_task,
    packed_row_tokens,
    prepare_training,
    sampling_configs,
    shard_models,
    start_run,
)
from common.run.step_metrics import rollout_sums
from common.run.summary import run_summary
from common.tasks.evaluation import evaluate_policy
from common.tasks.loading import PromptEncoder, PromptSampler


@dataclass
class Args(
    ModelFlags,
    DataFlags,
    RewardFlags,
    GenerationFlags,
    TrainingFlags,
    EvalFlags,
    ScaleFlags,
    OutputFlags,
    LogFlags,
):
    # TRL's names for what this file does: a token mean per mini-batch
    trl_equivalents: ClassVar[dict] = {"loss_type": "dapo"}
    # the step's hyperparameters (the same names in every script): its length, batch and update
    max_steps: Annotated[int, Range(1)] = 200
    """number of steps (each: one batch of queries, then num_iterations epochs x num_mini_batches
    updates)"""
    prompts_per_step: Annotated[int, Range(1)] = 32
    """prompts per step across all processes (every rank takes every world-th one; with fewer
    prompts than processes the ranks without one idle through the step)"""
    max_completion_length: Annotated[int, Range(1)] = 48
    """maximum completion length; a completion cut by it gets reward 0 from the built-in rewards
    (never a success), its functions' total from --reward_funcs"""
    mask_truncated_completions: bool = False
    """completions cut by the length limit get no gradient (TRL's flag); `clipped_ratio` is logged
    either way"""
    vllm_importance_sampling_correction: Optional[bool] = None
    """reweight each sampled token by rho = pi_trainer / pi_sampler under the sampling weights
    (TRL's flag); asked for with HF generate, whose log-probs come from its own cached decode, rho
    is about 1 in fp32 (a check rather than a correction; under --dtype bfloat16 the two passes
    differ by up to a few hundredths of a nat) (default: on with --use_vllm, as TRL, off with HF
    generate)"""
    vllm_importance_sampling_mode: Literal[
        "sequence_mask", "sequence_truncate", "token_mask", "token_truncate"
    ] = "sequence_mask"
    """how the ratio enters the policy-gradient term (TRL's modes): per `token` or one per
    `sequence` (the product over its sampled tokens); ratios outside [clip_min, clip_max] are
    zeroed (`mask`) or clipped to the range (`truncate`)"""
    vllm_importance_sampling_clip_max: Annotated[Optional[float], Range(0, lo_open=True)] = 3.0
    """upper bound C_max of the ratio (null in a --config file: none)"""
    vllm_importance_sampling_clip_min: Annotated[Optional[float], Range(0)] = None
    """lower bound C_min of the ratio, below --vllm_importance_sampling_clip_max (default: none)"""
    micro_batch_size: Annotated[int, Range(1)] = 64
    """sequences per forward/backward pass (gradients are accumulated over the step's batch)"""
    max_tokens_per_microbatch: Annotated[int, Range(0, zero="off")] = 0
    """if > 0, micro-batches are cut by this many prompt + completion tokens instead of
    --micro_batch_size sequences, so long and short completions cost what they are"""
    max_grad_norm: Annotated[float, Range(0, lo_open=True)] = 1.0
    """gradient clipping norm"""
    num_generations: Annotated[int, Range(2)] = 4
    """rollouts per query (group size; GRPO's baseline and PROS's per-node pass-rate observations
    need >= 2)"""
    adv: Literal["gae", "grpo"] = "gae"
    """advantage estimator: token-level GAE with a learned critic (PPO), or critic-free
    group-normalised GRPO"""
    gamma: Annotated[float, Range(0, 1)] = 1.0
    """GAE discount γ"""
    gae_lambda: Annotated[float, Range(0, 1)] = 0.95
    """GAE λ"""
    whiten_advantages: bool = True
    """(GAE) normalise advantages to zero mean / unit std over the batch's tokens"""
    num_iterations: Annotated[int, Range(1)] = 2
    """passes over each batch of rollouts"""
    num_mini_batches: Annotated[int, Range(1)] = 2
    """optimizer steps per epoch (the batch's rollouts are shuffled and split)"""
    epsilon: Annotated[float, Range(0, 1, lo_open=True, hi_open=True)] = 0.2
    """policy ratio clip 1 - epsilon"""
    epsilon_high: Annotated[float, Range(0, lo_open=True)] = 0.2
    """policy ratio clip 1 + epsilon_high (vanilla PPO: symmetric)"""
    cliprange_value: Annotated[float, Range(0, lo_open=True)] = 0.2
    """value clip: V is kept within ±cliprange_value of its old prediction in the clipped value
    loss"""
    critic_lr: Annotated[float, Range(0)] = 5e-4
    """critic AdamW learning rate (constant)"""
    critic_model_name_or_path: Optional[str] = None
    """critic backbone (default: a copy of the policy's backbone + a zero-initialised scalar
    head)"""
    beta: Annotated[float, Range(0, zero="off, no reference model")] = 0.0
    """per-token k3 KL penalty to the initial policy, added to the policy loss"""
    pros: Literal["bayes", "random", "off"] = "bayes"
    """[PROS] bayes: prefix reuse + hierarchical Bayesian selection (paper); random: uniform
    selection; off: no PROS"""
    select_by: Literal["draw", "mean"] = "draw"
    """[PROS] θ̃ ranked by |θ̃ - 0.5|: the current Gibbs draw σ(ψ) (Thompson-style) or θ̂ (mean over
    last sweeps)"""
    fresh_frac: Annotated[float, Range(0, 1, lo_open=True)] = 0.5
    """[PROS] fraction of each batch from the data stream (never-seen prompts enter this way); the
    rest: the pool"""
    value_top_frac: Annotated[float, Range(0, 1, lo_open=True)] = 0.1
    """[PROS] with a critic, t* is sought among the window positions in the top ⌈this·(T - L)⌉ by
    value (choose_cut)"""
    max_children_per_group: Annotated[int, Range(0, zero="no cap")] = 0
    """[PROS] cap on new children added per group per iteration (the paper: none, one per correct
    rollout)"""
    forget: Annotated[float, Range(0, 1, lo_open=True)] = 0.95
    """[PROS] forgetting λ: counts s, n are multiplied by λ before new observations are added
    (which: --forget_on)"""
    forget_on: Literal["iteration", "visit"] = "iteration"
    """[PROS] `iteration`: every node's counts decay once per iteration (they go stale as the policy
    moves, visited or not); `visit`: only the counts of nodes observed now (docs/pros_ppo.md)"""
    prior_mu: Annotated[float, Range()] = 0.0
    """[PROS] μ0: prior mean of a root's log-odds ψ_root"""
    prior_tau: Annotated[float, Range(0, lo_open=True)] = 2.0
    """[PROS] τ0: prior std of ψ_root"""
    child_sigma: Annotated[float, Range(0, lo_open=True)] = 1.0
    """[PROS] σ: std of a child's log-odds around its root's, ψ_child ~ N(ψ_root, σ²)"""
    gibbs_sweeps: Annotated[int, Range(1)] = 10
    """[PROS] Gibbs sweeps per iteration (warm-started from the previous iteration's state)"""
    pg_terms: Annotated[int, Range(1)] = 8
    """[PROS] exact Gamma terms in each Pólya-Gamma draw; the remainder is one Gamma with its exact
    mean and variance"""
    pool_capacity: Annotated[int, Range(2)] = 10000
    """[PROS] maximum number of nodes (roots + children) in the pool; least recently observed are
    evicted"""

    def validate(self) -> None:
        # single values: their declarations (common/run/flags.py); here, combinations
        problems = []
        if self.pool_capacity < 2 * self.prompts_per_step:
            problems.append(
                f"--pool_capacity {self.pool_capacity}: must be >= 2 x --prompts_per_step"
            )
        if problems:
            raise SystemExit("\n".join(problems))


@dataclass
class Query:
    """One query of the batch: a training prompt and the prefix appended to it (a root: none). With
    PROS, its tree node and that node's figures when it was picked (`parent`: -1 for a root)."""

    prompt_id: int
    prefix: tuple[int, ...] = ()
    node: int = -1
    parent: int = -1
    from_pool: bool = False
    theta_hat: float = 0.0
    trials: float = 0.0


@dataclass
class GroupOutcome:
    """[PROS] What one group of K rollouts tells the tree: its query (an index into the batch), its
    successes and rewarded rollouts (the node's new s and n) and the candidate child prefixes."""

    query: int
    successes: float
    trials: int
    candidates: list[tuple[int, ...]]


@dataclass
class TreeUpdate:
    """[PROS] (also in PPO / GRPO: empty) What the iteration's update of the tree leaves for the
    metrics."""

    outcomes: list[GroupOutcome] = field(default_factory=list)
    children_created: int = 0
    gibbs_seconds: float = 0.0


@dataclass
class RolloutScores:
    """`score_rollouts`' right-aligned [N, Rmax] CPU tensors: pi_old's token log-probs and
    entropies, the completion mask, the critic's values (None without one) and the reference's
    log-probs (None without one)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    mask: torch.Tensor
    value: torch.Tensor | None
    ref_logp: torch.Tensor | None


# ---------------- [PROS] Augmented query construction (Section 3) ----------------


def choose_cut(
    entropy: np.ndarray,
    values: np.ndarray | None,
    inherited: int,
    length: int,
    value_top_frac: float = 0.1,
) -> int | None:
    """[PROS] Sec. 3: the cut t* for one correct response of `length` = T tokens (stop token
    excluded). `entropy` / `values` hold one entry per *continuation* token: entry j is response
    position L + j, L = `inherited` (the node's own prefix, never re-scored). Window: the paper's
    t ∈ [T/4, 3T/4) on reals, t >= L: [max(L, ⌈T/4⌉), ⌈3T/4⌉) (T = 9: {3..6}); None when empty
    (no child). With values, the candidates are the window positions among the top
    ⌈value_top_frac·(T - L)⌉ of the scored positions L..T-1 by V(s_t) (the paper's top 10% of
    timesteps; ties at the threshold kept); if none lies in the window, the window positions of
    highest value (the length constraint stays hard, the value one is relaxed just enough). t* =
    the entropy argmax among the candidates (first on ties)."""
    # ceilings: T/4 <= t < 3T/4
    low = max(inherited, -(-length // 4))
    high = -(-3 * length // 4)
    if high <= low:
        return None
    positions = np.arange(low, high)
    if values is not None:
        # positions L..T-1 (high <= T)
        scored = np.asarray(values, dtype=np.float64)[: length - inherited]
        top_count = max(1, math.ceil(round(value_top_frac * len(scored), 9)))
        threshold = -np.sort(-scored)[top_count - 1]
        window_values = scored[positions - inherited]
        top = window_values >= threshold
        if top.any():
            positions = positions[top]
        else:
            positions = positions[window_values == window_values.max()]
    window_entropy = np.asarray(entropy, dtype=np.float64)[positions - inherited]
    return int(positions[int(np.argmax(window_entropy))])


def child_candidates(
    prefix: tuple,
    continuations: list[list[int]],
    correct: list[bool],
    entropies: list,
    values: list | None,
    stop_ids: set[int],
    value_top_frac: float,
) -> list[tuple[int, ...]]:
    """[PROS] Sec. 3: one group's candidate child prefixes y[:t*], one per correct rollout cut past
    the node's own prefix, best (highest entropy at t*) first, distinct. y = prefix + continuation
    (a child of a child is cut from its full response and attaches to the same root); the caller
    adds the new ones (`QueryTree.add_children`)."""
    scored = []
    for i in [i for i, ok in enumerate(correct) if ok]:
        full = list(prefix) + list(continuations[i])
        length = len(full) - (1 if full and full[-1] in stop_ids else 0)
        rollout_values = None if values is None else values[i]
        cut = choose_cut(entropies[i], rollout_values, len(prefix), length, value_top_frac)
        # a cut at the inherited length would reproduce the node itself
        if cut is not None and cut > len(prefix):
            scored.append((-float(entropies[i][cut - len(prefix)]), i, tuple(full[:cut])))
    # distinct, best first
    return list(dict.fromkeys(child_prefix for _, _, child_prefix in sorted(scored)))


def group_outcomes(
    my_indices: list[int],
    queries: list[Query],
    completions: list[list[int]],
    correct: torch.Tensor,
    truncated: torch.Tensor,
    has_reward: torch.Tensor,
    old: RolloutScores,
    stop_ids: set[int],
    value_top_frac: float,
) -> list[GroupOutcome]:
    """[PROS] This rank's groups (`correct`: [groups, K]), each with the cuts of its correct
    rollouts (Sec. 3); a rollout cut by --max_completion_length spawns no child."""
    k = correct.shape[1]
    width = old.mask.shape[1]
    cut_short = truncated.view(-1, k)
    trials = has_reward.view(-1, k).sum(-1).tolist()
    outcomes = []
    for group, j in enumerate(my_indices):
        rows = range(group * k, (group + 1) * k)
        # the continuations are right-aligned
        starts = [width - len(completions[i]) for i in rows]
        entropies = [old.entropy[i, start:].numpy() for i, start in zip(rows, starts)]
        values = None
        if old.value is not None:
            values = [old.value[i, start:].numpy() for i, start in zip(rows, starts)]
        sources = (correct[group] & ~cut_short[group]).tolist()
        candidates = child_candidates(
            queries[j].prefix,
            [completions[i] for i in rows],
            sources,
            entropies,
            values,
            stop_ids,
            value_top_frac,
        )
        successes = float(correct[group].sum())
        outcomes.append(GroupOutcome(j, successes, trials[group], candidates))
    return outcomes


# ---------------- [PROS] The two-layer query tree, its pass-rate model, selection (Section 4)


class QueryTree:
    """[PROS] (also in PPO / GRPO: built and checkpointed, empty) Roots are original prompts (prefix
    ()), children are augmented queries (pid, prefix) whose parent is their root. Per node:
    discounted successes s and trials n, the Gibbs state ψ, and θ̂ (the mean of σ(ψ) over the last
    iteration's sweeps). Identical on every rank (updated from gathered data only)."""

    # parent: -1 for a root; last: the step it was last observed
    ARRAYS = ("pid", "parent", "s", "n", "psi", "theta_hat", "last")
    DTYPES = (np.int64, np.int64, np.float64, np.float64, np.float64, np.float64, np.int64)

    def __init__(self, state: dict | None = None):
        state = state or {}
        for name, dtype in zip(self.ARRAYS, self.DTYPES):
            setattr(self, name, np.asarray(state.get(name, []), dtype=dtype))
        self.prefix: list[tuple[int, ...]] = [tuple(p) for p in state.get("prefix", [])]
        self.index = {(int(p), q): i for i, (p, q) in enumerate(zip(self.pid, self.prefix))}

    def __len__(self) -> int:
        return len(self.prefix)

    def state_dict(self) -> dict:
        arrays = {name: getattr(self, name).copy() for name in self.ARRAYS}
        return {**arrays, "prefix": list(self.prefix)}

    def add(self, pid: int, prefix: tuple, step: int, mu0: float) -> int:
        """Node id of (pid, prefix), created if new: a root starts at ψ = μ0, a child at its root's
        ψ."""
        key = (int(pid), tuple(prefix))
        if key in self.index:
            return self.index[key]
        parent = -1 if not prefix else self.index[(int(pid), ())]
        psi0 = mu0 if parent < 0 else self.psi[parent]
        values = (pid, parent, 0.0, 0.0, psi0, 1 / (1 + math.exp(-psi0)), step)
        for name, value in zip(self.ARRAYS, values):
            setattr(self, name, np.append(getattr(self, name), value))
        self.prefix.append(key[1])
        self.index[key] = len(self.prefix) - 1
        return self.index[key]

    def add_children(
        self, pid: int, prefixes: list[tuple], step: int, mu0: float, cap: int = 0
    ) -> int:
        """Sec. 3: new prefixes become children of root pid, at most `cap` (0 = all, the paper);
        returns how many."""
        new = [p for p in prefixes if (int(pid), tuple(p)) not in self.index][: cap or None]
        for prefix in new:
            self.add(pid, prefix, step, mu0)
        return len(new)

    def observe(
        self, nodes: list, succ: list, trials: list, forget: float, step: int, forget_on: str
    ) -> None:
        """Sec. 4 forgetting, s, n <- λ s, λ n (`forget_on`: every node or the observed ones), then
        the new counts."""
        self.s, self.n = update_counts(self.s, self.n, nodes, succ, trials, forget, forget_on)
        self.last[np.asarray(nodes, dtype=np.int64)] = step

    def evict(self, capacity: int) -> int:
        """Drop least recently observed nodes until len <= capacity (module doc); returns how many
        went."""
        num = len(self)
        if num <= capacity:
            return 0
        is_root = self.parent < 0
        recency = self.last.copy()
        children = np.flatnonzero(~is_root)
        # a root is as recent as its latest child
        np.maximum.at(recency, self.parent[children], self.last[children])
        # oldest first; children first on ties
        order = np.lexsort((np.arange(num), is_root, recency))
        gone = np.zeros(num, dtype=bool)
        left = num
        for i in order:
            if left <= capacity:
                break
            if gone[i]:
                continue
            drop = np.zeros(0, dtype=np.int64)
            if is_root[i]:
                drop = np.flatnonzero((self.parent == i) & ~gone)
            gone[i] = gone[drop] = True
            left -= 1 + len(drop)
        keep = ~gone
        new_id = np.cumsum(keep) - 1
        for name in self.ARRAYS:
            setattr(self, name, getattr(self, name)[keep])
        # ids re-numbered
        self.parent = np.where(self.parent >= 0, new_id[np.maximum(self.parent, 0)], -1)
        self.prefix = [p for p, kept in zip(self.prefix, keep) if kept]
        self.index = {(int(p), q): i for i, (p, q) in enumerate(zip(self.pid, self.prefix))}
        return int(gone.sum())

    def gibbs(self, args, rng: np.random.Generator) -> None:
        """Sec. 4, Props. 4.1/4.2: --gibbs_sweeps PG-augmented sweeps over the whole tree,
        warm-started."""
        if len(self):
            self.psi, self.theta_hat = pg_gibbs(
                self.psi,
                self.parent,
                self.s,
                self.n,
                args.prior_mu,
                args.prior_tau,
                args.child_sigma,
                args.gibbs_sweeps,
                rng,
                args.pg_terms,
            )

    def query(self, node: int, from_pool: bool) -> Query:
        """The batch's query of `node`, with the node's figures now (θ̂, effective trials,
        parent)."""
        return Query(
            prompt_id=int(self.pid[node]),
            prefix=self.prefix[node],
            node=node,
            parent=int(self.parent[node]),
            from_pool=from_pool,
            theta_hat=float(self.theta_hat[node]),
            trials=float(self.n[node]),
        )


def select_nodes(
    theta: np.ndarray,
    pid: np.ndarray,
    count: int,
    exclude: set[int],
    mode: str,
    rng: np.random.Generator,
) -> list[int]:
    """[PROS] Sec. 4: up to `count` nodes, the ones with θ̃ nearest 0.5 first (`random`: a uniform
    order), at most one node per root, none whose root is in `exclude` (already in the batch)."""
    if count <= 0 or len(theta) == 0:
        return []
    if mode == "bayes":
        order = np.argsort(np.abs(theta - 0.5), kind="stable")
    else:
        order = rng.permutation(len(theta))
    # each root's best node
    _, first = np.unique(pid[order], return_index=True)
    best = order[np.sort(first)]
    return [int(i) for i in best if int(pid[i]) not in exclude][:count]


def choose_batch(
    tree: QueryTree,
    sampler: PromptSampler,
    args: Args,
    step: int,
    rng: np.random.Generator,
    num_train: int,
) -> list[Query]:
    """[PROS] The iteration's queries, the same on every rank, those from the stream first.
    ⌈fresh_frac·P⌉ from the stream, the rest from the pool by |θ̃ - 0.5|; while the pool is short
    the stream tops up (skipping prompts already in the batch unless the whole training set was
    tried). Stream prompts become roots of the tree (no-op if already there)."""
    stream = sampler.next_ids(math.ceil(args.fresh_frac * args.prompts_per_step))
    if args.select_by == "draw":
        theta_tilde = 1 / (1 + np.exp(-tree.psi))
    else:
        theta_tilde = tree.theta_hat
    wanted = args.prompts_per_step - len(stream)
    picked = select_nodes(theta_tilde, tree.pid, wanted, set(stream), args.pros, rng)
    used = set(stream) | {int(tree.pid[node]) for node in picked}
    tries = 0
    while len(stream) + len(picked) < args.prompts_per_step:
        prompt_id = sampler.next_ids(1)[0]
        tries += 1
        if prompt_id not in used or tries > num_train:
            stream.append(prompt_id)
            used.add(prompt_id)
    roots = [tree.add(prompt_id, (), step, args.prior_mu) for prompt_id in stream]
    from_stream = [tree.query(node, from_pool=False) for node in roots]
    from_pool = [tree.query(node, from_pool=True) for node in picked]
    return from_stream + from_pool


def query_prompts(encode, examples: list, prefixes: list[list[int]]) -> list[list[int]]:
    """[PROS] (also in PPO / GRPO: no prefix) Each query as the generator's prompt: the encoded
    prompt, then its prefix (Sec. 3), which is thus context, never a completion token: no
    gradient reaches it."""
    return [encode(example.prompt) + prefix for example, prefix in zip(examples, prefixes)]


def outcome_advantages(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """--adv grpo: the group-normalised outcome advantage (`grpo_advantages`, [groups, K]) on every
    completion token of its rollout, [rollouts, R]."""
    return grpo_advantages(rewards).flatten()[:, None] * mask


# ---------------- PPO pieces ----------------


class ValueModel(torch.nn.Module):
    """PPO's critic: a transformers backbone + a scalar head. Column j of the [B, R] output is V(s)
    of the state that predicts completion token j (the hidden state one position earlier), aligned
    with `token_logprobs`."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        # skip_init: no draw from the global RNG (resume must replay the same random stream), then
        # V ≡ 0
        dtype = next(backbone.parameters()).dtype
        self.head = torch.nn.utils.skip_init(torch.nn.Linear, hidden_size, 1, dtype=dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, batch) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).last_hidden_state
        # padded or packed (--padding_free)
        return self.head(batch.completion_states(hidden)).squeeze(-1).float()


def build_value_model(policy, path: str | None = None) -> ValueModel:
    """Critic = an fp32 copy (master weights) of the policy's backbone (with LoRA: the adapted one,
    trained in full) or the backbone at `path` (same tokenizer: then no copy of the policy is
    needed), + a zero-initialised head."""
    if path:
        from transformers import AutoModel

        try:
            # the RNG untouched (exact resume); no bar
            with torch.random.fork_rng(devices=[]), library_bars_off():
                backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
        except OSError as e:
            raise SystemExit(f"--critic_model_name_or_path {path!r}: cannot load ({e})")
        if backbone.config.vocab_size != policy.config.vocab_size:
            raise SystemExit(
                f"--critic_model_name_or_path {path!r}: vocab size {backbone.config.vocab_size} "
                f"differs from the policy's {policy.config.vocab_size} (the critic reads policy "
                "tokens)"
            )
    else:
        model = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        backbone = copy.deepcopy(model.base_model)
        # with LoRA + bf16 the frozen base was stored in bf16
        backbone.float()
    # the critic follows the policy's --gradient_checkpointing
    if policy.is_gradient_checkpointing:
        backbone.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    backbone.requires_grad_(True).train()
    return ValueModel(backbone, backbone.config.hidden_size)


@torch.no_grad()
def score_rollouts(
    policy,
    critic,
    ref_model,
    forward: Forward,
    prompts: list[list[int]],
    completions: list[list[int]],
    micro_batch_size: int,
    accelerator,
) -> RolloutScores:
    """One no-grad pass: pi_old's log-probs and entropies (policy), values (critic, if any),
    reference log-probs (if any), all as right-aligned [N, Rmax] CPU tensors zeroed outside the
    completion mask. PROS reads t* from these same entropies. Under --fsdp the models stay sharded
    (a layer is gathered only while it runs): `micro_batches` gives every rank the same number of
    passes."""
    num = len(prompts)
    width = max([1] + [len(c) for c in completions])
    # filled on the device, copied to the host once at the end (no sync per micro-batch)
    on_device = dict(device=forward.device)
    logp = torch.zeros(num, width, **on_device)
    entropy = torch.zeros(num, width, **on_device)
    mask = torch.zeros(num, width, **on_device)
    value = None if critic is None else torch.zeros(num, width, **on_device)
    ref_logp = None if ref_model is None else torch.zeros(num, width, **on_device)
    for chunk in micro_batches(
        num, micro_batch_size, accelerator, policy, peers=(critic, ref_model)
    ):
        rows = slice(chunk[0], chunk[-1] + 1)
        mb = forward.rows(prompts[rows], completions[rows])
        cols = slice(width - mb.completion_width, width)
        mb_logp, mb_entropy = forward(policy, mb, grad=False)
        logp[rows, cols] = mb_logp
        entropy[rows, cols] = mb_entropy
        mask[rows, cols] = mb.loss_mask
        if critic is not None:
            with autocast(forward.device, forward.dtype):
                value[rows, cols] = critic(mb)
        if ref_model is not None:
            mb_ref_logp, _ = forward(ref_model, mb, grad=False)
            ref_logp[rows, cols] = mb_ref_logp
    return RolloutScores(
        logp=(logp * mask).cpu(),
        entropy=(entropy * mask).cpu(),
        mask=mask.cpu(),
        value=None if value is None else (value * mask).cpu(),
        ref_logp=None if ref_logp is None else (ref_logp * mask).cpu(),
    )


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE (Schulman et al., 2016) over [B, R] tensors: (advantages, returns =
    advantages + values).

    δ_t = r_t + γ V_{t+1} - V_t,  A_t = δ_t + γλ A_{t+1}; the state after a row's last valid token
    is terminal (V = 0). Positions with mask 0 (padding, masked tokens) are skipped: they are not
    actions, carry nothing through, and get A = R = 0. Put rewards on valid positions (outcome
    reward: the last valid token).
    """
    b, r = rewards.shape
    adv = torch.zeros_like(rewards)
    last_adv = rewards.new_zeros(b)
    next_value = rewards.new_zeros(b)
    for t in reversed(range(r)):
        valid = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * last_adv
        adv[:, t] = torch.where(valid, a, torch.zeros_like(a))
        last_adv = torch.where(valid, a, last_adv)
        next_value = torch.where(valid, values[:, t], next_value)
    return adv, (adv + values) * (mask > 0)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, accelerator=None, eps: float = 1e-8
) -> torch.Tensor:
    """Zero mean, unit std over the masked entries; masked-out entries become 0. With `accelerator`
    the mean and std are those of the whole batch, every process's rows (its sums reduced over
    ranks), as one process computes them."""

    def reduce(sums: dict) -> dict:
        if accelerator is None:
            return sums
        return reduce_sums(accelerator, sums)

    sums = reduce({"sum": float((values * mask).sum()), "count": float(mask.sum())})
    count = max(1.0, sums["count"])
    mean = sums["sum"] / count
    var = reduce({"sq": float((((values - mean) * mask) ** 2).sum())})["sq"] / count
    return (values - mean) / (math.sqrt(var) + eps) * mask


def token_divisor(global_tokens: float, world: int) -> float:
    """Each rank's divisor for a token mean over the whole minibatch: DDP / FSDP average the ranks'
    gradients, so the global count / world gives the global mean (a minibatch with no token anywhere
    has sums of 0: any divisor will do)."""
    return global_tokens / world or 1.0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    divisor: float,
    eps_low: float,
    eps_high: float,
    sampler_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy's clipped surrogate over the tokens with mask 1, divided by the minibatch's
    token count (`token_divisor`), and the clipped tokens' count. [PROS] a query's prefix is part
    of its prompt: no completion token of it, no gradient. `sampler_weight`: the sampler
    correction's rho per token (TRL's rule: it multiplies the clipped surrogate)."""
    per_token, clipped = clipped_surrogate(logp, old_logp, advantages, eps_low, eps_high)
    if sampler_weight is not None:
        per_token = per_token * sampler_weight  # sampler correction
    return (per_token * mask).sum() / divisor, (clipped * mask).sum()


def value_loss(
    v: torch.Tensor, v_old: torch.Tensor, returns: torch.Tensor, clip: float
) -> torch.Tensor:
    """Per-token clipped value loss 0.5·max((V - R)², (V_old + clip(V - V_old, ±c) - R)²) (PPO)."""
    v_clipped = v_old + (v - v_old).clamp(-clip, clip)
    return 0.5 * torch.max((v - returns) ** 2, (v_clipped - returns) ** 2)


# ---------------- the step's sample log and metrics ----------------


def sample_rows(
    tokenizer,
    my_queries: list[Query],
    prompts: list[list[int]],
    completions: list[list[int]],
    rewards: torch.Tensor,
    truncated: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    scored,
    k: int,
    pros: bool,
    args,
) -> list[dict]:
    """samples.jsonl rows of the first --log_samples_per_kind rollouts of each kind: the root query,
    the reused prefix (PROS: with its tree node and root), the continuation, its reward and its
    sequence-level advantage (GAE: the first token's; GRPO: any token's)."""
    first_token = mask.cumsum(-1) == 1
    seq_adv = (advantages * first_token).sum(-1)
    kinds = ["augmented" if my_queries[i // k].prefix else "root" for i in range(len(completions))]
    rows = []
    for i in first_of_each_kind(kinds, args.log_samples_per_kind):
        query = my_queries[i // k]
        kind = "augmented" if query.prefix else "root"
        root_prompt = prompts[i][: len(prompts[i]) - len(query.prefix)]
        row = {
            "kind": kind,
            "prompt": tokenizer.decode(root_prompt),
            "pros_prefix": tokenizer.decode(list(query.prefix)),
            "completion": tokenizer.decode(completions[i]),
            "reward": rewards.view(-1)[i].item(),
            "truncated": bool(truncated[i]),
            "advantage": seq_adv[i].item(),
        }
        if pros:
            row["pros_node"] = query.node
            row["pros_parent"] = query.parent
        row.update(scored.columns(i))
        rows.append(row)
    return rows


def mean_or_none(values) -> float | None:
    return float(np.mean(values)) if len(values) else None


def pros_mechanism_metrics(
    queries: list[Query], tree: QueryTree, tree_update: TreeUpdate, k: int
) -> dict:
    """[PROS] The mechanism's figures, from the gathered outcomes (the same on every rank)."""
    child_lens = [len(query.prefix) for query in queries if query.prefix]
    outcomes = tree_update.outcomes
    pool_outcomes = [outcome for outcome in outcomes if queries[outcome.query].from_pool]
    picks = [
        (
            queries[outcome.query].theta_hat,
            queries[outcome.query].trials,
            queries[outcome.query].parent < 0,
            outcome.successes,
        )
        for outcome in pool_outcomes
    ]
    # the pool's picks: θ̂ at selection, effective trials, root or not, successes of K
    theta, trials, root, wins = np.array(picks, float).reshape(-1, 4).T
    stream_wins = np.array(
        [outcome.successes for outcome in outcomes if not queries[outcome.query].from_pool]
    )
    calib_excess = calibration_excess(theta, wins, k) if len(wins) else None
    return {
        "pros_pool_size": len(tree),
        "pros_pool_children": int((tree.parent >= 0).sum()),
        "pros_frac_children_in_batch": len(child_lens) / max(1, len(queries)),
        "pros_prefix_len_mean": mean_or_none(child_lens),
        "pros_saved_prompt_tokens": int(sum(child_lens) * k),
        "pros_children_created": tree_update.children_created,
        "pros_gibbs_s": tree_update.gibbs_seconds,
        # |θ̂ at selection - s/K|; its floor: the K-sample noise
        "pros_calib_error": mean_or_none(np.abs(theta - wins / k)),
        # the same minus its expectation under θ̂
        "pros_calib_excess": calib_excess,
        "pros_frac_zero_var_picks": mean_or_none((wins == 0) | (wins == k)),
        "pros_frac_zero_var_stream": mean_or_none((stream_wins == 0) | (stream_wins == k)),
        "pros_pick_trials_mean": mean_or_none(trials),
        "pros_pick_root_frac": mean_or_none(root),
    }


def pros_ppo_metrics(
    totals: dict,
    has_critic: bool,
    pros: bool,
    queries: list[Query],
    tree: QueryTree,
    tree_update: TreeUpdate,
    k: int,
) -> dict:
    """[PPO] the clipped share of tokens and (with a critic) the per-token value loss, each a token
    mean of an optimizer step averaged over the update's steps (summed over ranks: each rank adds
    its part of the global mean); [PROS] the mechanism's figures (docs/pros_ppo.md)."""
    row = {"ppo_clip_frac": totals["clip_sum"]}
    if has_critic:
        row["ppo_value_loss"] = totals["value_loss_sum"]
    # [PROS]
    if pros:
        row |= pros_mechanism_metrics(queries, tree, tree_update, k)

    return row


def update_mean(values: list[torch.Tensor]) -> float:
    """The mean over the update's optimizer steps of one value each (one copy to the host)."""
    return float(np.mean(torch.stack(values).tolist()))


def update_query_tree(
    tree,
    queries,
    my_indices,
    completions,
    correct,
    truncated,
    has_reward,
    old,
    stop_ids,
    step,
    args,
    rng,
    accelerator,
) -> TreeUpdate:
    """[PROS] The tree's update from this step's outcomes: each query's successes and trials
    observed (Sec. 4), every distinct new cut of a correct rollout added as a child (Sec. 3, capped
    if asked), the pool evicted to --pool_capacity and the Gibbs sampler run. The outcomes are
    gathered from every rank in query order, so the tree stays the same on every rank. Returns what
    the update leaves for the metrics."""
    my_outcomes = group_outcomes(
        my_indices,
        queries,
        completions,
        correct,
        truncated,
        has_reward,
        old,
        stop_ids,
        args.value_top_frac,
    )
    outcomes = sorted(gather_list(accelerator, my_outcomes), key=lambda outcome: outcome.query)
    nodes = [queries[outcome.query].node for outcome in outcomes]
    successes = [outcome.successes for outcome in outcomes]
    # trials: the rollouts given a reward
    trials = [outcome.trials for outcome in outcomes]
    tree.observe(nodes, successes, trials, args.forget, step, args.forget_on)
    update = TreeUpdate(outcomes=outcomes)
    for outcome in outcomes:
        prompt_id = queries[outcome.query].prompt_id
        update.children_created += tree.add_children(
            prompt_id, outcome.candidates, step, args.prior_mu, args.max_children_per_group
        )
    tree.evict(args.pool_capacity)
    gibbs_start = time.time()
    tree.gibbs(args, rng)
    update.gibbs_seconds = time.time() - gibbs_start
    return update


def minibatch_rows(minibatch, model, prompts, completions, forward, accelerator, args):
    """Each micro-batch of a minibatch (rollout indices) through `model`, as `micro_batches` deals
    them (every rank as many): its rollout indices, its padded rows and its completion columns of a
    step-level [rollouts, Rmax] tensor."""
    lengths = [len(prompts[i]) + len(completions[i]) for i in minibatch]
    max_rows, max_tokens = args.micro_batch_size, args.max_tokens_per_microbatch
    micro = micro_batches(
        len(minibatch), max_rows, accelerator, model, lengths=lengths, max_tokens=max_tokens
    )
    for rows in micro:
        mb_ids = [minibatch[r] for r in rows]
        mb = forward.rows_at(mb_ids, prompts, completions)
        yield mb_ids, mb, slice(-mb.completion_width, None)


def minibatch_divisors(minibatch, policy_mask, mask, accelerator) -> tuple[float, float]:
    """Each rank's divisors for token means over the whole minibatch (see token_divisor): the
    policy's tokens and all tokens (the critic's), counted over every rank."""
    local_counts = {
        "policy": float(policy_mask[minibatch].sum()),
        "all": float(mask[minibatch].sum()),
    }
    token_counts = reduce_sums(accelerator, local_counts)
    world = accelerator.num_processes
    return token_divisor(token_counts["policy"], world), token_divisor(token_counts["all"], world)


def critic_step(
    critic_model,
    critic_optimizer,
    minibatch,
    old,
    returns,
    has_reward,
    minibatch_tokens,
    prompts,
    completions,
    forward,
    accelerator,
    args,
) -> torch.Tensor:
    """[PPO] The critic's step on one minibatch: the clipped value loss against the GAE returns, a
    token mean over the whole minibatch's rewarded rollouts, its backward, clipping and its own
    optimizer step. Returns the minibatch's value loss (float64, on the device)."""
    device = forward.device
    minibatch_value_loss = torch.zeros((), dtype=torch.float64, device=device)
    step_rows = prompts, completions, forward, accelerator, args
    for mb_ids, mb, cols in minibatch_rows(minibatch, critic_model, *step_rows):
        with autocast(device, forward.dtype):
            mb_values = critic_model(mb)
        per_token = value_loss(
            mb_values,
            old.value[mb_ids, cols].to(device),
            returns[mb_ids, cols].to(device),
            args.cliprange_value,
        )
        mb_mask = mb.loss_mask * has_reward[mb_ids, None].to(device)
        loss = (per_token * mb_mask).sum() / minibatch_tokens
        accelerator.backward(loss)
        minibatch_value_loss += loss.detach()
    accelerator.clip_grad_norm_(critic_model.parameters(), args.max_grad_norm)
    critic_optimizer.step()
    critic_optimizer.zero_grad(set_to_none=True)
    return minibatch_value_loss


def pros_ppo_sums(
    rewards, correct, truncated, completions, old, gens, losses, clip_fracs, value_losses, world
) -> dict:
    """The step's sums: the rollouts' (`rollout_sums`, scored on prefix + continuation; a NaN
    reward is out of reward_mean / _std; generated tokens, a child's prefix excluded), pi_old's
    entropy, the sampler/trainer agreement where the generator returns log-probs, and each rank's
    part of the update's global token means (the loss, the clipped share, the value loss; summed
    over ranks: the global mean)."""
    success, zero_var = correct.sum(), zero_variance(rewards).sum()
    sums = rollout_sums(len(rewards), rewards, success, zero_var, truncated.sum(), completions)
    sums |= {"ent_sum": (old.entropy * old.mask).sum(), "tok": old.mask.sum()}
    if any(gens.logprobs):
        sampler_logp = right_align(gens.logprobs, old.mask.shape[1])
        gap = (old.logp - sampler_logp).abs() * old.mask
        sums |= {"gap_sum": gap.sum(), "gap_tok": old.mask.sum()}
    sums |= {"loss_sum": update_mean(losses) / world, "clip_sum": update_mean(clip_fracs) / world}
    if value_losses:
        sums["value_loss_sum"] = update_mean(value_losses) / world
    return sums


def main(args: Args) -> None:
    # ---------------- set-up: launch, policy, reference, critic, optimizers, generator -----------
    accelerator, cpu_threads, log = start_run(args, "pros_ppo")
    device = accelerator.device
    world = accelerator.num_processes
    policy, tokenizer, model_path = load_training_policy(args, accelerator, log)
    # Countdown or a dataset; --reward_funcs: yours (docs/custom_task.md)
    task = make_task(args, tokenizer, log)
    # None at --beta 0
    ref_model = make_reference(policy, args)
    # PPO's critic: the policy's backbone copied + a zero scalar head (copied before any sharding)
    critic = None
    if args.adv == "gae":
        critic = build_value_model(policy, args.critic_model_name_or_path).to(device)
    # --fsdp only; the optimizers then see the shards
    policy, ref_model, critic = shard_models(args, policy, ref_model, critic)
    optimizer, scheduler = make_optimizer(policy, args)
    # `model`: DDP-wrapped for the backward pass
    model, optimizer = prepare_training(accelerator, policy, optimizer, args.fsdp)
    # the critic's own constant-lr AdamW; `critic` stays unwrapped, `critic_model`: its DDP wrapper
    critic_model = None
    critic_optimizer = None
    if critic is not None:
        critic_optimizer = torch.optim.AdamW(
            critic.parameters(), lr=args.critic_lr, weight_decay=0.0
        )
        critic_model, critic_optimizer = prepare_training(
            accelerator, critic, critic_optimizer, args.fsdp
        )
    encode = PromptEncoder(tokenizer, task.templated)
    sampler = PromptSampler(len(task.train), args.seed)
    compiled = make_compiled(args, log)
    generator = make_generator(args, model_path, policy, tokenizer, accelerator, compiled, log)
    _, eval_sampling = sampling_configs(args)
    # pi_old's log-probs come from score_rollouts, with the entropies PROS needs; the sampler's
    # only for its correction
    sampling = SamplingConfig(
        max_new_tokens=args.max_completion_length,
        temperature=args.temperature,
        logprobs=bool(args.vllm_importance_sampling_correction),
    )
    # greedy samples are scored at T = 1
    temperature = args.temperature if args.temperature > 0 else 1.0
    pack = packed_row_tokens(args, device)
    k = args.num_generations
    stop_ids = set(generator.end_ids)
    pros = args.pros != "off"

    def run_eval() -> dict:
        # fit the free cores
        torch.set_num_threads(cpu_threads.count(torch.get_num_threads()))
        # FSDP + HF generate: whole weights (else a no-op)
        with gathered(policy, enabled=generator.reads_policy):
            return evaluate_policy(
                generator,
                tokenizer,
                task,
                encode,
                eval_sampling,
                args,
                accelerator,
                train_prompts_first=True,
            )

    # ---------------- resume, the query tree, logs, step-0 evaluation ----------------
    # the critic and its optimizer are saved and restored with the policy's
    trained = {"critic": (critic, critic_optimizer)} if critic is not None else {}
    checkpoints = Checkpoints(
        args, accelerator, model, tokenizer, optimizer, scheduler, log, models=trained
    )
    start_step, saved = checkpoints.resume(sampler, generator, policy)
    counters = saved["counters"] if saved else {"rollouts": 0, "gen_tokens": 0}
    # [PROS] (also in PPO / GRPO: empty, unused) the query tree, the Gibbs/selection RNG (one seed:
    # identical pools)
    tree = QueryTree(saved["method"]["tree"] if saved else None)
    pros_rng = np.random.default_rng(args.seed)
    if saved:
        pros_rng.bit_generator.state = saved["method"]["rng"]

    run_log = RunLog(args, accelerator, "pros_ppo", start_step, saved is not None, log)
    # Ctrl-C / SIGTERM from here on: the run stops after its step, with a checkpoint
    stop = GracefulStop(log)
    if start_step == 0:
        run_log.first_row(run_eval(), compiled)
    forward = Forward(tokenizer.pad_token_id, device, args.dtype, temperature, pack, compiled)

    # sampler correction (TRL's vllm_importance_sampling_*, on by default with vLLM): (trainer
    # log-probs, sampler log-probs, known tokens) -> (weights, sums); the module loads only then
    correct_sampler = None
    if args.vllm_importance_sampling_correction:
        from common.rl.sampler_correction import sampler_is_weights

        correct_sampler = partial(
            sampler_is_weights,
            mode=args.vllm_importance_sampling_mode,
            clip_min=args.vllm_importance_sampling_clip_min,
            clip_max=args.vllm_importance_sampling_clip_max,
        )

    for step in range(start_step + 1, args.max_steps + 1):
        # a shared CPU: torch's threads fit the cores other processes leave free (--num_threads)
        run_log.start_step(cpu_threads)

        # ================ the batch: one query per group, the same on every rank ================
        # [PROS] Sec. 4: part data stream, the rest from the pool by |θ̃ - 0.5|
        if pros:
            queries = choose_batch(tree, sampler, args, step, pros_rng, len(task.train))
        else:
            queries = [Query(prompt_id) for prompt_id in sampler.next_ids(args.prompts_per_step)]

        # ================ sample: K continuations of this rank's queries (q + prefix: the prompt)
        my_indices = my_slice(list(range(len(queries))), accelerator)
        my_queries = [queries[j] for j in my_indices]
        examples = [task.train[query.prompt_id] for query in my_queries]
        prefixes = [list(query.prefix) for query in my_queries]
        query_tokens = query_prompts(encode, examples, prefixes)
        with run_log.timing("gen"):
            # FSDP + HF generate: whole weights (else a no-op)
            with gathered(policy, enabled=generator.reads_policy):
                gens = generator.generate(query_tokens, k, sampling)
            # vLLM on a GPU: its memory goes to training; the push brings the weights back
            generator.sleep()
        completions = [list(completion) for completion in gens.completion_ids]
        prompts = [tokens for tokens in query_tokens for _ in range(k)]
        num_rollouts = len(completions)

        # ================ verify: the reward reads prefix + continuation (PROS Sec. 3) ===========
        with run_log.timing("reward"):
            whole = [prefixes[i // k] + completion for i, completion in enumerate(completions)]
            texts = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens in whole]
            truncated = torch.tensor([reason == "length" for reason in gens.finish_reasons])
            prompt_of = [examples[i // k] for i in range(len(texts))]
            scored = task.score(texts, prompt_of, whole, truncated, step)
        # NaN: no function scored it
        rewards = torch.tensor(scored.total, dtype=torch.float32).view(-1, k)  # [groups, K]
        # the task's rule (`Task.passes`)
        correct = torch.tensor(scored.success, dtype=torch.bool).view(-1, k)  # [groups, K]
        # False: no reward (no gradient, no critic target, not a trial)
        has_reward = torch.tensor(scored.scored, dtype=torch.bool)  # [rollouts]

        # ================ pi_old's log-probs, entropies, values, reference log-probs: one pass ===
        # FSDP: sharded, in lock-step (no whole model gathered)
        with run_log.timing("logprob"):
            old = score_rollouts(
                policy,
                critic,
                ref_model,
                forward,
                prompts,
                completions,
                args.micro_batch_size,
                accelerator,
            )
        mask = old.mask  # [rollouts, Rmax]
        # --mask_truncated_completions: cut rollouts get no policy gradient (the critic still fits
        # their returns); rollouts with no reward get none either
        policy_mask = mask * ~truncated[:, None] if args.mask_truncated_completions else mask
        policy_mask = policy_mask * has_reward[:, None]

        # ================ [PROS] the tree: child candidates (Sec. 3); observe, add, Gibbs (Sec. 4)
        # [PROS] (also in PPO / GRPO: empty) what the tree's update leaves for the metrics
        tree_update = TreeUpdate()
        # [PROS]
        if pros:
            tree_update = update_query_tree(
                tree,
                queries,
                my_indices,
                completions,
                correct,
                truncated,
                has_reward,
                old,
                stop_ids,
                step,
                args,
                pros_rng,
                accelerator,
            )

        # ================ advantages ================
        returns = None
        if args.adv == "gae":
            # the outcome reward on the last token (right-aligned: the last column), token-level
            # GAE; the rows with no reward are masked out below
            token_rewards = torch.zeros_like(mask)
            token_rewards[:, -1] = rewards.flatten().nan_to_num(0.0)
            advantages, returns = gae_advantages(
                token_rewards, old.value, mask, args.gamma, args.gae_lambda
            )
            # whitened over the rewarded rows' tokens only (global: all ranks)
            reward_mask = mask * has_reward[:, None]
            if args.whiten_advantages:
                advantages = masked_whiten(advantages, reward_mask, accelerator)
            advantages = advantages * reward_mask
        else:
            advantages = outcome_advantages(rewards, mask)

        # sampler correction: rho = pi_old / pi_sampler per token, pi_old being the trainer's pass
        # above (the weights that sampled), taken once per step; TRL's rule: it multiplies the
        # clipped surrogate of every epoch (the ratio pi_theta / pi_old stays the trainer's)
        sampler_weight, is_sums = torch.ones_like(old.logp), {}
        if correct_sampler:
            sampler_logp = right_align(gens.logprobs, mask.shape[1])
            # the trained tokens only (a cut or unscored rollout's are not)
            sampler_weight, is_sums = correct_sampler(old.logp, sampler_logp, policy_mask)

        # ================ update: clipped steps of the policy, the critic alongside ==============
        # num_iterations passes, each of num_mini_batches optimizer steps; each step's loss, clipped
        # share, value loss and KL (float64 on the device: host copies once the update ends)
        losses, clip_fracs, value_losses, update_sums, grad_norms = [], [], [], [], []
        step_rows = prompts, completions, forward, accelerator, args
        with run_log.timing("update"):
            for epoch in range(args.num_iterations):
                order = torch.randperm(num_rollouts).tolist()
                for part in range(args.num_mini_batches):
                    start = part * num_rollouts // args.num_mini_batches
                    end = (part + 1) * num_rollouts // args.num_mini_batches
                    minibatch = order[start:end]
                    # token means of the whole minibatch on every rank (see token_divisor)
                    divisors = minibatch_divisors(minibatch, policy_mask, mask, accelerator)
                    policy_tokens, minibatch_tokens = divisors
                    minibatch_loss = torch.zeros((), dtype=torch.float64, device=device)
                    clipped_sum = torch.zeros((), dtype=torch.float64, device=device)
                    kl_sum = torch.zeros((), dtype=torch.float64, device=device)
                    for mb_ids, mb, cols in minibatch_rows(minibatch, model, *step_rows):
                        mb_mask = policy_mask[mb_ids, cols].to(device)
                        logp, _ = forward(model, mb)
                        old_logp = old.logp[mb_ids, cols].to(device)
                        mb_advantages = advantages[mb_ids, cols].to(device)
                        eps = args.epsilon, args.epsilon_high
                        # sampler correction (x 1 when off)
                        mb_sampler_weight = sampler_weight[mb_ids, cols].to(device)
                        loss, clipped = policy_loss(
                            logp,
                            old_logp,
                            mb_advantages,
                            mb_mask,
                            policy_tokens,
                            *eps,
                            mb_sampler_weight,
                        )
                        # logged `loss`: the clipped surrogate, the KL excluded
                        minibatch_loss += loss.detach()
                        clipped_sum += clipped
                        if ref_model is not None:
                            kl = kl_k3(logp, old.ref_logp[mb_ids, cols].to(device)) * mb_mask
                            loss = loss + args.beta * kl.sum() / policy_tokens
                            kl_sum += kl.detach().sum()
                        accelerator.backward(loss)
                    norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    grad_norms.append(norm)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                    losses.append(minibatch_loss)
                    clip_fracs.append(clipped_sum / policy_tokens)
                    # the on-policy epoch's KL is the one logged
                    if epoch == 0:
                        update_sums.append({"kl_sum": kl_sum})
                    # the critic: the clipped value loss against the GAE returns, its own step
                    if critic is not None:
                        minibatch_value_loss = critic_step(
                            critic_model,
                            critic_optimizer,
                            minibatch,
                            old,
                            returns,
                            has_reward,
                            minibatch_tokens,
                            *step_rows,
                        )
                        value_losses.append(minibatch_value_loss)

        # ================ push the new weights to the generator (a no-op for HF generate) ========
        generator.sync_weights(policy)

        # ================ metrics: the step's sums over ranks, the shared keys, the method's ======
        update_sums.append(is_sums)
        update_means = losses, clip_fracs, value_losses
        sums = pros_ppo_sums(
            rewards, correct, truncated, completions, old, gens, *update_means, world
        )
        lr = scheduler.get_last_lr()[0]
        row, totals = run_log.step_metrics(
            step, counters, scored, sums, update_sums, grad_norms, lr, loss_per=None
        )
        row |= pros_ppo_metrics(totals, critic is not None, pros, queries, tree, tree_update, k)

        # ================ evaluation, sample log, the row, checkpoint, stop ================
        if run_log.evaluation_due(step):
            with run_log.timing("eval"):
                row.update(run_eval())
        # a few root and (with PROS) augmented rollouts
        if run_log.samples_due(step):
            rollouts = my_queries, prompts, completions, rewards, truncated, advantages, mask
            picked = sample_rows(tokenizer, *rollouts, scored, k, pros, args)
            run_log.write_samples(step, picked)
        run_log.write_row(row, compiled)
        stopping = stop.any_rank_signalled(accelerator)
        if checkpoints.due(step, stopping):
            # [PROS] (also in PPO / GRPO: the empty tree and its RNG)
            method_state = {"tree": tree.state_dict(), "rng": pros_rng.bit_generator.state}
            state = {"sampler": sampler.state_dict(), "counters": counters, "method": method_state}
            checkpoints.save(step, state, stopping)
        if stopping:
            break
    run_log.close()
    export_model(args, accelerator, policy, tokenizer, generator.end_ids, "pros_ppo", __doc__)
    # trackers finish and the process group ends now, not at exit: no hang, no abort
    end_processes(accelerator)
    stop.close()
    log(
        run_summary(
            args.output_dir, ["pros_calib_error", "pros_calib_excess", "pros_frac_zero_var_picks"]
        )
    )


if __name__ == "__main__":
    raise SystemExit(
        main(parse_args(Args, description=__doc__.split("\n\n")[0])) or GracefulStop.exit_status()
    )
