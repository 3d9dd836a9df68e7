"""A real dataset's prompts as `Example`s (training and held-out), the prompt encoder and the
sampler that walks the training prompts in epochs. An `Example`'s `id` is its index in the training
list, so per-prompt state (replay buffers, pass-rate estimates) survives steps, epochs and resumes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from common.tasks.task import Example, Task

# local files and their loaders
LOCAL = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
MATH_SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."


def _check_jsonl(path: Path) -> None:
    """One line naming the file and line for a .jsonl line that is not a JSON object (`datasets`
    raises a chain of tracebacks instead)."""
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as error:
                raise SystemExit(f"{path} line {number}: not valid JSON ({error})") from None
            if not isinstance(row, dict):
                raise SystemExit(
                    f"{path} line {number}: a row must be a JSON object, got {type(row).__name__}"
                )


def one_split(name: str) -> bool:
    """A source that holds one split: a local file or a saved `Dataset` (a `DatasetDict` has its
    own splits)."""
    if Path(name).suffix in LOCAL:
        return True
    from common.tasks.hub_datasets import saved_to_disk

    return saved_to_disk(name) == "dataset"


def _load_split(name: str, config, split: str, flag: str, required: bool):
    """`split` of a local file (it holds one split: any `split` reads it whole), or of a hub dataset
    or a `save_to_disk` folder (common/tasks/hub_datasets.py); None when it is not `required` and
    absent."""
    path = Path(name)
    if path.suffix not in LOCAL:
        from common.tasks.hub_datasets import load_split

        return load_split(name, config, split, flag, required)
    import datasets

    from common.model.policy import library_bars_off

    if not path.exists():
        raise SystemExit(f"{flag} {name}: file not found")
    if path.suffix == ".jsonl":
        _check_jsonl(path)
    try:
        with library_bars_off(datasets):
            return datasets.load_dataset(LOCAL[path.suffix], data_files=str(path), split="train")
    except Exception as error:  # noqa: BLE001 - a damaged file: one line, not the library's traceback chain
        cause = error.__cause__ or error
        raise SystemExit(
            f"{flag} {name}: cannot read it ({type(cause).__name__}: {str(cause)[:200]})"
        ) from None


def load_splits(args):
    """(training rows, held-out rows) of --dataset_name: the held-out rows are --eval_dataset's
    (its --dataset_test_split, else `test`), else --dataset_test_split of a source that has splits;
    None for a one-split source (a local file, a saved `Dataset`: any split reads it whole) or an
    absent split: its last rows are held out instead (`hold_out_last`)."""
    train_ds = _load_split(
        args.dataset_name, args.dataset_config, args.dataset_train_split, "--dataset_name", True
    )
    eval_ds = None  # a single local file holds no evaluation split: rows are held out of it instead
    if args.eval_dataset:
        eval_split = args.dataset_test_split or "test"
        eval_ds = _load_split(
            args.eval_dataset, args.dataset_config, eval_split, "--eval_dataset", True
        )
    elif args.dataset_test_split and not one_split(args.dataset_name):
        eval_ds = _load_split(
            args.dataset_name, args.dataset_config, args.dataset_test_split, "--dataset_name", False
        )
    return train_ds, eval_ds


def held_out_source(args) -> str:
    """Where `load_splits`' held-out rows come from, as the start-up line says it."""
    name = args.eval_dataset or args.dataset_name
    return name if one_split(name) else f"{name} split {args.dataset_test_split or 'test'}"


