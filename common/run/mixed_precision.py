"""`accelerate config`'s mixed precision (ACCELERATE_MIXED_PRECISION) as the run's --dtype, when
--dtype is not set explicitly (common/run/launch.py); loaded only when the variable is set."""

from __future__ import annotations


def accelerate_dtype(mode: str) -> tuple[str, str]:
    """(--dtype, the source line) for accelerate's mixed precision `mode` (not "no"): bf16 becomes
    `--dtype bfloat16`; fp16 and fp8 stop here with one line."""
    if mode != "bf16":
        raise SystemExit(
            f"ACCELERATE_MIXED_PRECISION={mode} (from `accelerate config` or "
            "--mixed_precision) is not supported: relaunch with --mixed_precision no and pass "
            "--dtype bfloat16 for bf16 compute"
        )
    source = (
        "accelerate's ACCELERATE_MIXED_PRECISION=bf16 (from `accelerate config` or "
        "--mixed_precision), as --dtype bfloat16: fp32 master weights"
    )
    return "bfloat16", source
