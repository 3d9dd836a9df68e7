"""`accelerate launch` / `accelerate config` choices that these scripts map onto their own flags or
refuse, read from the ACCELERATE_* variables the launcher exports (loaded only when one is set;
its mixed precision: common/run/launch.py). No torch import here."""

from __future__ import annotations

import os

# Read as true: the values transformers' strtobool accepts, which is how it reads
# ACCELERATE_USE_FSDP (5.19 distributed/fsdp.py:42-48: with FSDP_CPU_RAM_EFFICIENT_LOADING, real
# weights on rank 0 only), as does accelerate's str_to_bool (1.15 utils/environment.py:59-71).
# accelerate's Accelerator itself only takes the literal "true" (accelerator.py:348, 382-393), which
# its launcher writes (utils/launch.py:305, 566); the wider set maps and removes every value that
# one of them would act on.
TRUE = ("1", "true", "t", "yes", "y", "on")


def accelerate_sharding(environ) -> str | None:
    """The sharding `accelerate launch` exported (from `accelerate config` or its flags):
    "deepspeed", "fsdp" or None (ACCELERATE_USE_DEEPSPEED / ACCELERATE_USE_FSDP set to one of
    `TRUE`, any case; DeepSpeed wins)."""
    for kind in ("deepspeed", "fsdp"):
        if environ.get(f"ACCELERATE_USE_{kind.upper()}", "").strip().lower() in TRUE:
            return kind
    return None


# Open MPI's and MPICH's rank variables: accelerate's `--mpirun_hostfile` launch starts its
# processes through mpirun, which sets these instead of WORLD_SIZE
MPI_WORLD = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def collapsed_launch(environ=None) -> str | None:
    """The line for an `accelerate launch --num_processes N` (N > 1) that started one process, else
    None. Without --multi_gpu (or a multi-GPU `accelerate config`) on a machine with no GPU,
    accelerate's simple launcher starts the script once: it exports the rendezvous address for the
    processes it was asked for (MASTER_ADDR / MASTER_PORT, 1.15 utils/launch.py) but no WORLD_SIZE,
    which a launch of several processes (torchrun, accelerate's multi-GPU launcher) always sets."""
    environ = os.environ if environ is None else environ
    by_accelerate = "ACCELERATE_DYNAMO_BACKEND" in environ  # set by every accelerate launch
    several = "MASTER_PORT" in environ and "WORLD_SIZE" not in environ
    if not (by_accelerate and several) or any(name in environ for name in MPI_WORLD):
        return None
    return (
        "accelerate launch started 1 process, not the --num_processes asked for: add --multi_gpu "
        "(`accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no "
        "--dynamo_backend no <script> ...`, on CPU too; docs/scaling.md)"
    )


def resolve_accelerate_sharding(
    args_fsdp: bool, environ=None, log=print, given: str | None = None
) -> bool:
    """The `--fsdp` value to run with; call it first in main(), before the Accelerator and any model
    exist. accelerate's FSDP (version 1 or 2) becomes our `--fsdp` (FSDP2,
    common/distributed/fsdp.py), unless --fsdp was set explicitly (`given`: where, as
    common/run/flags.py `given_flags` says), which wins; either way ACCELERATE_USE_FSDP is deleted
    from `environ` (default os.environ): Accelerator() would build its FSDP plugin from it and wrap
    the policy a second way, its clip_grad_norm_ re-reads it, and transformers' from_pretrained with
    it (and FSDP_CPU_RAM_EFFICIENT_LOADING) loads real weights on rank 0 only. The other FSDP_*
    settings are inert without it. DeepSpeed stops here with SystemExit: generation, the weight push
    and checkpoints are written for DDP or our FSDP2."""
    environ = os.environ if environ is None else environ
    kind = accelerate_sharding(environ)
    if kind == "deepspeed":
        raise SystemExit(
            "ACCELERATE_USE_DEEPSPEED is set (DeepSpeed, from `accelerate config` or "
            "--use_deepspeed), "
            "which these scripts do not support: relaunch without DeepSpeed (`accelerate launch "
            "--multi_gpu ...`, or re-run `accelerate config` choosing multi-GPU) and pass --fsdp "
            "to shard"
        )
    if kind != "fsdp":
        return args_fsdp
    del environ["ACCELERATE_USE_FSDP"]
    if environ.get("RANK", "0") != "0":  # one line, not one per rank (no Accelerator to ask yet)
        return args_fsdp if given else True
    if given:
        log(
            f"--fsdp {args_fsdp} (set on {given}) wins over accelerate's ACCELERATE_USE_FSDP; "
            "accelerate's FSDP_* options are ignored"
        )
        return args_fsdp
    log(
        f"ACCELERATE_USE_FSDP is set (FSDP_VERSION={environ.get('FSDP_VERSION', '1')}, from "
        "`accelerate config` or "
        "--use_fsdp): mapped onto this script's --fsdp (FSDP2); accelerate's FSDP_* options "
        "are ignored"
    )
    return True


def refuse_accelerate_accumulation(environ=None) -> None:
    """accelerate's gradient accumulation (ACCELERATE_GRADIENT_ACCUMULATION_STEPS, from the
    environment or `accelerate launch --gradient_accumulation_steps`) makes `accelerator.backward`
    divide every loss by it: each gradient, its norm and the clipping change and nothing else. Every
    step here already accumulates the gradient of its whole batch over micro-batches, so a value
    other than 1 stops with one line; 1 does nothing."""
    environ = os.environ if environ is None else environ
    value = environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1").strip()
    if value in ("", "1"):
        return
    raise SystemExit(
        f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={value} (from the environment or `accelerate "
        "launch --gradient_accumulation_steps`) would divide every loss by it; each step here "
        "already accumulates its whole batch's gradient over micro-batches (--prompts_per_step "
        "sets the batch, --micro_batch_size or --max_tokens_per_microbatch the memory): unset it"
    )
