"""The tests marked `kernel_paths` once more under the other CPU kernel path.

A test whose outcome rests on the trajectory a run samples can pass on one kind of CPU and fail on
another: ATen picks its vector kernels by the CPU (AVX-512 on one machine, AVX2 on another), the
sums round differently, other tokens get sampled and the run takes another path. The suite runs
those tests natively; this runs them again, in a fresh process, with ATEN_CPU_CAPABILITY set to
another path (avx2 under AVX-512, else no vector kernels; the native path when the suite itself
runs under the variable), so that a test that holds on one path only fails here, on any machine."""

import os
import subprocess
import sys
import time

import torch
from conftest import ROOT, inductor_cache_dir

MARK = "@pytest.mark.kernel_paths"


def other_kernel_path() -> str | None:
    """The ATEN_CPU_CAPABILITY value of the other path (None: the native one)."""
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        return None
    native = torch.backends.cpu.get_cpu_capability().upper()
    return "avx2" if native.startswith("AVX512") else "default"


def marked_files() -> list[str]:
    here = ROOT / "tests"
    return sorted(
        str(path.relative_to(ROOT))
        for path in here.glob("test_*.py")
        if path.name != "test_kernel_paths.py" and MARK in path.read_text()
    )


def test_marked_tests_pass_on_the_other_kernel_path():
    files = marked_files()
    assert files, f"no test is marked {MARK}"
    other = other_kernel_path()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ATEN_CPU_"))}
    if other:
        env["ATEN_CPU_CAPABILITY"] = other
    env["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir(other)  # one kernel cache per path
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "kernel_paths", *files],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - start
    path = f"ATEN_CPU_CAPABILITY={other}" if other else "the native kernels"
    assert r.returncode == 0, (
        f"under {path} ({took:.0f} s):\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
    )
    assert " passed" in r.stdout and " skipped" not in r.stdout, r.stdout[-2000:]
