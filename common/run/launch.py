"""What a launch sets before any library starts: the CPU thread policy (before torch loads OpenMP)
and the compute dtype, which `accelerate config`'s mixed precision may set (its other choices:
common/run/accelerate_env.py). No torch import here."""

from __future__ import annotations

import os
import time


def resolve_accelerate_precision(
    args_dtype: str, environ=None, log=print, given: str | None = None
) -> str:
    """The `--dtype` to run with, named in one line with the source that set it: --dtype set
    explicitly (`given`: where), else `accelerate config`'s mixed precision
    (ACCELERATE_MIXED_PRECISION), else --dtype's default. accelerate would autocast only the DDP
    policy's forward: bf16 becomes `--dtype bfloat16` (every path alike), fp16 / fp8 stop here, and
    the variable is deleted so the Accelerator keeps full precision."""
    environ = os.environ if environ is None else environ
    mode = environ.pop("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    accelerate_set = mode not in ("", "no")
    if given:
        dtype, source = args_dtype, f"--dtype, set on {given}"
        if accelerate_set:
            source += f"; accelerate's ACCELERATE_MIXED_PRECISION={mode} is not applied"
    elif accelerate_set:
        from common.run.mixed_precision import accelerate_dtype

        dtype, source = accelerate_dtype(mode)
    else:
        dtype, source = args_dtype, "--dtype's default"
    if environ.get("RANK", "0") == "0":  # one line, not one per rank
        log(f"compute dtype {dtype} ({source})")
    return dtype


class CpuThreads:
    """The torch thread count of a run (docs/cpu_threads.md). `--num_threads N` > 0 fixes it at N.
    With 0 (the default) it follows the cores the rest of the machine leaves free, read from
    /proc/stat at set-up and before every step and evaluation: cores - (busy cores not ours), at
    least 1. Why: OpenMP's threads wait for each other at every parallel region, so one runnable
    thread more than the free cores stalls every region (on 2 cores torch's default ran 3.5x slower
    beside one busy process). Without /proc it keeps torch's default. `hold=True`
    (`--torch_compile`) keeps the first count: compiled graphs are guarded on the thread count, so
    each change would compile every graph again."""

    def __init__(self, num_threads: int = 0, cores: int | None = None, proc="/proc", hold=False):
        self.fixed, self.cores = num_threads, cores or os.cpu_count() or 1
        self.proc, self.hold = proc, hold
        self.last = None if num_threads > 0 else self._sample()

    def _sample(self) -> tuple[int, int, int] | None:
        """(all jiffies, busy jiffies, this process's jiffies) summed over the cores, or None
        without /proc."""
        try:
            with open(f"{self.proc}/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:]]
            with open(f"{self.proc}/self/stat") as f:
                # after the command name, which may hold spaces
                own = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError, IndexError):
            return None
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        return sum(ticks[:8]), sum(ticks[:8]) - idle, int(own[11]) + int(own[12])  # utime + stime

    def count(self, default: int, settle: float = 0.0) -> int:
        """The thread count to use now (`default`: torch's own, kept when nothing can be measured).
        `settle` > 0 measures the machine over that many seconds now instead of since the last call:
        the call right after the arguments are parsed, so set-up and the step-0 evaluation already
        run at a count that fits."""
        if self.fixed > 0:
            return self.fixed
        if self.hold:  # measured once, then fixed
            self.fixed = self._measure(default, settle)
            return self.fixed
        return self._measure(default, settle)

    def _measure(self, default: int, settle: float) -> int:
        if settle > 0:
            self.last = self._sample()
            time.sleep(settle)
        now = self._sample()
        if now is None or self.last is None or now[0] <= self.last[0]:
            self.last = now
            return default
        total, busy, own = (a - b for a, b in zip(now, self.last))
        self.last = now
        # cores the rest of the machine kept busy
        others = max(0.0, (busy - own) / (total / self.cores))
        return max(1, min(self.cores, round(self.cores - others)))
