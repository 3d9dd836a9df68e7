"""One run of a method script in this process (the plain, fsdp and gc_lora parts, and the learning and speed
parts' runs), and the proof of its update: the fraction of policy (and critic) weights that changed."""

from __future__ import annotations

import gc
import importlib
import json
import shutil
import time
from pathlib import Path

from benchmarks.gpu.budget import Args, Stop
from common.run.flags import parse_args
from common.run.process import GracefulStop


def changed_fraction(start: dict, end: dict, names: dict[str, str]) -> float:
    """Fraction of entries of `end[name]` differing from `start[names[name]]` (a bf16 round trip of the start counts
    as unchanged: LoRA stores its frozen base in the compute dtype)."""
    import torch

    changed = total = 0
    for name, start_name in names.items():
        # on the CPU: a trainer state saved on a GPU loads its tensors (pros_ppo's critic) back onto the GPU
        before, after = start[start_name].float().cpu(), end[name].float().cpu()
        differs = (after != before) & (after != before.to(torch.bfloat16).float())
        changed, total = changed + int(differs.sum()), total + after.numel()
    return changed / max(1, total)


def policy_changed(model_dir: Path, ckpt: Path) -> float:
    """Fraction of policy weights that differ from the start (LoRA: fraction of adapter B entries that left zero)."""
    from safetensors.torch import load_file

    if (ckpt / "adapter_model.safetensors").exists():
        adapter = load_file(str(ckpt / "adapter_model.safetensors"))
        lora_b = [t for name, t in adapter.items() if "lora_B" in name]
        return sum(int((t != 0).sum()) for t in lora_b) / max(1, sum(t.numel() for t in lora_b))
    start, end = (
        load_file(str(model_dir / "model.safetensors")),
        load_file(str(ckpt / "model.safetensors")),
    )
    return changed_fraction(start, end, {name: name for name in start})


def critic_changed(model_dir: Path, ckpt: Path) -> float | None:
    """pros_ppo's critic (saved in the trainer state): the fraction of its backbone entries that differ from the
    policy weights it was copied from, and of its zero-initialised head."""
    import torch
    from safetensors.torch import load_file

    from common.run.resume import safe_load

    critic = (
        safe_load(ckpt / "trainer_state.pt", ("state",))["state"].get("method", {}).get("critic")
    )
    if not critic:
        return None
    start = load_file(str(model_dir / "model.safetensors"))
    start.update(
        {
            name: torch.zeros_like(tensor)
            for name, tensor in critic.items()
            if name.startswith("head.")
        }
    )
    names = {}
    for name in (
        critic
    ):  # backbone.<x> is the policy's model.<x>; LoRA wraps a linear's weight as base_layer
        start_name = name if name.startswith("head.") else "model." + name.removeprefix("backbone.")
        start_name = start_name.replace(".base_layer", "")
        if start_name in start:
            names[name] = start_name
    return changed_fraction(start, critic, names)


def run_script(
    script: str, flags: list[str], out: Path, model_dir: Path, steps: int, args: Args, stop: Stop
) -> dict:
    """`script`'s main() in this process for `steps` steps; its metrics, timings, peak GPU memory, update proof."""
    import torch

    module = importlib.import_module(script)
    argv = [
        "--model_name_or_path",
        str(model_dir),
        "--output_dir",
        str(out),
        "--max_steps",
        str(steps),
        "--dtype",
        args.dtype,
        "--prompts_per_step",
        str(args.prompts_per_step),
        "--max_completion_length",
        str(args.max_completion_length),
        "--eval_steps",
        "0",
        "--eval_prompts",
        str(args.smoke_eval_prompts),
        "--eval_samples",
        "2",
        "--eval_train_prompts",
        "0",
        "--save_steps",
        "0",
        "--warmup_steps",
        "1",
        *(["--prompt_pool", str(args.prompt_pool)] if args.prompt_pool else []),
        "--overwrite_output_dir",
        *flags,
    ]  # a repeated smoke command replaces its own earlier runs
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    graphs, signals = _compiled_graphs(), len(GracefulStop.received)
    start = time.time()
    stop.in_run = True
    try:
        module.main(parse_args(module.Args, argv))
    except (
        KeyboardInterrupt
    ):  # a signal before the script took the signals over: nothing of its steps to save
        pass
    finally:
        stop.in_run = False
        if (
            torch.distributed.is_initialized()
        ):  # --fsdp made a world of one in this process: drop it
            torch.distributed.destroy_process_group()
    if (
        len(GracefulStop.received) > signals and stop.reason is None
    ):  # the script took it, saved and returned
        stop.reason = f"signal {GracefulStop.received[-1]}"
    wall = time.time() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    gc.collect()
    metrics = out / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in metrics.read_text().splitlines()][1:]
        if metrics.exists()
        else []
    )
    done = rows[-1]["step"] if rows else 0
    if not rows:
        return {"status": f"interrupted before step 1 ({stop.reason})", "wall_s": wall}
    gen_s, train_s, step_s = (
        sum(r[k] for r in rows) for k in ("time_gen_s", "time_train_s", "time_step_s")
    )
    result = {
        "status": "ok" if done == steps else f"stopped at step {done} of {steps} ({stop.reason})",
        "steps": done,
        "wall_s": wall,
        "fixed_s": wall - step_s,
        "step_s": step_s / len(rows),
        "gen_tokens_per_s": rows[-1]["gen_tokens"] / max(gen_s, 1e-9),
        "gen_s_per_step": gen_s / len(rows),
        "train_s_per_step": train_s / len(rows),
        "other_s_per_step": (step_s - gen_s - train_s) / len(rows),
        "peak_gpu_gib": peak,
        "reward_mean": sum(r["reward_mean"] for r in rows) / len(rows),
        "grad_norm_mean": sum(r["grad_norm"] for r in rows) / len(rows),
        "compiled_graphs": _compiled_graphs() - graphs,
    }
    if "time/other_s" in rows[0]:
        # the script's own step split (docs/metrics.md): its parts add up to time_step_s
        phases = ("gen", "logprob", "reward", "update", "eval", "other")
        split = {name: sum(r[f"time/{name}_s"] for r in rows) / len(rows) for name in phases}
        result["split_s_per_step"] = split
        result["other_s_per_step"] = split["other"]
        result["other_share"] = split["other"] / max(result["step_s"], 1e-9)
    if "ps_trained_groups" in rows[0]:
        result["groups_kept"] = int(sum(r["ps_trained_groups"] for r in rows))
    ckpt = out / f"checkpoint-{done}"
    if not (
        ckpt / "trainer_state.pt"
    ).exists():  # a second signal aborted the save: no update to measure
        result["status"] = (
            f"stopped at step {done} of {steps} ({stop.reason}; no checkpoint, update not measured)"
        )
        return result
    result["policy_changed_frac"] = policy_changed(model_dir, ckpt)
    if script == "pros_ppo":
        result["critic_changed_frac"] = critic_changed(model_dir, ckpt)
    result["checkpoint"] = str(ckpt)
    return result


def drop_checkpoint(result: dict, args: Args) -> None:
    """Delete a measured run's checkpoint unless --keep_checkpoints (a GPU machine's disk holds only a few)."""
    if not args.keep_checkpoints and result.get("checkpoint"):
        shutil.rmtree(result["checkpoint"], ignore_errors=True)


def _compiled_graphs() -> int:
    """Graphs torch.compile has built in this process so far (transformers compiles generate's decoding step)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"]["unique_graphs"])
