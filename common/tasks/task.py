"""The run's task (`make_task`, common/run/setup.py): its training and held-out `Example`s, how a
completion is scored (`Task.score`: the built-in rewards, or your --reward_funcs) and when it passes
(`Task.passes`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from common.tasks.scoring import Scored


@dataclass
class Example:
    id: int
    prompt: str  # exactly the text the model sees (chat template applied if any)
    answer: Any  # countdown.Problem, or a gold answer string
    tag: str = ""  # difficulty level of an embedded problem (eval_pass@1_<tag> is logged per level)
    # the row as the dataset holds it: what --reward_funcs see
    columns: dict = field(default_factory=dict)


@dataclass
class Task:
    train: list[Example]
    eval: list[Example]
    reward_fn: Callable[[str, Example], float]  # training reward
    eval_reward_fn: Callable[[str, Example], float]  # binary correctness
    name: str
    # prompts went through the chat template (which already holds the special tokens)
    templated: bool = False
    reward_funcs: Any = None  # --reward_funcs (common/tasks/rewards.py): replace reward_fn
    # --eval_reward_funcs (default: reward_funcs): replace eval_reward_fn
    eval_reward_funcs: Any = None
    # a completion is a success at a total >= this (`passes`), in training and evaluation
    success_reward: float = 1.0
    prompt_column: str = "prompt"  # the column passed to reward functions as `prompts`
    warn: Callable[[str], None] | None = None  # where the once-a-run truncation warning goes
    max_new_tokens: int = 0  # named in that warning
    mask_truncated: bool = False  # --mask_truncated_completions (named in that warning)
    warned_truncation: bool = False
    step: int | None = None  # the last training step scored (the evaluation's trainer_state)

    def _call(self, funcs, texts: list[str], examples: list[Example], completion_ids: list, step):
        from common.tasks.rewards import call_reward_funcs

        rows = [example.columns for example in examples]
        return call_reward_funcs(funcs, texts, rows, completion_ids, self.prompt_column, step)

    def passes(self, total: float) -> bool:
        """The one success rule, training and evaluation: total >= success_reward (NaN: never; a cut
        completion on its total, which the built-in rewards make 0: never a success there)."""
        return total >= self.success_reward  # False for NaN

    def score(
        self, texts: list[str], examples: list[Example], completion_ids: list, truncated, step
    ) -> Scored:
        """Training rewards of completions (`examples[i]`: completion i's prompt). A completion cut
        by max_new_tokens (`truncated[i]`) scores 0 under the built-in rewards (it has no final
        answer) and keeps its functions' total under --reward_funcs (TRL's rule;
        --mask_truncated_completions decides its gradient)."""
        start, self.step = time.time(), step
        cut = [bool(c) for c in truncated]
        if self.warn and not self.warned_truncation and sum(cut) > len(texts) / 4:
            self.warned_truncation = True
            rule = "reward 0, never a success"
            if self.reward_funcs is not None:
                rule = "they keep their functions' reward"
                if not self.mask_truncated:
                    rule += "; --mask_truncated_completions leaves them out of the loss"
            self.warn(
                f"warning: {sum(cut)} of {len(texts)} completions hit --max_completion_length "
                f"{self.max_new_tokens} (cut: {rule}); raise it if answers need more room"
            )
        logged, extra = {}, {}
        if self.reward_funcs is None:
            total = [
                0.0 if cut[i] else float(self.reward_fn(t, examples[i]))
                for i, t in enumerate(texts)
            ]
            values = {}
        # nothing to score on this rank: the same metric names as the others', no call
        elif not texts:
            total, values = [], {name: [] for name in self.reward_funcs.names}
        else:
            total, values = self._call(self.reward_funcs, texts, examples, completion_ids, step)
            logged, extra = self.reward_funcs.pop_logs()
        # a cut completion has no final answer there: never a success
        builtin = self.reward_funcs is None
        success = [not (builtin and cut[i]) and self.passes(value) for i, value in enumerate(total)]
        return Scored(total, values, time.time() - start, success, logged, extra)

    def eval_success(
        self, texts: list[str], examples: list[Example], completion_ids: list, truncated
    ) -> list[bool]:
        """Whether each evaluation sample passes, by the training rule: the binary verifier (a cut
        sample scores 0, so it never passes), or --eval_reward_funcs' total at --success_reward
        (`Task.passes`)."""
        if self.eval_reward_funcs is None:
            return [
                not cut and self.eval_reward_fn(text, example) >= 1.0
                for text, example, cut in zip(texts, examples, truncated)
            ]
        if self.step is not None:  # trainer_state: the updates done when the evaluation runs
            self.eval_reward_funcs.updates_done(self.step)
        total, _ = self._call(self.eval_reward_funcs, texts, examples, completion_ids, None)
        self.eval_reward_funcs.pop_logs()
        return [self.passes(value) for value in total]
