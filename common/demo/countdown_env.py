"""Multi-turn Countdown: a tool-using environment whose state can be restored by replaying actions.

The single-turn task (common/demo/countdown.py) asks for the whole solution in one completion. Here
the agent acts one arithmetic step per turn and the environment applies it, answering with an
observation:

    14 1 10 t5          <- reset(): the task, in the single-turn prompt format
    14-10=4             <- action 1 (the policy; the line the single-turn policy would write)
    1 4 t5              <- observation 1 (the environment: the numbers still left, then the target)
    4+1=5               <- action 2
    solved              <- observation 2 (terminal)

Actions keep the single-turn step format (`a op b=c`, the agent also states the result, the
environment checks it), and observations restate the remaining numbers in the single-turn *prompt*
format, so a policy trained on the text form reads every observation as "a (smaller) Countdown
problem" -- its habits transfer. An episode ends when one number is left (reward 1 if it is the
target), on an invalid action (unparsable, wrong arithmetic, a number that is not available; reward
0, or an error observation and another try with `invalid="retry"`), when the agent stops (an empty
action, or an action ended by EOS before the last number), or after `max_turns` turns.

The environment is pure and deterministic, so resetting a fresh one and re-executing a stored
trajectory's first K actions (`replay`) restores the same state *and* the same conversation token
for token: the prefix-replay primitive of Prefix Sampling. `Episode` is the token-level record a
trainer needs: the interleaved completion, its loss mask (1 only on tokens the current policy
generated) and the sampling log-probs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.demo import countdown
from common.demo.countdown import Problem
from common.rl.episode import Episode  # noqa: F401  (the record replay_episode fills)

MAX_ACTION_CHARS = 32  # a longer action is invalid before any regex runs (bounds hostile input)


@dataclass
class StepResult:
    observation: str
    done: bool
    reward: float
    status: str  # "ok" | "solved" | "wrong" | "invalid" | "stopped" | "out_of_turns"


def state_text(numbers: list[int], target: int) -> str:
    """'1 4 t5\\n': available numbers (in order of appearance), then the target -- the prompt
    format."""
    return " ".join(map(str, numbers)) + f" t{target}\n"


class CountdownEnv:
    """One episode of multi-turn Countdown. `reset()` then `step(action)` until `done`."""

    def __init__(self, problem: Problem, max_turns: int = 4, invalid: str = "end"):
        if invalid not in ("end", "retry"):
            raise ValueError(f"invalid must be 'end' or 'retry', got {invalid!r}")
        self.problem, self.max_turns, self.invalid = problem, max_turns, invalid
        self.reset()

    def reset(self) -> str:
        # display order; a result is appended at the end
        self.numbers: list[int] = list(self.problem.nums)
        self.turns: list[tuple[str, str]] = []  # (action, observation)
        self.done, self.reward, self.status = False, 0.0, "ok"
        return countdown.prompt_text(self.problem)

    @property
    def state(self) -> tuple:
        """Everything that determines the future of the episode (compared by the replay test)."""
        return (
            tuple(self.numbers),
            self.problem.target,
            len(self.turns),
            self.done,
            self.reward,
            self.status,
        )

    def _parse(self, action: str):
        """(a, op, b, c) if `action` is one valid, available step, else None. Never evaluates the
        text."""
        if len(action) > MAX_ACTION_CHARS:
            return None
        m = countdown._STEP_RE.fullmatch(action)
        if m is None:
            return None
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        if not countdown._step_arithmetic_ok(a, op, b, c):
            return None
        avail = list(self.numbers)
        for x in (a, b):
            if x not in avail:
                return None
            avail.remove(x)
        return a, op, b, c

    def step(self, action: str, final: bool = False) -> StepResult:
        """Apply one action (its text without the newline/EOS that ended it). `final`: the agent
        ended its turn with EOS, i.e. it considers itself finished after this action."""
        if self.done:
            raise RuntimeError("step() on a finished episode")
        action = action.removesuffix("\n")
        parsed = None if not action else self._parse(action)
        if not action:  # the agent stops (an empty turn): no answer
            obs, self.done, self.status = "stopped\n", True, "stopped"
        elif parsed is None:
            self.status = "invalid"
            self.done = self.invalid == "end" or final
            obs = (
                "invalid\n"
                if self.done
                else "invalid\n" + state_text(self.numbers, self.problem.target)
            )
        else:
            a, _, b, c = parsed
            self.numbers.remove(a)
            self.numbers.remove(b)
            self.numbers.append(c)
            if len(self.numbers) == 1:
                self.done = True
                self.status = "solved" if c == self.problem.target else "wrong"
                self.reward = 1.0 if self.status == "solved" else 0.0
                obs = self.status + "\n"
            elif final:
                obs, self.done, self.status = "stopped\n", True, "stopped"
            else:
                obs, self.status = state_text(self.numbers, self.problem.target), "ok"
        self.turns.append((action, obs))
        if not self.done and len(self.turns) >= self.max_turns:
            self.done, self.status = True, "out_of_turns"
        return StepResult(obs, self.done, self.reward, self.status)


class CountdownGame:
    """The environment in the text protocol of `--environment` (docs/custom_env.md), as ps_grpo.py
    plays it by default: `reset(nums, target)` (a task row) returns the problem, `step(action,
    final)` returns (observation, reward, done); `final` is the protocol's optional keyword (the
    policy ended its turn with EOS: it considers itself finished)."""

    def __init__(self, max_turns: int = 4, invalid: str = "end"):
        self.max_turns, self.invalid = max_turns, invalid

    def reset(self, nums, target) -> str:
        self.env = CountdownEnv(Problem(tuple(nums), int(target)), self.max_turns, self.invalid)
        return countdown.prompt_text(self.env.problem)

    def step(self, action: str, final: bool = False) -> tuple[str, float, bool]:
        result = self.env.step(action, final=final)
        return result.observation, result.reward, result.done

    @property
    def status(self) -> str:
        return self.env.status


def replay(
    problem: Problem, actions: list[str], max_turns: int = 4, invalid: str = "end"
) -> CountdownEnv:
    """Reset a fresh environment and re-execute stored actions: the same state and the same
    observations as when they were first taken (the environment is deterministic)."""
    env = CountdownEnv(problem, max_turns, invalid)
    for a in actions:
        env.step(a)
    return env


def replay_episode(
    problem: Problem,
    prefix: list[tuple[list[int], list[int]]],
    group: int,
    decode: Callable[[list[int]], str],
    encode: Callable[[str], list[int]],
    max_turns: int = 4,
    invalid: str = "end",
) -> Episode:
    """[Prefix replay] A fresh environment re-executes the stored actions of `prefix`; the episode's
    context is rebuilt turn by turn from the environment's own observations, and checked against the
    stored ones."""
    ep = Episode(group, env=CountdownEnv(problem, max_turns, invalid))
    for action_ids, stored_obs in prefix:
        obs_ids = encode(ep.env.step(decode(action_ids)).observation)
        if obs_ids != list(stored_obs):
            raise RuntimeError(
                "replay diverged from the stored trajectory (the environment must be deterministic)"
            )
        ep.add_turn(action_ids, obs_ids)  # no log-probs: replayed, mask 0
    if ep.env.done:
        raise ValueError("a replayed prefix must leave the episode unfinished")
    return ep


# --------------------------------------------------------------------------------------------------
# Tasks and reference episodes
# --------------------------------------------------------------------------------------------------


def make_env_splits(n_numbers: int = 0, max_number: int = 20, seed: int = 0, n_eval: int = 256):
    """(train, eval) lists of (tag, problem) for the environment: n_numbers 0 is the single-turn
    task's level mix (countdown.LEVELS, episodes of 1, 2 and 4 steps), else one size, numbers in
    1..max_number (tag "")."""
    if n_numbers == 0:
        return countdown.make_level_splits(seed=seed, n_eval=n_eval)
    train, held = countdown.make_splits(
        seed=seed, n_eval=n_eval, n_numbers=n_numbers, hi=max_number
    )
    return [("", p) for p in train], [("", p) for p in held]


def solver_actions(problem: Problem, rng: random.Random, aim: bool = True) -> list[str]:
    """A random correct action sequence (one per turn); `aim` False: a valid one that ignores the
    target."""
    return countdown.sample_steps(problem, rng, aim)


def make_env_task(
    n_numbers: int = 0, max_number: int = 20, eval_prompts: int = 256, prompt_pool: int = 0
):
    """(train, eval) lists of `Example`s for the environment (the prompt is the reset observation).

    With n_numbers 0 these are exactly the single-turn task's examples (same ids, problems and level
    tags)."""
    from common.tasks.task import Example

    train_p, eval_p = make_env_splits(n_numbers, max_number)
    train = [Example(i, countdown.prompt_text(p), p, tag) for i, (tag, p) in enumerate(train_p)]
    evals = [
        Example(i, countdown.prompt_text(p), p, tag)
        for i, (tag, p) in enumerate(eval_p[:eval_prompts])
    ]
    return (train[:prompt_pool] if prompt_pool > 0 else train), evals


# --------------------------------------------------------------------------------------------------
# A multi-turn warm-up of the embedded policy (built once, cached next to the base)
# --------------------------------------------------------------------------------------------------
# The embedded base was SFT-ed on the single-turn text form only. Measured on 256 held-out problems
# x 8 samples: text form 0.354 pass@1; in this environment 0.000 -- after the first observation line
# it emits EOS (it has only ever seen two lines after a prompt). Any observation that carries state
# breaks it the same way; only an empty observation (the text form again) transfers. So the
# multi-turn default starts from a short SFT of the base on solver-built episodes of the
# environment: loss on the action tokens, observations in the context with mask 0, exactly as in RL.


@dataclass(frozen=True)
class MultiTurnRecipe:
    """Everything that determines the multi-turn warm-up (its hash and the base's name the cache
    dir)."""

    # 0: the level mix, with the base recipe's careless shares (the base's habits carry over)
    n_numbers: int = 0
    max_number: int = 20
    sft_steps: int = 150
    batch_size: int = 64
    lr: float = 3e-4
    seed: int = 0


def solver_episode(
    problem: Problem,
    actions: list[str],
    encode: Callable[[str], list[int]],
    eos_id: int | None = None,
    max_turns: int = 4,
) -> Episode:
    """The env's episode for a given action sequence, every action marked as generated (for SFT)."""
    env = CountdownEnv(problem, max_turns)
    ep = Episode(0, env=env)
    for a in actions:
        a_ids = encode(a + "\n")
        ep.add_turn(a_ids, encode(env.step(a).observation), [0.0] * len(a_ids))
    ep.reward = env.reward
    return ep


