"""Replay-Augmented RLOO (RA-RLOO), one file.

Paper: "Replay-Augmented RLOO: Restoring Within-Group Reward Variance in Sparse-Reward Policy
Gradients" (../shared/papers/003_3367a9de2d6aa560.txt).

Plain RLOO samples K rollouts per prompt and uses the leave-one-out baseline. When all K rewards are
equal (no rollout succeeded), every advantage is 0 and the group gives no gradient. RA-RLOO keeps a
small per-prompt FIFO buffer of past successes and, *on demand* (only in groups with no fresh success),
replaces one rollout by a stored success, importance-weighted by w = min(pi_theta / pi_old, w_max).
Lines marked [RA-RLOO] are what the paper adds to RLOO; `--replay none` switches them all off.

    python ra_rloo.py                                   # embedded Countdown default, CPU, minutes
    python ra_rloo.py --replay none                     # vanilla RLOO baseline
    accelerate launch ra_rloo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --dataset openai/gsm8k --dataset_config main --use_vllm --dtype bfloat16 --learning_rate 1e-6
"""
from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import torch
from accelerate.utils import gather_object

from common.advantages import rloo_advantages, zero_variance
from common.args import BaseArgs
from common.cli import parse_args
from common.logprobs import score_completions, token_logprobs
from common.losses import kl_k3
from common.runtime import accumulate_gradients, core_metrics, finish_step, my_slice, optimizer_step, start_run


@dataclass
class Args(BaseArgs):
    k: int = 4
    """rollouts per prompt (K); RLOO needs K >= 2"""
    beta: float = 0.05
    """KL coefficient to the reference (initial) policy; per-token k3 estimator exp(r)-r-1, r = log ref - log pi"""
    replay: Literal["on_demand", "always", "none"] = "on_demand"
    """[RA-RLOO] when to splice a stored success: only into groups with no fresh success (paper), every group (ablation E3), or never (vanilla RLOO)"""
    buffer_capacity: int = 16
    """[RA-RLOO] per-prompt FIFO capacity C"""
    w_max: float = 5.0
    """[RA-RLOO] clip of the replay's importance weight w = min(exp(log pi_theta(y|x) - log pi_old(y|x)), w_max)"""
    seed_buffer: bool = True
    """[RA-RLOO] seed buffers at start with demonstrations scored under the initial policy (Countdown: solver solutions; the paper's IPO seed); false = lazy buffer"""
    success_reward: float = 1.0
    """a rollout is a success (buffered, and 'passes') when its training reward >= this"""

    def validate(self) -> None:
        if self.k < 2:
            raise SystemExit(f"--k {self.k}: RLOO needs at least 2 rollouts per prompt")
        if self.w_max <= 0 or self.buffer_capacity < 1:
            raise SystemExit("--w_max must be > 0 and --buffer_capacity >= 1")


def seed_buffers(task, model, tokenizer, encode, args, device) -> dict[int, deque]:
    """[RA-RLOO] One solver solution per training prompt, with its log-prob under the initial policy."""
    from common import countdown

    buffers: dict[int, deque] = {}
    if task.name != "countdown":
        return buffers  # real datasets: lazy buffers (no verified demonstrations to seed from)
    rng = random.Random(args.seed)
    eos = tokenizer.eos_token_id
    prompts = [encode(ex.prompt) for ex in task.train]
    demos = [tokenizer(countdown.solution_text(rng.choice(countdown.solutions(ex.answer))),
                       add_special_tokens=False).input_ids + [eos] for ex in task.train]
    lps = score_completions(model, prompts, demos, tokenizer.pad_token_id, 512, device)
    for ex, y, lp in zip(task.train, demos, lps):
        buffers[ex.id] = deque([(y, sum(lp))], maxlen=args.buffer_capacity)
    return buffers


def splice_replays(prompt_ids: list[int], completions: list[list[int]], rewards: torch.Tensor,
                   fresh_success: torch.Tensor, buffers: dict[int, deque], mode: str, rng) -> torch.Tensor:
    """[RA-RLOO] Replace the last rollout of each group that needs it by a stored success, in place.

    A group needs it when `mode` is "always", or ("on_demand") when none of its fresh rollouts succeeded
    and its prompt's buffer is non-empty. The spliced slot gets reward 1. Returns log pi_old(y|x) of the
    spliced responses as a [groups, K] tensor, NaN where nothing was spliced.
    """
    k = rewards.shape[1]
    lp_old = torch.full(rewards.shape, float("nan"))
    for g, pid in enumerate(prompt_ids):
        need = mode == "always" or not bool(fresh_success[g].any())
        if need and buffers.get(pid):
            y, lp = rng.choice(buffers[pid])
            slot = k - 1  # rollouts are i.i.d., so which slot is replaced does not matter
            completions[g * k + slot] = list(y)
            rewards[g, slot] = 1.0  # a stored success scores full reward (paper: "set its reward to 1")
            lp_old[g, slot] = lp
    return lp_old


def replay_weights(seq_logp: torch.Tensor, lp_old: torch.Tensor, w_max: float) -> torch.Tensor:
    """[RA-RLOO] w = min(exp(log pi_theta(y|x) - log pi_old(y|x)), w_max); sequence-level IS, no gradient."""
    return torch.exp(seq_logp.detach() - lp_old).clamp(max=w_max)


