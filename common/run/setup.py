"""A run's set-up, one call per piece, the same in every method script: the launch, the policy, the
frozen KL reference, the optimizer and its schedule, the wrapped model, the generator and the task.
The method's own pieces (a critic, an environment) stay in its file."""

from __future__ import annotations

import math
import os
import random

import numpy as np
import torch
from accelerate import Accelerator

from common.generation.hf import HFGenerator, end_token_ids, resolve_cache_implementation
from common.model.policy import load_policy
from common.run.flags import given_flags
from common.run.launch import CpuThreads, resolve_accelerate_precision
from common.run.logs import BarLine, check_tracker
from common.run.output_dir import claim_output_dir
from common.run.process import collective_timeout
from common.tasks.loading import hf_task
from common.tasks.task import Task


def start_run(args, script: str):
    """The launch: --reward `auto` resolved, accelerate's settings mapped onto --fsdp / --dtype (a
    flag the user set wins; its gradient accumulation refused), torch's CPU threads, the trackers
    checked, the Accelerator, per-rank seeds and the output folder claimed before any model loads.
    Returns (accelerator, cpu_threads, log); `log` prints on the main process."""
    if args.reward == "auto":  # a method with its own training reward has set it before this
        args.reward = "binary"
    given = given_flags(args)  # a flag the user set wins over accelerate's environment
    launched = any(name.startswith("ACCELERATE_") for name in os.environ)  # accelerate's settings
    if launched:
        from common.run.accelerate_env import (
            collapsed_launch,
            refuse_accelerate_accumulation,
            resolve_accelerate_sharding,
        )

        args.fsdp = resolve_accelerate_sharding(args.fsdp, given=given.get("fsdp"))
    args.dtype = resolve_accelerate_precision(args.dtype, given=given.get("dtype"))
    if launched:
        refuse_accelerate_accumulation()
    cpu_threads = CpuThreads(args.num_threads, hold=args.torch_compile)  # or the free cores
    torch.set_num_threads(cpu_threads.count(torch.get_num_threads(), settle=0.2))
    trackers = check_tracker(args.report_to)
    args.output_dir = args.output_dir or f"runs/{script}-seed{args.seed}"
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        project_dir=args.output_dir,
        log_with=trackers,
        kwargs_handlers=collective_timeout(args.collective_timeout),  # one line on expiry
    )
    log = main_process_log(accelerator)
    seed_everything(args.seed + accelerator.process_index)  # ranks sample different rollouts
    claim_output_dir(args, accelerator, log)  # refuses a used or unshared folder
    log(launch_line(accelerator.num_processes, args.fsdp, accelerator.device.type))
    collapsed = collapsed_launch() if launched and accelerator.num_processes == 1 else None
    if collapsed:
        log(collapsed)
    return accelerator, cpu_threads, log


def launch_line(processes: int, fsdp: bool, device: str) -> str:
    """The run's line on its processes and how they share the training."""
    if processes == 1:
        return f"processes: 1 on {device} (neither DDP nor FSDP)"
    how = (
        "FSDP (--fsdp): weights, gradients and optimizer state sharded over them"
        if fsdp
        else "DDP: each holds the whole model, gradients averaged over them"
    )
    return f"processes: {processes} on {device}, {how}"


def main_process_log(accelerator):
    """print, on the main process only (a line once a run, not once a rank)."""

    def log(message: str) -> None:
        if accelerator.is_main_process:
            BarLine.end_line()  # not glued to the progress bar's line
            print(message, flush=True)

    return log


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_training_policy(args, accelerator, log, model_path: str | None = None):
    """The policy in fp32 master weights (--dtype is the compute dtype, under autocast), in training
    mode, with gradient checkpointing and LoRA as the flags ask. `embedded`: rank 0 builds (or
    copies) the tiny Countdown model once and the others find it cached. `model_path`: the weights
    to start from instead of --model_name_or_path (a script's own starting point, e.g. ps_grpo.py's
    multi-turn warm-up). Returns (policy, tokenizer, model_path)."""
    model_path = model_path or args.model_name_or_path
    if model_path == "embedded":
        from common.demo.tiny_model import ensure_embedded_base

        with accelerator.main_process_first():
            model_path = str(ensure_embedded_base(log=log))
    policy, tokenizer = load_policy(model_path)
    # from_pretrained returns eval mode (checkpointing needs train)
    policy.to(accelerator.device).train()
    if args.gradient_checkpointing:  # training passes only; generate runs in eval mode
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # only the adapters train (fp32); the frozen base is stored in the compute dtype
    if args.lora_r:
        from common.model.lora import add_lora

        policy = add_lora(
            policy, args.lora_r, args.lora_alpha, args.lora_target_modules, args.dtype
        )
    return policy, tokenizer, model_path


def make_reference(policy, args):
    """The KL reference: the initial weights, frozen, computing as the policy did at step 0 (under
    LoRA: the same model with the adapters off); None when --beta is 0."""
    if args.beta <= 0:
        return None
    if args.lora_r:
        from common.model.lora import AdaptersOff

        return AdaptersOff(policy)
    from common.model.reference import frozen_reference

    return frozen_reference(policy, args.dtype, args.fsdp)