def sft_multiturn(model, tokenizer, recipe: MultiTurnRecipe, log=print) -> dict:
    """Supervised warm-up on solver episodes of the environment's training problems (loss on actions
    only)."""
    import numpy as np
    import torch

    from common.demo.tiny_model import BaseRecipe, sft_step
    from common.rl.masking import pad_sequences

    rng = random.Random(recipe.seed)
    torch.manual_seed(recipe.seed)
    train, _ = make_env_splits(recipe.n_numbers, recipe.max_number)
    careless = (
        dict(zip([level.tag for level in countdown.LEVELS], BaseRecipe().careless))
        if recipe.n_numbers == 0
        else {}
    )

    def encode(text):
        return tokenizer(text, add_special_tokens=False).input_ids

    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    warm = max(1, recipe.sft_steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    model.train()
    losses = []
    for _ in range(recipe.sft_steps):
        picks = [train[rng.randrange(len(train))] for _ in range(recipe.batch_size)]
        eps = [
            solver_episode(
                p,
                solver_actions(p, rng, rng.random() >= careless.get(tag, 0.0)),
                encode,
                max_turns=len(p.nums),
            )
            for tag, p in picks
        ]
        batch = pad_sequences(
            [encode(countdown.prompt_text(p)) for _, p in picks],
            [e.ids for e in eps],
            tokenizer.pad_token_id,
            [e.mask for e in eps],
        )
        losses.append(sft_step(model, opt, sched, batch))
    model.eval()
    return {"mt_sft_final_loss": float(np.mean(losses[-20:]))}


def ensure_multiturn_policy(
    base_path: str, recipe: MultiTurnRecipe | None = None, log=print
) -> Path:
    """Path of the cached multi-turn warm-up of `base_path` (built on first use: tmp dir + atomic
    rename)."""
    import hashlib
    import json
    import os
    import shutil
    import time
    from dataclasses import asdict

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.demo.tiny_model import cache_root, restore_shipped, weights_sha256
    from common.model.policy import library_bars_off

    recipe = recipe or MultiTurnRecipe()
    base = Path(base_path)
    key = hashlib.sha1(
        json.dumps({**asdict(recipe), "base": base.name}, sort_keys=True).encode()
    ).hexdigest()[:10]
    path = cache_root() / f"countdown-mt-{key}"
    if (path / "build_info.json").exists() or restore_shipped(path, log):
        return path
    log(
        f"building the multi-turn warm-up of {base} into {path} (once; {recipe.sft_steps} SFT "
        "steps)"
    )
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(base)
    with library_bars_off():  # transformers' bars: the run's step bar stays its only one
        model = AutoModelForCausalLM.from_pretrained(base)
    # the warm-up seeds torch; the caller's random stream stays as it was
    with torch.random.fork_rng(devices=[]):
        info = sft_multiturn(model, tokenizer, recipe, log)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with library_bars_off():
        model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info.update(
        recipe=asdict(recipe),
        base=str(base),
        build_seconds=round(time.time() - t0, 1),
        weights_sha256=weights_sha256(tmp),
    )
    (tmp / "build_info.json").write_text(json.dumps(info, indent=2))
    if path.exists():  # another process finished first; keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, path)
    log(f"multi-turn policy ready in {info['build_seconds']} s")
    return path
