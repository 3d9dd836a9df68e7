"""A run's logs: one JSON row per step in <output_dir>/metrics.jsonl (main process; the keys:
docs/metrics.md), optionally sent to trackers, a few sampled rollouts per kind in
<output_dir>/samples.jsonl, and the progress bar (`RunLog`, the same in every method script)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np

from common.distributed.ranks import first_failure, stop_every_rank
from common.run.folder_lock import lost_hold, write_deferred


def check_tracker(report_to: str) -> list[str] | None:
    """The trackers `--report_to` names, as accelerate's `log_with` (None for `none`), checked
    before anything starts: an unknown name or a tracker that is not installed stops with one
    line."""
    names = [name.strip() for name in report_to.split(",") if name.strip()]
    if names in ([], ["none"]):
        return None
    from common.run.trackers import check_names

    return check_names(report_to, names)


def append_rows(path: Path, rows: list[dict]) -> None:
    """Append each row as one JSON line with one write call, straight to the OS (no Python buffer):
    a killed process leaves whole rows behind (a full disk may still cut the last one: a resume
    drops it). A failed write (a full disk, no permission) stops the run with one line naming the
    file and the error."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for row in rows:
                # NaN (no reward): null
                row = {k: None if isinstance(v, float) and v != v else v for k, v in row.items()}
                data = (json.dumps(row) + "\n").encode()
                while data:  # a regular file takes it in one call; the loop covers a short write
                    data = data[os.write(fd, data) :]
        finally:
            os.close(fd)
    except OSError as error:
        from common.run.folder_errors import row_not_written

        raise SystemExit(row_not_written(path, error)) from None


def _numbers(row: dict) -> dict:
    """`row` with numpy numbers as Python floats (JSON writes them)."""
    return {k: float(v) if isinstance(v, (np.floating, np.integer)) else v for k, v in row.items()}


class MetricsLogger:
    def __init__(self, output_dir: str, accelerator, resume_step: int | None = None, args=None):
        """`args`: the run's flags, for the trackers --report_to names (None: no tracker)."""
        self.acc = accelerator
        self.path = Path(output_dir) / "metrics.jsonl"
        self.trackers = args is not None and args.report_to != "none"
        written_on_main(accelerator, output_dir, lambda: self._start(resume_step))
        if self.trackers and accelerator.is_main_process:
            from common.run.trackers import start_trackers

            config, resumed = dataclasses.asdict(args), resume_step is not None
            start_trackers(accelerator, args.project, config, output_dir, args.run_name, resumed)

    def _start(self, resume_step: int | None) -> None:
        write_deferred(self.path.parent)  # a resume's records of its flags: its checkpoint loaded
        # a resume drops rows written after its checkpoint (the file reads as one run)
        _keep_rows_until(self.path, resume_step)  # a new run: none

    def log(self, metrics: dict) -> None:
        """Every rank (a failed write stops them all); the main process writes the row."""
        clean = _numbers(metrics)
        written_on_main(self.acc, self.path.parent, lambda: append_rows(self.path, [clean]))
        if self.trackers and self.acc.is_main_process:
            from common.run.trackers import log_row

            log_row(self.acc.trackers, clean)


def _keep_rows_until(path: Path, resume_step: int | None) -> None:
    """A log file's rows up to `resume_step` (None: none) kept, when the folder holds one (a
    resume's, or a run's that --resume_from_checkpoint auto starts over)."""
    if path.exists():
        from common.run.resume_checks import keep_rows_until

        keep_rows_until(path, resume_step)


def written_on_main(accelerator, output_dir, write) -> None:
    """Every rank: `write()` on the main process, once this launch is known to still hold
    `output_dir`; a failure stops every rank at once with one line naming the folder or file and the
    error."""
    failed = []
    if accelerator.is_main_process:
        try:
            lost = lost_hold(Path(output_dir))
            if lost:
                raise SystemExit(lost)
            write()
        except SystemExit as stop:  # append_rows's line, or the lost hold's
            failed.append(str(stop))
        except OSError as error:
            from common.run.folder_errors import logs_not_written

            failed.append(logs_not_written(output_dir, error))
    if (reason := first_failure(accelerator, failed)) is not None:
        stop_every_rank(accelerator, reason)


