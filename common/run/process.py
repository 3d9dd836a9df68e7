"""A run's process: the graceful stop on SIGINT / SIGTERM that every rank agrees on, the one-line
exit of a rank whose collective timed out, and the end of the run (process group, trackers, output
folder)."""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta

from common.distributed.ranks import end_process_group, reduce_sums
from common.run.folder_lock import release_all


class GracefulStop:
    """First Ctrl-C / SIGTERM: finish the current step, then stop (the script saves a checkpoint,
    and its process exits with `exit_status()`: 128 + the signal's number, as a shell reports a
    process the signal ended). A second signal raises KeyboardInterrupt at once."""

    received: list[int] = []
    """every signal any GracefulStop of this process took: a program that runs a script's main() in
    its own process learns from it that a stop was asked for while the script held the signals"""
    stopped = 0
    """the exit status of a run that a signal stopped (0: none did), for the script's process"""

    def __init__(self, log=print):
        self.requested, self.log = False, log
        GracefulStop.stopped = 0
        self.previous = {
            sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)
        }

    def close(self) -> None:
        """Give the signals back to their previous handlers (a script's main() may run inside
        another program)."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        GracefulStop.received.append(signum)
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.log(
            f"\nsignal {signum}: saving a checkpoint after this step, then stopping (again to "
            "abort)"
        )

    def any_rank_signalled(self, accelerator) -> bool:
        """True on every rank when any rank was signalled (all must stop together, or a collective
        hangs)."""
        if reduce_sums(accelerator, {"stop": float(self.requested)})["stop"] == 0:
            return False
        # this rank's signal, or (another rank was signalled) the scheduler's usual one
        signum = GracefulStop.received[-1] if self.requested else signal.SIGTERM
        GracefulStop.stopped = 128 + signum
        return True

    @staticmethod
    def exit_status() -> int:
        """0 for a finished run, 128 + the signal's number (130 SIGINT, 143 SIGTERM) for one a
        signal stopped."""
        return GracefulStop.stopped


def end_processes(accelerator, settle_s: float = 0.2) -> None:
    """At the end of a run: the trackers finished, the process group destroyed (`settle_s`:
    common/distributed/ranks.py `end_process_group`) and the output folder given back."""
    end_process_group(accelerator, settle_s)
    release_all()


def collective_timeout(seconds: int) -> list:
    """`Accelerator(kwargs_handlers=...)` for a process group whose collectives give up after
    `seconds` (--collective_timeout), and a `sys.excepthook` for what a rank raises then: one line
    naming the step and the phase and exit status 1, not a traceback per rank (any other error, or
    one process, keeps its traceback). The exit skips the teardown: it would hang on the group."""
    from accelerate.utils import InitProcessGroupKwargs

    previous = sys.excepthook

    def hook(kind, error, trace):
        if int(os.environ.get("WORLD_SIZE", "1")) < 2:
            return previous(kind, error, trace)
        from common.distributed.timeouts import exit_if_collective_error

        exit_if_collective_error(error, trace, seconds, lambda: release_all(every_thread=True))
        return previous(kind, error, trace)

    sys.excepthook = hook
    return [InitProcessGroupKwargs(timeout=timedelta(seconds=seconds))]
