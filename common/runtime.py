"""Plumbing every script shares: accelerator and seeds, optimizer, cross-rank sums, the micro-batched
backward pass, and the reference model. The method-specific loss stays in each script."""
from __future__ import annotations

import contextlib
import copy
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from common.logprobs import token_logprobs
from common.masking import pad_sequences


def setup(args, script: str):
    """Accelerator (CPU gloo when no GPU), seeds (offset by rank), threads, output dir, config dump."""
    from accelerate import Accelerator

    if args.num_threads > 0:
        torch.set_num_threads(args.num_threads)
    log_with = None if args.report_to == "none" else args.report_to
    if log_with:
        import importlib.util

        need = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}[log_with]
        if not any(importlib.util.find_spec(m) for m in need):
            raise SystemExit(f"--report_to {log_with}: install it first (pip install {need[0]})")
    if not args.output_dir:
        args.output_dir = f"runs/{script}-seed{args.seed}"
    acc = Accelerator(cpu=not torch.cuda.is_available(), log_with=log_with, project_dir=args.output_dir)
    seed = args.seed + acc.process_index  # ranks sample different rollouts
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if acc.is_main_process:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / "args.json").write_text(json.dumps(asdict(args), indent=2))
    acc.wait_for_everyone()
    return acc


def log_main(acc):
    def log(msg: str) -> None:
        if acc.is_main_process:
            print(msg, flush=True)
    return log


def make_optimizer(args, model):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate,
                            weight_decay=args.weight_decay)
    warm = max(1, args.warmup_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))  # warm-up, then constant
    return opt, sched


def frozen_copy(model):
    """The reference policy for the KL term: the initial weights, frozen."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def my_slice(items: list, acc) -> list:
    """This rank's contiguous share of a global list (sizes differ by at most one)."""
    n, w, r = len(items), acc.num_processes, acc.process_index
    lo, hi = r * n // w, (r + 1) * n // w
    return items[lo:hi]


def reduce_sums(acc, sums: dict[str, float]) -> dict[str, float]:
    """Sum scalars over ranks (every rank must pass the same keys in the same order)."""
    if acc.num_processes == 1:
        return dict(sums)
    keys = list(sums)
    t = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64, device=acc.device)
    t = acc.reduce(t, reduction="sum")
    return dict(zip(keys, t.tolist()))


def accumulate_gradients(model, acc, prompts: list[list[int]], completions: list[list[int]], pad_id: int,
                         micro_batch_size: int, loss_fn: Callable, masks: list[list[int]] | None = None,
                         temperature: float = 1.0) -> dict[str, float]:
    """Forward/backward over micro-batches of sequences; gradients are summed (synced once, at the end).

    loss_fn(batch, logp, entropy, rows) -> (loss, {metric: sum}) where `rows` are the indices of this
    micro-batch in the full list. The loss must already be normalised by full-batch counts, so that the
    summed gradient equals the full-batch gradient. Returns the metric sums.
    """
    n = len(prompts)
    sums: dict[str, float] = {}
    starts = list(range(0, n, micro_batch_size)) or [0]
    device = acc.device
    for i, s in enumerate(starts):
        rows = list(range(s, min(n, s + micro_batch_size)))
        last = i == len(starts) - 1
        ctx = contextlib.nullcontext() if last or acc.num_processes == 1 else acc.no_sync(model)
        with ctx:
            if not rows:  # a rank with no data still joins the gradient all-reduce
                loss = sum(p.sum() * 0.0 for p in model.parameters() if p.requires_grad)
                acc.backward(loss)
                continue
            batch = pad_sequences([prompts[r] for r in rows], [completions[r] for r in rows], pad_id,
                                  None if masks is None else [masks[r] for r in rows]).to(device)
            logp, ent = token_logprobs(model, batch, temperature)
            loss, metrics = loss_fn(batch, logp, ent, rows)
            acc.backward(loss)
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    return sums


# ----------------------------------------------------------------------------------------------------
# The run: everything a script sets up before its loop, and the book-keeping after each step.
# ----------------------------------------------------------------------------------------------------


