"""Plumbing every script shares: accelerator and seeds, optimizer, cross-rank sums, the micro-batched
backward pass, and the reference model. The method-specific loss stays in each script."""
from __future__ import annotations

import contextlib
import copy
import json
import random
from dataclasses import asdict
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
