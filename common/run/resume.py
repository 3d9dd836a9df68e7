"""Resuming a run: a checkpoint of common/run/checkpoint.py read back (only with
--resume_from_checkpoint). Every file is read as data (safetensors, or tensors and plain containers
with torch's restricted unpickler: a tampered file cannot run code), checked against the run that
resumes (processes, --fsdp, LoRA, the model's weights), then the weights, optimizer, scheduler,
RNGs and the method's state are restored exactly.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch.distributed.fsdp import FSDPModule

from common.distributed.ranks import gather_list
from common.model.policy import tied_keys


def resume_run(checkpoints, sampler, generator, policy) -> tuple[int, dict]:
    """`Checkpoints.resume` of a resumed run: (step, saved state), with the weights, optimizer,
    scheduler, RNGs and prompt sampler restored and the generator given the weights."""
    path = checkpoints.resumed_from
    step, state = load_checkpoint(
        path,
        checkpoints.accelerator,
        checkpoints.model,
        checkpoints.optimizer,
        checkpoints.scheduler,
    )
    sampler.load_state_dict(state["sampler"])
    restore_models(checkpoints.models, state)
    generator.sync_weights(policy)
    checkpoints.log(f"resumed from {path} at step {step}")
    return step, state


def set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def safe_load(path: Path, keys: tuple[str, ...] = ()) -> dict:
    """One checkpoint file read as data (safetensors, or tensors and plain containers: a tampered
    file cannot run code); a missing, truncated, tampered or foreign file stops the run with one
    line naming it."""
    where = f"{path.parent.name}/{path.name}"
    try:
        content = (
            load_file(str(path))
            if path.suffix == ".safetensors"
            else torch.load(path, weights_only=True)
        )
    except (
        Exception
    ) as error:  # whatever failed, the file is at fault: name it, without torch's traceback
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception:
            found = []
        if found and all(
            name.startswith("numpy.") for name in found
        ):  # older checkpoints pickled numpy objects
            raise SystemExit(
                f"{where}: an older checkpoint format (numpy objects) that a resume no longer "
                "unpickles; "
                f"restart from its weights with --model_name_or_path {path.parent}"
            )
        reason = (
            f"it calls {', '.join(found)}"
            if found
            else str(error).split(". ")[0].strip() or "empty or cut short"
        )
        raise SystemExit(
            f"{where}: not a checkpoint written by this project (unsafe or unreadable content): "
            f"{reason}"
        )
    if not isinstance(content, dict) or not set(keys) <= set(content):
        raise SystemExit(
            f"{where}: not a checkpoint written by this project (expected the keys "
            f"{', '.join(keys)})"
        )
    return content


def load_checkpoint(path: Path, accelerator, model, optimizer, scheduler) -> tuple[int, dict]:
    """Restore weights, optimizer, scheduler and this rank's RNG (each file checked by `safe_load`);
    returns (step, method state). Under `--fsdp` the method state also holds this rank's
    `rank_state` under the key "rank_state"."""
    ts = safe_load(
        path / "trainer_state.pt", ("step", "optimizer", "scheduler", "state", "world_size")
    )
    if ts["world_size"] != accelerator.num_processes:
        raise SystemExit(
            f"--resume_from_checkpoint {path}: saved with {ts['world_size']} processes, now "
            f"{accelerator.num_processes}"
        )
    unwrapped = accelerator.unwrap_model(model)
    sharded = isinstance(unwrapped, FSDPModule)
    if sharded != (ts["optimizer"] is None):
        raise SystemExit(
            f"--resume_from_checkpoint {path}: saved {'without' if sharded else 'with'} --fsdp, "
            "resumed "
            f"{'with' if sharded else 'without'} it (the optimizer state is laid out differently)"
        )
    saved_lora = (path / "adapter_model.safetensors").exists()
    if saved_lora != hasattr(unwrapped, "get_base_model"):
        raise SystemExit(
            f"--resume_from_checkpoint {path}: saved {'with' if saved_lora else 'without'} LoRA "
            "adapters, resumed "
            f"{'without' if saved_lora else 'with'} them (match --lora_r)"
        )
    rank, refused = accelerator.process_index, []
    # this rank's own files: all ranks stop if one is refused (a rank leaving alone would hang the
    # others)
    try:
        rng = safe_load(path / f"rng_rank{rank}.pt", ("python", "numpy", "torch"))
        shards = safe_load(path / f"shards_rank{rank}.pt", ("optimizer",)) if sharded else None
    except SystemExit as error:
        refused.append(str(error))
    if refused := gather_list(accelerator, refused):
        raise SystemExit("; ".join(refused))
    for obj, saved in zip(getattr(accelerator, "_custom_objects", []), rng.get("objects", [])):
        obj.load_state_dict(
            saved
        )  # registered for checkpointing: the vLLM generator's seed counter
    if hasattr(
        unwrapped, "get_base_model"
    ):  # LoRA: the adapters are the trained weights, the base is unchanged
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(unwrapped, safe_load(path / "adapter_model.safetensors"))
        if result.unexpected_keys:
            raise SystemExit(
                f"--resume_from_checkpoint {path}: adapter does not match the model "
                f"({result.unexpected_keys[:3]})"
            )
        return _finish_load(ts, rng, shards, optimizer, scheduler)
    index = path / "model.safetensors.index.json"
    if index.exists():  # large models are saved in shards
        import json

        weights = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            weights.update(safe_load(path / shard))
    else:
        weights = safe_load(path / "model.safetensors")
    # another model than the run's (a changed --model_name_or_path): one line, not load_state_dict's
    # size-mismatch traceback
    own = unwrapped.state_dict()
    other = [
        f"{key} {list(weights[key].shape)} vs {list(own[key].shape)}"
        for key in weights
        if key in own and tuple(weights[key].shape) != tuple(own[key].shape)
    ]
    if other:
        raise SystemExit(
            f"--resume_from_checkpoint {path}: the checkpoint's weights do not fit this model "
            f"({len(other)} differ in shape, e.g. {other[0]}): resume with the run's "
            f"--model_name_or_path (--config {path.parent / 'args.json'} gives every flag it used)"
        )
    if sharded:  # --fsdp: every rank reads the whole weights and keeps its shards
        from common.distributed.fsdp import load_full_state_dict
    missing, unexpected = (
        load_full_state_dict(unwrapped, weights)
        if sharded
        else unwrapped.load_state_dict(weights, strict=False)
    )
    missing = [k for k in missing if k not in tied_keys(unwrapped)]
    if missing or unexpected:
        raise SystemExit(
            f"--resume_from_checkpoint {path}: weights do not match the model (missing "
            f"{missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    return _finish_load(ts, rng, shards, optimizer, scheduler)


def _finish_load(
    ts: dict, rng: dict, shards: dict | None, optimizer, scheduler
) -> tuple[int, dict]:
    if shards is not None:  # --fsdp: this rank's optimizer shard
        from common.distributed.fsdp import load_shards

        ts["state"]["rank_state"] = load_shards(optimizer, shards)
    else:
        optimizer.load_state_dict(ts["optimizer"])
    scheduler.load_state_dict(ts["scheduler"])
    set_rng_state(rng)
    return ts["step"], ts["state"]


def restore_models(models: dict, state: dict) -> None:
    """The weights and optimizer state of the models a method trains besides the policy
    (`Checkpoints(models=...)`), from a resumed checkpoint's state."""
    for name, (module, optimizer) in models.items():
        if isinstance(module, FSDPModule):  # whole weights, and this rank's optimizer shard
            from common.distributed import fsdp

            fsdp.load_full_state_dict(module, state["method"][name])
            fsdp.load_local_optimizer_state(optimizer, state["rank_state"][f"{name}_opt"])
        else:
            module.load_state_dict(state["method"][name])
            optimizer.load_state_dict(state["method"][f"{name}_opt"])