def main(args: Args) -> None:
    run = start_run(args, "ra_rloo", need_ref=args.beta > 0)
    acc, tokenizer, task, k = run.acc, run.tokenizer, run.task, args.k
    # [RA-RLOO] prompt id -> FIFO of (response ids, log pi_old(y|x)); identical on every rank
    buffers = {pid: deque(items, maxlen=args.buffer_capacity) for pid, items in run.method_state.get("buffers", {}).items()}
    if run.start_step == 0 and args.replay != "none" and args.seed_buffer:
        buffers = seed_buffers(task, run.policy, tokenizer, run.encode, args, acc.device)
        run.log(f"[RA-RLOO] seeded {len(buffers)} prompt buffers with demonstrations")

    for step in range(run.start_step + 1, args.max_steps + 1):
        t0 = time.time()
        # ---- sample: K rollouts for each of this rank's prompts ----
        examples = [task.train[i] for i in my_slice(run.sampler.next_ids(args.prompts_per_step), acc)]
        prompts = [run.encode(ex.prompt) for ex in examples]
        gens = run.generator.generate(prompts, k, run.sampling)
        t_gen = time.time() - t0
        completions = [list(c) for c in gens.completion_ids]

        # ---- verify ----
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        rewards = torch.tensor([task.reward_fn(t, examples[i // k]) for i, t in enumerate(texts)]).view(-1, k).float()
        fresh_success = rewards >= args.success_reward
        fresh_rewards = rewards.clone()

        # ---- [RA-RLOO] splice one stored success into groups that need it (paper Section 3.1) ----
        replay_lp_old = torch.full(rewards.shape, float("nan"))
        if args.replay != "none":
            replay_lp_old = splice_replays([ex.id for ex in examples], completions, rewards, fresh_success,
                                           buffers, args.replay, random)
        is_replay = ~torch.isnan(replay_lp_old)

        # ---- advantages: leave-one-out baseline on the (possibly mixed) group, eq. (1) ----
        adv = rloo_advantages(rewards).flatten().to(acc.device)
        lp_old = replay_lp_old.flatten().to(acc.device)
        replayed = is_replay.flatten().to(acc.device)

        # ---- update: REINFORCE with the LOO baseline + KL to the reference policy ----
        t1 = time.time()
        flat_prompts = [p for p in prompts for _ in range(k)]
        n_tokens = sum(len(c) for c in completions)
        norm = max(1, len(completions)) * args.max_new_tokens  # constant length normaliser: no length bias

        def loss_fn(batch, logp, ent, rows):
            mask = batch.loss_mask
            seq_lp = (logp * mask).sum(-1)
            a, rep = adv[rows], replayed[rows]
            # [RA-RLOO] scale the replayed slot's advantage by w = min(pi_theta/pi_old, w_max), no gradient through w
            w = replay_weights(seq_lp, lp_old[rows], args.w_max)
            a = torch.where(rep, a * w, a)
            loss = -(a * seq_lp).sum() / norm
            m = {"loss_sum": loss.item() * norm, "ent_sum": (ent * mask).sum().item(), "tok": mask.sum().item(),
                 "w_sum": torch.where(rep, w, torch.zeros_like(w)).sum().item(), "w_n": rep.sum().item()}
            if run.ref is not None:
                with torch.no_grad():
                    ref_lp, _ = token_logprobs(run.ref, batch)
                kl = kl_k3(logp, ref_lp) * mask
                loss = loss + args.beta * kl.sum() / max(1, n_tokens)
                m["kl_sum"] = kl.sum().item()
            return loss, m

        sums = accumulate_gradients(run.model, acc, flat_prompts, completions, tokenizer.pad_token_id,
                                    args.micro_batch_size, loss_fn)
        optimizer_step(run)
        t_train = time.time() - t1

        # ---- [RA-RLOO] append every fresh success to its prompt's FIFO (gathered: all ranks keep the same buffers) ----
        new = [(examples[i // k].id, list(c), float(sum(gens.logprobs[i])))
               for i, c in enumerate(gens.completion_ids) if args.replay != "none" and fresh_success.view(-1)[i]]
        if acc.num_processes > 1:
            new = gather_object(new)
        for pid, y, lp in new:
            buffers.setdefault(pid, deque(maxlen=args.buffer_capacity)).append((y, lp))

        # ---- log ----
        row, x = core_metrics(run, step, {
            "groups": len(examples), "rollouts": len(completions), "gen_tokens": sum(map(len, gens.completion_ids)),
            "reward_sum": float(fresh_rewards.sum()), "rewarded": fresh_rewards.numel(),
            "success": float(fresh_success.sum()), "zero_var": float(zero_variance(fresh_rewards).sum()),
            "loss_sum": sums.get("loss_sum", 0.0), "seqs": len(completions), "kl_sum": sums.get("kl_sum", 0.0),
            "ent_sum": sums.get("ent_sum", 0.0), "tok": sums.get("tok", 0.0), "t_gen": t_gen, "t_train": t_train,
        }, extra={"zero_var_post": float(zero_variance(rewards).sum()), "fired": float(is_replay.any(-1).sum()),
                  "w_sum": sums.get("w_sum", 0.0), "w_n": sums.get("w_n", 0.0)})
        row.update({  # [RA-RLOO] mechanism metrics
            "ra_zero_var_frac_post": x["zero_var_post"] / max(1, x["groups"]),
            "ra_replay_fired_frac": x["fired"] / max(1, x["groups"]),
            "ra_is_weight_mean": x["w_sum"] / x["w_n"] if x["w_n"] else None,
            "ra_buffer_prompts": sum(1 for b in buffers.values() if b),
        })
        finish_step(run, step, row, t0, {"buffers": {pid: list(b) for pid, b in buffers.items()}})


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
