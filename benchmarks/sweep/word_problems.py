"""A small, learnable task in the real format and a small base model for it, both built offline and deterministically:
what `benchmarks/sweep/real_path.py` trains every script on through the path a user takes (a Hugging Face model
directory, `.jsonl` files through `datasets`, the chat template, the built-in math reward or `--reward_funcs`).

The task: short arithmetic word problems, GSM8K-shaped (`question`, and an `answer` whose last line is `#### N`), of
three graded kinds (`LEVELS`): one step (a gain or a loss), two steps (a gain and a loss in either order), and a
product followed by a loss. The same rows are also written as message prompts (`prompt`: a system message saying how
to answer, then the question), for `--reward_funcs`. Training and held-out rows are disjoint questions.

    python benchmarks/sweep/word_problems.py --out runs/wp/  # runs/wp/{train,heldout}{,_messages}.jsonl, the base model

The base: a char-level tokenizer with a chat template and a ~1M-parameter Llama decoder, SFT'd on both prompt
renderings (a text prompt with the math reward's default suffix, and the message prompt) to answer with one
`a+b=c` line per step and a last line `\\boxed{N}`. Like the embedded Countdown base, a share of its SFT answers is
careless (every loss read as a gain, a product read as a sum): the base writes the right steps often enough that RL
finds them and wrongly often enough that it has room (held-out pass@1 in `build_info.json`). Built once
under `$RLVR_CACHE` keyed by a hash of its recipe, or copied from `assets/` when a build of that recipe ships there.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAMES = (
    "Ann",
    "Ben",
    "Cara",
    "Dan",
    "Eva",
    "Finn",
    "Gia",
    "Hal",
    "Ivy",
    "Jon",
    "Kim",
    "Leo",
    "Mia",
    "Ned",
    "Ola",
    "Pat",
    "Raj",
    "Sue",
    "Tom",
    "Uma",
)
ITEMS = (
    "apples",
    "pens",
    "cards",
    "stamps",
    "shells",
    "coins",
    "books",
    "eggs",
    "marbles",
    "stickers",
    "beads",
    "plums",
)
GAINS = ("buys {n} more", "finds {n} more", "gets {n} more", "is given {n} more")
LOSSES = ("gives away {n}", "loses {n}", "sells {n}", "eats {n}")
SYSTEM = "Solve the problem step by step. Put the final answer in \\boxed{}."
"""the system message of the message-prompt rows"""


@dataclass(frozen=True)
class Level:
    tag: str
    steps: str
    """the operations in order: `+` a gain, `-` a loss, `*` boxes of equal size (first only)"""
    careless: float
    """the share of SFT answers that read every loss as a gain and a product as a sum"""


LEVELS = (Level("one", "-", 0.6), Level("two", "+-", 0.75), Level("mul", "*-", 0.75))


@dataclass(frozen=True)
class DataRecipe:
    train_rows: int = 3000
    heldout_rows: int = 256
    seed: int = 0


def _problem(level: Level, rng: random.Random) -> tuple[str, list[tuple[int, str, int, int]]]:
    """(question, steps (x, op, y, result)) of one problem of `level`; every intermediate result stays positive."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    ops = level.steps if level.tag != "two" or rng.random() < 0.5 else level.steps[::-1]
    if ops[0] == "*":
        boxes, size = rng.randint(2, 9), rng.randint(2, 9)
        value, steps = boxes * size, [(boxes, "*", size, boxes * size)]
        sentences = [f"{name} has {boxes} bags with {size} {item} in each."]
        ops = ops[1:]
    else:
        value, steps = rng.randint(8, 40), []
        sentences = [f"{name} has {value} {item}."]
    for op in ops:
        amount = rng.randint(2, 20) if op == "+" else rng.randint(1, max(1, value - 1))
        result = value + amount if op == "+" else value - amount
        sentences.append(f"{name} {rng.choice(GAINS if op == '+' else LOSSES).format(n=amount)}.")
        steps.append((value, op, amount, result))
        value = result
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), steps


def careless_steps(steps: list[tuple[int, str, int, int]]) -> list[tuple[int, str, int, int]]:
    """The same steps with every loss read as a gain and a product as a sum (the errors RL has to unlearn)."""
    out, value = [], None
    for x, op, y, _ in steps:
        x = x if value is None else value
        value = x + y
        out.append((x, "+", y, value))
    return out


def solution_text(steps) -> str:
    """What the base is taught to write: one `a+b=c` line per step, then `\\boxed{N}`."""
    return "".join(f"{x}{op}{y}={z}\n" for x, op, y, z in steps) + f"\\boxed{{{steps[-1][3]}}}"


def gsm8k_answer(steps) -> str:
    return "".join(f"{x} {op} {y} = {z}\n" for x, op, y, z in steps) + f"#### {steps[-1][3]}"


