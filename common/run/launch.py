"""What a launch sets before any library starts: the CPU thread policy (before torch loads OpenMP)
and the `accelerate config` choices that these scripts map onto their own flags. No torch import
here."""

from __future__ import annotations

import os
import time

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


def resolve_accelerate_precision(
    args_dtype: str, environ=None, log=print, given: str | None = None
) -> str:
    """The `--dtype` to run with, named in one line with the source that set it: --dtype set
    explicitly (`given`: where), else `accelerate config`'s mixed precision
    (ACCELERATE_MIXED_PRECISION), else --dtype's default. accelerate's setting would make
    `accelerator.prepare` wrap the policy's forward in autocast, under the DDP path only, while the
    reference, the critic's copy and vLLM stay in --dtype: bf16 becomes `--dtype bfloat16` (our
    autocast, fp32 master weights, every path alike), fp16 / fp8 stop here; the variable is deleted
    so the Accelerator keeps full precision."""
    environ = os.environ if environ is None else environ
    mode = environ.pop("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    accelerate_set = mode not in ("", "no")
    if given:
        dtype, source = args_dtype, f"--dtype, set on {given}"
        if accelerate_set:
            source += f"; accelerate's ACCELERATE_MIXED_PRECISION={mode} is not applied"
    elif accelerate_set:
        if mode != "bf16":
            raise SystemExit(
                f"ACCELERATE_MIXED_PRECISION={mode} (from `accelerate config` or "
                "--mixed_precision) is not supported: relaunch with --mixed_precision no and pass "
                "--dtype bfloat16 for bf16 compute"
            )
        dtype = "bfloat16"
        source = (
            "accelerate's ACCELERATE_MIXED_PRECISION=bf16 (from `accelerate config` or "
            "--mixed_precision), as --dtype bfloat16: fp32 master weights"
        )
    else:
        dtype, source = args_dtype, "--dtype's default"
    if environ.get("RANK", "0") == "0":  # one line, not one per rank
        log(f"compute dtype {dtype} ({source})")
    return dtype


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


class CpuThreads:
    """The torch thread count of a run (docs/cpu_threads.md). `--num_threads N` > 0 fixes it at N,
    from the first line of main() on. With 0 (the default) it follows the cores the rest of the
    machine leaves free, measured at set-up and re-read before every step and evaluation from
    /proc/stat: cores - (busy cores not ours), at least 1. Why: OpenMP's threads wait for each other
    at every parallel region, so one more runnable thread than cores (an editor, a second run, a
    busy process) stalls every region on a descheduled thread: on 2 cores torch's default ran 3.5x
    slower beside one busy process and two runs side by side collapsed, while a thread count that
    fits the free cores keeps a run at one-core speed. Without /proc (not Linux) it keeps torch's
    default. `hold=True` (`--torch_compile`) keeps the first count it gives for the rest of the run:
    torch.compile's graphs are guarded on the thread count, so each change would compile every graph
    again (on a GPU machine, 16 cores measured 15 and then 16: three recompilations of 35-100 s
    each)."""

    def __init__(
        self,
        num_threads: int = 0,
        cores: int | None = None,
        proc: str = "/proc",
        hold: bool = False,
    ):
        self.fixed, self.cores, self.proc, self.hold = (
            num_threads,
            cores or os.cpu_count() or 1,
            proc,
            hold,
        )
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