@dataclass
class Run:
    """What `start_run` builds. Plain data: the training loop itself stays in each script."""
    args: object
    acc: object
    log: Callable
    model: object  # wrapped for distributed training; call it for forward passes with gradient
    policy: object  # the unwrapped HF model (generation, saving)
    tokenizer: object
    model_path: str
    task: object
    ref: object  # frozen initial policy, or None
    opt: object
    sched: object
    generator: object
    sampling: object
    sampler: object
    logger: object
    start_step: int
    method_state: dict  # the script's own state restored from a checkpoint ({} on a fresh start)
    counters: dict = field(default_factory=lambda: {"rollouts": 0, "gen_tokens": 0})
    bar: object = None
    stop_requested: bool = False  # set by SIGINT/SIGTERM: checkpoint at the end of this step, then exit
    _encoded: dict = field(default_factory=dict)

    def encode(self, text: str) -> list[int]:
        """Token ids of a prompt (cached: prompts recur across epochs)."""
        if text not in self._encoded:
            chat = self.task.name != "countdown" and bool(self.tokenizer.chat_template)
            self._encoded[text] = self.tokenizer(text, add_special_tokens=not chat).input_ids
        return self._encoded[text]

    def evaluate(self) -> dict:
        from common.metrics import evaluate

        return evaluate(self.generator, self.tokenizer, self.task.eval, self.encode, self.task.eval_reward_fn,
                        self.sampling, self.args.eval_samples, self.acc, ks=(1, self.args.eval_samples))


def start_run(args, script: str, need_ref: bool, stop_token_ids: list[int] | None = None) -> Run:
    """Accelerator, policy (+ frozen reference), task, optimizer, generator, sampler, resume, logger,
    and the step-0 evaluation of the starting policy."""
    from common import checkpoint as ckpt
    from common.data import PromptSampler, load_task
    from common.generation import SamplingConfig, build_generator
    from common.metrics import MetricsLogger
    from common.policy import load_policy

    acc = setup(args, script)
    log = log_main(acc)
    model, tokenizer, model_path = load_policy(args.model_name_or_path, args.dtype, acc, log)
    model.to(acc.device)
    task = load_task(args, tokenizer, log)
    ref = frozen_copy(model) if need_ref else None
    opt, sched = make_optimizer(args, model)
    model, opt = acc.prepare(model, opt)
    policy = acc.unwrap_model(model)
    generator = build_generator(args, policy, tokenizer, model_path, acc)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              stop_token_ids=list(stop_token_ids or []))
    run = Run(args, acc, log, model, policy, tokenizer, model_path, task, ref, opt, sched, generator, sampling,
              PromptSampler(len(task.train), args.seed), None, 0, {})
    resume_from = ckpt.resolve_resume(args.resume, args.output_dir)
    if resume_from is not None:
        run.start_step, state = ckpt.load_checkpoint(resume_from, acc, model, opt, sched)
        run.sampler.load_state_dict(state["sampler"])
        run.counters = state["counters"]
        run.method_state = state["method"]
        generator.sync_weights(policy)
        log(f"resumed from {resume_from} at step {run.start_step}")
    run.logger = MetricsLogger(args.output_dir, acc, args.report_to, vars(args),
                               resume_step=run.start_step if resume_from is not None else None)
    if run.start_step == 0:
        row = {"step": 0, **run.evaluate()}
        run.logger.log(row)
        log(f"step 0 (starting policy): {row}")
    _install_stop_handler(run)
    from tqdm.auto import tqdm

    run.bar = tqdm(range(run.start_step + 1, args.max_steps + 1), initial=run.start_step, total=args.max_steps,
                   desc=script, disable=not acc.is_main_process)
    return run


