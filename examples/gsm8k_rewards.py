"""Reward functions for GSM8K-shaped rows (a `question` or message `prompt`, an `answer` ending in
`#### 72`), written in TRL's calling convention: each gets the batch's `prompts`, `completions` and
`completion_ids` and every other column of the dataset as a list, and returns one number (or None:
"does not apply") per completion.

    R=examples/gsm8k_rewards.py
    python ra_rloo.py --dataset_name examples/gsm8k_chat.jsonl --prompt_column prompt \
        --reward_funcs $R:format_reward,$R:correctness_reward \
        --reward_weights 0.2,1 --success_reward 1 ...
"""

import re

FINAL = re.compile(r"Answer:\s*(-?[\d,]*\.?\d+)\s*$")  # the last line: "Answer: 1,234"


def _text(completion) -> str:
    """A completion as text: message-format prompts get a list holding one assistant message."""
    return completion[0]["content"] if isinstance(completion, list) else completion


def format_reward(completions, **kwargs):
    """1 when the completion ends with a line `Answer: <number>`, else 0."""
    return [1.0 if FINAL.search(_text(c).strip()) else 0.0 for c in completions]


def correctness_reward(completions, answer, **kwargs):
    """1 when the final answer equals the gold number after `####`, else 0; None for a row without a
    gold answer (it is then left out of the total and of this function's metrics)."""
    scores = []
    for completion, gold in zip(completions, answer):
        if not gold or "####" not in gold:
            scores.append(None)
            continue
        found = FINAL.search(_text(completion).strip())
        target = gold.split("####")[-1].strip().replace(",", "")
        scores.append(1.0 if found and found.group(1).replace(",", "") == target else 0.0)
    return scores
