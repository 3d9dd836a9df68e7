"""benchmarks/gpu/smoke.py starts on the lent GPU image, which has torch, transformers, accelerate and peft but not
vllm, datasets, math-verify or latex2sympy2_extended: run here with those four made unimportable."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

ABSENT = ("vllm", "datasets", "math_verify", "latex2sympy2_extended")
# Wraps every finder on sys.meta_path so that it finds none of ABSENT, exactly as if they were not installed:
# `import x` raises ModuleNotFoundError and importlib.util.find_spec("x") is None (what availability checks ask).
HIDE = f"""import sys

ABSENT = {ABSENT!r}


class Hidden:
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT or not hasattr(self.inner, "find_spec"):
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [Hidden(finder) for finder in sys.meta_path]
"""
PROBE = f"""import importlib, importlib.util
for name in {ABSENT!r}:
    assert importlib.util.find_spec(name) is None, name
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        continue
    raise SystemExit(name + " imported")
import accelerate, peft, transformers  # what the image does have
print("hidden")
"""
SCRIPTS = "ra_rloo,ada_seq,ada_est,ps_grpo,pros_ppo"


def _image_env(tmp_path) -> dict:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return dict(
        os.environ,
        PYTHONPATH=path,
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
        RLVR_CACHE=str(tmp_path / "cache"),
    )


SMALL = [
    "--size",
    "tiny",
    "--steps",
    "2",
    "--dtype",
    "float32",
    "--prompts_per_step",
    "4",
    "--max_completion_length",
    "24",
    "--budget_s",
    "1200",
    "--learning_max_steps",
    "2",
    "--learning_eval_prompts",
    "16",
    "--learning_eval_samples",
    "2",
    "--speed_steps",
    "2",
    "--speed_runs",
    "dynamic,static",
    "--learning_methods",
    "ra_rloo",  # the other pairs' flags are checked in tests/test_gpu_smoke.py
    "--smoke_eval_prompts",
    "4",
    "--prompt_pool",
    "256",
]


def _smoke(env: dict, out, parts: str, scripts: str) -> dict:
    r = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu/smoke.py",
            *SMALL,
            "--parts",
            parts,
            "--scripts",
            scripts,
            "--output_dir",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "No module named" not in r.stdout + r.stderr
    report = json.loads((out / "smoke.json").read_text())
    runs = report["runs"]
    # gpu_smoke catches each run's exception and goes on, so exit 0 alone would not show a failure
    assert all(x["status"] == "ok" and x["steps"] == 2 for x in runs), [x["status"] for x in runs]
    assert all(x["policy_changed_frac"] > 0 for x in runs)
    assert all(x["reward_mean"] > 0 for x in runs)  # the warm start: successes as well as failures
    assert report["verdict"] == f"policy updated in {len(runs)} of {len(runs)} runs"
    assert (
        f"**policy updated in {len(runs)} of {len(runs)} runs**" in (out / "smoke.md").read_text()
    )
    assert report["stopped"] is None
    assert not list(
        out.glob("*/checkpoint-*")
    )  # measured, then deleted (a GPU machine's disk holds only a few)
    return report


def test_gpu_smoke_every_part_on_the_image_without_vllm_datasets_or_math_verify(tmp_path):
    """The GPU command at CPU size, as the GPU image would run it: every script's plain run, and every other part
    (--fsdp, gradient checkpointing, LoRA, learning, speed) with ra_rloo.py, update the policy (the verdict says N of
    N), the learning and speed parts report, and the TRL peer, which needs datasets, is skipped with its line. The
    variants of the other scripts are tested in the main environment (tests/test_fsdp.py, tests/test_lora.py,
    tests/test_gradient_checkpointing.py): what the image changes is which packages import."""
    env = _image_env(tmp_path)
    probe = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0 and "hidden" in probe.stdout, probe.stderr[
        -2000:
    ]  # the four really are gone
    plain = _smoke(env, tmp_path / "plain", "plain", SCRIPTS)
    assert [(x["script"], x["variant"]) for x in plain["runs"]] == [
        (s, "plain") for s in SCRIPTS.split(",")
    ]
    pros = [x for x in plain["runs"] if x["script"] == "pros_ppo"]
    assert all(x["critic_changed_frac"] > 0 for x in pros)  # PPO's critic trains too
    assert all(x["groups_kept"] > 0 for x in plain["runs"] if x["script"] == "ps_grpo")

    # the second command starts from the first one's warm-start folder (its pass rate measured once, as
    # a repeated command on the GPU machine finds it)
    shutil.copytree(tmp_path / "plain" / "model-tiny-warm", tmp_path / "parts" / "model-tiny-warm")
    report = _smoke(env, tmp_path / "parts", "fsdp,gc_lora,learning,speed,peer", "ra_rloo")
    assert report["warm_start"] == plain["warm_start"]
    assert [x["variant"] for x in report["runs"]] == ["fsdp", "gradient_checkpointing", "lora"]
    learning = report["learning"]
    (pair,) = learning["methods"]
    for arm in ("method", "baseline"):
        assert pair[arm]["steps"] == 2 and 0 <= pair[arm]["end"]["pass@1"] <= 1
        assert pair[arm]["policy_changed_frac"] > 0
    assert (
        learning["start"]["ci95"] > 0
        and (tmp_path / "parts" / "learning.png").stat().st_size > 10_000
    )
    assert [(x["cache_implementation"], x["status"]) for x in report["speed"]] == [
        ("dynamic", "ok"),
        ("static", "ok"),
    ]
    assert report["peer"]["status"].startswith("skipped: trl (or datasets) does not import")


def _wheel(folder, name: str, code: str):
    """A one-module pure-Python wheel `name`-0.1 (offline: written as the zip a wheel is)."""
    import zipfile

    dist = f"{name}-0.1.dist-info"
    files = {
        f"{name}/__init__.py": code,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    path = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


PEER_INSTALL = """import json, os, subprocess, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from benchmarks.gpu.peer import peer_python
python, how, env = peer_python(Path(sys.argv[2]), Path(sys.argv[3]), ("peerprobe",))
assert python is not None, how
r = subprocess.run([python, "-c", "import peerprobe, safetensors; print(peerprobe.__file__); print(safetensors.__file__)"],
                   env={**os.environ, **env}, capture_output=True, text=True)
