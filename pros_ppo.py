"""PROS (prefix reuse for on-policy sampling) on PPO, one file; `--adv grpo` runs it on GRPO instead.

Paper: "PROS: Towards Compute-Efficient RLVR via Rollout Prefix Reuse", ICLR 2026 (OpenReview lz1SRTcnUb).

The base is PPO for LLMs: a critic (the policy's backbone copied, plus a scalar head: `ValueModel`),
token-level GAE with the outcome reward on the last token, clipped policy and value losses, several epochs over
minibatches. PROS is a plug-in that changes only *which queries* are trained on:
  1. Augmented queries (Sec. 3): for every correct rollout y (T tokens, the first L inherited from the node's
     prefix) cut at t* = argmax of the policy's token entropy within [max(L, ⌈T/4⌉), ⌈3T/4⌉); with a critic, only
     among the top ⌈10%·(T - L)⌉ of the scored positions L..T-1 by value (none in the window: the window positions
     of highest value). Each distinct new q' = q + y[:t*] joins a two-layer tree as a child of q's root. A child is
     generated from q + prefix; only the continuation is trained (the prefix is part of the prompt, so it gets no
     gradient and no credit); its reward is scored on prefix + continuation.
  2. Hierarchical Bayesian selection (Sec. 4): θ = σ(ψ), ψ_root ~ N(μ0, τ0²), ψ_child ~ N(ψ_root, σ²), counts
     with exponential forgetting, Pólya-Gamma Gibbs sweeps (common/rl/gibbs.py); the batch takes the nodes whose
     current Gibbs draw θ̃ is nearest 0.5, at most one node per root.
[PROS] lines are the plug-in; `--pros off` (vanilla PPO / GRPO) runs none but no-ops marked "(also in PPO / GRPO)".
Departures from the paper (docs/pros_ppo.md says why): ⌈fresh_frac·P⌉ queries per batch from the data stream, the
rest from the pool; the pool is bounded (--pool_capacity); one node per root per batch; Bernoulli rewards.

    python pros_ppo.py                         # PPO + PROS on the embedded Countdown default (CPU, minutes)
    python pros_ppo.py --pros off              # vanilla PPO (+ --adv grpo: vanilla GRPO; --adv grpo alone: GRPO + PROS)
    python pros_ppo.py --pros random           # ablation: prefix reuse + random selection
"""
from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass
from typing import Annotated, Literal, Optional

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from common.run import checkpoint
from common.rl.advantages import grpo_advantages, zero_variance
from common.run.flags import BaseArgs, Range
from common.run.flags import parse_args
from common.tasks.loading import PromptEncoder, PromptSampler
from common.tasks.scoring import reward_moments, reward_sums
from common.distributed.ranks import GracefulStop, collective_timeout, end_processes, gather_list, gathered, micro_batches, my_slice, reduce_sums
from common.generation.hf import HFGenerator, SamplingConfig, end_token_ids
from common.rl.gibbs import calibration_excess, gibbs_sweeps, update_counts
from common.run.launch import CpuThreads, resolve_accelerate_precision, resolve_accelerate_sharding
from common.rl.logprobs import token_logprobs
from common.rl.losses import clipped_surrogate, kl_k3
from common.rl.masking import pad_sequences, right_align
from common.run.logs import MetricsLogger, SampleLogger, check_tracker
from common.tasks.evaluation import evaluate, evaluate_train_prompts, train_prompt_sample
from common.run.output_dir import claim_output_dir
from common.model.policy import autocast, frozen_reference, library_bars_off, load_policy
from common.run.summary import run_summary
from common.tasks.task import make_task


@dataclass
class Args(BaseArgs):
    max_steps: Annotated[int, Range(1)] = 200
    """number of iterations (each: one batch of queries, then ppo_epochs x num_minibatches updates)"""
    num_generations: Annotated[int, Range(2)] = 4
    """rollouts per query (group size; GRPO's baseline and PROS's per-node pass-rate observations need >= 2)"""
    adv: Literal["gae", "grpo"] = "gae"
    """advantage estimator: token-level GAE with a learned critic (PPO), or critic-free group-normalised GRPO"""
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
    """policy ratio clip 1 - clip_low"""
    epsilon_high: Annotated[float, Range(0, lo_open=True)] = 0.2
    """policy ratio clip 1 + clip_high (vanilla PPO: symmetric)"""
    cliprange_value: Annotated[float, Range(0, lo_open=True)] = 0.2
    """value clip: V is kept within ±vf_clip of its old prediction in the clipped value loss"""
    critic_lr: Annotated[float, Range(0)] = 5e-4
    """critic AdamW learning rate (constant)"""
    critic_model_name_or_path: Optional[str] = None
    """critic backbone; default (None): a copy of the policy's backbone + a zero-initialised scalar head"""
    beta: Annotated[float, Range(0, zero="off, no reference model")] = 0.0
    """per-token k3 KL penalty to the initial policy, added to the policy loss"""
    pros: Literal["bayes", "random", "off"] = "bayes"
    """[PROS] bayes: prefix reuse + hierarchical Bayesian selection (paper); random: uniform selection; off: no PROS"""
    select_by: Literal["draw", "mean"] = "draw"
    """[PROS] θ̃ ranked by |θ̃ - 0.5|: the current Gibbs draw σ(ψ) (Thompson-style) or θ̂ (mean over last sweeps)"""
    fresh_frac: Annotated[float, Range(0, 1, lo_open=True)] = 0.5
    """[PROS] fraction of each batch from the data stream (never-seen prompts enter this way); the rest: the pool"""
    value_top_frac: Annotated[float, Range(0, 1, lo_open=True)] = 0.1
    """[PROS] with a critic, t* is sought among the window positions in the top ⌈this·(T - L)⌉ by value (choose_cut)"""
    max_children_per_group: Annotated[int, Range(0, zero="no cap")] = 0
    """[PROS] cap on new children added per group per iteration (the paper: none, one per correct rollout)"""
    forget: Annotated[float, Range(0, 1, lo_open=True)] = 0.95
    """[PROS] forgetting λ: counts s, n are multiplied by λ before new observations are added (which: --forget_on)"""
    forget_on: Literal["iteration", "visit"] = "iteration"
    """[PROS] `iteration`: every node's counts decay once per iteration (they go stale as the policy moves, visited
    or not); `visit`: only the counts of nodes observed now (docs/pros_ppo.md)"""
    prior_mu: Annotated[float, Range()] = 0.0
    """[PROS] μ0: prior mean of a root's log-odds ψ_root"""
    prior_tau: Annotated[float, Range(0, lo_open=True)] = 2.0
    """[PROS] τ0: prior std of ψ_root"""
    child_sigma: Annotated[float, Range(0, lo_open=True)] = 1.0
    """[PROS] σ: std of a child's log-odds around its root's, ψ_child ~ N(ψ_root, σ²)"""
    gibbs_sweeps: Annotated[int, Range(1)] = 10
    """[PROS] Gibbs sweeps per iteration (warm-started from the previous iteration's state)"""
    pg_terms: Annotated[int, Range(1)] = 8
    """[PROS] exact Gamma terms in each Pólya-Gamma draw; the remainder is one Gamma with its exact mean and variance"""
    pool_capacity: Annotated[int, Range(2)] = 10000
    """[PROS] maximum number of nodes (roots + children) in the pool; least recently observed are evicted"""

    def validate(self) -> None:  # single values: their declarations (common/run/flags.py); here, combinations
        if self.pool_capacity < 2 * self.prompts_per_step:
            raise SystemExit(f"--pool_capacity {self.pool_capacity}: must be >= 2 x --prompts_per_step")


