"""benchmarks/gpu/smoke.py starts on the lent GPU image, which has torch, transformers, accelerate and peft but not
vllm, datasets, math-verify or latex2sympy2_extended: run here with those four made unimportable."""

import json
import os
import subprocess
import sys

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
    "default,static",
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

    report = _smoke(env, tmp_path / "parts", "fsdp,gc_lora,learning,speed,peer", "ra_rloo")
    assert [x["variant"] for x in report["runs"]] == ["fsdp", "gradient_checkpointing", "lora"]
    learning = report["learning"]
    for arm in ("method", "baseline"):
        assert learning[arm]["steps"] == 2 and 0 <= learning[arm]["end"]["pass@1"] <= 1
        assert learning[arm]["policy_changed_frac"] > 0
    assert (
        learning["start"]["ci95"] > 0
        and (tmp_path / "parts" / "learning.png").stat().st_size > 10_000
    )
    assert [(x["cache_implementation"], x["status"]) for x in report["speed"]] == [
        ("default", "ok"),
        ("static", "ok"),
    ]
    assert report["peer"]["status"].startswith("skipped: trl (or datasets) does not import")