def hold_out_last(train: list, args) -> tuple[list, list, str]:
    """(training, held out, where from) of a source without held-out rows: its last
    min(--eval_prompts, rows / 5) rows are held out, deterministically, and kept out of training."""
    n_hold = min(args.eval_prompts, len(train) // 5)  # at most a fifth of a small file
    source = (
        f"the last {n_hold} rows of {args.dataset_name} (at most --eval_prompts, at most a "
        "fifth of the rows)"
    )
    return train[: len(train) - n_hold], train[len(train) - n_hold :], source


def hf_task(args, tokenizer, log=print) -> Task:
    from common.rl.verifiers import gsm8k_gold, math_reward

    if args.reward not in ("auto", "binary"):
        raise SystemExit(
            f"--reward {args.reward} is defined for the Countdown task only; use --reward binary"
        )
    train_ds, eval_ds = load_splits(args)
    need_answer = not args.reward_funcs  # only the built-in math reward reads the answer column
    prompt_column = args.prompt_column or prompt_column_of(train_ds)
    for ds, flag in ((train_ds, "--dataset_name"), (eval_ds, "--eval_dataset")):
        for col in (prompt_column, *([args.answer_column] if need_answer else [])):
            if ds is not None and col not in ds.column_names:
                from common.tasks.dataset_errors import missing_column

                raise SystemExit(missing_column(args, col, prompt_column, flag, ds.column_names))
    chat = args.use_chat_template == "yes" or (
        args.use_chat_template == "auto" and tokenizer.chat_template
    )
    suffix = args.prompt_suffix
    if suffix is None:  # the built-in math reward asks for a boxed answer
        suffix = "" if args.reward_funcs else MATH_SUFFIX
    system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []

    def is_messages(q) -> bool:
        return (
            isinstance(q, list)
            and bool(q)
            and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in q)
        )

    as_messages = sum(map(is_messages, train_ds[prompt_column]))
    found = {"messages": as_messages, "text": len(train_ds) - as_messages}
    has_template = bool(tokenizer.chat_template)
    log(prompt_rendering(args, prompt_column, bool(chat), has_template, found, suffix))

    def to_examples(ds, name) -> list[Example]:
        out, dropped = [], 0
        for row_i, row in enumerate(ds):
            q, a = row[prompt_column], row.get(args.answer_column)
            if not (isinstance(q, str) or is_messages(q)) or (need_answer and a is None):
                from common.tasks.dataset_errors import bad_row

                raise SystemExit(bad_row(args, name, row_i, prompt_column, need_answer, q, a))
            if isinstance(q, str):
                messages = [*system, {"role": "user", "content": q + suffix}]
            else:
                messages = list(q)
            if chat:
                text = tokenizer.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=True
                )
            elif isinstance(q, str):
                text = (args.system_prompt + "\n\n" if args.system_prompt else "") + q + suffix
            else:
                from common.tasks.dataset_errors import needs_chat_template

                raise SystemExit(needs_chat_template(args, name, row_i, tokenizer))
            if len(tokenizer(text, add_special_tokens=False).input_ids) > args.max_prompt_length:
                dropped += 1
                continue
            gold = None if a is None else str(a)
            gold = gsm8k_gold(gold) if gold is not None and "####" in gold else gold
            out.append(Example(len(out), text, gold, columns=dict(row)))
        if dropped:
            log(
                f"dropped {dropped} prompts longer than --max_prompt_length "
                f"{args.max_prompt_length}"
            )
        return out

    train = to_examples(train_ds, args.dataset_name)
    if eval_ds is not None:
        evals = to_examples(eval_ds, args.eval_dataset or args.dataset_name)[: args.eval_prompts]
        source = held_out_source(args)
    else:  # hold out the last rows, deterministically, and keep them out of training
        train, held, source = hold_out_last(train, args)
        evals = [Example(i, e.prompt, e.answer, columns=e.columns) for i, e in enumerate(held)]
    if not train:
        raise SystemExit(f"--dataset_name {args.dataset_name}: no usable training prompts")
    if args.prompt_pool > 0:
        train = train[: args.prompt_pool]
    log(
        f"{len(train)} training prompts from {args.dataset_name}; {len(evals)} held-out prompts "
        f"from {source}"
    )
    fn = lambda text, ex: math_reward(text, ex.answer)  # noqa: E731
    return Task(
        train, evals, fn, fn, args.dataset_name, templated=bool(chat), prompt_column=prompt_column
    )


def prompt_column_of(dataset) -> str:
    """The prompt column when --prompt_column is not given: TRL's `prompt` when the dataset has
    one, else `question` (GSM8K's)."""
    return "prompt" if "prompt" in dataset.column_names else "question"


def prompt_rendering(
    args, column: str, chat: bool, has_template: bool, found: dict, suffix: str
) -> str:
    """The run's first line on the prompts: which column, whether its rows were found as messages
    or as text (`found`: the count of each), whether the chat template renders them and what the
    run adds to them (--system_prompt, `suffix`: text prompts only; messages go as they are)."""
    source = "--prompt_column" if args.prompt_column else "found by name; --prompt_column to choose"
    kinds = [f"{count} rows as {kind}" for kind, count in found.items() if count]
    parts = []
    if found.get("messages"):
        parts.append(
            "messages go through the tokenizer's chat template as they are (nothing added)"
        )
    if found.get("text"):
        if chat:
            how = (
                "text goes through the tokenizer's chat template as a user message (TRL leaves "
                "text prompts as they are: --use_chat_template no to do so)"
            )
        elif has_template:
            how = "text is used as it is, the chat template left out (--use_chat_template no)"
        else:
            how = "text is used as it is (the tokenizer has no chat template)"
        added = []
        if args.system_prompt:
            where = "as a system message" if chat else "as a first paragraph"
            added.append(f"--system_prompt {args.system_prompt!r:.80} before it, {where}")
        if suffix:
            default = (
                " (the default with the built-in math reward; --prompt_suffix '' adds none)"
                if args.prompt_suffix is None
                else ""
            )
            added.append(f"--prompt_suffix {suffix!r} appended{default}")
        parts.append(how + "; added: " + ("; ".join(added) if added else "nothing"))
    head = f"prompts: column {column!r} ({source}), {', '.join(kinds) or 'no rows'}: "
    return head + "; ".join(parts)


class PromptEncoder:
    """Token ids of a prompt text, cached (prompts recur across epochs). Special tokens (BOS) are
    added unless the chat template already put them in the text."""

    def __init__(self, tokenizer, templated: bool):
        self.tokenizer, self.templated, self.cache = tokenizer, templated, {}

    def __call__(self, text: str) -> list[int]:
        if text not in self.cache:
            self.cache[text] = self.tokenizer(text, add_special_tokens=not self.templated).input_ids
        return list(self.cache[text])


class PromptSampler:
    """Epoch-wise seeded shuffles of the training set; its state is (epoch, position) for exact
    resume."""

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
            out.extend(int(i) for i in self._perm[self.pos : self.pos + take])
            self.pos += take
        return out

    def state_dict(self) -> dict:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, s: dict) -> None:
        if s["n"] != self.n:
            raise SystemExit(
                f"resume: the checkpoint's training set has {s['n']} prompts, this run has {self.n}"
            )
        self.seed, self.epoch, self.pos = s["seed"], s["epoch"], s["pos"]
        self._perm = self._permutation()
