"""Checkpoints: <output_dir>/checkpoint-<step>/ holds an HF model dir (model + tokenizer, whole
weights even under --fsdp), `trainer_state.pt` (step, optimizer, scheduler, sampler position, the
method's state), `rng_rank<r>.pt` (each process's RNGs and the state of objects registered with
`accelerator.register_for_checkpointing`) and under --fsdp `shards_rank<r>.pt` (each rank's
optimizer shard). The .pt files hold only tensors and plain containers, so a resume
(common/run/resume.py) runs no code from a checkpoint. A checkpoint is written to a temporary dir
and renamed when whole; a failed write stops every rank with one line. `run.json` records the run
that wrote it (common/run/output_dir.py): rotation removes only that run's own.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil
from collections import deque
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from torch.distributed.fsdp import FSDPModule

from common.distributed.ranks import first_failure, stop_every_rank
from common.model.policy import library_bars_off, tied_keys
from common.run.folder_lock import lost_hold
from common.run.run_folder import read_record

_NAME = re.compile(r"^checkpoint-(\d+)$")
MARKER = ".run.json"  # in the output dir: the id of the run writing there (output_dir.py)
# a failed write (a full disk, no permission): OSError, torch.save's RuntimeError, safetensors' own
_WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


def run_id(record: Path) -> str:
    """The run id in `record`: a checkpoint's `run.json` (the run that wrote it) or the output dir's
    marker (the run writing there); "" when none is recorded."""
    return str(read_record(Path(record)).get("run_id", ""))


def rng_state() -> dict:
    s = {
        "python": random.getstate(),
        "numpy": np.random.get_state(legacy=False),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def plain(obj):
    """`obj` as what `torch.load(weights_only=True)` reads back with no allowlist: numpy arrays
    become tensors, numpy scalars Python numbers, deques lists and dataclasses dicts of their
    fields; any other object fails here, when saving, rather than at resume."""
    if isinstance(obj, dict):
        return {plain(key): plain(value) for key, value in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # its fields, as a dict
        return plain(dataclasses.asdict(obj))
    if isinstance(obj, (list, tuple, deque)):  # a deque (a FIFO) is saved as a list
        return tuple(map(plain, obj)) if isinstance(obj, tuple) else list(map(plain, obj))
    if isinstance(obj, (np.ndarray, np.generic)):
        return torch.from_numpy(obj.copy()) if isinstance(obj, np.ndarray) else obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str, torch.Tensor)):
        return obj
    raise TypeError(
        f"checkpoint state holds a {type(obj).__name__}: keep to numbers, strings, tensors and "
        "containers"
    )


def list_checkpoints(output_dir: str) -> list[Path]:
    d = Path(output_dir)
    if not d.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in d.iterdir()
        if p.is_dir() and (m := _NAME.match(p.name)) and (p / "trainer_state.pt").exists()
    ]
    return [p for _, p in sorted(found)]


def resolve_resume(resume: str | None, output_dir: str) -> Path | None:
    if not resume:
        return None
    if resume == "auto":
        ckpts = list_checkpoints(output_dir)
        return ckpts[-1] if ckpts else None  # nothing yet: start fresh
    p = Path(resume)
    if not (p / "trainer_state.pt").exists():
        raise SystemExit(
            f"--resume_from_checkpoint {resume}: not a checkpoint dir (no trainer_state.pt)"
        )
    return p


# transformers' "Writing model shards" bar: the step bar stays the run's only bar
@library_bars_off()
def save_checkpoint(
    output_dir: str,
    step: int,
    accelerator,
    model,
    tokenizer,
    optimizer,
    scheduler,
    state: dict,
    keep: int = 2,
    merged_export: bool = False,
    rank_state: dict | None = None,
) -> Path:
    """With LoRA the model dir holds the adapter (adapter_model.safetensors, loads with peft on the
    base model); `merged_export` adds `merged/`, a plain model dir with the adapters folded in.
    Every rank must call this. `keep` > 0: afterwards the run writing in `output_dir` keeps its
    `keep` latest checkpoints (another run's are never removed); a failed write stops every rank
    with one line naming the folder and the error."""
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = Path(output_dir) / f".tmp-checkpoint-{step}"
    # failed: messages (an error object would keep its open file through its traceback)
    main, rank, failed = accelerator.is_main_process, accelerator.process_index, []
    _stop_if_not_held(accelerator, output_dir)
    if main:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except OSError as error:
            failed.append(str(error))
    _stop_if_failed(accelerator, failed, tmp, step)  # a collective: the barrier before writing
    try:  # this rank's objects registered for checkpointing (the vLLM generator's seed counter)
        objects = [obj.state_dict() for obj in getattr(accelerator, "_custom_objects", [])]
        torch.save(plain({**rng_state(), "objects": objects}), tmp / f"rng_rank{rank}.pt")
    except _WRITE_ERRORS as error:
        failed.append(str(error))
    unwrapped, weights = accelerator.unwrap_model(model), None
    # --fsdp (common.distributed.fsdp is imported only then)
    sharded = isinstance(unwrapped, FSDPModule)
    if sharded:  # every rank takes part; rank 0 receives the whole fp32 weights
        from common.distributed.fsdp import save_shards

        shards = tmp / f"shards_rank{rank}.pt"
        try:
            weights = save_shards(
                unwrapped, optimizer, plain(rank_state), shards, tied_keys(unwrapped)
            )
        except _WRITE_ERRORS as error:
            failed.append(str(error))
    # run.json: the id, script, settings and flags of the run writing here (output_dir.py)
    record = read_record(Path(output_dir) / MARKER)
    writing = str(record.get("run_id", ""))
    if main and not failed:
        try:
            unwrapped.save_pretrained(tmp, state_dict=weights)
            tokenizer.save_pretrained(tmp)
            if merged_export and hasattr(unwrapped, "get_base_model"):
                from common.model.lora import merged_state_dict

                unwrapped.get_base_model().save_pretrained(
                    tmp / "merged", state_dict=merged_state_dict(unwrapped)
                )
                tokenizer.save_pretrained(tmp / "merged")
            trainer = {
                "step": step,
                "optimizer": None if sharded else optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "state": state,
                "world_size": accelerator.num_processes,
            }
            torch.save(plain(trainer), tmp / "trainer_state.pt")
            (tmp / "run.json").write_text(json.dumps({**record, "run_id": writing}))
        except _WRITE_ERRORS as error:
            failed.append(str(error))
    _stop_if_failed(accelerator, failed, tmp, step)
    # writing took minutes on a large model: the rename and rotation delete
    _stop_if_not_held(accelerator, output_dir)
    if main:
        try:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        except OSError as error:
            failed.append(str(error))
    _stop_if_failed(accelerator, failed, tmp, step)
    # this run's older checkpoints, never the one just written nor another run's
    if main and keep > 0:
        mine = [
            path
            for path in list_checkpoints(output_dir)
            if path != final and run_id(path / "run.json") == writing
        ]
        for old in mine[: max(0, len(mine) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _stop_if_not_held(accelerator, output_dir: str) -> None:
    """Every rank: stop every rank, removing nothing, when this launch lost `output_dir`."""
    mine = lost_hold(Path(output_dir)) if accelerator.is_main_process else None
    lost = first_failure(accelerator, [mine] if mine else [])
    if lost:
        stop_every_rank(accelerator, lost)


def _stop_if_failed(accelerator, failed: list, tmp: Path, step: int) -> None:
    """Every rank: when a write failed on any rank, remove the partial checkpoint and stop every
    rank with one line naming the folder, the error and the checkpoint a resume starts from."""
    reason = first_failure(accelerator, failed)
    if reason is not None:
        from common.run.folder_errors import stop_checkpoint

        stop_checkpoint(accelerator, reason, tmp, step, list_checkpoints(str(tmp.parent)))


class Checkpoints:
    """The run's checkpoints, the same in every method script: the resume at set-up, a save every
    --save_steps steps, at the last step and when a stop (Ctrl-C / SIGTERM) is agreed."""

    def __init__(
        self, args, accelerator, model, tokenizer, optimizer, scheduler, log=print, models=None
    ):
        """`models`: {name: (module, its optimizer)} a method trains besides the policy (PPO's
        critic), saved and restored with it: the weights under `name` and the optimizer under
        `<name>_opt` in the method state (under --fsdp: whole weights, and each rank's optimizer
        shard in its own file)."""
        self.args, self.accelerator, self.log = args, accelerator, log
        self.models = dict(models or {})
        self.model, self.tokenizer = model, tokenizer
        self.optimizer, self.scheduler = optimizer, scheduler
        self.resumed_from = resolve_resume(args.resume_from_checkpoint, args.output_dir)

    def resume(self, sampler, generator, policy) -> tuple[int, dict | None]:
        """(step, saved state) of --resume_from_checkpoint, the weights, optimizer, scheduler, RNG
        and prompt sampler restored and the generator given the weights; (0, None) for a fresh run.
        """
        if self.resumed_from is None:
            return 0, None
        from common.run.resume import resume_run

        return resume_run(self, sampler, generator, policy)

    def due(self, step: int, stopping: bool) -> bool:
        every = self.args.save_steps
        return bool(every and step % every == 0) or step == self.args.max_steps or stopping

    def save(self, step: int, state: dict, stopping: bool, rank_state: dict | None = None) -> Path:
        """Every rank; `state` (the sampler, counters and the method's own state, plain containers)
        goes to trainer_state.pt with the weights and optimizer state of `models`, `rank_state`
        (this rank's optimizer shards under --fsdp) to its own file."""
        for name, (module, optimizer) in self.models.items():
            if isinstance(module, FSDPModule):  # every rank gathers; rank 0 gets whole weights
                from common.distributed import fsdp

                state["method"][name] = fsdp.full_state_dict(module)
                shard = fsdp.local_optimizer_state(optimizer)
                rank_state = {**(rank_state or {}), f"{name}_opt": shard}
            else:
                state["method"][name] = module.state_dict()
                state["method"][f"{name}_opt"] = optimizer.state_dict()
        path = save_checkpoint(
            self.args.output_dir,
            step,
            self.accelerator,
            self.model,
            self.tokenizer,
            self.optimizer,
            self.scheduler,
            state,
            self.args.save_total_limit,
            self.args.lora_merged_export,
            rank_state=rank_state,
        )
        if stopping:
            self.log(
                f"stopped at step {step}; continue with --resume_from_checkpoint auto (checkpoint "
                f"{path})"
            )
        return path