def make_rows(recipe: DataRecipe = DataRecipe()) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): `question`, `answer` (`#### N`), `level`, `prompt` (system + user messages);
    the levels take turns, questions are unique and no held-out question is a training one."""
    rng, seen, rows = random.Random(recipe.seed), set(), []
    while len(rows) < recipe.train_rows + recipe.heldout_rows:
        level = LEVELS[len(rows) % len(LEVELS)]
        question, steps = _problem(level, rng)
        if question in seen:
            continue
        seen.add(question)
        rows.append(
            {
                "question": question,
                "answer": gsm8k_answer(steps),
                "level": level.tag,
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": question},
                ],
            }
        )
    return rows[: recipe.train_rows], rows[recipe.train_rows :]


def data_sha256(recipe: DataRecipe = DataRecipe()) -> str:
    """A hash of the rows `recipe` gives (build_info.json keeps it: a changed generator is caught by its test)."""
    return hashlib.sha256(json.dumps(make_rows(recipe), sort_keys=True).encode()).hexdigest()


def write_data(folder: Path, recipe: DataRecipe = DataRecipe()) -> dict[str, Path]:
    """The four files: train.jsonl / heldout.jsonl (text prompts: `question`, `answer`, `level`) and
    train_messages.jsonl / heldout_messages.jsonl (`prompt` as messages, `answer`, `level`)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, rows in zip(("train", "heldout"), make_rows(recipe)):
        for kind, keys in (
            ("", ("question", "answer", "level")),
            ("_messages", ("prompt", "answer", "level")),
        ):
            path = folder / f"{split}{kind}.jsonl"
            path.write_text(
                "".join(json.dumps({key: row[key] for key in keys}) + "\n" for row in rows)
            )
            out[split + kind] = path
    return out


# ----------------------------------------------------------------------------------------------------
# The base model
# ----------------------------------------------------------------------------------------------------

SPECIAL = ("<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>")
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]


def phrases() -> list[str]:
    """Multi-character tokens, as a trained BPE vocabulary would have them: the task's recurring words and phrases,
    the math reward's default suffix and the system message. Prompts are ~40 tokens instead of ~170 characters (RL
    and SFT cost what they hold); numbers, answers and any other text stay one token per character."""
    from common.tasks.loading import MATH_SUFFIX

    words = [*NAMES, *ITEMS, *(verb.split(" {n}")[0] + " " for verb in (*GAINS, *LOSSES))]
    return [
        MATH_SUFFIX,
        SYSTEM,
        *words,
        " more",
        " has ",
        " bags with ",
        " in each.",
        "How many ",
        " does ",
        " have now?",
    ]


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + "
    "'\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@dataclass(frozen=True)
class ModelRecipe:
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    sft_steps: int = 1500
    sft_batch_size: int = 32
    sft_lr: float = 1e-3
    seed: int = 0
    data: DataRecipe = DataRecipe()

    def key(self) -> str:
        spec = {
            **asdict(self),
            "levels": [asdict(level) for level in LEVELS],
            "system": SYSTEM,
            "chat_template": CHAT_TEMPLATE,
            "vocab": [*SPECIAL, *CHARS, *phrases()],
        }
        return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]


def build_tokenizer():
    """One token per character (printable ASCII and newline) and per phrase of `phrases()`, the chat roles as special
    tokens, a chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate([*SPECIAL, *CHARS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=list(SPECIAL[4:]),
    )
    tokenizer.add_tokens(phrases())
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(recipe: ModelRecipe, tokenizer):
    """The untrained decoder (seeded: call inside torch.random.fork_rng to leave the caller's stream alone)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=recipe.hidden_size,
            num_hidden_layers=recipe.num_layers,
            num_attention_heads=recipe.num_heads,
            num_key_value_heads=recipe.num_kv_heads,
            intermediate_size=recipe.intermediate_size,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )


def renderings(row: dict, tokenizer) -> list[str]:
    """The two prompts a row is trained on: the question with the math reward's default suffix (as `--dataset_name
    train.jsonl` renders it) and the message prompt (as `--prompt_column prompt` renders it)."""
    from common.tasks.loading import MATH_SUFFIX

    user = [{"role": "user", "content": row["question"] + MATH_SUFFIX}]
    return [
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        for messages in (user, row["prompt"])
    ]


