"""Prompts and rewards of a real dataset through `datasets` (the embedded Countdown task: common/countdown.py).
Every prompt is an `Example` with a stable integer `id` (its index in the training list), so that per-prompt
state (replay buffers, pass-rate estimates) survives across steps, epochs and resumes.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np


@dataclass
class Example:
    id: int
    prompt: str  # exactly the text the model sees (chat template applied if any)
    answer: Any  # countdown.Problem, or a gold answer string
    tag: str = ""  # difficulty level of an embedded problem (eval_pass@1_<tag> is logged per level)
    columns: dict = field(default_factory=dict)  # the row as the dataset holds it: what --reward_funcs see


@dataclass
class Scored:
    """One batch's rewards: the `total` per completion, each --reward_funcs function's `values` (None: does not
    apply) and the `seconds` spent computing them."""
    total: list[float]
    values: dict[str, list]
    seconds: float

    def metrics(self, accelerator) -> dict:
        """time_reward_s and reward/<name>_mean / _std over every rank's completions (call on every rank)."""
        from common.distributed import reduce_sums

        sums = {"seconds": self.seconds}
        for name, values in self.values.items():
            given = [value for value in values if value is not None]
            sums.update({f"{name}:n": len(given), f"{name}:sum": sum(given), f"{name}:sq": sum(v * v for v in given)})
        sums = reduce_sums(accelerator, sums)
        out = {"time_reward_s": sums["seconds"] / accelerator.num_processes}
        for name in self.values:
            count = sums[f"{name}:n"]
            mean = sums[f"{name}:sum"] / count if count else None
            out[f"reward/{name}_mean"] = mean
            out[f"reward/{name}_std"] = math.sqrt(max(0.0, sums[f"{name}:sq"] / count - mean ** 2)) if count else None
        return out

    @staticmethod
    def join(parts: list[Scored]) -> Scored:
        """Several batches (e.g. sampling rounds) as one."""
        names = parts[0].values if parts else {}
        return Scored([t for part in parts for t in part.total],
                      {name: [v for part in parts for v in part.values[name]] for name in names},
                      sum(part.seconds for part in parts))

    def columns(self, index: int) -> dict:
        """Each function's value for completion `index`, for its samples.jsonl row."""
        return {f"reward/{name}": values[index] for name, values in self.values.items()}


@dataclass
class Task:
    train: list[Example]
    eval: list[Example]
    reward_fn: Callable[[str, Example], float]  # training reward
    eval_reward_fn: Callable[[str, Example], float]  # binary correctness
    name: str
    templated: bool = False  # prompts went through the chat template (which already holds the special tokens)
    reward_funcs: Any = None  # --reward_funcs (common/rewards.py): replace reward_fn
    eval_reward_funcs: Any = None  # --eval_reward_funcs (default: reward_funcs): replace eval_reward_fn
    success_reward: float = 1.0  # a sample scored by eval_reward_funcs passes at a total >= this
    prompt_column: str = "prompt"  # the column passed to reward functions as `prompts`
    warn: Callable[[str], None] | None = None  # where the once-a-run truncation warning goes
    max_new_tokens: int = 0  # named in that warning
    warned_truncation: bool = False

    def _call(self, funcs, texts: list[str], examples: list[Example], completion_ids: list, step):
        from common.rewards import call_reward_funcs

        return call_reward_funcs(funcs, texts, [example.columns for example in examples], completion_ids,
                                 self.prompt_column, step)

    def score(self, texts: list[str], examples: list[Example], completion_ids: list, truncated, step) -> Scored:
        """Training rewards of completions (`examples[i]`: completion i's prompt). A completion cut by
        max_new_tokens (`truncated[i]`) scores 0 whatever the reward: it never counts as a success."""
        start = time.time()
        if self.warn and not self.warned_truncation and sum(map(bool, truncated)) > len(texts) / 4:
            self.warned_truncation = True
            self.warn(f"warning: {sum(map(bool, truncated))} of {len(texts)} completions hit --max_new_tokens "
                      f"{self.max_new_tokens} (cut: reward 0, never a success); raise it if answers need more room")
        if self.reward_funcs is None:
            total, values = [0.0 if truncated[i] else self.reward_fn(text, examples[i])
                             for i, text in enumerate(texts)], {}
        elif not texts:  # nothing to score on this rank: the same metric names as the others', no call
            total, values = [], {name: [] for name in self.reward_funcs.names}
        else:
            total, values = self._call(self.reward_funcs, texts, examples, completion_ids, step)
            total = [0.0 if truncated[i] else value for i, value in enumerate(total)]
        return Scored(total, values, time.time() - start)

    def eval_success(self, texts: list[str], examples: list[Example], completion_ids: list, truncated) -> list[bool]:
        """Whether each evaluation sample passes: the binary verifier, or --eval_reward_funcs at --success_reward (a
        sample cut by max_new_tokens never passes)."""
        if self.eval_reward_funcs is None:
            return [not cut and self.eval_reward_fn(text, example) >= 1.0
                    for text, example, cut in zip(texts, examples, truncated)]
        total, _ = self._call(self.eval_reward_funcs, texts, examples, completion_ids, None)
        return [value >= self.success_reward and not cut for value, cut in zip(total, truncated)]


LOCAL = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}  # local files and their loaders
MATH_SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."


def _check_jsonl(path: Path) -> None:
    """One line naming the file and line for a .jsonl line that is not a JSON object (`datasets` raises a chain of
    tracebacks instead)."""
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise SystemExit(f"{path} line {number}: not valid JSON ({error})") from None
            if not isinstance(row, dict):
                raise SystemExit(f"{path} line {number}: a row must be a JSON object, got {type(row).__name__}")


