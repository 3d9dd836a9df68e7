"""Answer checking for math datasets (MATH-style \\boxed{} answers, GSM8K golds) with math-verify.

The answer is the content of the last \\boxed{...}; every failure (no box, unparsable, math-verify
error) scores 0.0, so a bad sample never crashes the trainer. math-verify's timeouts use
signal.alarm, which raises off the main thread, where we pass timeout=None; then one answer like
\\boxed{9^{9^{9}}} or \\boxed{99!!!} would make sympy build an astronomically large integer in C
code holding the GIL. So answers are capped in length and pre-screened by `_too_costly` (power
towers, huge exponents, big or chained factorials, huge binomials), in every thread, so that a score
never depends on the thread that computed it.
"""

from __future__ import annotations

import math
import re
import threading

from math_verify import parse, verify

MAX_SEARCH_CHARS = 10_000  # only the tail of a completion is searched for a box
# longer "answers" are not sent to sympy (unbounded parse time off-main-thread)
MAX_ANSWER_CHARS = 1_000
# product of the integer literals in all exponents: 2^{10000} fine, 9^{99999} not
MAX_EXPONENT = 10_000
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


def _exponents(s: str):
    """(exponent text, next char) for every '^' in s: a braced group, a \\command or one char."""
    i = s.find("^")
    while i >= 0:
        j = i + 1
        if s.startswith("{", j):  # balanced group; an unclosed group runs to the end
            depth = 0
            while j < len(s):
                depth += {"{": 1, "}": -1}.get(s[j], 0)
                j += 1
                if depth == 0:
                    break
        elif s.startswith("\\", j):
            j += 1
            while j < len(s) and s[j].isalpha():
                j += 1
        else:
            j += 1
        yield s[i + 1 : j], s[j : j + 1]
        i = s.find("^", i + 1)


def _too_costly(answer: str) -> bool:
    """True for answers whose evaluation may build gigantic integers (see module docstring)."""
    s = re.sub(r"\s+", "", answer.replace("\\!", ""))  # '\!' is a LaTeX thin space ('10,\!000')
    if "**" in s or "!!" in s:
        return True
    if "!" in re.sub(r"(?<![0-9])[0-9]{1,3}!", "", s):  # factorials of literals up to 999 only
        return True
    product = 1
    for exp, after in _exponents(s):
        if "^" in exp or after == "^" or "!" in exp:  # towers: a^{b^c}, a^b^c
            return True
        product *= math.prod(max(1, int(d)) for d in re.findall(r"[0-9]{1,6}", exp))
        if product > MAX_EXPONENT or re.search(r"[0-9]{7}", exp):
            return True
    if "^" in s and re.search(r"[0-9]{31}", s):  # huge base raised to a power
        return True
    if re.search(r"binom|choose|Gamma|prod", s) and ("^" in s or re.search(r"[0-9]{5}", s)):
        return True
    return False


def gsm8k_gold(answer_field: str) -> str:
    """GSM8K 'answer' field ('... #### 1,234') -> '1234'."""
    return answer_field.split("####")[-1].strip().replace(",", "")


def _timeout() -> int | None:
    # signal.alarm raises outside the main thread, so disable math-verify's timeout there.
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse_gold(gold: str, parsing_timeout):
    """Parse a gold answer; a bare one ("72", "0.5", "2^{10}") is tried inside $...$ first.

    Wrapping first matters: bare, math-verify's plain-expression extractor reads "2^{10}" as 2 and
    "x=3" as 3, so \\boxed{2} would match gold 2^{10}. The bare parse is only a fallback.
    """
    # Already delimited: an unescaped $ (in "\$5" it is a dollar sign), \boxed, \( or \[.
    delimited = re.search(r"(?<!\\)\$|\\boxed|\\\(|\\\[", gold) is not None
    parsed = [] if delimited else parse(f"${gold}$", parsing_timeout=parsing_timeout)
    return parsed or parse(gold, parsing_timeout=parsing_timeout)


def math_reward(text: str, gold: str) -> float:
    """1.0 if the last boxed answer in `text` equals `gold` according to math-verify, else 0.0."""
    try:
        answer = extract_boxed(text)
        if (
            answer is None
            or not answer.strip()
            or len(answer) > MAX_ANSWER_CHARS
            or _too_costly(answer)
        ):
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
