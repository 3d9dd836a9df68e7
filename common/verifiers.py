"""Answer checking for math datasets (MATH-style \\boxed{} answers, GSM8K golds) with math-verify.

The model's answer is the content of its last \\boxed{...}; math-verify decides whether it equals the
gold answer. Every failure mode (no box, unparsable answer, math-verify exception) scores 0.0 so a bad
sample can never crash the trainer.

Threads: math-verify bounds parse/verify time with signal.alarm, which only works in the main thread
(elsewhere it raises ValueError). Off the main thread we pass timeout=None instead and rely on the input
caps below (last 10k characters searched, boxed answers at most 1,000 characters) to keep work bounded.
"""
from __future__ import annotations

import threading

from math_verify import parse, verify

MAX_SEARCH_CHARS = 10_000  # only the tail of a completion is searched for a box
MAX_ANSWER_CHARS = 1_000  # longer "answers" are not sent to sympy (unbounded parse time off-main-thread)
TIMEOUT_S = 5  # math-verify's own default, used only where signal.alarm is allowed

_BOX = "\\boxed{"


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (nested braces balanced), or None if absent or unclosed.

    Backslash escapes (\\{, \\}, \\\\) are skipped so escaped braces do not count. Only the last
    MAX_SEARCH_CHARS characters are looked at, so the scan is linear in a bounded length.
    """
    text = text[-MAX_SEARCH_CHARS:]
    start = text.rfind(_BOX)
    if start < 0:
        return None
    i = start + len(_BOX)
    body_start, depth = i, 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[body_start:i]
        i += 1
    return None  # the last box never closes (e.g. truncated generation): no answer


def gsm8k_gold(answer_field: str) -> str:
    """GSM8K 'answer' field ('... #### 1,234') -> '1234'."""
    return answer_field.split("####")[-1].strip().replace(",", "")


def _timeout() -> int | None:
    # signal.alarm raises outside the main thread, so disable math-verify's timeout there.
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse_gold(gold: str, parsing_timeout):
    parsed = parse(gold, parsing_timeout=parsing_timeout)
    # Bare LaTeX ("\frac{1}{2}") may be found only inside math delimiters.
    return parsed or parse(f"${gold}$", parsing_timeout=parsing_timeout)


def math_reward(text: str, gold: str) -> float:
    """1.0 if the last boxed answer in `text` equals `gold` according to math-verify, else 0.0."""
    try:
        answer = extract_boxed(text)
        if answer is None or not answer.strip() or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        timeout = _timeout()
        gold_parsed = _parse_gold(gold, timeout)
        # Re-box the answer so math-verify's LaTeX extractor targets exactly that expression.
        pred_parsed = parse(_BOX + answer + "}", parsing_timeout=timeout)
        if not gold_parsed or not pred_parsed:
            return 0.0
        return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=timeout) else 0.0
    except Exception:  # noqa: BLE001 - any verifier failure is a wrong answer, never a crash
        return 0.0