# ---------------- [PROS] Augmented query construction (Section 3) ----------------

def choose_cut(entropy: np.ndarray, values: np.ndarray | None, inherited: int, length: int,
               value_top_frac: float = 0.1) -> int | None:
    """[PROS] Sec. 3: the cut t* for one correct response of `length` = T tokens (stop token excluded). `entropy` /
    `values` hold one entry per *continuation* token: entry j is response position L + j, L = `inherited` (the node's
    own prefix, never re-scored). Window: the paper's t ∈ [T/4, 3T/4) on reals, t >= L: [max(L, ⌈T/4⌉), ⌈3T/4⌉) (T = 9:
    {3..6}); None when empty (no child). With values, the candidates are the window positions among the top
    ⌈value_top_frac·(T - L)⌉ of the scored positions L..T-1 by V(s_t) (the paper's top 10% of timesteps; ties at the
    threshold kept); if none lies in the window, the window positions of highest value (the length constraint stays
    hard, the value one is relaxed just enough). t* = the entropy argmax among the candidates (first on ties)."""
    low, high = max(inherited, -(-length // 4)), -(-3 * length // 4)  # ceilings: T/4 <= t < 3T/4
    if high <= low:
        return None
    positions = np.arange(low, high)
    if values is not None:
        scored = np.asarray(values, dtype=np.float64)[:length - inherited]  # positions L..T-1 (high <= T)
        threshold = -np.sort(-scored)[max(1, math.ceil(round(value_top_frac * len(scored), 9))) - 1]
        window_values = scored[positions - inherited]
        top = window_values >= threshold
        positions = positions[top if top.any() else window_values == window_values.max()]
    return int(positions[int(np.argmax(np.asarray(entropy, dtype=np.float64)[positions - inherited]))])


def child_candidates(prefix: tuple, continuations: list[list[int]], correct: list[bool], entropies: list,
                     values: list | None, stop_ids: set[int], value_top_frac: float) -> list[tuple[int, ...]]:
    """[PROS] Sec. 3: one group's candidate child prefixes y[:t*], one per correct rollout cut past the node's own
    prefix, best (highest entropy at t*) first, distinct. y = prefix + continuation (a child of a child is cut from
    its full response and attaches to the same root); the caller adds the new ones (`QueryTree.add_children`)."""
    scored = []
    for i in [i for i, ok in enumerate(correct) if ok]:
        full = list(prefix) + list(continuations[i])
        length = len(full) - (1 if full and full[-1] in stop_ids else 0)
        cut = choose_cut(entropies[i], None if values is None else values[i], len(prefix), length, value_top_frac)
        if cut is not None and cut > len(prefix):  # a cut at the inherited length would reproduce the node itself
            scored.append((-float(entropies[i][cut - len(prefix)]), i, tuple(full[:cut])))
    return list(dict.fromkeys(child_prefix for _, _, child_prefix in sorted(scored)))  # distinct, best first


# ---------------- [PROS] The two-layer query tree with its pass-rate model, and selection (Section 4) ----------------

class QueryTree:
    """[PROS] (also in PPO / GRPO: built and checkpointed, empty) Roots are original prompts (prefix ()), children are
    augmented queries (pid, prefix) whose parent is their root. Per node: discounted successes s and trials n, the
    Gibbs state ψ, and θ̂ (the mean of σ(ψ) over the last iteration's sweeps). Identical on every rank (updated from
    gathered data only)."""

    ARRAYS = ("pid", "parent", "s", "n", "psi", "theta_hat", "last")  # parent: -1 for a root; last: latest observed
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
        return {**{name: getattr(self, name).copy() for name in self.ARRAYS}, "prefix": list(self.prefix)}

    def add(self, pid: int, prefix: tuple, step: int, mu0: float) -> int:
        """Node id of (pid, prefix), created if new: a root starts at ψ = μ0, a child at its root's ψ."""
        key = (int(pid), tuple(prefix))
        if key in self.index:
            return self.index[key]
        parent = -1 if not prefix else self.index[(int(pid), ())]
        psi0 = mu0 if parent < 0 else self.psi[parent]
        for name, value in zip(self.ARRAYS, (pid, parent, 0.0, 0.0, psi0, 1 / (1 + math.exp(-psi0)), step)):
            setattr(self, name, np.append(getattr(self, name), value))
        self.prefix.append(key[1])
        self.index[key] = len(self.prefix) - 1
        return self.index[key]

    def add_children(self, pid: int, prefixes: list[tuple], step: int, mu0: float, cap: int = 0) -> int:
        """Sec. 3: new prefixes become children of root pid, at most `cap` (0 = all, the paper); returns how many."""
        new = [p for p in prefixes if (int(pid), tuple(p)) not in self.index][:cap or None]
        for prefix in new:
            self.add(pid, prefix, step, mu0)
        return len(new)

    def observe(self, nodes: list, succ: list, trials: list, forget: float, step: int, forget_on: str) -> None:
        """Sec. 4 forgetting, s, n <- λ s, λ n (`forget_on`: every node or the observed ones), then the new counts."""
        self.s, self.n = update_counts(self.s, self.n, nodes, succ, trials, forget, forget_on)
        self.last[np.asarray(nodes, dtype=np.int64)] = step

    def evict(self, capacity: int) -> int:
        """Drop least recently observed nodes until len <= capacity (module doc); returns how many went."""
        num = len(self)
        if num <= capacity:
            return 0
        is_root, recency = self.parent < 0, self.last.copy()
        children = np.flatnonzero(~is_root)
        np.maximum.at(recency, self.parent[children], self.last[children])  # a root is as recent as its latest child
        order = np.lexsort((np.arange(num), is_root, recency))  # oldest first; children first on ties
        gone, left = np.zeros(num, dtype=bool), num
        for i in order:
            if left <= capacity:
                break
            if gone[i]:
                continue
            drop = np.flatnonzero((self.parent == i) & ~gone) if is_root[i] else np.zeros(0, dtype=np.int64)
            gone[i] = gone[drop] = True
            left -= 1 + len(drop)
        keep, new_id = ~gone, np.cumsum(~gone) - 1
        for name in self.ARRAYS:
            setattr(self, name, getattr(self, name)[keep])
        self.parent = np.where(self.parent >= 0, new_id[np.maximum(self.parent, 0)], -1)  # ids re-numbered
        self.prefix = [p for p, kept in zip(self.prefix, keep) if kept]
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


def choose_batch(tree: QueryTree, sampler: PromptSampler, args: Args, step: int, rng: np.random.Generator,
                 num_train: int) -> tuple[list[tuple[int, tuple, int]], int]:
    """[PROS] The iteration's queries as (prompt id, prefix, tree node), the same on every rank, and how many
    came from the stream (they come first). ⌈fresh_frac·P⌉ from the stream, the rest from the pool by
    |θ̃ - 0.5|; while the pool is short the stream tops up (skipping prompts already in the batch unless the
    whole training set was tried). Stream prompts become roots of the tree (no-op if already there)."""
    stream = sampler.next_ids(math.ceil(args.fresh_frac * args.prompts_per_step))
    theta_tilde = 1 / (1 + np.exp(-tree.psi)) if args.select_by == "draw" else tree.theta_hat
    picked = select_nodes(theta_tilde, tree.pid, args.prompts_per_step - len(stream), set(stream), args.pros, rng)
    used, tries = set(stream) | {int(tree.pid[node]) for node in picked}, 0
    while len(stream) + len(picked) < args.prompts_per_step:
        prompt_id = sampler.next_ids(1)[0]
        tries += 1
        if prompt_id not in used or tries > num_train:
            stream.append(prompt_id)
            used.add(prompt_id)
    queries = [(prompt_id, (), tree.add(prompt_id, (), step, args.prior_mu)) for prompt_id in stream]
    return queries + [(int(tree.pid[node]), tree.prefix[node], node) for node in picked], len(stream)


# ---------------- PPO pieces ----------------

class ValueModel(torch.nn.Module):
    """PPO's critic: a transformers backbone + a scalar head. Column j of the [B, R] output is V(s) of the state
    that predicts completion token j (the hidden state one position earlier), aligned with `token_logprobs`."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        # skip_init: no draw from the global RNG (resume must replay the same random stream), then V ≡ 0
        self.head = torch.nn.utils.skip_init(torch.nn.Linear, hidden_size, 1, dtype=next(backbone.parameters()).dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, batch) -> torch.Tensor:
        hidden = self.backbone(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               position_ids=batch.position_ids, use_cache=False).last_hidden_state
        return self.head(batch.completion_states(hidden)).squeeze(-1).float()  # padded or packed (--padding_free)


def build_value_model(policy, path: str | None = None) -> ValueModel:
    """Critic = an fp32 copy (master weights) of the policy's backbone (with LoRA: the adapted one, trained in full) or
    the backbone at `path` (same tokenizer: then no copy of the policy is needed), + a zero-initialised head."""
    if path:
        from transformers import AutoModel
        try:
            with torch.random.fork_rng(devices=[]), library_bars_off():  # the RNG untouched (exact resume); no bar
                backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
        except OSError as e:
            raise SystemExit(f"--critic_model_name_or_path {path!r}: cannot load ({e})")
        if backbone.config.vocab_size != policy.config.vocab_size:
            raise SystemExit(f"--critic_model_name_or_path {path!r}: vocab size {backbone.config.vocab_size} "
                             f"differs from the policy's {policy.config.vocab_size} (the critic reads policy tokens)")
    else:
        backbone = copy.deepcopy((policy.get_base_model() if hasattr(policy, "get_base_model") else policy).base_model)
        backbone.float()  # with LoRA + bf16 the frozen base was stored in bf16
    if policy.is_gradient_checkpointing:  # the critic follows the policy's --gradient_checkpointing
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    backbone.requires_grad_(True).train()
    return ValueModel(backbone, backbone.config.hidden_size)


@torch.no_grad()
def score_rollouts(policy, critic, ref_model, tokenizer, prompts: list[list[int]], completions: list[list[int]],
                   micro_batch_size: int, temperature: float, device, accelerator,
                   pack: int = 0, compiled=None) -> dict[str, torch.Tensor]:
    """One no-grad pass: old log-probs `logp` and entropies `ent` (policy), `value` (critic, if any), `ref` log-probs
    (reference, if any), all as right-aligned [N, Rmax] CPU tensors zeroed outside `mask`, the completion mask. PROS
    reads t* from these same entropies. Under --fsdp the models stay sharded (a layer is gathered only while it runs):
    `micro_batches` gives every rank the same number of passes. `compiled`: --torch_compile's (common/generation/compile.py)."""
    num, width = len(prompts), max([1] + [len(c) for c in completions])
    names = ["logp", "ent", "mask"] + ["value"] * (critic is not None) + ["ref"] * (ref_model is not None)
    out = {name: torch.zeros(num, width) for name in names}
    for chunk in micro_batches(num, micro_batch_size, accelerator, policy, peers=(critic, ref_model)):
        rows = slice(chunk[0], chunk[-1] + 1)
        batch = pad_sequences(prompts[rows], completions[rows], tokenizer.pad_token_id, pack_tokens=pack).to(device)
        cols = slice(width - batch.completion_width, width)
        logp, entropy = token_logprobs(policy, batch, temperature, compiled=compiled)
        out["logp"][rows, cols], out["ent"][rows, cols] = logp.cpu(), entropy.cpu()
        out["mask"][rows, cols] = batch.loss_mask.cpu()
        if critic is not None:
            out["value"][rows, cols] = critic(batch).cpu()
        if ref_model is not None:
            out["ref"][rows, cols] = token_logprobs(ref_model, batch, temperature, compiled=compiled)[0].cpu()
    return {name: value if name == "mask" else value * out["mask"] for name, value in out.items()}


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
                   lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level GAE (Schulman et al., 2016) over [B, R] tensors: (advantages, returns = advantages + values).

    δ_t = r_t + γ V_{t+1} - V_t,  A_t = δ_t + γλ A_{t+1}; the state after a row's last valid token is terminal
    (V = 0). Positions with mask 0 (padding, masked tokens) are skipped: they are not actions, carry nothing
    through, and get A = R = 0. Put rewards on valid positions (outcome reward: the last valid token).
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


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, accelerator=None, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit std over the masked entries; masked-out entries become 0. With `accelerator` the mean and std
    are those of the whole batch, every process's rows (its sums reduced over ranks), as one process computes them."""
    reduce = (lambda sums: reduce_sums(accelerator, sums)) if accelerator is not None else (lambda sums: sums)
    sums = reduce({"sum": float((values * mask).sum()), "count": float(mask.sum())})
    count = max(1.0, sums["count"])
    mean = sums["sum"] / count
    var = reduce({"sq": float((((values - mean) * mask) ** 2).sum())})["sq"] / count
    return (values - mean) / (math.sqrt(var) + eps) * mask


def value_loss(v: torch.Tensor, v_old: torch.Tensor, returns: torch.Tensor, clip: float) -> torch.Tensor:
    """Per-token clipped value loss 0.5·max((V - R)², (V_old + clip(V - V_old, ±c) - R)²) (PPO)."""
    v_clipped = v_old + (v - v_old).clamp(-clip, clip)
    return 0.5 * torch.max((v - returns) ** 2, (v_clipped - returns) ** 2)


def main(args: Args) -> None:
    # ---------------- set-up: accelerator, seeds, output dir ----------------
    args.fsdp, args.dtype = resolve_accelerate_sharding(args.fsdp), resolve_accelerate_precision(args.dtype)
    cpu_threads = CpuThreads(args.num_threads, hold=args.torch_compile)  # --num_threads, or free cores: launch.py
    torch.set_num_threads(cpu_threads.count(torch.get_num_threads(), settle=0.2))  # before any torch work
    check_tracker(args.report_to)
    args.output_dir = args.output_dir or f"runs/pros_ppo-seed{args.seed}"
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), project_dir=args.output_dir,
                              log_with=None if args.report_to == "none" else args.report_to,
                              kwargs_handlers=collective_timeout(args.collective_timeout))  # one line on expiry
    device, world = accelerator.device, accelerator.num_processes
    log = lambda msg: print(msg, flush=True) if accelerator.is_main_process else None  # noqa: E731  (once a run)
    rank_seed = args.seed + accelerator.process_index  # ranks sample different rollouts
    random.seed(rank_seed)
    np.random.seed(rank_seed)
    torch.manual_seed(rank_seed)
    claim_output_dir(args, accelerator, log)  # before any model: refuses a used or unshared folder

    # ---------------- policy, frozen reference, critic, optimizers ----------------
    model_path = args.model_name_or_path
    if model_path == "embedded":  # the tiny Countdown model: rank 0 builds it once, the others find it cached
        from common.demo.tiny_model import ensure_embedded_base
        with accelerator.main_process_first():
            model_path = str(ensure_embedded_base(log=log))
    policy, tokenizer = load_policy(model_path)  # fp32 master weights; --dtype is the compute dtype (autocast)
    policy.to(device).train()  # training mode: from_pretrained returns eval mode (checkpointing needs train)
    if args.gradient_checkpointing:  # activations recomputed in backward (training passes only; generate is eval)
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora_r:  # LoRA: only the adapters train (fp32); the frozen base is stored in the compute dtype
        from common.model.lora import AdaptersOff, add_lora
        policy = add_lora(policy, args.lora_r, args.lora_alpha, args.lora_target_modules, args.dtype)
    task = make_task(args, tokenizer, log)  # Countdown or a dataset; --reward_funcs: yours (docs/custom_task.md)
    ref_model = None if args.beta <= 0 else AdaptersOff(policy) if args.lora_r else \
        frozen_reference(policy, args.dtype, args.fsdp)  # KL reference: computes as the policy at step 0
    # PPO's critic: the policy's backbone copied + a zero scalar head (copied before any sharding)
    critic = build_value_model(policy, args.critic_model_name_or_path).to(device) if args.adv == "gae" else None
    if args.fsdp:  # FSDP2: each rank keeps 1/world of every weight (common/distributed/fsdp.py); the optimizers see the shards
        from common.distributed import fsdp
        policy, ref_model, critic = (net and fsdp.shard(net, args.dtype) for net in (policy, ref_model, critic))
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=args.weight_decay)  # lr: linear warm-up, then constant
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, args.warmup_steps)))
    # `model`, `critic_model`: DDP-wrapped for the backward pass (FSDP: the sharded models are their own wrappers)
    model, optimizer = (policy, accelerator.prepare(optimizer)) if args.fsdp else accelerator.prepare(policy, optimizer)
    critic_model = critic_optimizer = None
    if critic is not None:  # constant-lr AdamW; `critic` stays unwrapped
        critic_optimizer = torch.optim.AdamW(critic.parameters(), lr=args.critic_lr, weight_decay=0.0)
        critic_model, critic_optimizer = (critic, accelerator.prepare(critic_optimizer)) if args.fsdp else \
            accelerator.prepare(critic, critic_optimizer)

    # ---------------- data and generator ----------------
    encode = PromptEncoder(tokenizer, task.templated)
    sampler = PromptSampler(len(task.train), args.seed)
    compiled = None  # --torch_compile: the decoding step and the packed training forward compiled (common/generation/compile.py)
    if args.torch_compile:
        from common.generation.compile import TorchCompile
        compiled = TorchCompile(log=log)
    if args.use_vllm:
        from common.generation.vllm_backend import VLLMGenerator
        generator = VLLMGenerator(model_path, policy, tokenizer, seed=args.seed, dtype=args.dtype,
                                  max_model_len=args.vllm_max_model_length,
                                  gpu_memory_utilization=args.vllm_gpu_memory_utilization, accelerator=accelerator)
    else:
        generator = HFGenerator(policy, tokenizer, batch_size=args.gen_batch_size, dtype=args.dtype,
                                cache_implementation=args.cache_implementation, compiled=compiled)
    generator.end_ids = end_token_ids(tokenizer, policy, args.stop_token_ids, log)  # EOS, end-of-turn, flag
    # no sampler log-probs: pi_old's come from score_rollouts, with the entropies PROS needs
    sampling = SamplingConfig(max_new_tokens=args.max_completion_length, temperature=args.temperature, logprobs=False)
    temperature = args.temperature if args.temperature > 0 else 1.0  # greedy samples are scored at T=1
    pack = (args.pack_row_tokens or (2048 if device.type == "cuda" else 128)) if args.padding_free else 0  # rows
    k, stop_ids, pros = args.num_generations, set(generator.end_ids), args.pros != "off"
    eval_temperature = args.temperature if args.eval_temperature is None else args.eval_temperature  # 0: greedy
    eval_sampling = SamplingConfig(max_new_tokens=args.max_completion_length, temperature=eval_temperature, logprobs=False)

    def run_eval() -> dict:  # pass@k for every power of two k <= --eval_samples
        torch.set_num_threads(cpu_threads.count(torch.get_num_threads()))  # fit the free cores
        with gathered(policy, enabled=generator.reads_policy):  # FSDP + HF generate: whole weights (else no-op)
            score = lambda examples: evaluate(generator, tokenizer, examples, encode, task.eval_success,  # noqa: E731
                                              eval_sampling, args.eval_samples, accelerator)
            train_fit = evaluate_train_prompts(score, train_prompt_sample(task.train, args.eval_train_prompts))
            return {**score(task.eval), **train_fit}  # eval_train_*: the pool's fit, to compare with held-out

    # ---------------- resume ----------------
    start_step, counters, method_state = 0, {"rollouts": 0, "gen_tokens": 0}, {}
    resume_from = checkpoint.resolve_resume(args.resume_from_checkpoint, args.output_dir)
    if resume_from is not None:
        start_step, state = checkpoint.load_checkpoint(resume_from, accelerator, model, optimizer, scheduler)
        sampler.load_state_dict(state["sampler"])
        counters, method_state = state["counters"], state["method"]
        if critic is not None and args.fsdp:  # whole weights; this rank's optimizer shard (rank_state)
            fsdp.load_full_state_dict(critic, method_state["critic"])
            fsdp.load_local_optimizer_state(critic_optimizer, state["rank_state"]["critic_opt"])
        elif critic is not None:
            critic.load_state_dict(method_state["critic"])
            critic_optimizer.load_state_dict(method_state["critic_opt"])
        generator.sync_weights(policy)
        log(f"resumed from {resume_from} at step {start_step}")
    # [PROS] (also in PPO / GRPO: empty, unused) the query tree, the Gibbs/selection RNG (one seed: identical pools)
    tree = QueryTree(method_state.get("tree"))
    pros_rng = np.random.default_rng(args.seed)
    if "rng" in method_state:
        pros_rng.bit_generator.state = method_state["rng"]

    # ---------------- logging, step-0 evaluation, graceful stop ----------------
    resume_step, warned_logp_diff = start_step if resume_from is not None else None, False
    logger = MetricsLogger(args.output_dir, accelerator, args.report_to, vars(args), resume_step=resume_step)
    sample_log = SampleLogger(args.output_dir, accelerator, args.log_samples_every, args.log_samples_per_kind,
                              resume_step=resume_step)
    if start_step == 0:
        row = {"step": 0, **run_eval(), "num_threads": torch.get_num_threads(),
               **(compiled.metrics(accelerator) if compiled else {})}
        logger.log(row)
        log(f"step 0 (starting policy): {row}")
    stop = GracefulStop(log)
    progress = tqdm(range(start_step + 1, args.max_steps + 1), initial=start_step, total=args.max_steps,
                    desc="pros_ppo", disable=not accelerator.is_main_process)

    for step in range(start_step + 1, args.max_steps + 1):
        t_start = time.time()
        threads = cpu_threads.count(torch.get_num_threads())  # a shared CPU: fit the free cores
        torch.set_num_threads(threads)
        # ================ the batch: (prompt id, prefix, tree node) per query, the same on every rank ================
        if pros:  # [PROS] Sec. 4: part data stream, the rest from the pool by |θ̃ - 0.5|
            queries, num_stream = choose_batch(tree, sampler, args, step, pros_rng, len(task.train))
            picked = [(tree.theta_hat[node], tree.n[node], tree.parent[node] < 0) for _, _, node in queries]  # now
            parent_ids = [int(tree.parent[node]) for _, _, node in queries]  # for the sample log (evict renumbers)
        else:
            queries = [(prompt_id, (), -1) for prompt_id in sampler.next_ids(args.prompts_per_step)]

        # ================ sample: K continuations of each of this rank's queries (q + prefix is the prompt) ========
        my_queries = my_slice(list(range(len(queries))), accelerator)  # indices into `queries`
        examples, prefixes = [task.train[queries[j][0]] for j in my_queries], [list(queries[j][1]) for j in my_queries]
        query_ids = [encode(example.prompt) + prefix for example, prefix in zip(examples, prefixes)]
        with gathered(policy, enabled=generator.reads_policy):  # FSDP + HF generate: whole weights (else no-op)
            gens = generator.generate(query_ids, k, sampling)
        generator.sleep()  # vLLM on a GPU: its memory goes to training; the push brings the weights back
        t_gen = time.time() - t_start
        completions, prompts = [list(c) for c in gens.completion_ids], [ids for ids in query_ids for _ in range(k)]
        num_rollouts = len(completions)

        # ================ verify: the reward reads prefix + continuation (PROS Sec. 3); the task's cut rule ==========
        whole = [prefixes[i // k] + c for i, c in enumerate(completions)]
        texts = [tokenizer.decode(c, skip_special_tokens=True) for c in whole]  # (batch_decode([]) is [''])
        truncated = torch.tensor([reason == "length" for reason in gens.finish_reasons], dtype=torch.bool)
        scored = task.score(texts, [examples[i // k] for i in range(len(texts))], whole, truncated, step)
        rewards = torch.tensor(scored.total, dtype=torch.float32).view(-1, k)  # NaN: no function scored it
        correct = torch.tensor(scored.success, dtype=torch.bool).view(-1, k)  # the task's rule (Task.passes)
        rated = torch.tensor(scored.scored, dtype=torch.bool)  # False: no reward (no gradient, critic target, count)

        # ================ pi_old's log-probs, entropies, values (and reference log-probs): one no-grad pass ========
        t_score_start = time.time()
        with autocast(device, args.dtype):  # bf16 compute; FSDP: sharded, in lock-step (no whole model gathered)
            scores = score_rollouts(policy, critic, ref_model, tokenizer, prompts, completions,
                                    args.micro_batch_size, temperature, device, accelerator, pack, compiled)
        mask = scores["mask"]
        t_score = time.time() - t_score_start
        # --mask_truncated_completions: cut rollouts get no policy gradient (the critic still fits their returns)
        policy_mask = (mask * ~truncated[:, None] if args.mask_truncated_completions else mask) * rated[:, None]
        sampler_logp = right_align(gens.logprobs, mask.shape[1]) if any(gens.logprobs) else None

        # ================ [PROS] the tree: child candidates (Sec. 3); forget + observe, add, evict, Gibbs (Sec. 4) ===
        children_created, gibbs_seconds = 0, 0.0  # [PROS] (also in PPO / GRPO: logged as 0)
        if pros:  # [PROS] from every rank's gathered outcomes, sorted: the tree stays the same on every rank
            outcomes = []  # per group: (query index, successes, candidate child prefixes)
            for group, j in enumerate(my_queries):  # the candidates: cuts of the group's correct rollouts (if any)
                rows = range(group * k, (group + 1) * k)
                starts = [mask.shape[1] - len(completions[i]) for i in rows]  # right-aligned continuations
                entropies = [scores["ent"][i, s:].numpy() for i, s in zip(rows, starts)]
                values = None if critic is None else [scores["value"][i, s:].numpy() for i, s in zip(rows, starts)]
                sources = (correct[group] & ~truncated.view(-1, k)[group]).tolist()  # a cut rollout spawns no child
                candidates = child_candidates(queries[j][1], [completions[i] for i in rows], sources,
                                              entropies, values, stop_ids, args.value_top_frac)
                outcomes.append((j, float(correct[group].sum()), candidates))
            outcomes = sorted(gather_list(accelerator, outcomes))
            rated_trials = dict(gather_list(accelerator, list(zip(my_queries, rated.view(-1, k).sum(-1).tolist()))))
            tree.observe([queries[j][2] for j, _, _ in outcomes], [s for _, s, _ in outcomes],  # trials: rated rollouts
                         [rated_trials[j] for j, _, _ in outcomes], args.forget, step, args.forget_on)
            for j, _, candidates in outcomes:  # every distinct new cut of a correct rollout (capped if asked)
                children_created += tree.add_children(queries[j][0], candidates, step, args.prior_mu,
                                                      args.max_children_per_group)
            tree.evict(args.pool_capacity)
            gibbs_start = time.time()
            tree.gibbs(args, pros_rng)
            gibbs_seconds = time.time() - gibbs_start

        # ================ advantages ================
        if args.adv == "gae":  # outcome reward on the last token (right-aligned: the last column), token-level GAE
            token_rewards = torch.zeros_like(mask)
            token_rewards[:, -1] = rewards.flatten().nan_to_num(0.0)  # unrated rows: masked out below
            advantages, returns = gae_advantages(token_rewards, scores["value"], mask, args.gamma, args.gae_lambda)
            rated_mask = mask * rated[:, None]  # whitened over the rated rows' tokens only (global: all ranks)
            advantages = (masked_whiten(advantages, rated_mask, accelerator) if args.whiten_advantages
                          else advantages) * rated_mask
        else:  # GRPO: the group-normalised outcome advantage on every token of the rollout
            advantages = grpo_advantages(rewards).flatten()[:, None] * mask

        # ================ update: ppo_epochs x num_minibatches clipped steps of the policy, the critic alongside ====
        t_update_start = time.time()
        policy_losses, clip_fracs, grad_norms, value_losses, kl_sum = [], [], [], [], 0.0
        for epoch in range(args.num_iterations):
            order, parts = torch.randperm(num_rollouts).tolist(), args.num_mini_batches
            for m in range(parts):
                minibatch = order[m * num_rollouts // parts:(m + 1) * num_rollouts // parts]
                # token means of the minibatch on every rank: DDP / FSDP average the ranks' gradients (see rank_mean)
                policy_tokens, minibatch_tokens = (count / world or 1.0 for count in reduce_sums(accelerator, {
                    "policy": float(policy_mask[minibatch].sum()), "all": float(mask[minibatch].sum())}).values())
                surrogate_sum, clipped_sum, minibatch_kl, value_loss_sum = 0.0, 0.0, 0.0, 0.0
                lengths = [len(prompts[i]) + len(completions[i]) for i in minibatch]  # --max_tokens_per_microbatch
                for rows in micro_batches(len(minibatch), args.micro_batch_size, accelerator, model, lengths=lengths,
                                          max_tokens=args.max_tokens_per_microbatch):
                    ids = [minibatch[r] for r in rows]
                    batch = pad_sequences([prompts[i] for i in ids], [completions[i] for i in ids],
                                          tokenizer.pad_token_id, pack_tokens=pack).to(device)
                    cols = slice(-batch.completion_width, None)
                    token_mask = policy_mask[ids, cols].to(device)
                    with autocast(device, args.dtype):
                        logp, _ = token_logprobs(model, batch, temperature, compiled=compiled)
                    old_logp, adv = scores["logp"][ids, cols].to(device), advantages[ids, cols].to(device)
                    per_token, clipped = clipped_surrogate(logp, old_logp, adv, args.epsilon, args.epsilon_high)
                    loss = (per_token * token_mask).sum() / policy_tokens
                    surrogate_sum += loss.item()
                    clipped_sum += (clipped * token_mask).sum().item()
                    if ref_model is not None:
                        kl = kl_k3(logp, scores["ref"][ids, cols].to(device)) * token_mask
                        loss = loss + args.beta * kl.sum() / policy_tokens
                        minibatch_kl += kl.sum().item()
                    accelerator.backward(loss)
                grad_norms.append(float(accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                policy_losses.append(surrogate_sum)
                clip_fracs.append(clipped_sum / policy_tokens)
                kl_sum += minibatch_kl if epoch == 0 else 0.0  # the on-policy epoch's KL is the one logged
                if critic is not None:  # the critic: clipped value loss against the GAE returns, its own step
                    for rows in micro_batches(len(minibatch), args.micro_batch_size, accelerator, critic_model,
                                              lengths=lengths, max_tokens=args.max_tokens_per_microbatch):
                        ids = [minibatch[r] for r in rows]
                        batch = pad_sequences([prompts[i] for i in ids], [completions[i] for i in ids],
                                              tokenizer.pad_token_id, pack_tokens=pack).to(device)
                        cols = slice(-batch.completion_width, None)
                        with autocast(device, args.dtype):
                            values = critic_model(batch)
                        per_token = value_loss(values, scores["value"][ids, cols].to(device),
                                               returns[ids, cols].to(device), args.cliprange_value)
                        loss = (per_token * batch.loss_mask * rated[ids, None].to(device)).sum() / minibatch_tokens
                        accelerator.backward(loss)
                        value_loss_sum += loss.item()
                    accelerator.clip_grad_norm_(critic_model.parameters(), args.max_grad_norm)
                    critic_optimizer.step()
                    critic_optimizer.zero_grad(set_to_none=True)
                    value_losses.append(value_loss_sum)
        t_train = t_score + time.time() - t_update_start

        # ================ push the new weights to the generator, once per iteration (a no-op for HF generate) ======
        generator.sync_weights(policy)

        # ================ metrics: one reduce of named sums over ranks, each ratio next to its name ================
        totals = reduce_sums(accelerator, {
            "groups": len(my_queries), "rollouts": num_rollouts, "gen_tokens": sum(map(len, completions)),
            **reward_sums(rewards),  # NaN (no function scored it): out of reward_mean / _std
            "success": float(correct.sum()), "zero_var": float(zero_variance(rewards).sum()),
            "truncated": float(truncated.sum()), "gap_tok": float(mask.sum()) if sampler_logp is not None else 0.0,
            "gap_sum": float(((scores["logp"] - sampler_logp).abs() * mask).sum()) if sampler_logp is not None else 0.0,
            # this rank's parts of the global token means (their sum over ranks), averaged over the update's steps
            "loss_sum": np.mean(policy_losses) / world, "clip_sum": np.mean(clip_fracs) / world,
            "value_loss_sum": float(np.mean(value_losses)) / world if value_losses else 0.0,
            "kl_sum": kl_sum, "ent_sum": float((scores["ent"] * mask).sum()), "tok": float(mask.sum()),
            "t_gen": t_gen, "t_train": t_train,
        })
        counters = {name: count + int(totals[name]) for name, count in counters.items()}  # rollouts, gen_tokens
        samples, tokens = max(1.0, totals["rollouts"]), max(1.0, totals["tok"])
        reward_mean, reward_std = reward_moments(totals, totals["rollouts"])  # over the completions given a reward
        row = {
            "step": step, "rollouts": counters["rollouts"], "gen_tokens": counters["gen_tokens"],
            "reward_mean": reward_mean, "reward_std": reward_std,  # scored on prefix + continuation
            "pass_rate": totals["success"] / samples, **scored.metrics(accelerator),  # reward >= success_reward
            "frac_zero_var_groups": totals["zero_var"] / max(1.0, totals["groups"]),
            "completion_len_mean": totals["gen_tokens"] / samples,  # generated tokens (a child's prefix excluded)
            "clipped_ratio": totals["truncated"] / samples,  # completions cut by max_new_tokens
            "loss": totals["loss_sum"],  # per-token clipped surrogate, mean over steps (module doc)
            "kl": totals["kl_sum"] / tokens, "entropy": totals["ent_sum"] / tokens,  # per completion token
            "grad_norm": float(np.mean(grad_norms)), "lr": scheduler.get_last_lr()[0],
            "time_gen_s": totals["t_gen"] / world, "time_train_s": totals["t_train"] / world,
            "ppo_clip_frac": totals["clip_sum"],  # clipped tokens / tokens, mean over steps
            "sampler_logp_diff": totals["gap_sum"] / totals["gap_tok"] if totals["gap_tok"] else None,
        }
        gap = row["sampler_logp_diff"]  # None: not measured this step
        if not warned_logp_diff and gap is not None and gap >= args.logp_diff_warn:
            warned_logp_diff = True
            log(f"warning: sampler_logp_diff {gap:.4f} >= --logp_diff_warn {args.logp_diff_warn}: "
                "the generator does not sample from the policy being trained (stale weights, dtype, temperature?)")
        if critic is not None:
            row["ppo_value_loss"] = totals["value_loss_sum"]  # per-token value loss, mean over steps
        if pros:  # [PROS] mechanism metrics (from the gathered outcomes: the same on every rank)
            child_lens = [len(prefix) for _, prefix, _ in queries if prefix]
            picks = np.array([(*picked[j], wins) for j, wins, _ in outcomes if j >= num_stream], float).reshape(-1, 4)
            theta, trials, root, wins = picks.T  # the pool's picks: θ̂, effective trials, root?, successes of k
            stream_wins = np.array([wins for j, wins, _ in outcomes if j < num_stream])  # the data stream's queries
            mean = lambda values: float(np.mean(values)) if len(values) else None  # noqa: E731
            row.update({
                "pros_pool_size": len(tree), "pros_pool_children": int((tree.parent >= 0).sum()),
                "pros_frac_children_in_batch": len(child_lens) / max(1, len(queries)),
                "pros_prefix_len_mean": mean(child_lens), "pros_saved_prompt_tokens": int(sum(child_lens) * k),
                "pros_children_created": children_created, "pros_gibbs_s": gibbs_seconds,
                "pros_calib_error": mean(np.abs(theta - wins / k)),  # |θ̂ at selection - s/k|, floor: k-sample noise
                "pros_calib_excess": calibration_excess(theta, wins, k) if len(wins) else None,  # minus E under θ̂
                "pros_frac_zero_var_picks": mean((wins == 0) | (wins == k)),
                "pros_frac_zero_var_stream": mean((stream_wins == 0) | (stream_wins == k)),
                "pros_pick_trials_mean": mean(trials), "pros_pick_root_frac": mean(root),
            })

        # ================ sample log / evaluate / log / checkpoint / stop ================
        evaluating = (args.eval_steps and step % args.eval_steps == 0) or step == args.max_steps
        if sample_log.due(step, evaluating):  # a few root and (with PROS) augmented rollouts -> samples.jsonl
            kinds = ["augmented" if prefixes[i // k] else "root" for i in range(num_rollouts)]
            tags = [{"pros_node": queries[j][2], "pros_parent": parent_ids[j]} if pros else {} for j in my_queries]
            seq_adv = (advantages * (mask.cumsum(-1) == 1)).sum(-1)  # sequence-level: GAE's first token's (GRPO: any)
            sample_log.log(step, [{
                "kind": kinds[i], "prompt": tokenizer.decode(prompts[i][:len(prompts[i]) - len(prefixes[i // k])]),
                "pros_prefix": tokenizer.decode(prefixes[i // k]), "completion": tokenizer.decode(completions[i]),
                "reward": rewards.view(-1)[i].item(), "truncated": bool(truncated[i]), "advantage": seq_adv[i].item(),
                **tags[i // k], **scored.columns(i)} for i in sample_log.pick(kinds)])
        if evaluating:
            row.update(run_eval())
        row.update(compiled.metrics(accelerator) if compiled else {})  # --torch_compile: compile time, recompiles
        row["time_step_s"] = time.time() - t_start
        row["num_threads"] = threads  # the step's count: with a fixed one the run repeats exactly
        logger.log(row)
        progress.update(1)
        progress.set_postfix({"reward": f"{row['reward_mean']:.3f}", "zero_var": f"{row['frac_zero_var_groups']:.2f}",
                              **({"eval": f"{row['eval_pass@1']:.3f}"} if "eval_pass@1" in row else {})})
        stopping = stop.agreed(accelerator)
        if (args.save_steps and step % args.save_steps == 0) or step == args.max_steps or stopping:
            method_state = {"tree": tree.state_dict(), "rng": pros_rng.bit_generator.state}
            rank_state = {"critic_opt": fsdp.local_optimizer_state(critic_optimizer)} if critic and args.fsdp else None
            if rank_state:  # FSDP: the critic's whole weights gathered to rank 0; each rank keeps its optimizer shard
                method_state["critic"] = fsdp.full_state_dict(critic)
            elif critic is not None:
                method_state.update(critic=critic.state_dict(), critic_opt=critic_optimizer.state_dict())
            state = {"sampler": sampler.state_dict(), "counters": counters, "method": method_state}
            path = checkpoint.save_checkpoint(args.output_dir, step, accelerator, model, tokenizer, optimizer,
                                              scheduler, state, args.save_total_limit, args.lora_merged_export,
                                              rank_state)
            if stopping:
                log(f"stopped at step {step}; continue with --resume_from_checkpoint auto (checkpoint {path})")
                break
    progress.close()
    end_processes(accelerator)  # trackers finish and the process group ends now, not at exit: no hang, no abort
    stop.close()
    log(run_summary(args.output_dir, ["pros_calib_error", "pros_calib_excess", "pros_frac_zero_var_picks"]))


if __name__ == "__main__":
    raise SystemExit(main(parse_args(Args, description=__doc__.split("\n\n")[0])) or GracefulStop.exit_status())
