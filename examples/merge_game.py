"""An environment in the text protocol of `ps_grpo.py --environment` (docs/custom_env.md): a
number-merging game the embedded model can play, since it writes one arithmetic step a line.

The game shows some numbers and a target (`3 7 2 t19`). Each action merges two of the numbers
shown into one: `7*2=14` takes 7 and 2 and puts 14 back; the stated result must be right. The game
ends when one number is left (reward 1 if it is the target), on a move that breaks the rules
(reward 0), or when the trainer's --max_turns runs out. Observations are empty while the game goes
on (the model reads the conversation as one solution, the form it was trained on) and `won` /
`lost` / `illegal` at the end.

    python ps_grpo.py --environment examples/merge_game.py:MergeGame --max_steps 8
    python ps_grpo.py --environment examples/merge_game.py:NoisyMergeGame --max_steps 8

`MergeGame` is deterministic, so prefix replay re-executes stored moves (it could also define
`snapshot()` / `restore(state)`); `NoisyMergeGame` adds a random tag to each observation, so a
replayed prefix no longer matches its stored trajectory: those prefix tasks are dropped and
counted in `ps_replay_mismatch_frac`.

Test it before training (docs/custom_env.md, "Test your environment"):

    python examples/merge_game.py
"""

import random
import re

# `a op b=c`, integers only: the text is matched, never evaluated
MOVE = re.compile(r"\s*(\d{1,4})\s*([-+*/])\s*(\d{1,4})\s*=\s*(-?\d{1,6})\s*")


def apply(a: int, op: str, b: int) -> int | None:
    """The result of a move, None when it is not a whole number."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a // b if b and a % b == 0 else None


class MergeGame:
    """Task `seed`: 3 or 4 numbers in 1..9 and a target reached by merging them in some order."""

    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        self.numbers = [rng.randint(1, 9) for _ in range(rng.choice((3, 4)))]
        # a target that some sequence of merges reaches
        pool = list(self.numbers)
        while len(pool) > 1:
            a, b = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
            a, b = max(a, b), min(a, b)
            pool.append(a + b if rng.random() < 0.5 else a * b if a * b <= 99 else a - b)
        self.target = pool[0]
        return self.show()

    def show(self) -> str:
        return " ".join(map(str, self.numbers)) + f" t{self.target}\n"

    def step(self, action: str) -> tuple[str, float, bool]:
        move = MOVE.fullmatch(action)
        if move is None:
            return self.tag("illegal\n"), 0.0, True
        a, op, b, c = int(move[1]), move[2], int(move[3]), int(move[4])
        left = list(self.numbers)
        for x in (a, b):
            if x not in left:
                return self.tag("illegal\n"), 0.0, True
            left.remove(x)
        if apply(a, op, b) != c:
            return self.tag("illegal\n"), 0.0, True
        self.numbers = left + [c]
        if len(self.numbers) == 1:
            won = c == self.target
            return self.tag("won\n" if won else "lost\n"), float(won), True
        return self.tag(""), 0.0, False

    def tag(self, observation: str) -> str:
        return observation


class NoisyMergeGame(MergeGame):
    """The same game, each observation led by a random tag of 0 to 2 spaces (the embedded model
    plays on through spaces; a visible tag such as a digit stops it after the first move): not
    deterministic, so a prefix cannot be replayed by executing its moves again."""

    def tag(self, observation: str) -> str:
        return " " * random.randint(0, 2) + observation


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description="Check MergeGame as docs/custom_env.md says: each seed's episode played twice "
        "gives the same observations, and every call returns what the protocol says."
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="how many seeds to check (0, 1, ...) (default: %(default)s)",
    )
    checked = parser.parse_args()
    for seed in range(checked.seeds):
        runs = []
        for _ in range(2):
            game = MergeGame()
            first = game.reset(seed=seed)
            assert isinstance(first, str)
            a, b = game.numbers[:2]
            moves = [f"{a}+{b}={a + b}"]
            seen = [first]
            for move in moves:
                observation, reward, done = game.step(move)
                assert isinstance(observation, str) and isinstance(done, bool)
                seen.append(observation)
            runs.append(seen)
        assert runs[0] == runs[1], runs
        print(f"seed {seed}: {runs[0]!r} (the same twice)")
