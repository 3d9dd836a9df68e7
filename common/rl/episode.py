"""The token-level record of one rollout: prompt + interleaved (action, observation) turns, with the
loss mask and the sampling log-probs. Used by the multi-turn rollouts (common/envs/rollout.py)
and by ps_grpo.py's single-turn text mode, where a "turn" is a line
of the completion and there is no observation."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Episode:
    """One rollout as the trainer sees it: prompt + interleaved (action, observation) turns.

    `ids` is the completion (every turn's action tokens then its observation tokens), `mask` is 1
    only on action tokens the current policy generated (observations and replayed actions are
    context, mask 0), `old_logp` the sampling log-prob of each generated token (0 where masked).
    `steps` keeps each turn's (action ids, observation ids): a prefix of K steps is `steps[:K]`.
    """

    group: int  # index of the task this rollout belongs to
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    old_logp: list[float] = field(default_factory=list)
    steps: list[tuple[list[int], list[int]]] = field(default_factory=list)
    replayed_steps: int = 0
    reward: float = 0.0
    env: object = None  # the environment being played (multi-turn), None for single-turn text
    prompt: list[int] = field(default_factory=list)  # the context the turns follow
    # [PS] the environment's snapshot() after each turn, when it has one (prefix replay restores it)
    snapshots: list = field(default_factory=list)
    # TRL's environment_factory convention: the conversation as chat messages, the prompt's
    # (`chat[0]`) then one list per turn (the assistant's message, its tool results)
    chat: list = field(default_factory=list)
    # the environment failed (it raised): no reward, left out of the update and of every count
    env_error: bool = False

    def add_turn(
        self, action_ids: list[int], obs_ids: list[int], logps: list[float] | None = None
    ) -> None:
        """Append a turn; `logps` None means the action was replayed, not generated (mask 0)."""
        replayed = logps is None
        self.ids += list(action_ids) + list(obs_ids)
        self.mask += [0 if replayed else 1] * len(action_ids) + [0] * len(obs_ids)
        self.old_logp += ([0.0] * len(action_ids) if replayed else list(logps)) + [0.0] * len(
            obs_ids
        )
        self.steps.append((list(action_ids), list(obs_ids)))
        self.replayed_steps += replayed

    @property
    def generated_tokens(self) -> int:
        return sum(self.mask)

    @property
    def replayed_tokens(self) -> int:
        """Action tokens taken from a stored trajectory instead of being generated."""
        return sum(len(a) for a, _ in self.steps[: self.replayed_steps])
