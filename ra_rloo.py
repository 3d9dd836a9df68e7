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
from tqdm.auto import tqdm

from common import checkpoint as ckpt
from common.advantages import rloo_advantages, zero_variance
from common.args import BaseArgs
from common.cli import parse_args
from common.data import PromptSampler, load_task
from common.generation import SamplingConfig, build_generator
from common.logprobs import score_completions, token_logprobs
from common.metrics import MetricsLogger, evaluate
from common.policy import load_policy
from common.runtime import accumulate_gradients, frozen_copy, log_main, make_optimizer, my_slice, reduce_sums, setup


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


def main(args: Args) -> dict:
    acc = setup(args, "ra_rloo")
    log = log_main(acc)
    model, tokenizer, model_path = load_policy(args.model_name_or_path, args.dtype, acc, log)
    model.to(acc.device)
    task = load_task(args, tokenizer, log)
    encode_cache: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        if text not in encode_cache:
            encode_cache[text] = tokenizer(text, add_special_tokens=task.name != "countdown").input_ids
        return encode_cache[text]

    ref = frozen_copy(model) if args.beta > 0 else None
    opt, sched = make_optimizer(args, model)
    model, opt = acc.prepare(model, opt)
    policy = acc.unwrap_model(model)
    generator = build_generator(args, policy, tokenizer, model_path, acc)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    sampler = PromptSampler(len(task.train), args.seed)
    buffers: dict[int, deque] = {}  # [RA-RLOO] prompt id -> deque of (response ids, log pi_old(y|x))
    counters = {"rollouts": 0, "gen_tokens": 0}

    start = 0
    resume_from = ckpt.resolve_resume(args.resume, args.output_dir)
    if resume_from is not None:
        start, state = ckpt.load_checkpoint(resume_from, acc, model, opt, sched)
        sampler.load_state_dict(state["sampler"])
        buffers = {pid: deque(items, maxlen=args.buffer_capacity) for pid, items in state["buffers"].items()}
        counters = state["counters"]
        generator.sync_weights(policy)
        log(f"resumed from {resume_from} at step {start}")
    elif args.replay != "none" and args.seed_buffer:
        buffers = seed_buffers(task, policy, tokenizer, encode, args, acc.device)
        log(f"[RA-RLOO] seeded {len(buffers)} prompt buffers with demonstrations")
    logger = MetricsLogger(args.output_dir, acc, args.report_to, vars(args), resume_step=start if resume_from else None)

    def run_eval(step: int) -> dict:
        return evaluate(generator, tokenizer, task.eval, encode, task.eval_reward_fn, sampling,
                        args.eval_samples, acc, ks=(1, args.eval_samples))

    if start == 0:
        row = {"step": 0, **run_eval(0)}
        logger.log(row)
        log(f"step 0 (base policy): {row}")
    bar = tqdm(range(start + 1, args.max_steps + 1), initial=start, total=args.max_steps, desc="ra_rloo",
               disable=not acc.is_main_process)
    state = {}
    for step in bar:
        t0 = time.time()
        # ---- sample: K rollouts for each of this rank's prompts ----
        ids = my_slice(sampler.next_ids(args.prompts_per_step), acc)
        examples = [task.train[i] for i in ids]
        prompts = [encode(ex.prompt) for ex in examples]
        gens = generator.generate(prompts, args.k, sampling)
        t_gen = time.time() - t0
        completions = [list(c) for c in gens.completion_ids]

        # ---- verify ----
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        rewards = torch.tensor([task.reward_fn(t, examples[i // args.k]) for i, t in enumerate(texts)],
                               dtype=torch.float32).view(len(examples), args.k)
        fresh_success = rewards >= args.success_reward
        zero_var_pre = zero_variance(rewards)

        # ---- [RA-RLOO] splice one stored success into groups that need it (paper Section 3.1) ----
        replay_lp_old = torch.full((len(examples), args.k), float("nan"))
        if args.replay != "none":
            replay_lp_old = splice_replays([ex.id for ex in examples], completions, rewards, fresh_success,
                                           buffers, args.replay, random)
        is_replay = ~torch.isnan(replay_lp_old)
        fired = is_replay.any(-1)

        # ---- advantages: leave-one-out baseline on the (possibly mixed) group, eq. (1) ----
        adv = rloo_advantages(rewards)
        flat_adv = adv.flatten().to(acc.device)
        flat_lp_old = replay_lp_old.flatten().to(acc.device)
        flat_replay = is_replay.flatten().to(acc.device)

        # ---- update: REINFORCE with LOO baseline + KL to the reference ----
        t1 = time.time()
        flat_prompts = [p for p in prompts for _ in range(args.k)]
        n_seqs = len(completions)
        n_tokens = sum(len(c) for c in completions)
        norm = max(1, n_seqs) * args.max_new_tokens  # constant length normaliser: unbiased, no length bias

        def loss_fn(batch, logp, ent, rows):
            mask = batch.loss_mask
            seq_lp = (logp * mask).sum(-1)
            a = flat_adv[rows]
            # [RA-RLOO] scale the replayed slot's advantage by w = min(pi_theta/pi_old, w_max), no gradient through w
            rep = flat_replay[rows]
            w = replay_weights(seq_lp.detach(), flat_lp_old[rows], args.w_max)
            a = torch.where(rep, a * w, a)
            loss = -(a * seq_lp).sum() / norm
            m = {"pg_loss": loss.item() * norm, "ent_sum": (ent * mask).sum().item(), "tok": mask.sum().item(),
                 "w_sum": torch.where(rep, w, torch.zeros_like(w)).sum().item(), "w_n": rep.sum().item()}
            if ref is not None:
                with torch.no_grad():
                    ref_lp, _ = token_logprobs(ref, batch)
                d = (ref_lp - logp) * mask
                kl = (torch.exp(d) - d - 1) * mask  # k3 estimator, >= 0, unbiased for KL(pi || ref)
                loss = loss + args.beta * kl.sum() / max(1, n_tokens)
                m["kl_sum"] = kl.sum().item()
            return loss, m

        sums = accumulate_gradients(model, acc, flat_prompts, completions, tokenizer.pad_token_id,
                                    args.micro_batch_size, loss_fn)
        acc.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        generator.sync_weights(policy)
        t_train = time.time() - t1

        # ---- [RA-RLOO] append every fresh success to its prompt's FIFO (all ranks keep the same buffers) ----
        new = []
        if args.replay != "none":
            for i, c in enumerate(gens.completion_ids):
                g = i // args.k
                if fresh_success.view(-1)[i]:
                    new.append((examples[g].id, list(c), float(sum(gens.logprobs[i]))))
        if acc.num_processes > 1:
            from accelerate.utils import gather_object

            new = gather_object(new)
        for pid, y, lp in new:
            buffers.setdefault(pid, deque(maxlen=args.buffer_capacity)).append((y, lp))

        # ---- log ----
        gen_tokens = sum(len(c) for c in gens.completion_ids)
        s = reduce_sums(acc, {
            "groups": len(examples), "rollouts": len(gens.completion_ids), "gen_tokens": gen_tokens,
            "reward_sum": float(rewards.masked_fill(is_replay, 0).sum()),  # fresh rollouts only
            "success": float(fresh_success.sum()), "zero_var_pre": float(zero_var_pre.sum()),
            "zero_var_post": float(zero_variance(rewards).sum()), "fired": float(fired.sum()),
            "pg_loss": sums.get("pg_loss", 0.0), "seqs": n_seqs, "kl_sum": sums.get("kl_sum", 0.0),
            "ent_sum": sums.get("ent_sum", 0.0), "tok": sums.get("tok", 0.0), "w_sum": sums.get("w_sum", 0.0),
            "w_n": sums.get("w_n", 0.0), "t_gen": t_gen, "t_train": t_train})
        counters["rollouts"] += int(s["rollouts"])
        counters["gen_tokens"] += int(s["gen_tokens"])
        world = acc.num_processes
        row = {
            "step": step, "rollouts": counters["rollouts"], "gen_tokens": counters["gen_tokens"],
            "reward_mean": s["reward_sum"] / max(1, s["rollouts"]), "pass_rate": s["success"] / max(1, s["rollouts"]),
            "frac_zero_var_groups": s["zero_var_pre"] / max(1, s["groups"]),
            "loss": s["pg_loss"] / max(1, s["seqs"]), "kl": s["kl_sum"] / max(1, s["tok"]),
            "entropy": s["ent_sum"] / max(1, s["tok"]), "lr": sched.get_last_lr()[0],
            "time_gen_s": s["t_gen"] / world, "time_train_s": s["t_train"] / world,
            # [RA-RLOO] mechanism metrics
            "ra_zero_var_frac_post": s["zero_var_post"] / max(1, s["groups"]),
            "ra_replay_fired_frac": s["fired"] / max(1, s["groups"]),
            "ra_is_weight_mean": s["w_sum"] / s["w_n"] if s["w_n"] else None,
            "ra_buffer_prompts": sum(1 for b in buffers.values() if b),
        }
        if step % max(1, args.eval_every) == 0 or step == args.max_steps:
            row.update(run_eval(step))
        row["time_step_s"] = time.time() - t0
        logger.log(row)
        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", zv=f"{row['frac_zero_var_groups']:.2f}",
                        **({"eval": f"{row['eval_pass@1']:.3f}"} if "eval_pass@1" in row else {}))
        state = {"sampler": sampler.state_dict(), "counters": counters,
                 "buffers": {pid: list(b) for pid, b in buffers.items()}}
        if (args.save_every and step % args.save_every == 0) or step == args.max_steps:
            ckpt.save_checkpoint(args.output_dir, step, acc, model, tokenizer, opt, sched, state, args.keep_checkpoints)
    logger.close()
    return state


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
