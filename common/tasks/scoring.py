"""One batch's rewards (`Scored`) and the sums behind reward_mean / reward_std over ranks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Scored:
    """One batch's rewards: `total` per completion (NaN: no function scored it), `success`
    (`Task.passes`), each function's `values` (None: does not apply), the `seconds` spent,
    `log_metric`'s and `log_extra`'s logs."""

    total: list[float]
    values: dict[str, list]
    seconds: float
    success: list[bool] = field(default_factory=list)
    logged: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def scored(self) -> list[bool]:
        """Whether each completion got a reward (not NaN)."""
        return [not math.isnan(value) for value in self.total]

    def metrics(self, accelerator) -> dict:
        """time_reward_s over every rank; with functions' `values` (--reward_funcs) also their
        means and stds, reward_none_frac and each `log_metric` name (common/tasks/rewards.py
        `reward_metrics`). Call on every rank."""
        if self.values:  # on every rank alike
            from common.tasks.rewards import reward_metrics

            return reward_metrics(accelerator, self)
        from common.distributed.ranks import reduce_sums

        seconds = reduce_sums(accelerator, {"seconds": self.seconds})["seconds"]
        return {"time_reward_s": seconds / accelerator.num_processes}

    @staticmethod
    def join(parts: list[Scored]) -> Scored:
        """Several batches (e.g. sampling rounds) as one."""
        names = parts[0].values if parts else {}
        joined = Scored(
            [t for part in parts for t in part.total],
            {name: [v for part in parts for v in part.values[name]] for name in names},
            sum(part.seconds for part in parts),
            [s for part in parts for s in part.success],
        )
        if any(part.logged or part.extra for part in parts):
            from common.tasks.rewards import join_logs

            joined.logged, joined.extra = join_logs(parts)
        return joined

    def columns(self, index: int) -> dict:
        """Each function's value (and each `log_extra` column) for completion `index`, for its
        samples.jsonl row."""
        out = {f"reward/{name}": values[index] for name, values in self.values.items()}
        out.update(
            {
                column: values[index] if index < len(values) else None
                for column, values in self.extra.items()
            }
        )
        return out


def reward_sums(rewards) -> dict:
    """Sums for reward_mean / reward_std over the completions given a reward (NaN: `unscored`);
    reduce, then `reward_moments`."""
    values = np.asarray(
        rewards.tolist() if hasattr(rewards, "tolist") else rewards, dtype=np.float64
    ).ravel()
    rated = values[~np.isnan(values)]
    return {
        "reward_sum": float(rated.sum()),
        "reward_sq_sum": float((rated**2).sum()),
        "unscored": float(values.size - rated.size),
    }


def reward_moments(totals: dict, count: float) -> tuple[float, float]:
    """(mean, population std) from reduced `reward_sums` of `count` completions."""
    rated = max(1.0, count - totals["unscored"])
    mean = totals["reward_sum"] / rated
    return mean, math.sqrt(max(0.0, totals["reward_sq_sum"] / rated - mean**2))
