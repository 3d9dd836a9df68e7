"""Held-out evaluation: pass@1 and unbiased pass@k of a task's prompts (held-out, or a fixed sample
of the training pool), sampled by the run's generator and scored by the task's success rule."""

from __future__ import annotations

import math
import random

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples, c correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n: the k of the eval_pass@k metrics logged from n samples."""
    return [2**i for i in range(max(1, n).bit_length())]


def pass_metrics(counts: list[int], n_samples: int, tags: list[str] | None = None, ks=None) -> dict:
    """eval_pass@k (unbiased; default every power of two k <= n_samples) from per-prompt success
    counts, and eval_pass@1_<tag> per difficulty level when the prompts carry tags."""
    if not counts:  # no held-out prompt: nothing to average (no NaN, no numpy warning)
        return {}
    out = {
        f"eval_pass@{k}": float(np.mean([pass_at_k(n_samples, c, k) for c in counts]))
        for k in (powers_of_two(n_samples) if ks is None else ks)
        if k <= n_samples
    }
    for tag in sorted(set(tags or []) - {""}):
        out[f"eval_pass@1_{tag}"] = float(
            np.mean([c / n_samples for c, t in zip(counts, tags) if t == tag])
        )
    return out


def evaluate(
    generator,
    tokenizer,
    examples,
    encode,
    success_fn,
    sampling,
    n_samples: int,
    accelerator,
    ks=None,
) -> dict:
    """Held-out pass@1 (mean over n_samples), unbiased pass@k (default: every power of two k <=
    n_samples) and pass@1 per difficulty tag; prompts are split across ranks. `success_fn(texts,
    examples, completion_ids, truncated)` says which samples pass (`Task.eval_success`)."""
    from dataclasses import replace

    from accelerate.utils import gather_object

    sampling = replace(sampling, logprobs=False)
    mine = examples[accelerator.process_index :: accelerator.num_processes]
    counts = []
    if mine:
        gens = generator.generate([encode(e.prompt) for e in mine], n_samples, sampling)
        texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
        passed = success_fn(
            texts,
            [e for e in mine for _ in range(n_samples)],
            gens.completion_ids,
            [reason == "length" for reason in gens.finish_reasons],
        )
        counts = [
            (sum(passed[i * n_samples : (i + 1) * n_samples]), getattr(e, "tag", ""))
            for i, e in enumerate(mine)
        ]
    counts = gather_object(counts) if accelerator.num_processes > 1 else counts
    return pass_metrics([c for c, _ in counts], n_samples, [t for _, t in counts], ks)


def train_prompt_sample(train: list, count: int) -> list:
    """The training-pool prompts that eval_train_* is measured on: `count` of them drawn with a
    fixed seed of their own (the same prompts for every run seed and method on one pool), the whole
    pool when it is smaller; [] for 0."""
    if count <= 0:
        return []
    if count >= len(train):
        return list(train)
    return [train[i] for i in sorted(random.Random(0).sample(range(len(train)), count))]


def evaluate_train_prompts(score, examples: list) -> dict:
    """`score(examples)` (the held-out evaluation's own function) on training-pool prompts, renamed
    eval_train_*, sampled on a copy of the random state (torch, CUDA, numpy, Python): the run's
    training steps are the same with or without it (HF generation; vLLM's request seeds advance)."""
    if not examples:
        return {}
    import torch

    py_state, np_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        out = score(examples)
    random.setstate(py_state)
    np.random.set_state(np_state)
    return {name.replace("eval_", "eval_train_", 1): value for name, value in out.items()}


def evaluate_policy(
    generator, tokenizer, task, encode, sampling, args, accelerator, train_prompts_first=False
) -> dict:
    """The evaluation every script logs: held-out pass@1 / pass@k (eval_*) and the same on a fixed
    sample of --eval_train_prompts training prompts (eval_train_*: the gap shows how much of the
    pool's fit carries over to new prompts). `train_prompts_first` samples those first (their
    samples depend on the order: the order some scripts' runs were recorded with)."""

    def score(examples):
        return evaluate(
            generator,
            tokenizer,
            examples,
            encode,
            task.eval_success,
            sampling,
            args.eval_samples,
            accelerator,
        )

    train_prompts = train_prompt_sample(task.train, args.eval_train_prompts)
    if train_prompts_first:
        train_fit = evaluate_train_prompts(score, train_prompts)
        out = score(task.eval)
    else:
        out = score(task.eval)
        train_fit = evaluate_train_prompts(score, train_prompts)
    out.update(train_fit)
    return out
