"""benchmarks/gpu_smoke.py starts on the lent GPU image, which has torch, transformers, accelerate and peft but not
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
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                CUDA_VISIBLE_DEVICES="")


def test_gpu_smoke_runs_without_vllm_datasets_or_math_verify(tmp_path):
    env = _image_env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode == 0 and "hidden" in probe.stdout, probe.stderr[-2000:]  # the four really are gone
    out = tmp_path / "smoke"
    # every script once (their module-level imports) in the plain variant, ra_rloo also with LoRA (peft: on the
    # image); --fsdp imports nothing more (tests/test_benchmarks.py runs gpu_smoke's fsdp variant)
    runs = [(SCRIPTS, "plain"), ("ra_rloo", "lora")]
    for scripts, variants in runs:
        r = subprocess.run([sys.executable, "benchmarks/gpu_smoke.py", "--size", "tiny", "--steps", "1", "--scripts",
                            scripts, "--variants", variants, "--prompts_per_step", "2", "--max_new_tokens", "8",
                            "--output_dir", str(out / variants)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
        results = json.loads((out / variants / "smoke.json").read_text())["results"]
        # gpu_smoke catches each run's exception and goes on, so exit 0 alone would not show an import failure
        assert [(x["script"], x["variant"]) for x in results] == \
            [(s, v) for s in scripts.split(",") for v in variants.split(",")]
        assert all(x["status"] == "ok" and x["steps"] == 1 for x in results), [x["status"] for x in results]
        assert "No module named" not in r.stdout + r.stderr
