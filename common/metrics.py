"""One JSON object per step in <output_dir>/metrics.jsonl (main process), plus optional trackers. Core names
every script logs (each script computes them where it logs them): step, rollouts, gen_tokens,
reward_mean, reward_std, pass_rate, frac_zero_var_groups, completion_len_mean, clipped_ratio, loss, kl, entropy,
grad_norm, lr, time_step_s, time_gen_s, time_train_s; eval_pass@1 / eval_pass@k when evaluating.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def check_tracker(report_to: str) -> None:
    """A clear error before anything starts when `--report_to` names a tracker that is not installed."""
    import importlib.util

    need = {"none": (), "tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",)}[report_to]
    if need and not any(importlib.util.find_spec(module) for module in need):
        raise SystemExit(f"--report_to {report_to}: install it first (pip install {need[0]})")


class MetricsLogger:
    def __init__(self, output_dir: str, accelerator, report_to: str = "none", config: dict | None = None,
                 resume_step: int | None = None, project: str = "rlvr-sampling"):
        self.acc = accelerator
        self.path = Path(output_dir) / "metrics.jsonl"
        self.trackers = report_to != "none"
        if not accelerator.is_main_process:
            return
        if resume_step is not None and self.path.exists():
            # drop rows written after the checkpoint, so the file reads as one uninterrupted run
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_step]
            self.path.write_text("".join(ln + "\n" for ln in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        if self.trackers:
            accelerator.init_trackers(project, config=config or {})

    def log(self, metrics: dict) -> None:
        if not self.acc.is_main_process:
            return
        clean = {k: (float(v) if isinstance(v, (np.floating, np.integer)) else v) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.trackers:
            self.acc.log({k: v for k, v in clean.items() if isinstance(v, (int, float))}, step=clean["step"])

    def close(self) -> None:
        if self.trackers:
            self.acc.end_training()


def evaluate(generator, tokenizer, examples, encode, reward_fn, sampling, n_samples: int, accelerator,
             ks=(1, 4)) -> dict:
    """Held-out pass@1 (mean over n_samples) and unbiased pass@k; prompts are split across ranks."""
    from dataclasses import replace

    from accelerate.utils import gather_object

    sampling = replace(sampling, logprobs=False)
    mine = examples[accelerator.process_index::accelerator.num_processes]
    counts = []
    if mine:
        gens = generator.generate([encode(e.prompt) for e in mine], n_samples, sampling)
        for i, e in enumerate(mine):
            texts = [tokenizer.decode(gens.completion_ids[i * n_samples + j], skip_special_tokens=True)
                     for j in range(n_samples)]
            counts.append(sum(reward_fn(t, e) >= 1.0 for t in texts))
    counts = gather_object(counts) if accelerator.num_processes > 1 else counts
    out = {}
    for k in ks:
        if k <= n_samples:
            out[f"eval_pass@{k}"] = float(np.mean([pass_at_k(n_samples, c, k) for c in counts]))
    return out