def shard_models(args, *models):
    """--fsdp: FSDP2 over the processes, each rank keeping 1/world of every weight
    (common/distributed/fsdp.py); without it, the models unchanged. A None stays None."""
    if not args.fsdp:
        return models
    from common.distributed.fsdp import shard

    return tuple(None if model is None else shard(model, args.dtype) for model in models)


def make_optimizer(policy, args):
    """AdamW over the trainable parameters, and its learning-rate schedule (`make_scheduler`)."""
    trainable = [param for param in policy.parameters() if param.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate, weight_decay=args.weight_decay)
    return optimizer, make_scheduler(optimizer, args)


def make_scheduler(optimizer, args):
    """--lr_scheduler_type over --max_steps updates, warming up over --warmup_steps (or
    --warmup_ratio of --max_steps): `warmup_constant` ramps up linearly, its first update already
    at 1/warm-up of the rate, then holds it; any other name is transformers' `get_scheduler`. Each
    is a LambdaLR of the update count, rebuilt from the flags: a checkpoint's scheduler state (the
    count) continues it exactly."""
    warmup = args.warmup_steps
    if args.warmup_ratio > 0:
        warmup = math.ceil(args.warmup_ratio * args.max_steps)
    if args.lr_scheduler_type != "warmup_constant":
        from common.run.schedulers import transformers_scheduler

        return transformers_scheduler(optimizer, args, warmup)
    ramp = max(1, warmup)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / ramp))


def prepare_training(accelerator, model, optimizer, fsdp: bool):
    """(model, optimizer) for the backward pass: DDP-wrapped by accelerate, or, under FSDP, the
    sharded model as its own wrapper with the optimizer prepared alone."""
    if fsdp:
        return model, accelerator.prepare(optimizer)
    return accelerator.prepare(model, optimizer)


def make_compiled(args, log):
    """--torch_compile: the decoding step and the packed training forward compiled
    (common/generation/compile.py); None otherwise."""
    if not args.torch_compile:
        return None
    from common.generation.compile import TorchCompile

    return TorchCompile(log=log)


def make_generator(args, model_path: str, policy, tokenizer, accelerator, compiled, log):
    """HF generate on the policy, or a colocated vLLM engine (--use_vllm), ending completions at
    every stop token (EOS, the model's end-of-turn ids, --stop_token_ids), which the run's first
    lines name."""
    if args.use_vllm:
        from common.generation.vllm_backend import vllm_generator

        generator = vllm_generator(args, model_path, policy, tokenizer, accelerator)
    else:
        device_type = next(policy.parameters()).device.type
        cache, line = resolve_cache_implementation(
            args.cache_implementation, device_type, policy, fsdp=getattr(args, "fsdp", False)
        )
        if compiled is not None:  # --torch_compile decodes on a static cache of its own
            cache, line = None, "KV cache: static (--torch_compile's own)"
        log(line)
        generator = HFGenerator(
            policy,
            tokenizer,
            batch_size=args.gen_batch_size,
            dtype=args.dtype,
            cache_implementation=cache,
            compiled=compiled,
        )
    generator.end_ids = end_token_ids(tokenizer, policy, args.stop_token_ids, log)
    return generator


def packed_row_tokens(args, device) -> int:
    """Row length of the packed training layout (--padding_free), 0 when off: 128 tokens on a CPU,
    2048 on a GPU unless --pack_row_tokens says."""
    if not args.padding_free:
        return 0
    return args.pack_row_tokens or (2048 if device.type == "cuda" else 128)


def sampling_configs(args, logprobs: bool = True):
    """(training, evaluation) sampling: rollouts at --temperature with their log-probs
    (`logprobs` False: without, for a script that does not read them); the evaluation at
    --eval_temperature (default: --temperature; 0: greedy) without."""
    from common.generation.hf import SamplingConfig

    eval_temperature = args.temperature if args.eval_temperature is None else args.eval_temperature
    sampling = SamplingConfig(
        max_new_tokens=args.max_completion_length, temperature=args.temperature, logprobs=logprobs
    )
    eval_sampling = SamplingConfig(
        max_new_tokens=args.max_completion_length, temperature=eval_temperature, logprobs=False
    )
    return sampling, eval_sampling


def make_task(args, tokenizer, log=print, positive_threshold: float | None = None) -> Task:
    """The run's task: the embedded Countdown task or a real dataset; with --reward_funcs /
    --eval_reward_funcs their functions (common/tasks/rewards.py, imported only then) score it
    instead of the built-in rewards. `positive_threshold` (a script whose success rule is a reward
    above a threshold): without --success_reward, a success is a reward above it."""
    if args.dataset_name == "countdown":  # the embedded demo task, imported only here
        from common.demo.countdown import countdown_task

        task = countdown_task(
            "binary" if args.reward == "auto" else args.reward, args.eval_prompts, args.prompt_pool
        )
    else:
        task = hf_task(args, tokenizer, log)
    task.success_reward = 1.0 if args.success_reward is None else args.success_reward
    if args.success_reward is None and positive_threshold is not None:
        # reward > the threshold (>= the next float up), training and evaluation
        task.success_reward = math.nextafter(positive_threshold, math.inf)
    task.warn, task.max_new_tokens = log, args.max_completion_length
    task.mask_truncated = bool(getattr(args, "mask_truncated_completions", False))
    if args.reward_funcs or args.eval_reward_funcs:
        from common.tasks.rewards import add_reward_funcs

        add_reward_funcs(task, args, log)
    return task
