"""Prompts and rewards of a real dataset through `datasets` (the embedded Countdown task: common/countdown.py).
Every prompt is an `Example` with a stable integer `id` (its index in the training list), so that per-prompt
state (replay buffers, pass-rate estimates) survives across steps, epochs and resumes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np


@dataclass
class Example:
    id: int
    prompt: str  # exactly the text the model sees (chat template applied if any)
    answer: Any  # countdown.Problem, or a gold answer string
    tag: str = ""  # difficulty level of an embedded problem (eval_pass@1_<tag> is logged per level)


@dataclass
class Task:
    train: list[Example]
    eval: list[Example]
    reward_fn: Callable[[str, Example], float]  # training reward
    eval_reward_fn: Callable[[str, Example], float]  # binary correctness
    name: str
    templated: bool = False  # prompts went through the chat template (which already holds the special tokens)


def _load_split(args, split: str):
    import datasets

    path = Path(args.dataset)
    if path.suffix in (".json", ".jsonl", ".parquet", ".csv"):
        if not path.exists():
            raise SystemExit(f"--dataset {args.dataset}: file not found")
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}[path.suffix]
        if split != args.train_split:
            return None  # a single local file has no separate eval split
        return datasets.load_dataset(kind, data_files=str(path), split="train")
    try:
        return datasets.load_dataset(args.dataset, args.dataset_config, split=split)
    except ValueError as e:  # unknown split
        if split == args.train_split:
            raise SystemExit(f"--dataset {args.dataset}: cannot load split {split!r} ({e})")
        return None


def hf_task(args, tokenizer, log=print) -> Task:
    from common.verifiers import gsm8k_gold, math_reward

    if args.reward != "binary":
        raise SystemExit(f"--reward {args.reward} is defined for the Countdown task only; use --reward binary")
    train_ds = _load_split(args, args.train_split)
    eval_ds = _load_split(args, args.eval_split) if args.eval_split else None
    for col in (args.prompt_column, args.answer_column):
        if col not in train_ds.column_names:
            raise SystemExit(f"--prompt_column/--answer_column: column {col!r} not in {args.dataset} "
                             f"(columns: {train_ds.column_names})")
    chat = args.use_chat_template == "yes" or (args.use_chat_template == "auto" and tokenizer.chat_template)

    def to_examples(ds) -> list[Example]:
        out, dropped = [], 0
        for row_i, row in enumerate(ds):
            q, a = row[args.prompt_column], row[args.answer_column]
            if not isinstance(q, str) or a is None:
                raise SystemExit(f"{args.dataset} row {row_i}: {args.prompt_column!r} must be text and "
                                 f"{args.answer_column!r} present (got {type(q).__name__}, {a!r})")
            text = q + args.prompt_suffix
            if chat:
                text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                     add_generation_prompt=True)
            if len(tokenizer(text, add_special_tokens=False).input_ids) > args.max_prompt_tokens:
                dropped += 1
                continue
            a = str(a)
            out.append(Example(len(out), text, gsm8k_gold(a) if "####" in a else a))
        if dropped:
            log(f"dropped {dropped} prompts longer than --max_prompt_tokens {args.max_prompt_tokens}")
        return out

    train = to_examples(train_ds)
    if eval_ds is not None:
        evals = to_examples(eval_ds)[: args.eval_prompts]
    else:  # hold out the last rows, deterministically, and keep them out of training
        n_hold = min(args.eval_prompts, len(train) // 5)
        evals = [Example(i, e.prompt, e.answer) for i, e in enumerate(train[-n_hold:])]
        train = train[:-n_hold]
    if not train:
        raise SystemExit(f"--dataset {args.dataset}: no usable training prompts")
    if args.prompt_pool > 0:
        train = train[:args.prompt_pool]
    fn = lambda text, ex: math_reward(text, ex.answer)  # noqa: E731
    return Task(train, evals, fn, fn, args.dataset, templated=bool(chat))


class PromptEncoder:
    """Token ids of a prompt text, cached (prompts recur across epochs). Special tokens (BOS) are added
    unless the chat template already put them in the text."""

    def __init__(self, tokenizer, templated: bool):
        self.tokenizer, self.templated, self.cache = tokenizer, templated, {}

    def __call__(self, text: str) -> list[int]:
        if text not in self.cache:
            self.cache[text] = self.tokenizer(text, add_special_tokens=not self.templated).input_ids
        return list(self.cache[text])


class PromptSampler:
    """Epoch-wise seeded shuffles of the training set; its state is (epoch, position) for exact resume."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n)

    def next_ids(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self._perm = self._permutation()
            take = min(k - len(out), self.n - self.pos)
            out.extend(int(i) for i in self._perm[self.pos:self.pos + take])
            self.pos += take
        return out

    def state_dict(self) -> dict:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        if s["n"] != self.n:
            raise SystemExit(f"resume: the checkpoint's training set has {s['n']} prompts, this run has {self.n}")
        self.seed, self.epoch, self.pos = s["seed"], s["epoch"], s["pos"]
        self._perm = self._permutation()