def sft(model, tokenizer, recipe: ModelRecipe, stop_after: int | None = None, log=print) -> dict:
    """Supervised warm-up, loss on the answer only: each example a random training row in one of its two renderings,
    answered correctly or, with its level's `careless` share, carelessly."""
    import numpy as np
    import torch

    from common.demo.tiny_model import sft_step
    from common.rl.masking import pad_sequences

    rng = random.Random(recipe.seed)
    train, _ = make_rows(recipe.data)
    careless = {level.tag: level.careless for level in LEVELS}
    steps_of = {row["question"]: _steps_of(row) for row in train}
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, weight_decay=0.0)
    warmup = max(1, recipe.sft_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1 - s / recipe.sft_steps) ** 0.5
    )
    model.train()
    losses, start = [], time.time()
    for step in range(stop_after or recipe.sft_steps):
        rows = [train[rng.randrange(len(train))] for _ in range(recipe.sft_batch_size)]
        prompts, answers = [], []
        for row in rows:
            steps = steps_of[row["question"]]
            steps = careless_steps(steps) if rng.random() < careless[row["level"]] else steps
            prompts.append(
                tokenizer(
                    rng.choice(renderings(row, tokenizer)), add_special_tokens=False
                ).input_ids
            )
            answers.append(
                tokenizer(solution_text(steps), add_special_tokens=False).input_ids
                + [tokenizer.eos_token_id]
            )
        losses.append(
            sft_step(model, opt, sched, pad_sequences(prompts, answers, tokenizer.pad_token_id))
        )
        if step % 50 == 0:
            log(f"SFT step {step}: loss {np.mean(losses[-50:]):.3f} ({time.time() - start:.0f} s)")
    return {
        "sft_final_loss": float(np.mean(losses[-50:])),
        "sft_loss_trace": [round(x, 6) for x in losses[:20]],
    }


def _steps_of(row: dict) -> list[tuple[int, str, int, int]]:
    steps = []
    for line in row["answer"].splitlines()[:-1]:
        x, op, y, _, z = line.split()
        steps.append((int(x), op, int(y), int(z)))
    return steps


def evaluate(
    model, tokenizer, rows: list[dict], samples: int = 4, max_new_tokens: int = 48
) -> dict:
    """Held-out pass@1 (T=1, math-verify on the last `\\boxed{}`) of each rendering, overall and per level."""
    import numpy as np

    from common.generation.hf import HFGenerator, SamplingConfig
    from common.rl.verifiers import gsm8k_gold, math_reward

    generator, out = HFGenerator(model, tokenizer), {}
    for k, name in enumerate(("text_suffix", "messages")):
        prompts = [
            tokenizer(renderings(row, tokenizer)[k], add_special_tokens=False).input_ids
            for row in rows
        ]
        gens = generator.generate(prompts, samples, SamplingConfig(max_new_tokens=max_new_tokens))
        texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
        wins = np.array(
            [
                math_reward(text, gsm8k_gold(rows[i // samples]["answer"]))
                for i, text in enumerate(texts)
            ]
        )
        wins = wins.reshape(-1, samples)
        levels = np.array([row["level"] for row in rows])
        out[f"heldout_pass@1_{name}"] = round(float(wins.mean()), 3)
        for level in LEVELS:
            out[f"heldout_pass@1_{name}_{level.tag}"] = round(
                float(wins[levels == level.tag].mean()), 3
            )
        out[f"heldout_pass@{samples}_{name}"] = round(float((wins.max(1) > 0).mean()), 3)
    return out


def ensure_base(recipe: ModelRecipe = ModelRecipe(), log=print) -> Path:
    """The built base's directory (in the cache; copied from assets/ when a build of this recipe ships there, else
    built: SFT, then the held-out measurement into build_info.json)."""
    import torch

    from common.demo.cache import cache_root
    from common.demo.tiny_model import restore_shipped, weights_sha256

    path = cache_root() / f"wordproblems-base-{recipe.key()}"
    if (path / "build_info.json").exists() or restore_shipped(path, log):
        return path
    log(f"building the word-problem base into {path}")
    start, threads = time.time(), torch.get_num_threads()
    tokenizer = build_tokenizer()
    with torch.random.fork_rng(devices=[]):
        model = build_model(recipe, tokenizer)
        info = sft(model, tokenizer, recipe, log=log)
        info.update(evaluate(model, tokenizer, make_rows(recipe.data)[1]))
    log(f"word-problem base: {info}")
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info.update(
        recipe=asdict(recipe),
        build_seconds=round(time.time() - start, 1),
        torch_threads=threads,
        params=sum(p.numel() for p in model.parameters()),
        weights_sha256=weights_sha256(tmp),
        data_sha256=data_sha256(recipe.data),
    )
    (tmp / "build_info.json").write_text(json.dumps(info, indent=2))
    if path.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, path)
    return path


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        default="runs/word_problems",
        help="folder for the four .jsonl files (default: %(default)s)",
    )
    parser.add_argument("--no_model", action="store_true", help="write the data only")
    flags = parser.parse_args()
    for name, file in write_data(Path(flags.out)).items():
        print(f"{name}: {file}")
    if not flags.no_model:
        print(f"base model: {ensure_base()}")