def first_of_each_kind(kinds: list[str], per_kind: int) -> list[int]:
    """Indices of the first `per_kind` items of each kind (the rollouts worth decoding for
    samples.jsonl)."""
    seen: dict[str, int] = {}
    chosen = []
    for i, kind in enumerate(kinds):
        if seen.get(kind, 0) < per_kind:
            seen[kind] = seen.get(kind, 0) + 1
            chosen.append(i)
    return chosen


class SampleLogger:
    """samples.jsonl: at chosen steps, up to --log_samples_per_kind rollouts of each kind (fresh,
    replayed, prefix...) as JSON rows (step, kind, prompt, completion, reward, advantage and the
    method's tags), also sent to the tracker as a table (wandb, trackio) or text (tensorboard).
    `write` must be called on every rank (rows are gathered)."""

    def __init__(self, args, accelerator, resume_step: int | None):
        self.acc, self.path = accelerator, Path(args.output_dir) / "samples.jsonl"
        self.every, self.per_kind = args.log_samples_every, args.log_samples_per_kind
        # as metrics.jsonl: rows past the checkpoint go
        written_on_main(
            accelerator, args.output_dir, lambda: _keep_rows_until(self.path, resume_step)
        )

    def write(self, step: int, rows: list[dict]) -> None:
        from accelerate.utils import gather_object

        rows = gather_object(rows) if self.acc.num_processes > 1 else rows
        # the bound holds over all ranks
        rows = [rows[i] for i in first_of_each_kind([row["kind"] for row in rows], self.per_kind)]
        clean = [{"step": step, **_numbers(row)} for row in rows]
        written_on_main(
            self.acc, self.path.parent, lambda: append_rows(self.path, clean) if clean else None
        )
        if self.acc.is_main_process and rows and self.acc.trackers:
            from common.run.trackers import log_sample_table

            log_sample_table(self.acc.trackers, step, clean)


