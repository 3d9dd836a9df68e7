"""A step's metrics, recorded where each value is computed and reduced over ranks once.

The loop feeds named sums as it goes (tensors stay on the device: no host sync per micro-batch),
times its phases where they happen, and at the step's end one packed reduction gives every rank the
same totals, from which the keys every script logs are derived here (docs/metrics.md); a method's
own figures come from the same totals (`StepMetrics.totals`).

    steps = StepMetrics(accelerator, counters, loss_per="rollouts")
    for step in ...:
        steps.begin()
        with steps.phase("gen"):
            ...
        steps.add(rollouts=len(completions), truncated=n_cut, ...)
        steps.add_rewards(rewards)
        for rows in micro:
            ...
            steps.add(loss_sum=pg_sum, tok=mask.sum())
        steps.grad_norm(norm)
        row = steps.finish(step, lr, scored)
        row |= method_metrics(steps.totals, ...)
        run_log.end_step(row, steps.end(row), threads, compiled)
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import numpy as np
import torch

from common.tasks.scoring import reward_moments, reward_sums

# the step's phases, written as time/<name>_s in every script (0 where a script has none): sampling;
# log-prob passes outside the update (old policy, reference, replay scoring); verification and
# rewards; the update (forward, backward, optimizer step); the evaluation; the rest is time/other_s
PHASES = ("gen", "logprob", "reward", "update", "eval")
# the sums the generic keys read, packed first (0 when a script adds none, e.g. kl_sum without KL)
GENERIC_SUMS = (
    "groups",
    "rollouts",
    "gen_tokens",
    "truncated",
    "success",
    "zero_var",
    "reward_n",
    "reward_sum",
    "reward_sq_sum",
    "unscored",
    "loss_sum",
    "kl_sum",
    "ent_sum",
    "tok",
    "gap_sum",
    "gap_tok",
)


def _exact(value):
    """A value to add: a tensor as float64 (exact for float32 and integer counts), detached, on its
    device; a number as a Python float."""
    if torch.is_tensor(value):
        return value.detach().to(torch.float64)
    return float(value)


class StepMetrics:
    """One step's sums and phase times; `finish` reduces them over ranks (one collective) and
    returns the keys every script logs. `counters` (the run's rollouts and gen_tokens so far, kept
    in the checkpoint) grows at each `finish`. `loss_per` names the total the summed loss is divided
    by (None: the loss is added as its final value, summed over ranks). `method_sums` names the
    method's sums that a rank may never add in a step (e.g. inside a micro-batch loop, which a rank
    with no rows skips): they start at 0, so every rank packs the same names."""

    def __init__(
        self,
        accelerator,
        counters: dict,
        loss_per: str | None = "rollouts",
        method_sums: tuple[str, ...] = (),
    ):
        self.accelerator = accelerator
        self.counters = counters
        self.loss_per = loss_per
        self.method_sums = tuple(method_sums)
        self.sync = accelerator.device.type == "cuda"
        self.totals: dict = {}
        self.begin()

    # ---------------- feeding ----------------
    def begin(self) -> None:
        """A new step: its clock starts, its sums and times are empty."""
        self.sums: dict = {}
        self.norms: list = []
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.open = None
        self.start = self._clock()

    def add(self, **values) -> None:
        """Add to named sums, in the order the values come (a float64 sum, as Python floats add).
        Tensors stay where they are until `finish`. Every rank adds the same names."""
        for name, value in values.items():
            value = _exact(value)
            # value + total, not total + value: a tensor then keeps the sum on its device
            self.sums[name] = value + self.sums[name] if name in self.sums else value + 0.0

    def add_rewards(self, rewards) -> None:
        """The rewards behind reward_mean / reward_std / pass_rate (NaN: no function scored it, left
        out of the mean and std)."""
        values = np.asarray(
            rewards.tolist() if hasattr(rewards, "tolist") else rewards, dtype=np.float64
        ).ravel()
        self.add(reward_n=values.size, **reward_sums(values))

    def grad_norm(self, norm) -> None:
        """An optimizer step's gradient norm (grad_norm: their mean)."""
        self.norms.append(norm)

    @contextmanager
    def phase(self, name: str):
        """Time the block as phase `name` (added up when entered again within the step)."""
        if name not in self.seconds:
            raise ValueError(f"phase {name!r}: one of {', '.join(PHASES)}")
        if self.open:
            # a phase inside another would count its seconds twice
            raise RuntimeError(f"phase {name!r} entered inside phase {self.open!r}")
        self.open, start = name, self._clock()
        try:
            yield
        finally:
            self.seconds[name] += self._clock() - start
            self.open = None

    # ---------------- the step's end ----------------
    def finish(self, step: int, lr: float, scored) -> dict:
        """One packed sum over ranks of every named sum (kept in `totals`), then the keys every
        script logs; `scored` (the step's `Scored`) adds its reward keys. Call on every rank."""
        sums = {name: self.sums.get(name, 0.0) for name in GENERIC_SUMS + self.method_sums}
        # the method's names sorted: the same packing on every rank, whatever order they came in
        sums.update(sorted(self.sums.items()))
        sums["t_gen"], sums["t_train"] = self.seconds["gen"], self.seconds["update"]
        self.totals = totals = self._reduce(sums)
        world = self.accelerator.num_processes
        self.counters["rollouts"] += int(totals["rollouts"])
        self.counters["gen_tokens"] += int(totals["gen_tokens"])
        samples = max(1.0, totals["rollouts"])
        tokens = max(1.0, totals["tok"])
        reward_mean, reward_std = reward_moments(totals, totals["reward_n"])
        loss = totals["loss_sum"]
        if self.loss_per is not None:
            if self.loss_per not in totals:
                raise KeyError(f"loss_per={self.loss_per!r}: no sum of that name was added")
            loss /= max(1.0, totals[self.loss_per])
        norms = [float(norm) for norm in self.norms]
        return {
            "step": step,
            "rollouts": self.counters["rollouts"],
            "gen_tokens": self.counters["gen_tokens"],
            "reward_mean": reward_mean,
            "reward_std": reward_std,
            "pass_rate": totals["success"] / max(1.0, totals["reward_n"]),
            **scored.metrics(self.accelerator),
            "frac_zero_var_groups": totals["zero_var"] / max(1.0, totals["groups"]),
            "completion_len_mean": totals["gen_tokens"] / samples,
            "clipped_ratio": totals["truncated"] / samples,
            "loss": loss,
            "kl": totals["kl_sum"] / tokens,
            "entropy": totals["ent_sum"] / tokens,
            "grad_norm": float(np.mean(norms)) if norms else math.nan,
            "lr": lr,
            "time_gen_s": totals["t_gen"] / world,
            "time_train_s": totals["t_train"] / world,
            "sampler_logp_diff": totals["gap_sum"] / totals["gap_tok"]
            if totals["gap_tok"]
            else None,
        }

    def end(self, row: dict) -> float:
        """Add this rank's phase times to `row` (time/<phase>_s, and time/other_s: the step less
        them) and return the step's seconds (its time_step_s)."""
        step_seconds = self._clock() - self.start
        row.update({f"time/{name}_s": seconds for name, seconds in self.seconds.items()})
        row["time/other_s"] = step_seconds - sum(self.seconds.values())
        return step_seconds

    def _clock(self) -> float:
        # on a GPU the queued work belongs to the phase that queued it: one sync per boundary
        if self.sync:
            torch.cuda.synchronize(self.accelerator.device)
        return time.perf_counter()

    def _reduce(self, sums: dict) -> dict:
        """Every named sum over ranks in one float64 all-reduce and one copy to the host."""
        device = self.accelerator.device
        names = list(sums)
        # numbers and host tensors go to the device in one copy; device tensors are stacked there
        numbers = [
            i
            for i, name in enumerate(names)
            if not torch.is_tensor(sums[name]) or sums[name].device.type == "cpu"
        ]
        packed = [None] * len(names)
        cpu = torch.tensor([float(sums[names[i]]) for i in numbers], dtype=torch.float64)
        for i, value in zip(numbers, cpu.to(device).unbind()):
            packed[i] = value
        for i, name in enumerate(names):
            if packed[i] is None:
                packed[i] = sums[name].to(device).reshape(())
        total = torch.stack(packed)
        if self.accelerator.num_processes > 1:
            total = self.accelerator.reduce(total, reduction="sum")
        return dict(zip(names, total.tolist()))
