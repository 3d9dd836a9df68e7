"""PROS (prefix reuse for on-policy sampling) on PPO, one file; `--adv grpo` runs it on GRPO instead.

Paper: "PROS: Towards Compute-Efficient RLVR via Rollout Prefix Reuse" (ICLR 2026,
../shared/papers/001_1760c67a1330819a.txt).

The base is PPO for LLMs: a critic (the policy's backbone copied, plus a scalar head: common/value.py),
token-level GAE with the outcome reward on the last token, clipped policy and value losses, several epochs over
minibatches. PROS is a plug-in that changes only *which queries* are trained on:
  1. Augmented queries (Sec. 3): in every group with a correct rollout, cut a correct response y at
     t* = argmax of the policy's token entropy within [max(L, ⌊T/4⌋), ⌊3T/4⌋) (L: inherited prefix; with a
     critic, among the top 10% of those positions by value) and add q' = q + y[:t*] to a two-layer tree as a
     child of q's root. A child is generated from q + prefix; only the continuation is trained (the prefix is
     part of the prompt, so it gets no gradient and no credit); its reward is scored on prefix + continuation.
  2. Hierarchical Bayesian selection (Sec. 4): θ = σ(ψ), ψ_root ~ N(μ0, τ0²), ψ_child ~ N(ψ_root, σ²), counts
     with exponential forgetting, Pólya-Gamma Gibbs sweeps (common/gibbs.py); the batch takes the nodes whose
     current Gibbs draw θ̃ is nearest 0.5, at most one node per root.
Lines marked [PROS] are the plug-in; `--pros off` removes every one of them (vanilla PPO / GRPO).

Batch composition with PROS: ⌈fresh_frac·P⌉ queries come from the data stream (the same epoch-wise shuffle
the vanilla run reads), so never-seen prompts keep entering (there is no data to rank them by); the other slots
go to the pool, ranked by |θ̃ - 0.5| (`--pros random`: uniformly, the paper's ablation). While the pool has too
few eligible roots (early on) the stream fills the rest. The pool is bounded by --pool_capacity: beyond it the
least recently observed nodes are evicted (a root counts as recent as its most recent child; children go first
on ties; evicting a root evicts its children; an evicted prompt can re-enter from the stream as a fresh root).

    python pros_ppo.py                         # PPO + PROS on the embedded Countdown default (CPU, minutes)
    python pros_ppo.py --pros off              # vanilla PPO
    python pros_ppo.py --adv grpo              # GRPO + PROS   (--pros off: vanilla GRPO)
    python pros_ppo.py --pros random           # ablation: prefix reuse + random selection
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Literal, Optional

import numpy as np
import torch
from accelerate.utils import gather_object

from common.advantages import gae_advantages, grpo_advantages, zero_variance
from common.args import BaseArgs
from common.cli import parse_args
from common.gibbs import gibbs_sweeps, update_counts
from common.logprobs import token_logprobs
from common.losses import clipped_surrogate, kl_k3
from common.masking import pad_sequences
from common.runtime import accumulate_gradients, core_metrics, finish_step, my_slice, optimizer_step, start_run
from common.value import accumulate_value_gradients, build_value_model


@dataclass
class Args(BaseArgs):
    max_steps: int = 200
    """number of iterations (each: one batch of queries, then ppo_epochs x num_minibatches updates; 200 keeps the default run under 10 minutes on 2 cores)"""
    k: int = 4
    """rollouts per query (group size; GRPO's baseline and PROS's per-node pass-rate observations need >= 2)"""
    adv: Literal["gae", "grpo"] = "gae"
    """advantage estimator: token-level GAE with a learned critic (PPO), or critic-free group-normalised GRPO"""
    gamma: float = 1.0
    """GAE discount γ"""
    gae_lambda: float = 0.95
    """GAE λ"""
    whiten_advantages: bool = True
    """(GAE) normalise advantages to zero mean / unit std over the batch's tokens"""
    ppo_epochs: int = 2
    """passes over each batch of rollouts"""
    num_minibatches: int = 2
    """optimizer steps per epoch (the batch's rollouts are shuffled and split)"""
    clip_low: float = 0.2
    """policy ratio clip 1 - clip_low"""
    clip_high: float = 0.2
    """policy ratio clip 1 + clip_high (vanilla PPO: symmetric)"""
    vf_clip: float = 0.2
    """value clip: V is kept within ±vf_clip of its old prediction in the clipped value loss"""
    critic_lr: float = 5e-4
    """critic AdamW learning rate (constant)"""
    critic_model_name_or_path: Optional[str] = None
    """critic backbone; default (None): a copy of the policy's backbone + a zero-initialised scalar head"""
    kl_coef: float = 0.0
    """per-token k3 KL penalty to the initial policy, added to the policy loss (0 = off, no reference model)"""
    success_reward: float = 1.0
    """a rollout is correct (a PROS success and a prefix source) when its training reward >= this"""
    pros: Literal["bayes", "random", "off"] = "bayes"
    """[PROS] bayes: prefix reuse + hierarchical Bayesian selection (paper); random: prefix reuse + uniform selection from the pool (ablation); off: vanilla PPO/GRPO"""
    select_by: Literal["draw", "mean"] = "draw"
    """[PROS] the θ̃ ranked by |θ̃ - 0.5|: the current Gibbs draw σ(ψ) (Thompson-style; the issue's reading) or θ̂, the mean of σ(ψ) over the last iteration's sweeps"""
    fresh_frac: float = 0.5
    """[PROS] fraction of each batch drawn from the data stream (never-seen prompts enter this way); the rest is selected from the pool"""
    value_top_frac: float = 0.1
    """[PROS] with a critic, t* is the entropy argmax among the top ⌈this·|window|⌉ window positions by predicted value"""
    forget: float = 0.95
    """[PROS] exponential forgetting λ: all counts s, n are multiplied by λ each iteration before new observations are added"""
    prior_mu: float = 0.0
    """[PROS] μ0: prior mean of a root's log-odds ψ_root"""
    prior_tau: float = 2.0
    """[PROS] τ0: prior std of ψ_root"""
    child_sigma: float = 1.0
    """[PROS] σ: std of a child's log-odds around its root's, ψ_child ~ N(ψ_root, σ²)"""
    gibbs_sweeps: int = 10
    """[PROS] Gibbs sweeps per iteration (warm-started from the previous iteration's state)"""
    pg_terms: int = 4
    """[PROS] exact Gamma terms in each Pólya-Gamma draw; the remainder is one Gamma with its exact mean and variance"""
    pool_capacity: int = 10000
    """[PROS] maximum number of nodes (roots + children) in the pool; least recently observed are evicted"""

    def validate(self) -> None:
        if self.k < 2:
            raise SystemExit(f"--k {self.k}: need at least 2 rollouts per query")
        if self.ppo_epochs < 1 or self.num_minibatches < 1:
            raise SystemExit("--ppo_epochs and --num_minibatches must be >= 1")
        if not (0 <= self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise SystemExit("--gamma and --gae_lambda must be in [0, 1]")
        if self.clip_low <= 0 or self.clip_high <= 0 or self.vf_clip <= 0:
            raise SystemExit("--clip_low, --clip_high and --vf_clip must be > 0")
        if not 0 < self.fresh_frac <= 1:
            raise SystemExit(f"--fresh_frac {self.fresh_frac}: must be in (0, 1]")
        if not 0 < self.value_top_frac <= 1:
            raise SystemExit(f"--value_top_frac {self.value_top_frac}: must be in (0, 1]")
        if not 0 < self.forget <= 1:
            raise SystemExit(f"--forget {self.forget}: must be in (0, 1] (1 = no forgetting)")
        if self.prior_tau <= 0 or self.child_sigma <= 0:
            raise SystemExit("--prior_tau and --child_sigma must be > 0")
        if self.gibbs_sweeps < 1 or self.pg_terms < 1:
            raise SystemExit("--gibbs_sweeps and --pg_terms must be >= 1")
        if self.pool_capacity < 2 * self.prompts_per_step:
            raise SystemExit(f"--pool_capacity {self.pool_capacity}: must be >= 2 x --prompts_per_step")


# ----------------------------------------------------------------------------------------------------
# [PROS] Augmented query construction (Section 3)
# ----------------------------------------------------------------------------------------------------

def choose_cut(entropy: np.ndarray, values: np.ndarray | None, inherited: int, length: int,
               value_top_frac: float = 0.1) -> int | None:
    """[PROS] Sec. 3: the cut t* for one correct response of `length` tokens (stop token excluded).

    `entropy` / `values` hold one entry per *continuation* token: entry j is response position inherited + j
    (the first `inherited` tokens are the node's own prefix, never re-scored). Candidates: the window
    [max(inherited, ⌊T/4⌋), ⌊3T/4⌋); with values, only its top ⌈value_top_frac·|window|⌉ positions by V(s_t);
    t* = the entropy argmax among them (first on ties). None when the window is empty (no child).
    """
    lo, hi = max(inherited, length // 4), (3 * length) // 4
    if hi <= lo:
        return None
    cand = np.arange(lo, hi)
    ent = np.asarray(entropy, dtype=np.float64)[cand - inherited]
    if values is not None:
        keep = max(1, math.ceil(value_top_frac * len(cand)))
        top = np.argsort(-np.asarray(values, dtype=np.float64)[cand - inherited], kind="stable")[:keep]
        top.sort()
        cand, ent = cand[top], ent[top]
    return int(cand[int(np.argmax(ent))])


def child_candidates(prefix: tuple, continuations: list[list[int]], correct: list[bool], entropies: list,
                     values: list | None, stop_ids: set[int], value_top_frac: float) -> list[tuple[int, ...]]:
    """[PROS] Sec. 3: one group's candidate child prefixes y[:t*], best (highest entropy at t*) first, distinct.

    y = prefix + continuation is the full response (a child of a child is cut from its full response, so its
    prefix extends the inherited one and it attaches to the same root). The caller adds the first candidate not
    already in the pool: one child per group per iteration.
    """
    scored = []
    for i, cont in enumerate(continuations):
        if not correct[i]:
            continue
        full = list(prefix) + list(cont)
        length = len(full) - (1 if full and full[-1] in stop_ids else 0)
        t = choose_cut(entropies[i], None if values is None else values[i], len(prefix), length, value_top_frac)
        if t is not None and t > len(prefix):  # a cut at the inherited length would reproduce the node itself
            scored.append((-float(entropies[i][t - len(prefix)]), i, tuple(full[:t])))
    out: list[tuple[int, ...]] = []
    for _, _, p in sorted(scored):
        if p not in out:
            out.append(p)
    return out


# ----------------------------------------------------------------------------------------------------
# [PROS] The two-layer query tree with its pass-rate model (Section 4)
# ----------------------------------------------------------------------------------------------------

class QueryTree:
    """[PROS] Roots are original prompts (prefix ()), children are augmented queries (pid, prefix) whose
    parent is their root. Per node: discounted successes s and trials n, the Gibbs state ψ, and θ̂ (the mean
    of σ(ψ) over the last iteration's sweeps). Identical on every rank (updated from gathered data only)."""

    ARRAYS = ("pid", "parent", "s", "n", "psi", "theta_hat", "last")

    def __init__(self, state: dict | None = None):
        state = state or {}
        self.pid = np.asarray(state.get("pid", []), dtype=np.int64)
        self.parent = np.asarray(state.get("parent", []), dtype=np.int64)  # -1 for a root
        self.s = np.asarray(state.get("s", []), dtype=np.float64)
        self.n = np.asarray(state.get("n", []), dtype=np.float64)
        self.psi = np.asarray(state.get("psi", []), dtype=np.float64)
        self.theta_hat = np.asarray(state.get("theta_hat", []), dtype=np.float64)
        self.last = np.asarray(state.get("last", []), dtype=np.int64)  # iteration of the last observation
        self.prefix: list[tuple[int, ...]] = [tuple(p) for p in state.get("prefix", [])]
        self.index = {(int(p), q): i for i, (p, q) in enumerate(zip(self.pid, self.prefix))}

    def __len__(self) -> int:
        return len(self.prefix)

    def state_dict(self) -> dict:
        return {**{a: getattr(self, a).copy() for a in self.ARRAYS}, "prefix": list(self.prefix)}

    def add(self, pid: int, prefix: tuple, step: int, mu0: float) -> int:
        """Node id of (pid, prefix), created if new: a root starts at ψ = μ0, a child at its root's ψ."""
        key = (int(pid), tuple(prefix))
        if key in self.index:
            return self.index[key]
        parent = -1 if not prefix else self.index[(int(pid), ())]
        psi0 = mu0 if parent < 0 else self.psi[parent]
        self.pid = np.append(self.pid, pid)
        self.parent = np.append(self.parent, parent)
        self.s, self.n = np.append(self.s, 0.0), np.append(self.n, 0.0)
        self.psi = np.append(self.psi, psi0)
        self.theta_hat = np.append(self.theta_hat, 1 / (1 + math.exp(-psi0)))
        self.last = np.append(self.last, step)
        self.prefix.append(key[1])
        self.index[key] = len(self.prefix) - 1
        return self.index[key]

    def observe(self, nodes: list[int], succ: list[float], trials: list[float], forget: float, step: int) -> None:
        """Sec. 4 exponential forgetting: s, n <- λ s, λ n for every node, then add this iteration's counts."""
        self.s, self.n = update_counts(self.s, self.n, nodes, succ, trials, forget)
        self.last[np.asarray(nodes, dtype=np.int64)] = step

    def evict(self, capacity: int) -> int:
        """Drop least recently observed nodes until len <= capacity (module doc); returns how many went."""
        num = len(self)
        if num <= capacity:
            return 0
        is_root = self.parent < 0
        recency = self.last.copy()
        ch = np.flatnonzero(~is_root)
        np.maximum.at(recency, self.parent[ch], self.last[ch])  # a root is as recent as its latest child
        order = np.lexsort((np.arange(num), is_root, recency))  # oldest first; children first on ties
        gone = np.zeros(num, dtype=bool)
        left = num
        for i in order:
            if left <= capacity:
                break
            if gone[i]:
                continue
            drop = np.flatnonzero((self.parent == i) & ~gone) if is_root[i] else np.zeros(0, dtype=np.int64)
            gone[i] = True
            gone[drop] = True
            left -= 1 + len(drop)
        keep = ~gone
        new_id = np.cumsum(keep) - 1
        parent = np.where(self.parent[keep] >= 0, new_id[np.maximum(self.parent[keep], 0)], -1)
        for a in self.ARRAYS:
            setattr(self, a, getattr(self, a)[keep])
        self.parent = parent
        self.prefix = [p for p, k in zip(self.prefix, keep) if k]
        self.index = {(int(p), q): i for i, (p, q) in enumerate(zip(self.pid, self.prefix))}
        return int(gone.sum())

    def gibbs(self, args, rng: np.random.Generator) -> None:
        """Sec. 4, Props. 4.1/4.2: `gibbs_sweeps` PG-augmented sweeps over the whole tree, warm-started."""
        if len(self):
            self.psi, self.theta_hat = gibbs_sweeps(self.psi, self.parent, self.s, self.n, args.prior_mu,
                                                    args.prior_tau, args.child_sigma, args.gibbs_sweeps, rng,
                                                    args.pg_terms)


def select_nodes(theta: np.ndarray, pid: np.ndarray, count: int, exclude: set[int], mode: str,
                 rng: np.random.Generator) -> list[int]:
    """[PROS] Sec. 4: up to `count` nodes, the ones with θ̃ nearest 0.5 first (`random`: a uniform order),
    at most one node per root, none whose root is in `exclude` (already in the batch)."""
    if count <= 0 or len(theta) == 0:
        return []
    order = np.argsort(np.abs(theta - 0.5), kind="stable") if mode == "bayes" else rng.permutation(len(theta))
    _, first = np.unique(pid[order], return_index=True)  # each root's best node
    best = order[np.sort(first)]
    return [int(i) for i in best if int(pid[i]) not in exclude][:count]


# ----------------------------------------------------------------------------------------------------
# PPO pieces
# ----------------------------------------------------------------------------------------------------

def value_loss(v: torch.Tensor, v_old: torch.Tensor, returns: torch.Tensor, clip: float) -> torch.Tensor:
    """Per-token clipped value loss 0.5·max((V - R)², (V_old + clip(V - V_old, ±c) - R)²) (PPO)."""
    v_clipped = v_old + (v - v_old).clamp(-clip, clip)
    return 0.5 * torch.max((v - returns) ** 2, (v_clipped - returns) ** 2)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    n = mask.sum().clamp(min=1)
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / n
    return (x - mean) / (var.sqrt() + eps) * mask


@torch.no_grad()
def score_rollouts(run, critic, prompts, completions, temperature: float) -> dict[str, torch.Tensor]:
    """One no-grad pass: old log-probs and entropies (policy), values (critic), reference log-probs (KL), all
    as right-aligned [N, Rmax] tensors with the completion mask. PROS reads t* from these same entropies."""
    args, dev = run.args, run.acc.device
    n, rmax = len(prompts), max([1] + [len(c) for c in completions])
    names = ["logp", "ent", "mask"] + (["value"] if critic is not None else []) + (["ref"] if run.ref is not None else [])
    out = {k: torch.zeros(n, rmax) for k in names}
    for s in range(0, n, args.micro_batch_size):
        rows = slice(s, min(n, s + args.micro_batch_size))
        batch = pad_sequences(prompts[rows], completions[rows], run.tokenizer.pad_token_id).to(dev)
        r = batch.completion_width
        lp, ent = token_logprobs(run.policy, batch, temperature)
        out["logp"][rows, rmax - r:], out["ent"][rows, rmax - r:] = lp.cpu(), ent.cpu()
        out["mask"][rows, rmax - r:] = batch.loss_mask.cpu()
        if critic is not None:
            out["value"][rows, rmax - r:] = critic(batch).cpu()
        if run.ref is not None:
            out["ref"][rows, rmax - r:] = token_logprobs(run.ref, batch, temperature)[0].cpu()
    for k in names:
        if k != "mask":
            out[k] *= out["mask"]
    return out


def main(args: Args) -> None:
    run = start_run(args, "pros_ppo", need_ref=args.kl_coef > 0)
    acc, tokenizer, task, k, dev = run.acc, run.tokenizer, run.task, args.k, run.acc.device
    temp = args.temperature if args.temperature > 0 else 1.0
    stop_ids = {tokenizer.eos_token_id}
    ms = run.method_state

    # Critic (PPO only): a copy of the policy's backbone + scalar head, its own optimizer; state in method_state
    critic = critic_opt = None
    if args.adv == "gae":
        critic = build_value_model(run.policy, args.critic_model_name_or_path).to(dev)
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=args.critic_lr, weight_decay=0.0)
        if "critic" in ms:
            critic.load_state_dict(ms["critic"])
            critic_opt.load_state_dict(ms["critic_opt"])
        critic, critic_opt = acc.prepare(critic, critic_opt)
    critic_u = acc.unwrap_model(critic) if critic is not None else None

    # [PROS] the query tree and the Gibbs/selection RNG (same seed on every rank: identical pools)
    pros = args.pros != "off"
    tree = QueryTree(ms.get("tree"))
    rng = np.random.default_rng(args.seed)
    if "rng" in ms:
        rng.bit_generator.state = ms["rng"]

    for step in range(run.start_step + 1, args.max_steps + 1):
        t0 = time.time()
        P = args.prompts_per_step
        # ---- choose the batch: (pid, prefix, node) per query, identical on every rank ----
        n_stream = math.ceil(args.fresh_frac * P) if pros else P
        stream = run.sampler.next_ids(n_stream)
        picked: list[int] = []
        if pros:  # [PROS] Sec. 4: the rest of the batch from the pool, by |θ̃ - 0.5| (θ̃ = σ(current Gibbs ψ) by default)
            theta_tilde = 1 / (1 + np.exp(-tree.psi)) if args.select_by == "draw" else tree.theta_hat
            picked = select_nodes(theta_tilde, tree.pid, P - n_stream, set(stream), args.pros, rng)
            used, tries = set(stream) | {int(tree.pid[i]) for i in picked}, 0
            while len(stream) + len(picked) < P:  # pool too small (early on): top up from the stream
                pid = run.sampler.next_ids(1)[0]
                tries += 1
                if pid not in used or tries > len(task.train):
                    stream.append(pid)
                    used.add(pid)
        items = [(pid, (), -1) for pid in stream] + [(int(tree.pid[i]), tree.prefix[i], i) for i in picked]
        if pros:  # [PROS] stream prompts become roots of the tree (no-op if already there)
            items = [(pid, pre, tree.add(pid, pre, step, args.prior_mu) if node < 0 else node)
                     for pid, pre, node in items]
        theta_sel = [float(tree.theta_hat[node]) if pros else float("nan") for _, _, node in items]
        from_pool = [j >= len(stream) for j in range(len(items))]

        # ---- sample: K continuations of each of this rank's queries (q + prefix: the prefix is prompt) ----
        mine = my_slice(list(range(len(items))), acc)
        queries = [run.encode(task.train[items[j][0]].prompt) + list(items[j][1]) for j in mine]
        gens = run.generator.generate(queries, k, replace(run.sampling, logprobs=False))  # old log-probs: score_rollouts
        t_gen = time.time() - t0
        completions = [list(c) for c in gens.completion_ids]
        prompts = [q for q in queries for _ in range(k)]

        # ---- verify: the reward reads prefix + continuation (PROS Sec. 3) ----
        texts = tokenizer.batch_decode([list(items[mine[i // k]][1]) + c for i, c in enumerate(completions)],
                                       skip_special_tokens=True)
        rewards = torch.tensor([task.reward_fn(t, task.train[items[mine[i // k]][0]]) for i, t in enumerate(texts)],
                               dtype=torch.float32).view(-1, k)
        correct = rewards >= args.success_reward

        # ---- old log-probs, entropies, values: one no-grad pass; then advantages ----
        t1 = time.time()
        sc = score_rollouts(run, critic_u, prompts, completions, temp)
        mask = sc["mask"]
        if args.adv == "gae":  # outcome reward on the last token (right-aligned: the last column), token-level GAE
            tok_rewards = torch.zeros_like(mask)
            tok_rewards[:, -1] = rewards.flatten()
            adv, returns = gae_advantages(tok_rewards, sc["value"], mask, args.gamma, args.gae_lambda)
            if args.whiten_advantages:
                adv = masked_whiten(adv, mask)
        else:  # GRPO: group-normalised outcome advantage on every token of the rollout
            adv = grpo_advantages(rewards).flatten()[:, None] * mask
            returns = None

        # ---- update: ppo_epochs x num_minibatches clipped steps (policy; critic alongside) ----
        n_roll = len(completions)
        stats = {"pol_loss": [], "clip_frac": [], "v_loss": [], "kl_sum": 0.0}
        for epoch in range(args.ppo_epochs):
            perm = torch.randperm(n_roll).tolist()
            for m in range(args.num_minibatches):
                ids = perm[m * n_roll // args.num_minibatches:(m + 1) * n_roll // args.num_minibatches]
                mb_tok = max(1.0, float(mask[ids].sum()))

                def pol_loss_fn(batch, logp, ent, rows):
                    g, r = [ids[x] for x in rows], batch.completion_width
                    msk = batch.loss_mask
                    old, a = sc["logp"][g, -r:].to(dev), adv[g, -r:].to(dev)
                    per_tok, clipped = clipped_surrogate(logp, old, a, args.clip_low, args.clip_high)
                    loss = (per_tok * msk).sum() / mb_tok
                    mt = {"loss": loss.item(), "clipped": (clipped * msk).sum().item()}
                    if run.ref is not None:
                        kl = kl_k3(logp, sc["ref"][g, -r:].to(dev)) * msk
                        loss = loss + args.kl_coef * kl.sum() / mb_tok
                        mt["kl_sum"] = kl.sum().item()
                    return loss, mt

                sums = accumulate_gradients(run.model, acc, [prompts[i] for i in ids], [completions[i] for i in ids],
                                            tokenizer.pad_token_id, args.micro_batch_size, pol_loss_fn,
                                            temperature=temp)
                optimizer_step(run)
                stats["pol_loss"].append(sums.get("loss", 0.0))
                stats["clip_frac"].append(sums.get("clipped", 0.0) / mb_tok)
                if epoch == 0:
                    stats["kl_sum"] += sums.get("kl_sum", 0.0)
                if critic is not None:
                    def val_loss_fn(batch, v, rows):
                        g, r = [ids[x] for x in rows], batch.completion_width
                        vl = value_loss(v, sc["value"][g, -r:].to(dev), returns[g, -r:].to(dev), args.vf_clip)
                        loss = (vl * batch.loss_mask).sum() / mb_tok
                        return loss, {"loss": loss.item()}

                    vs = accumulate_value_gradients(critic, acc, [prompts[i] for i in ids],
                                                    [completions[i] for i in ids], tokenizer.pad_token_id,
                                                    args.micro_batch_size, val_loss_fn)
                    acc.clip_grad_norm_(critic.parameters(), args.max_grad_norm)
                    critic_opt.step()
                    critic_opt.zero_grad(set_to_none=True)
                    stats["v_loss"].append(vs.get("loss", 0.0))
        t_train = time.time() - t1

        # ---- [PROS] per-query outcomes and child candidates (Sec. 3), gathered so every rank updates the same tree ----
        recs = []
        for gi, j in enumerate(mine):
            prefix = items[j][1]
            cands = []
            if pros and bool(correct[gi].any()):
                rows = range(gi * k, (gi + 1) * k)
                ents = [sc["ent"][i, mask.shape[1] - len(completions[i]):].numpy() for i in rows]
                vals = None if critic is None else [sc["value"][i, mask.shape[1] - len(completions[i]):].numpy()
                                                    for i in rows]
                cands = child_candidates(prefix, [completions[i] for i in rows], correct[gi].tolist(), ents, vals,
                                         stop_ids, args.value_top_frac)
            recs.append((j, float(correct[gi].sum()), cands))
        if acc.num_processes > 1:
            recs = gather_object(recs)
        recs.sort()

        # ---- [PROS] update the tree: forget + observe (Sec. 4), add one child per group (Sec. 3), evict, Gibbs ----
        created = 0
        t_g = 0.0
        if pros:
            tree.observe([items[j][2] for j, _, _ in recs], [s for _, s, _ in recs], [k] * len(recs),
                         args.forget, step)
            for j, _, cands in recs:
                new = next((c for c in cands if (items[j][0], c) not in tree.index), None)
                if new is not None:
                    tree.add(items[j][0], new, step, args.prior_mu)
                    created += 1
            tree.evict(args.pool_capacity)
            t_g0 = time.time()
            tree.gibbs(args, rng)
            t_g = time.time() - t_g0

        # ---- log ----
        row, x = core_metrics(run, step, {
            "groups": len(mine), "rollouts": n_roll, "gen_tokens": sum(map(len, completions)),
            "reward_sum": float(rewards.sum()), "rewarded": rewards.numel(), "success": float(correct.sum()),
            "zero_var": float(zero_variance(rewards).sum()),
            "loss_sum": float(np.mean(stats["pol_loss"])) * n_roll, "seqs": n_roll, "kl_sum": stats["kl_sum"],
            "ent_sum": float((sc["ent"] * mask).sum()), "tok": float(mask.sum()), "t_gen": t_gen, "t_train": t_train,
        }, extra={"clip_frac": float(np.mean(stats["clip_frac"])) * n_roll,
                  "v_loss": float(np.mean(stats["v_loss"])) * n_roll if stats["v_loss"] else 0.0})
        row["ppo_clip_frac"] = x["clip_frac"] / max(1, x["rollouts"])
        if critic is not None:
            row["ppo_value_loss"] = x["v_loss"] / max(1, x["rollouts"])
        if pros:  # [PROS] mechanism metrics (from gathered records: the same on every rank)
            child_lens = [len(items[j][1]) for j in range(len(items)) if items[j][1]]
            calib = [abs(theta_sel[j] - s / k) for j, s, _ in recs if from_pool[j]]
            row.update({
                "pros_pool_size": len(tree), "pros_pool_children": int((tree.parent >= 0).sum()),
                "pros_frac_children_in_batch": len(child_lens) / max(1, len(items)),
                "pros_prefix_len_mean": float(np.mean(child_lens)) if child_lens else None,
                "pros_saved_prompt_tokens": int(sum(child_lens) * k),  # prefix tokens not regenerated
                "pros_children_created": created,
                "pros_calib_error": float(np.mean(calib)) if calib else None,  # |θ̂ - observed pass rate|, pool picks
                "pros_gibbs_s": t_g,
            })
        state = {"tree": tree.state_dict(), "rng": rng.bit_generator.state}
        if critic is not None:
            state.update(critic=critic_u.state_dict(), critic_opt=critic_opt.state_dict())
        finish_step(run, step, row, t0, state)


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
