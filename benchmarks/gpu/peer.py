"""The peer part: benchmarks/speed/trl_peer.py (TRL's GRPOTrainer against ours) on the spell's model, with a
Python that imports trl (this one, or a venv with TRL's wheels from `.whl/`)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu.budget import ROOT, WHEELS, Args, Stop


def peer_python(out: Path) -> tuple[str | None, str]:
    """A Python that imports trl: this one, or a venv over this one's packages with TRL's wheels from `.whl/`."""
    if (
        importlib.util.find_spec("trl") is not None
        and importlib.util.find_spec("datasets") is not None
    ):
        return sys.executable, "trl imports here"  # (trl imports datasets at once)
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    if not wheels:
        return None, (
            f"skipped: trl (or datasets) does not import and {WHEELS} holds no wheels (docs/scaling.md "
            "lists them, with the pip download line)"
        )
    venv = out / "peer-venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    done = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(WHEELS), "trl"],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        return (
            None,
            f"skipped: installing trl from {WHEELS} failed: {done.stderr.strip().splitlines()[-1:]}",
        )
    return python, f"trl installed from {len(wheels)} wheels in {WHEELS}"


def run_peer(model_dir: Path, out: Path, args: Args, stop: Stop, timeout_s: float) -> dict:
    python, how = peer_python(out)
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
    proc = subprocess.Popen(cmd, cwd=ROOT)
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
        "trl": result["trl"],
        "ours": result["ours"],
        "check_agree": result["check"]["agree"],
        "versions": result["versions"],
    }
