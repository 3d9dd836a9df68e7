"""The peer part: benchmarks/speed/trl_peer.py (TRL's GRPOTrainer against ours, at TRL's default cache and at ours)
on the spell's model, with this Python, and TRL's wheels from `.whl/` on PYTHONPATH where it lacks them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu.budget import ROOT, WHEELS, Args, Stop


def missing_wheels(wheels: list[Path]) -> list[Path]:
    """The wheels of the distributions this Python lacks, one per name (the newest file name last wins): a wheel of
    one it has (torch, transformers, ...) would shadow the image's own copy from PYTHONPATH."""
    from importlib.metadata import PackageNotFoundError, version

    keep = {}
    for wheel in wheels:
        name = wheel.name.split("-")[0]
        try:
            version(name)
        except PackageNotFoundError:
            keep[name.lower().replace("-", "_")] = wheel
    return list(keep.values())


def peer_python(
    out: Path, wheels_dir: Path = WHEELS, needed: tuple[str, ...] = ("trl", "datasets")
) -> tuple[str | None, str, dict]:
    """(python, how, environment) that imports `needed` (trl imports datasets at once): this Python as it is, or
    this Python with the missing wheels of `wheels_dir` installed into `out/peer-site` (`pip install --no-index
    --no-deps --target`) and put on PYTHONPATH. Not a virtual environment over this one: on the GPU image `python3`
    is itself a venv, and a venv made from it sees the base interpreter's packages, without torch."""
    if all(importlib.util.find_spec(name) is not None for name in needed):
        return sys.executable, f"{', '.join(needed)} import here", {}
    wheels = sorted(wheels_dir.glob("*.whl")) if wheels_dir.is_dir() else []
    if not wheels:
        also = f" (or {', '.join(needed[1:])})" if needed[1:] else ""
        return (
            None,
            f"skipped: {needed[0]}{also} does not import and {wheels_dir} holds no wheels "
            "(docs/scaling.md lists them, with the pip download line)",
            {},
        )
    site = out / "peer-site"
    todo = missing_wheels(wheels)
    done = subprocess.run(
        [
            sys.executable,
            *("-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"),
            *("--no-cache-dir", "--target", str(site), *map(str, todo)),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return (
            None,
            f"skipped: installing {len(todo)} wheels from {wheels_dir} into {site} failed: "
            f"{(done.stderr.strip().splitlines() or [''])[-1]}",
            {},
        )
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    probe = subprocess.run(
        [sys.executable, "-c", "import " + ", ".join(needed)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return (
            None,
            f"skipped: {', '.join(needed)} installed from {wheels_dir} but does not import: "
            f"{(probe.stderr.strip().splitlines() or [''])[-1]}",
            {},
        )
    return (
        sys.executable,
        f"{', '.join(needed)} from {len(todo)} of the {len(wheels)} wheels in {wheels_dir} (--target {site}, "
        "on PYTHONPATH)",
        env,
    )


def run_peer(model_dir: Path, out: Path, args: Args, stop: Stop, timeout_s: float) -> dict:
    python, how, env = peer_python(out)
    if python is None:
        return {"status": how}
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cmd = [
        python,
        "benchmarks/speed/trl_peer.py",
        "--device",
        device,
        "--model_name_or_path",
        str(model_dir),
        "--dtype",
        args.dtype,
        "--steps",
        "5",
        "--repeats",
        "1",
        "--prompts_per_step",
        str(args.prompts_per_step),
        "--max_completion_length",
        str(args.max_completion_length),
        "--micro_batch_size",
        str(args.prompts_per_step * 4),
        "--out",
        str(out / "trl_peer.md"),
        "--json",
        str(out / "trl_peer.json"),
    ]
    print("peer:", how, "\n  " + " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env})
    stop.in_run = True
    try:
        proc.wait(timeout=max(1.0, timeout_s))
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        proc.terminate()
        proc.wait()
        return {"status": f"stopped ({stop.reason or 'budget'})", "command": cmd}
    finally:
        stop.in_run = False
    if proc.returncode != 0 or not (out / "trl_peer.json").exists():
        return {"status": f"error: trl_peer.py exited {proc.returncode}", "command": cmd}
    result = json.loads((out / "trl_peer.json").read_text())
    return {
        "status": "ok",
        "how": how,
        "command": cmd,
        "ratio": result["ratio"],
        # against TRL with ours' KV cache (absent: a trl_peer.py without that comparison)
        "ratio_same_cache": result.get("ratio_same_cache"),
        "cache": result.get("cache"),
        "trl": result["trl"],
        "ours": result["ours"],
        "check_agree": result["check"]["agree"],
        "versions": result["versions"],
    }
