import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> str:
    """A briefly SFT-ed embedded base policy (30 steps): enough structure for mechanics tests."""
    from common.tiny_model import BaseRecipe, ensure_embedded_base

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("RLVR_CACHE")
    os.environ["RLVR_CACHE"] = str(cache)
    try:
        path = ensure_embedded_base(BaseRecipe(sft_steps=30), log=lambda *_: None, eval_prompts=16)
    finally:
        if old is None:
            os.environ.pop("RLVR_CACHE")
        else:
            os.environ["RLVR_CACHE"] = old
    return str(path)


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory) -> str:
    """An untrained tiny Llama + char tokenizer saved as an HF dir."""
    from common.tiny_model import BaseRecipe, build_char_tokenizer, build_tiny_model

    d = tmp_path_factory.mktemp("random_model")
    tok = build_char_tokenizer()
    build_tiny_model(BaseRecipe(), len(tok)).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def run_script(args: list[str], timeout: int = 600, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env_extra or {}))
    r = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return r