def _install_stop_handler(run: Run) -> None:
    """First Ctrl-C / SIGTERM: finish the current step, save a checkpoint, exit 0. Second: stop at once."""
    import signal

    def handler(signum, frame):
        if run.stop_requested:
            raise KeyboardInterrupt
        run.stop_requested = True
        run.log(f"\nsignal {signum}: saving a checkpoint after this step, then stopping (again to abort)")

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def optimizer_step(run: Run) -> float:
    """Clip, step, schedule, zero grads, and push the new weights to the generator. Returns the grad norm."""
    norm = run.acc.clip_grad_norm_(run.model.parameters(), run.args.max_grad_norm)
    run.opt.step()
    run.sched.step()
    run.opt.zero_grad(set_to_none=True)
    run.generator.sync_weights(run.policy)
    return float(norm)


CORE_SUMS = ("groups", "rollouts", "gen_tokens", "reward_sum", "rewarded", "success", "zero_var", "loss_sum",
             "seqs", "kl_sum", "ent_sum", "tok", "t_gen", "t_train")


def core_metrics(run: Run, step: int, sums: dict, extra: dict | None = None) -> tuple[dict, dict]:
    """Reduce this rank's sums over ranks and build the core metric row (same names in every script).

    `sums` keys (this rank): groups, rollouts (generated samples), gen_tokens, reward_sum / rewarded (the
    training reward over `rewarded` fresh samples), success (samples counted as passing), zero_var (groups
    whose rewards were all equal, before any method intervenes), loss_sum / seqs, kl_sum / ent_sum / tok
    (per completion token), t_gen, t_train (seconds). Returns (row, every reduced sum: the core ones and `extra`).
    """
    missing = [k for k in CORE_SUMS if k not in sums]
    if missing:
        raise KeyError(f"core_metrics: missing sums {missing}")
    extra = extra or {}
    s = reduce_sums(run.acc, {**{k: sums[k] for k in CORE_SUMS}, **{f"x_{k}": v for k, v in extra.items()}})
    run.counters["rollouts"] += int(s["rollouts"])
    run.counters["gen_tokens"] += int(s["gen_tokens"])
    world = run.acc.num_processes
    row = {
        "step": step, "rollouts": run.counters["rollouts"], "gen_tokens": run.counters["gen_tokens"],
        "reward_mean": s["reward_sum"] / max(1, s["rewarded"]), "pass_rate": s["success"] / max(1, s["rewarded"]),
        "frac_zero_var_groups": s["zero_var"] / max(1, s["groups"]), "loss": s["loss_sum"] / max(1, s["seqs"]),
        "kl": s["kl_sum"] / max(1, s["tok"]), "entropy": s["ent_sum"] / max(1, s["tok"]),
        "lr": run.sched.get_last_lr()[0], "time_gen_s": s["t_gen"] / world, "time_train_s": s["t_train"] / world,
    }
    return row, {(k[2:] if k.startswith("x_") else k): v for k, v in s.items()}


def finish_step(run: Run, step: int, row: dict, t_start: float, method_state: dict) -> None:
    """Evaluate when due, log the row, update the progress bar, checkpoint when due."""
    from common import checkpoint as ckpt

    args = run.args
    if (args.eval_every and step % args.eval_every == 0) or step == args.max_steps:
        row.update(run.evaluate())
    row["time_step_s"] = time.time() - t_start
    run.logger.log(row)
    run.bar.update(1)
    post = {"reward": f"{row['reward_mean']:.3f}", "zero_var": f"{row['frac_zero_var_groups']:.2f}"}
    if "eval_pass@1" in row:
        post["eval"] = f"{row['eval_pass@1']:.3f}"
    run.bar.set_postfix(post)
    # every rank must agree on stopping, or the next collective would hang
    stop = reduce_sums(run.acc, {"stop": float(run.stop_requested)})["stop"] > 0
    if (args.save_every and step % args.save_every == 0) or step == args.max_steps or stop:
        state = {"sampler": run.sampler.state_dict(), "counters": run.counters, "method": method_state}
        path = ckpt.save_checkpoint(args.output_dir, step, run.acc, run.model, run.tokenizer, run.opt, run.sched,
                                    state, args.keep_checkpoints)
        if stop:
            run.log(f"stopped at step {step}; continue with --resume auto (checkpoint {path})")
    if step == args.max_steps or stop:
        run.bar.close()
        run.logger.close()
        if stop:
            raise SystemExit(0)