print(json.dumps({"python": python, "how": how, "rc": r.returncode, "out": r.stdout.split(), "err": r.stderr}))
"""


def test_peer_wheels_install_in_a_venv_made_from_a_venv(tmp_path):
    """The peer part's install path on an interpreter like the GPU image's `python3`: a venv whose own site-packages
    hold the stack (torch, safetensors, ...). A venv made over it with --system-site-packages sees the base
    interpreter's packages, not those (what stopped the peer on the image); the wheels go to a --target folder on
    PYTHONPATH instead, only those of distributions the interpreter lacks (a wheel named safetensors is left out,
    not shadowing the real one). safetensors stands for torch here: as absent from the base, cheaper to import."""
    import sysconfig

    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(image)], check=True)
    python = str(image / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # this environment's packages (torch, pip) in the image venv's own site-packages, as on the image
    (Path(site) / "image.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    assert subprocess.run([python, "-c", "import safetensors"], env=env).returncode == 0
    over = tmp_path / "over"
    subprocess.run([python, "-m", "venv", "--without-pip", "--system-site-packages", str(over)])
    seen = subprocess.run(
        [str(over / "bin" / "python"), "-c", "import safetensors"], env=env, capture_output=True
    )
    assert seen.returncode != 0  # the trap: a venv over a venv does not see the image's packages

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "peerprobe", "import safetensors  # needs the image's packages beside it\n")
    _wheel(
        wheels, "safetensors", "raise ImportError('the wheel of a distribution the image has')\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run(
        [python, "-c", PEER_INSTALL, str(ROOT), str(out), str(wheels)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["python"] == python and result["rc"] == 0, result
    probe, image_file = result["out"]
    assert probe.startswith(str(out / "peer-site")) and "peer-site" not in image_file
    assert "from 1 of the 2 wheels" in result["how"]
    assert not (out / "peer-site" / "safetensors").exists()
