"""Countdown: the embedded default task (a mix of problem sizes, `LEVELS`, see `countdown_task`).

A problem is a few small numbers and a target. The model answers with one arithmetic step per line,

    14 1 10 t5          <- prompt
    14-10=4             <- completion
    4+1=5

where every step combines two available numbers (originals or earlier results, each used once) with
`+ - * /` into a positive integer (division must be exact), every original number is used exactly
once, and the last result is the target.

The embedded task mixes three levels: 2 numbers in 1..30 (one step), 3 in 1..20 and 5 in 1..9 (four
steps). Problem space of one size (e.g. 3 numbers in 1..20, targets 1..100): a problem is a *sorted
multiset* of numbers (repeats allowed) plus one target reachable from it. Counted that way the space
has 16,292 problems (1,540 multisets). This is the only natural convention giving 16,292; the figure
1,865 quoted for the 1..9 space matches the same convention with `+ - *` only (no division) -- with
all four ops 1..9 has 2,145. `ops` is a parameter of the generator so both counts can be reproduced
(see the tests).

Splits hold out whole multisets, so every eval problem is an unseen set of numbers, not just an
unseen target for a known set. Because the canonical multiset is sorted, `make_splits` shows the
numbers of every problem (train and eval) in a seeded random order so the model cannot rely on
sorted input.

The checker parses the completion with one strict, anchored ASCII-only regex per line after a length
cap; model text is never evaluated.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from common.demo.cache import cache_root

OPS = "+-*/"
MAX_TEXT_CHARS = 256  # longer completions are rejected before any regex runs (bounds hostile input)

# [0-9], not \d: \d also matches Unicode digits ('٣', '３'), which int() would happily convert.
_STEP_RE = re.compile(r"([0-9]{1,4})([+\-*/])([0-9]{1,4})=([0-9]{1,6})")


@dataclass(frozen=True)
class Problem:
    nums: tuple[int, ...]
    target: int


# --------------------------------------------------------------------------------------------------
# Arithmetic on the problem space
# --------------------------------------------------------------------------------------------------


def _combine(a: int, b: int, ops: str = OPS) -> list[tuple[int, str, int, int]]:
    """All steps (x, op, y, result) combining a and b into a positive integer.

    Only the larger-first order can give a positive integer for - and /, so trying "either operand
    order" reduces to one order; + and * are commutative, so one order is listed (larger first) too.
    """
    hi, lo = max(a, b), min(a, b)
    steps = []
    if "+" in ops:
        steps.append((hi, "+", lo, hi + lo))
    if "-" in ops and hi != lo:  # hi - lo == 0 is not positive
        steps.append((hi, "-", lo, hi - lo))
    if "*" in ops:
        steps.append((hi, "*", lo, hi * lo))
    if "/" in ops and hi % lo == 0:  # exact division only
        steps.append((hi, "/", lo, hi // lo))
    return steps


def _pairs(values: tuple[int, ...]):
    """(i, j, rest) for each pair of positions, skipping pairs of equal values (same outcomes)."""
    seen = set()
    for i, j in itertools.combinations(range(len(values)), 2):
        key = (values[i], values[j])
        if key in seen:
            continue
        seen.add(key)
        rest = values[:i] + values[i + 1 : j] + values[j + 1 :]
        yield values[i], values[j], rest


@functools.lru_cache(maxsize=None)
def _final_values(values: tuple[int, ...], ops: str) -> frozenset[int]:
    """Every value obtainable by combining *all* of `values` (a sorted tuple) step by step.

    Repeatedly combining any two available numbers covers every expression tree and operand order.
    Intermediates are unbounded positive integers (e.g. 20*20=400, then 400/4=100).
    """
    if len(values) == 1:
        return frozenset(values)
    out: set[int] = set()
    for a, b, rest in _pairs(values):
        for *_, c in _combine(a, b, ops):
            out |= _final_values(tuple(sorted(rest + (c,))), ops)
    return frozenset(out)


def reachable_targets(nums, max_target: int = 100, *, ops: str = OPS) -> set[int]:
    """Targets in 1..max_target reachable using every number of `nums` exactly once."""
    return {v for v in _final_values(tuple(sorted(nums)), ops) if 1 <= v <= max_target}


@functools.lru_cache(maxsize=None)
def _enumerate(n_numbers: int, lo: int, hi: int, max_target: int, ops: str) -> tuple[Problem, ...]:
    # Sorted multisets in lexicographic order, targets ascending: a deterministic canonical order.
    return tuple(
        Problem(nums, t)
        for nums in itertools.combinations_with_replacement(range(lo, hi + 1), n_numbers)
        for t in sorted(reachable_targets(nums, max_target, ops=ops))
    )


def enumerate_problems(
    n_numbers: int = 3, lo: int = 1, hi: int = 20, max_target: int = 100, *, ops: str = OPS
) -> list[Problem]:
    """All problems: (sorted multiset of numbers in lo..hi, repeats allowed; reachable target).

    16,292 for the default space; `ops` restricts the generator only (the checker accepts all four
    ops).
    """
    if not ops or set(ops) - set(OPS):
        raise ValueError(f"ops must be a non-empty subset of {OPS!r}, got {ops!r}")
    return list(_enumerate(n_numbers, lo, hi, max_target, "".join(o for o in OPS if o in ops)))


# --------------------------------------------------------------------------------------------------
# Splits
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _splits(
    seed, n_eval, n_numbers, lo, hi, max_target
) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    rng = random.Random(seed)
    by_multiset: dict[tuple[int, ...], list[int]] = {}
    for p in _enumerate(n_numbers, lo, hi, max_target, OPS):
        by_multiset.setdefault(p.nums, []).append(p.target)
    multisets = list(by_multiset)
    rng.shuffle(multisets)

    # Hold out n_eval whole multisets (at most half of them, so train never starves in tiny spaces).
    k = min(n_eval, len(multisets) // 2)
    held, kept = multisets[:k], multisets[k:]

    # Eval: one uniformly drawn target per held-out multiset (the sampler's distribution); only if
    # n_eval > k, further distinct targets of the same multisets are taken round-robin.
    queues = [rng.sample(by_multiset[m], len(by_multiset[m])) for m in held]
    eval_pairs = []
    for rank in range(max((len(q) for q in queues), default=0)):
        eval_pairs += [(m, q[rank]) for m, q in zip(held, queues) if rank < len(q)]
    eval_pairs = eval_pairs[:n_eval]

    # Train: every problem of the remaining multisets, shuffled.
    train_pairs = [(m, t) for m in kept for t in by_multiset[m]]
    rng.shuffle(train_pairs)

    # Display order of the numbers is random per problem (canonical multisets are sorted).
    def shown(pairs):
        return tuple(Problem(tuple(rng.sample(m, len(m))), t) for m, t in pairs)

    return shown(train_pairs), shown(eval_pairs)


def make_splits(
    seed: int = 0,
    n_eval: int = 256,
    n_numbers: int = 3,
    lo: int = 1,
    hi: int = 20,
    max_target: int = 100,
) -> tuple[list[Problem], list[Problem]]:
    """(train, eval), deterministic in `seed`; disjoint on the number multiset (eval triples are
    unseen).

    Eval has n_eval problems from n_eval held-out multisets, one uniform target each; train is every
    problem of the other multisets in seeded shuffled order. Numbers are shown in a seeded random
    order.
    """
    train, ev = _splits(seed, n_eval, n_numbers, lo, hi, max_target)
    return list(train), list(ev)


# --------------------------------------------------------------------------------------------------
# Text formats and reference solutions
# --------------------------------------------------------------------------------------------------


def prompt_text(p: Problem) -> str:
    """'14 1 10 t5\\n': numbers in display order, then t + target."""
    return " ".join(map(str, p.nums)) + f" t{p.target}\n"


def solution_text(steps: list[str]) -> str:
    """One step per line, trailing newline."""
    return "".join(s + "\n" for s in steps)


def solutions(p: Problem) -> list[list[str]]:
    """All distinct step sequences solving p, sorted (commutative steps written larger operand
    first)."""
    found: set[tuple[str, ...]] = set()

    def search(values: tuple[int, ...], steps: tuple[str, ...]):
        if len(values) == 1:
            if values[0] == p.target:
                found.add(steps)
            return
        for a, b, rest in _pairs(values):
            for x, op, y, c in _combine(a, b):
                search(tuple(sorted(rest + (c,))), steps + (f"{x}{op}{y}={c}",))

    search(tuple(sorted(p.nums)), ())
    return [list(s) for s in sorted(found)]


# --------------------------------------------------------------------------------------------------
# Checking completions
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    well_formed: bool = False  # >= 1 step line, every non-empty line matches _STEP_RE
    arithmetic_ok: bool = False  # every stated result is right, exact, positive
    numbers_ok: bool = False  # operands available, each used once, all originals used
    value: int | None = None  # last step's stated result
    correct: bool = False  # all of the above and value == target


def _parse_steps(text: str) -> list[tuple[int, str, int, int]] | None:
    """Steps of a completion, or None when it is not well formed (length capped before regexes)."""
    if len(text) > MAX_TEXT_CHARS:
        return None
    steps = []
    # split("\n") rather than splitlines(): other Unicode line breaks stay inside a line and fail
    # the regex.
    for line in text.split("\n"):
        if not line:
            continue  # blank lines (including the trailing newline) are ignored
        m = _STEP_RE.fullmatch(line)  # fullmatch: '$' would also accept a trailing '\n'
        if m is None:
            return None
        a, op, b, c = m.groups()
        steps.append((int(a), op, int(b), int(c)))
    return steps or None


def _step_arithmetic_ok(a: int, op: str, b: int, c: int) -> bool:
    if c <= 0:
        return False
    if op == "+":
        return a + b == c
    if op == "-":
        return a - b == c
    if op == "*":
        return a * b == c
    return b != 0 and a % b == 0 and a // b == c  # '/': exact division only


def _numbers_ok(steps, nums) -> bool:
    """Operands drawn from a running multiset of available numbers; each result becomes available
    once.

    Numbers are indistinguishable by value, so a counter is exact. At the end only the last result
    may remain: that means every original and every intermediate result was consumed exactly once.
    """
    avail = Counter(nums)
    for a, _, b, c in steps:
        for x in (a, b):
            if avail[x] <= 0:
                return False
            avail[x] -= 1
        avail[c] += 1
    return +avail == Counter([steps[-1][3]])


def check(text: str, p: Problem) -> Verdict:
    """Verdict on a decoded completion (no special tokens). Never evaluates the text."""
    steps = _parse_steps(text)
    if steps is None:
        return Verdict()
    arithmetic_ok = all(_step_arithmetic_ok(*s) for s in steps)
    numbers_ok = _numbers_ok(steps, p.nums)
    value = steps[-1][3]
    return Verdict(
        True, arithmetic_ok, numbers_ok, value, arithmetic_ok and numbers_ok and value == p.target
    )


# --------------------------------------------------------------------------------------------------
# Rewards: f(text, problem) -> float
# --------------------------------------------------------------------------------------------------


def reward_binary(text: str, p: Problem) -> float:
    return 1.0 if check(text, p).correct else 0.0


def reward_tinyzero(text: str, p: Problem) -> float:
    """TinyZero-style format bonus: 0 unparsable, 0.1 parsable but wrong, 1 correct."""
    v = check(text, p)
    return 1.0 if v.correct else 0.1 if v.well_formed else 0.0


def reward_shaped(text: str, p: Problem) -> float:
    """0 unparsable; 0.05 bad numbers/arithmetic; 0.1 + 0.4*proximity for a valid miss; 1 exact."""
    v = check(text, p)
    if not v.well_formed:
        return 0.0
    if not (v.numbers_ok and v.arithmetic_ok):
        return 0.05
    if v.correct:
        return 1.0
    t = p.target
    prox = max(0.0, 1.0 - abs(v.value - t) / max(abs(t), 1))  # max(.., 1): guard a zero target
    return 0.1 + 0.4 * prox


REWARDS = {"binary": reward_binary, "tinyzero": reward_tinyzero, "shaped": reward_shaped}


# --------------------------------------------------------------------------------------------------
# The embedded task: a mix of problem sizes (difficulty levels)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Level:
    """Problems of `n_numbers` numbers in 1..`hi` (targets 1..100); `tag` names the level in eval
    metrics."""

    tag: str
    n_numbers: int
    hi: int
    weight: float  # share of the training and held-out problems


# Sizes chosen so that the base policy's pass rates are skewed as the papers assume
# (docs/benchmark.md): one-step problems it nearly always solves, 3-number ones in between, 5-number
# ones (4 steps) it rarely solves.
LEVELS = (Level("easy", 2, 30, 0.15), Level("mid", 3, 20, 0.7), Level("hard", 5, 9, 0.15))


@functools.lru_cache(maxsize=None)
def _finals_all(values: tuple[int, ...]) -> frozenset[int]:
    return _final_values(values, OPS)


def sample_steps(p: Problem, rng: random.Random, aim: bool = True) -> list[str]:
    """A random step sequence using every number once: a correct solution when `aim` (each step
    chosen uniformly among those from which the target stays reachable), else a random valid chain
    that ignores the target."""
    values, steps = tuple(sorted(p.nums)), []
    if aim and p.target not in _finals_all(values):
        raise ValueError(f"{p} has no solution")
    while len(values) > 1:
        moves = [
            (f"{x}{op}{y}={z}", tuple(sorted(rest + (z,))))
            for a, b, rest in _pairs(values)
            for x, op, y, z in _combine(a, b)
        ]
        if aim:
            moves = [m for m in moves if p.target in _finals_all(m[1])]
        step, values = rng.choice(moves)
        steps.append(step)
    return steps


@functools.lru_cache(maxsize=4)
def _level_splits(levels: tuple[Level, ...], seed: int, n_eval: int, n_train: int):
    # Enumerating and shuffling the levels takes ~1.7 s on a laptop core, in every process that
    # trains on the task: the result is kept on disk, keyed by the arguments and this file's own
    # text (an edit here recomputes it).
    path = _splits_file(levels, seed, n_eval, n_train)
    try:
        saved = json.loads(path.read_text())
        return tuple(
            tuple((tag, Problem(tuple(nums), target)) for tag, nums, target in part)
            for part in saved
        )
    except (OSError, ValueError, TypeError):  # none yet, or unreadable: compute (and replace) it
        pass
    splits = _compute_level_splits(levels, seed, n_eval, n_train)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(
            json.dumps([[[tag, list(p.nums), p.target] for tag, p in part] for part in splits])
        )
        os.replace(tmp, path)  # whole or absent, also with several processes writing it at once
    except OSError:  # a read-only cache folder: compute it each time
        pass
    return splits


def _splits_file(levels: tuple[Level, ...], seed: int, n_eval: int, n_train: int):
    key = hashlib.sha256(
        Path(__file__).read_bytes() + repr((levels, seed, n_eval, n_train)).encode()
    ).hexdigest()
    return cache_root() / "countdown-splits" / f"{key[:16]}.json"


def _compute_level_splits(levels: tuple[Level, ...], seed: int, n_eval: int, n_train: int):
    train, held = [], []
    for level in levels:
        # held-out multisets: the level's share of n_eval, at most a quarter of its multisets
        n_multisets = math.comb(level.hi + level.n_numbers - 1, level.n_numbers)
        k = min(max(1, round(n_eval * level.weight)), n_multisets // 4)
        tr, ev = make_splits(seed, k, level.n_numbers, 1, level.hi)
        rng = random.Random(f"{seed}-{level.tag}")
        take = min(len(tr), round(n_train * level.weight))
        train += [(level.tag, p) for p in rng.sample(tr, take)]
        held += [(level.tag, p) for p in ev]
    rng = random.Random(seed)
    rng.shuffle(train)
    rng.shuffle(held)
    return tuple(train), tuple(held)


def make_level_splits(
    levels: tuple[Level, ...] = LEVELS, seed: int = 0, n_eval: int = 256, n_train: int = 4096
):
    """(train, eval) lists of (tag, Problem) over the levels, each level disjoint on its number
    multisets (held-out sets are unseen), shuffled together; a level gets `weight` of each list
    (fewer if its space is small)."""
    train, held = _level_splits(tuple(levels), seed, n_eval, n_train)
    return list(train), list(held)


def countdown_task(reward: str, eval_prompts: int, prompt_pool: int = 0):
    """The embedded task as `common.tasks.task.Task`: training problems of every level (the first
    `prompt_pool` if > 0), held-out ones (tagged by level), the training reward named by `reward`
    and the binary evaluation reward."""
    from common.tasks.task import Example, Task

    train_problems, eval_problems = make_level_splits()

    # its columns: what --reward_funcs functions see
    def example(i: int, tag: str, p: Problem) -> Example:
        text = prompt_text(p)
        return Example(
            i, text, p, tag, {"prompt": text, "numbers": list(p.nums), "target": p.target}
        )

    train = [example(i, tag, p) for i, (tag, p) in enumerate(train_problems)]
    evals = [example(i, tag, p) for i, (tag, p) in enumerate(eval_problems[:eval_prompts])]
    fn = REWARDS[reward]
    return Task(
        train[:prompt_pool] if prompt_pool > 0 else train,
        evals,
        lambda text, ex: fn(text, ex.answer),
        lambda text, ex: reward_binary(text, ex.answer),
        "countdown",
    )