class RunLog:
    """What a step leaves besides its checkpoint, the same in every method script: the row in
    metrics.jsonl (and the tracker) with the step's time, thread count and compile figures, a few
    rollouts in samples.jsonl, the progress bar, and one warning when the generator stops sampling
    from the policy being trained."""

    def __init__(self, args, accelerator, script: str, start_step: int, resumed: bool, log=print):
        resume_step = start_step if resumed else None  # a resume drops rows after its checkpoint
        self.args, self.accelerator, self.log_line = args, accelerator, log
        self.metrics = MetricsLogger(args.output_dir, accelerator, resume_step, args)
        self.samples = SampleLogger(args, accelerator, resume_step)
        self.warned_sampler_gap = False
        self.script, self.initial_step, self.progress = script, start_step, None
        if resumed:  # a fresh run opens the bar after its step-0 line (`first_row`)
            self._open_progress()

    def start_step(self, cpu_threads) -> None:
        """A step begins: torch's thread count fitted to the cores free now (fixed by
        --num_threads), the step's clock started."""
        import torch

        from common.run.step_metrics import StepClock

        self.threads = cpu_threads.count(torch.get_num_threads())
        torch.set_num_threads(self.threads)
        self.clock = StepClock(self.accelerator.device)

    def timing(self, phase: str):
        """Context: the block's seconds count as the step's `phase` (time/<phase>_s)."""
        return self.clock.timing(phase)

    def step_metrics(
        self,
        step: int,
        counters: dict,
        scored,
        sums: dict,
        update: list[dict],
        grad_norms: list,
        lr: float,
        loss_per: str | None = "rollouts",
    ) -> tuple[dict, dict]:
        """The step's row of the keys every script logs (docs/metrics.md) and the step's totals over
        ranks (one all-reduce), from the step's `sums` (`rollout_sums` and the method's) and the
        update's (one dict per micro-batch); `counters` (the run's rollouts and gen_tokens) grows by
        the step's. Call on every rank, with the same names."""
        from common.run.step_metrics import step_metrics, step_totals

        # the sampler correction's extremes are reduced by max, its sums with the others
        correction = getattr(self.args, "vllm_importance_sampling_correction", False)
        if correction:
            from common.rl.sampler_correction import correction_metrics, split_extremes

            update, extremes = split_extremes(update)
        totals = step_totals(self.accelerator, self.clock, sums, update)
        row = step_metrics(
            step, totals, counters, grad_norms, lr, scored, self.accelerator, loss_per
        )
        if correction:
            row |= correction_metrics(self.accelerator, totals, extremes)
        return row, totals

    def samples_due(self, step: int) -> bool:
        """Whether this step writes rollouts to samples.jsonl (--log_samples_every, by default at
        each evaluation)."""
        every = self.samples.every
        return self.evaluation_due(step) if every is None else every > 0 and step % every == 0

    def write_samples(self, step: int, rows: list[dict]) -> None:
        """This rank's rollout rows to samples.jsonl, at most --log_samples_per_kind of each kind
        over all ranks. Call on every rank."""
        self.samples.write(step, rows)

    def write_row(self, row: dict, compiled) -> None:
        """The step's row, with its times, thread count and compile figures, to metrics.jsonl and
        the tracker; the progress bar moves. Call on every rank."""
        times = self.clock.times()
        step_seconds = times.pop("time_step_s")
        row = row | times
        self._warn_sampler_gap(row.get("sampler_logp_diff"))
        # compile time, recompiles
        row.update(compiled.metrics(self.accelerator) if compiled else {})
        row["time_step_s"] = step_seconds
        row["num_threads"] = self.threads  # with a fixed count the run repeats exactly
        self.metrics.log(row)
        if self.progress is None:
            self._open_progress()
        self.progress.update(1)
        postfix = {
            "reward": f"{row['reward_mean']:.3f}",
            "zero_var": f"{row['frac_zero_var_groups']:.2f}",
        }
        if "eval_pass@1" in row:
            postfix["eval"] = f"{row['eval_pass@1']:.3f}"
        self.progress.set_postfix(postfix)

    def evaluation_due(self, step: int) -> bool:
        """Every --eval_steps steps and at the last step."""
        every = self.args.eval_steps
        return bool(every and step % every == 0) or step == self.args.max_steps

    def first_row(self, evaluation: dict, compiled) -> None:
        """Step 0: the starting policy's evaluation."""
        import torch

        row = {"step": 0, **evaluation, "num_threads": torch.get_num_threads()}
        row.update(compiled.metrics(self.accelerator) if compiled else {})
        self.metrics.log(row)
        self.log_line(f"step 0 (starting policy): {row}")
        self._open_progress()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
            BarLine.uninstall()

    def _open_progress(self) -> None:
        from tqdm.auto import tqdm

        self.progress = tqdm(
            total=self.args.max_steps,
            initial=self.initial_step,
            desc=self.script,
            disable=not self.accelerator.is_main_process,
            file=BarLine.install(),
        )

    def _warn_sampler_gap(self, gap) -> None:
        """Once a run: the mean |log-prob| gap between the generator and the trainer's first pass
        reached --logp_diff_warn (None: not measured this step)."""
        if self.warned_sampler_gap or gap is None or gap < self.args.logp_diff_warn:
            return
        self.warned_sampler_gap = True
        self.log_line(
            f"warning: sampler_logp_diff {gap:.4f} >= --logp_diff_warn {self.args.logp_diff_warn}: "
            "the generator does not sample from the policy being trained (stale weights, dtype, "
            "temperature?)"
        )


class BarLine:
    """The progress bar's line on stderr, ended before anything else is written there: the bar
    leaves its line open (it redraws it with a carriage return), and in a log file a warning or the
    error that stops the run would be glued to its end."""

    open = False  # the bar's last write left its line open
    stream = None  # the stderr the bar was opened on

    def __init__(self, stream, bar: bool):
        self._stream, self._bar = stream, bar

    def write(self, text: str) -> int:
        if self._bar:
            if text:
                BarLine.open = not text.endswith("\n")
        elif text:
            if BarLine.open and not text.startswith(("\r", "\n")):
                self._stream.write("\n")
            BarLine.open = False
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)

    @classmethod
    def install(cls) -> "BarLine":
        """The bar's file; sys.stderr guarded until `uninstall`."""
        if not isinstance(sys.stderr, BarLine):
            cls.stream, cls.open = sys.stderr, False
            sys.stderr = BarLine(cls.stream, bar=False)
        return BarLine(cls.stream, bar=True)

    @classmethod
    def end_line(cls) -> None:
        """End the bar's open line before a line written to stdout (the run's own lines): in a
        terminal or a log of both streams it starts on a line of its own."""
        if cls.open and isinstance(sys.stderr, BarLine):
            cls.stream.write("\n")
            cls.open = False

    @classmethod
    def uninstall(cls) -> None:
        if isinstance(sys.stderr, BarLine):
            sys.stderr = cls.stream