def _load_split(name: str, config, split: str, flag: str, required: bool):
    """`split` of a hub dataset or a local file (which holds one split: any `split` reads it whole); None when it is
    not `required` and absent."""
    import datasets

    path = Path(name)
    if path.suffix in LOCAL:
        if not path.exists():
            raise SystemExit(f"{flag} {name}: file not found")
        if path.suffix == ".jsonl":
            _check_jsonl(path)
        kind = LOCAL[path.suffix]
        try:
            return datasets.load_dataset(kind, data_files=str(path), split="train")
        except Exception as error:  # noqa: BLE001 - a damaged file: one line, not the library's traceback chain
            cause = error.__cause__ or error
            raise SystemExit(f"{flag} {name}: cannot read it ({type(cause).__name__}: {str(cause)[:200]})") from None
    try:
        return datasets.load_dataset(name, config, split=split)
    except ValueError as e:  # unknown split
        if required:
            raise SystemExit(f"{flag} {name}: cannot load split {split!r} ({e})")
        return None


def hf_task(args, tokenizer, log=print) -> Task:
    from common.verifiers import gsm8k_gold, math_reward

    if args.reward != "binary":
        raise SystemExit(f"--reward {args.reward} is defined for the Countdown task only; use --reward binary")
    single_file = Path(args.dataset).suffix in LOCAL
    train_ds = _load_split(args.dataset, args.dataset_config, args.train_split, "--dataset", True)
    if args.eval_dataset:
        eval_ds = _load_split(args.eval_dataset, args.dataset_config, args.eval_split or "test", "--eval_dataset",
                              True)
    else:  # a single local file holds no evaluation split: rows are held out of it instead
        eval_ds = _load_split(args.dataset, args.dataset_config, args.eval_split, "--dataset", False) \
            if args.eval_split and not single_file else None
    need_answer = not args.reward_funcs  # only the built-in math reward reads the answer column
    for ds, flag in ((train_ds, "--dataset"), (eval_ds, "--eval_dataset")):
        for col in (args.prompt_column, *([args.answer_column] if need_answer else [])):
            if ds is not None and col not in ds.column_names:
                raise SystemExit(f"--prompt_column/--answer_column: column {col!r} not in {flag} "
                                 f"(columns: {ds.column_names})")
    chat = args.use_chat_template == "yes" or (args.use_chat_template == "auto" and tokenizer.chat_template)
    suffix = args.prompt_suffix if args.prompt_suffix is not None else ("" if args.reward_funcs else MATH_SUFFIX)
    system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []

    def is_messages(q) -> bool:
        return isinstance(q, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in q) and q

    def to_examples(ds, name) -> list[Example]:
        out, dropped = [], 0
        for row_i, row in enumerate(ds):
            q, a = row[args.prompt_column], row.get(args.answer_column)
            if not (isinstance(q, str) or is_messages(q)) or (need_answer and a is None):
                raise SystemExit(f"{name} row {row_i}: {args.prompt_column!r} must be text or a list of "
                                 f"{{role, content}} messages" + (f" and {args.answer_column!r} present" if
                                                                  need_answer else "") + f" (got {q!r:.80}, {a!r:.40})")
            if isinstance(q, str):
                messages = [*system, {"role": "user", "content": q + suffix}]
            else:
                messages = list(q)
            if chat:
                text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            elif isinstance(q, str):
                text = (args.system_prompt + "\n\n" if args.system_prompt else "") + q + suffix
            else:
                raise SystemExit(f"{name} row {row_i}: a message-format prompt needs a chat template and the tokenizer "
                                 f"of {args.model_name_or_path} has none (or --use_chat_template no)")
            if len(tokenizer(text, add_special_tokens=False).input_ids) > args.max_prompt_tokens:
                dropped += 1
                continue
            gold = None if a is None else str(a)
            gold = gsm8k_gold(gold) if gold is not None and "####" in gold else gold
            out.append(Example(len(out), text, gold, columns=dict(row)))
        if dropped:
            log(f"dropped {dropped} prompts longer than --max_prompt_tokens {args.max_prompt_tokens}")
        return out

    train = to_examples(train_ds, args.dataset)
    if eval_ds is not None:
        evals = to_examples(eval_ds, args.eval_dataset or args.dataset)[: args.eval_prompts]
        name = args.eval_dataset or args.dataset
        source = name if Path(name).suffix in LOCAL else f"{name} split {args.eval_split or 'test'}"
    else:  # hold out the last rows, deterministically, and keep them out of training
        n_hold = min(args.eval_prompts, len(train) // 5)  # at most a fifth of a small file
        evals = [Example(i, e.prompt, e.answer, columns=e.columns) for i, e in enumerate(train[len(train) - n_hold:])]
        train = train[:len(train) - n_hold]
        source = f"the last {n_hold} rows of {args.dataset} (at most --eval_prompts, at most a fifth of the rows)"
    if not train:
        raise SystemExit(f"--dataset {args.dataset}: no usable training prompts")
    if args.prompt_pool > 0:
        train = train[:args.prompt_pool]
    log(f"{len(train)} training prompts from {args.dataset}; {len(evals)} held-out prompts from {source}")
    fn = lambda text, ex: math_reward(text, ex.answer)  # noqa: E731
    return Task(train, evals, fn, fn, args.dataset, templated=bool(chat), prompt_column=args.prompt_column)


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
