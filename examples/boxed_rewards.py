"""Reward functions for GSM8K-shaped rows answered in `\\boxed{}` (a message `prompt` or a
`question`, an `answer` ending in `#### 72`), in TRL's calling convention: each gets the batch's
`prompts`, `completions` and `completion_ids` and every other column of the dataset as a list, and
returns one number (or None: "does not apply") per completion. `benchmarks/sweep/real_path.py`
trains every script with them on the word-problem task:

    R=examples/boxed_rewards.py
    python ra_rloo.py --model_name_or_path <dir> --dataset_name train_messages.jsonl \
        --prompt_column prompt --reward_funcs $R:boxed_format_reward,$R:boxed_correctness_reward \
        --reward_weights 0.2,1 --success_reward 1
"""

import re

# a number in the box that ends the text
BOXED = re.compile(r"\\boxed\{\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*\}\s*$")


def _text(completion) -> str:
    """A completion as text: message-format prompts get a list holding one assistant message."""
    return completion[0]["content"] if isinstance(completion, list) else completion


def _number(text: str) -> float | None:
    found = BOXED.search(text)
    return None if found is None else float(found.group(1).replace(",", ""))


def boxed_format_reward(completions, **kwargs):
    """1 when the completion ends with `\\boxed{<number>}`, else 0."""
    return [0.0 if _number(_text(c)) is None else 1.0 for c in completions]


def boxed_correctness_reward(completions, answer, **kwargs):
    """1 when the boxed number that ends the completion equals the gold number after `####`, else 0;
    None for a row without a gold answer (left out of the total and of this function's metrics)."""
    scores = []
    for completion, gold in zip(completions, answer):
        if not gold or "####" not in gold:
            scores.append(None)
            continue
        found = _number(_text(completion))
        target = float(gold.split("####")[-1].strip().replace(",", ""))
        scores.append(1.0 if found is not None and found == target else 0.0)
    return scores
