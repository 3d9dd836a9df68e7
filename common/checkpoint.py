"""Checkpoints: <output_dir>/checkpoint-<step>/ holds an HF model dir (model + tokenizer, loadable by
`from_pretrained` and vLLM), `trainer_state.pt` (optimizer, scheduler, step, sampler position, the method's state
such as replay buffers) and `rng_rank<r>.pt` (each process's RNGs); under `--fsdp` the model dir still holds the
whole weights, and each rank's optimizer shard (and `rank_state`) is in `shards_rank<r>.pt`. It is written to a
temporary dir and renamed when complete, so an interrupted save never leaves a half-written checkpoint behind.
"""
from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch
from torch.distributed.fsdp import FSDPModule

_NAME = re.compile(r"^checkpoint-(\d+)$")


def rng_state() -> dict:
    s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def list_checkpoints(output_dir: str) -> list[Path]:
    d = Path(output_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if p.is_dir() and (m := _NAME.match(p.name))
             and (p / "trainer_state.pt").exists()]
    return [p for _, p in sorted(found)]


def resolve_resume(resume: str | None, output_dir: str) -> Path | None:
    if not resume:
        return None
    if resume == "auto":
        ckpts = list_checkpoints(output_dir)
        return ckpts[-1] if ckpts else None  # nothing yet: start fresh
    p = Path(resume)
    if not (p / "trainer_state.pt").exists():
        raise SystemExit(f"--resume {resume}: not a checkpoint dir (no trainer_state.pt)")
    return p


def save_checkpoint(output_dir: str, step: int, accelerator, model, tokenizer, optimizer, scheduler,
                    state: dict, keep: int = 2, merged_export: bool = False, rank_state: dict | None = None) -> Path:
    """With LoRA the model dir holds the adapter (adapter_model.safetensors, loads with peft on the base model);
    `merged_export` adds `merged/`, a plain model dir with the adapters folded in. Every rank must call this."""
    final = Path(output_dir) / f"checkpoint-{step}"
    tmp = Path(output_dir) / f".tmp-checkpoint-{step}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(rng_state(), tmp / f"rng_rank{accelerator.process_index}.pt")
    unwrapped, weights = accelerator.unwrap_model(model), None
    sharded = isinstance(unwrapped, FSDPModule)  # --fsdp (common.fsdp is imported only then)
    if sharded:  # every rank takes part; rank 0 receives the whole fp32 weights
        from common.fsdp import save_shards

        weights = save_shards(unwrapped, optimizer, rank_state, tmp / f"shards_rank{accelerator.process_index}.pt",
                              skip=_tied_keys(unwrapped))
    if accelerator.is_main_process:
        unwrapped.save_pretrained(tmp, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        if merged_export and hasattr(unwrapped, "get_base_model"):
            from common.lora import merged_state_dict

            unwrapped.get_base_model().save_pretrained(tmp / "merged", state_dict=merged_state_dict(unwrapped))
            tokenizer.save_pretrained(tmp / "merged")
        torch.save({"step": step, "optimizer": None if sharded else optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "state": state, "world_size": accelerator.num_processes}, tmp / "trainer_state.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(path: Path, accelerator, model, optimizer, scheduler) -> tuple[int, dict]:
    """Restore weights, optimizer, scheduler and this rank's RNG; returns (step, method state). Under `--fsdp` the
    method state also holds this rank's `rank_state` (as saved) under the key "rank_state"."""
    from safetensors.torch import load_file

    ts = torch.load(path / "trainer_state.pt", weights_only=False)
    if ts["world_size"] != accelerator.num_processes:
        raise SystemExit(f"--resume {path}: saved with {ts['world_size']} processes, now {accelerator.num_processes}")
    unwrapped = accelerator.unwrap_model(model)
    sharded = isinstance(unwrapped, FSDPModule)
    if sharded != (ts["optimizer"] is None):
        raise SystemExit(f"--resume {path}: saved {'without' if sharded else 'with'} --fsdp, resumed "
                         f"{'with' if sharded else 'without'} it (the optimizer state is laid out differently)")
    saved_lora = (path / "adapter_model.safetensors").exists()
    if saved_lora != hasattr(unwrapped, "get_base_model"):
        raise SystemExit(f"--resume {path}: saved {'with' if saved_lora else 'without'} LoRA adapters, resumed "
                         f"{'without' if saved_lora else 'with'} them (match --lora_r)")
    if hasattr(unwrapped, "get_base_model"):  # LoRA: the adapters are the trained weights, the base is unchanged
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(unwrapped, load_file(str(path / "adapter_model.safetensors")))
        if result.unexpected_keys:
            raise SystemExit(f"--resume {path}: adapter does not match the model ({result.unexpected_keys[:3]})")
        return _finish_load(path, ts, accelerator, optimizer, scheduler)
    index = path / "model.safetensors.index.json"
    if index.exists():  # large models are saved in shards
        import json

        weights = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            weights.update(load_file(str(path / shard)))
    else:
        weights = load_file(str(path / "model.safetensors"))
    if sharded:  # --fsdp: every rank reads the whole weights and keeps its shards
        from common.fsdp import load_full_state_dict
    missing, unexpected = load_full_state_dict(unwrapped, weights) if sharded else \
        unwrapped.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k not in _tied_keys(unwrapped)]
    if missing or unexpected:
        raise SystemExit(f"--resume {path}: weights do not match the model (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    return _finish_load(path, ts, accelerator, optimizer, scheduler)


def _finish_load(path: Path, ts: dict, accelerator, optimizer, scheduler) -> tuple[int, dict]:
    if ts["optimizer"] is None:  # --fsdp: this rank's optimizer shard
        from common.fsdp import load_shards

        ts["state"]["rank_state"] = load_shards(optimizer, path / f"shards_rank{accelerator.process_index}.pt")
    else:
        optimizer.load_state_dict(ts["optimizer"])
    scheduler.load_state_dict(ts["scheduler"])
    set_rng_state(torch.load(path / f"rng_rank{accelerator.process_index}.pt", weights_only=False))
    return ts["step"], ts["state"]


def _tied_keys(model) -> set[str]:
    return {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
