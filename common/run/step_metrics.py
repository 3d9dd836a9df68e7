"""A step's metrics: its sums, reduced over ranks once, and the keys every script logs.

The step's sums are taken at its end: the rollouts' (`rollout_sums`) and the method's, the update's
as one dict of tensors per micro-batch (no host sync per micro-batch), and the phase times
(`StepClock`). One packed all-reduce gives every rank the same totals (`step_totals`), from which
the shared keys (`step_metrics`, docs/metrics.md) and a method's own figures are derived; the
scripts call them through `RunLog` (common/run/logs.py).
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
GENERIC_SUMS = tuple(
    "groups rollouts gen_tokens clipped success zero_var_groups "
    "reward_n reward_sum reward_sq_sum unscored "
    "loss_sum kl_sum ent_sum tok gap_sum gap_tok".split()
)


class StepClock:
    """One step's wall clock: the seconds of each phase (time/<phase>_s), the rest (time/other_s)
    and the whole step (time_step_s). On a GPU the queued work belongs to the phase that queued it:
    one sync per boundary."""

    def __init__(self, device):
        self.sync = device.type == "cuda"
        self.device = device
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.open = None
        self.start = self.now()

    def now(self) -> float:
        if self.sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextmanager
    def timing(self, phase: str):
        """Add the block's seconds to `phase`."""
        if phase not in self.seconds:
            raise ValueError(f"phase {phase!r}: one of {', '.join(PHASES)}")
        if self.open:
            # a phase inside another would count its seconds twice
            raise RuntimeError(f"phase {phase!r} entered inside phase {self.open!r}")
        self.open, start = phase, self.now()
        try:
            yield
        finally:
            self.seconds[phase] += self.now() - start
            self.open = None

    def times(self) -> dict:
        """time/<phase>_s for each phase, time/other_s and time_step_s, up to now."""
        step_seconds = self.now() - self.start
        times = {f"time/{name}_s": seconds for name, seconds in self.seconds.items()}
        times["time/other_s"] = step_seconds - sum(self.seconds.values())
        return times | {"time_step_s": step_seconds}


def rollout_sums(groups, rewards, success, zero_var, truncated, completion_ids) -> dict:
    """The step's rollouts as the sums the shared keys read: `groups` (a count), every rollout's
    reward (`rewards`, a tensor or list of any shape: rollouts; NaN where no function scored it,
    out of reward_mean / _std), the counts `success`, `zero_var` (groups whose rewards are all
    equal: `zero_var_groups`, over `groups` frac_zero_var_groups) and `truncated` (`clipped`, over
    the rollouts clipped_ratio), and the generated tokens of `completion_ids`."""
    rewards = rewards.tolist() if hasattr(rewards, "tolist") else rewards
    values = np.asarray(rewards, dtype=np.float64).ravel()
    return {
        "groups": groups,
        "rollouts": values.size,
        "gen_tokens": sum(map(len, completion_ids)),
        "success": success,
        "zero_var_groups": zero_var,
        "clipped": truncated,
        "reward_n": values.size,
        **reward_sums(values),
    }


def add_up(per_micro_batch: list[dict]) -> dict:
    """Each name's sum over the micro-batches, in their order, in float64 (exact for float32 and
    integer counts; tensors detached, on their device)."""
    sums: dict = {}
    for values in per_micro_batch:
        for name, value in values.items():
            value = value.detach().to(torch.float64) if torch.is_tensor(value) else float(value)
            # value + total, not total + value: a tensor then keeps the sum on its device
            sums[name] = value + sums[name] if name in sums else value + 0.0
    return sums


def step_totals(accelerator, clock: StepClock, sums: dict, update: list[dict]) -> dict:
    """Every sum of the step over ranks, in one float64 all-reduce: the step's `sums` (e.g.
    `rollout_sums` and the method's), the update's (one dict per micro-batch, added in their
    order), and the sampling and update seconds. Every rank gives the same names."""
    added = add_up([sums, *update])
    # the shared names first, then the method's sorted: the same packing on every rank
    packed = {name: added.get(name, 0.0) for name in GENERIC_SUMS}
    packed |= {name: added[name] for name in sorted(added) if name not in packed}
    packed["t_gen"], packed["t_train"] = clock.seconds["gen"], clock.seconds["update"]
    return sum_over_ranks(accelerator, packed)


def step_metrics(step, totals, counters, grad_norms, lr, scored, accelerator, loss_per) -> dict:
    """The keys every script logs (docs/metrics.md), from the step's `totals` over ranks;
    `counters` (the run's rollouts and gen_tokens so far, kept in the checkpoint) grows by the
    step's. `loss_per` names the total the summed loss is divided by (None: the loss was summed as
    its final value)."""
    world = accelerator.num_processes
    counters["rollouts"] += int(totals["rollouts"])
    counters["gen_tokens"] += int(totals["gen_tokens"])
    samples, tokens = max(1.0, totals["rollouts"]), max(1.0, totals["tok"])
    reward_mean, reward_std = reward_moments(totals, totals["reward_n"])
    loss = totals["loss_sum"]
    if loss_per is not None:
        if loss_per not in totals:
            raise KeyError(f"loss_per={loss_per!r}: no sum of that name was added")
        loss /= max(1.0, totals[loss_per])
    norms = [float(norm) for norm in grad_norms]
    return {
        "step": step,
        "rollouts": counters["rollouts"],
        "gen_tokens": counters["gen_tokens"],
        "reward_mean": reward_mean,
        "reward_std": reward_std,
        "pass_rate": totals["success"] / max(1.0, totals["reward_n"]),
        **scored.metrics(accelerator),
        "frac_zero_var_groups": totals["zero_var_groups"] / max(1.0, totals["groups"]),
        "completion_len_mean": totals["gen_tokens"] / samples,
        "clipped_ratio": totals["clipped"] / samples,
        "loss": loss,
        "kl": totals["kl_sum"] / tokens,
        "entropy": totals["ent_sum"] / tokens,
        "grad_norm": float(np.mean(norms)) if norms else math.nan,
        "lr": lr,
        "time_gen_s": totals["t_gen"] / world,
        "time_train_s": totals["t_train"] / world,
        "sampler_logp_diff": totals["gap_sum"] / totals["gap_tok"] if totals["gap_tok"] else None,
    }


def sum_over_ranks(accelerator, sums: dict) -> dict:
    """Every named sum over ranks in one float64 all-reduce and one copy to the host."""
    device = accelerator.device
    names, values = list(sums), list(sums.values())
    # numbers and host tensors go to the device in one copy; device tensors are stacked there
    on_host = [i for i, v in enumerate(values) if not torch.is_tensor(v) or v.device.type == "cpu"]
    cpu = torch.tensor([float(values[i]) for i in on_host], dtype=torch.float64)
    copied = dict(zip(on_host, cpu.to(device).unbind()))
    packed = [copied[i] if i in copied else v.to(device).reshape(()) for i, v in enumerate(values)]
    total = torch.stack(packed)
    if accelerator.num_processes > 1:
        total = accelerator.reduce(total, reduction="sum")
    return dict(zip(names, total.tolist()))
