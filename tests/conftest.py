import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# inductor's on-disk kernel cache does not key on ATEN_CPU_CAPABILITY: kernels built while the suite ran as on another
# CPU (docs/development.md) were reused by a native run and gave wrong tokens and a corrupted heap. One cache per
# capability, unless the caller chose a folder.
def inductor_cache_dir(capability: str | None) -> str:
    """The suite's inductor kernel cache for an ATEN_CPU_CAPABILITY value (None: native kernels)."""
    import tempfile

    return os.path.join(
        tempfile.gettempdir(), f"torchinductor-{os.getuid()}-{capability or 'native'}"
    )


if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir(
        os.environ.get("ATEN_CPU_CAPABILITY")
    )


# Two code paths of the same forward (another summation order, layout, kernel or vector width) give one float32
# per-token log-prob or entropy to a few roundings of reductions over ~100 terms: far below this bound. A wrong mask,
# position or weight moves one by 0.01-1.
TOKEN_LOGP_TOL = 2e-5
MAX_ABS_ADVANTAGE = 5.0  # RA-RLOO's default w_max times |A| <= 1; GRPO's std-scaled advantages stay below it (k <= 16)


def loss_tolerance(row: dict) -> float:
    """Absolute tolerance of a metrics row's policy `loss` compared across two code paths. Its advantages sum to about
    zero within each group, so it is a difference of nearly cancelling terms and its relative error is many times the
    log-probs' (1.8e-4 measured between two CPUs); its absolute error is at most the per-token one times a
    completion's tokens times the largest |advantage|."""
    return TOKEN_LOGP_TOL * row["completion_len_mean"] * MAX_ABS_ADVANTAGE


@contextmanager
def _cache(path: Path):
    """RLVR_CACHE pointed at `path` while a fixture builds or restores into it."""
    old = os.environ.get("RLVR_CACHE")
    os.environ["RLVR_CACHE"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("RLVR_CACHE")
        else:
            os.environ["RLVR_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> str:
    """The embedded base policy every default run starts from, copied from assets/ (no SFT: a copy of 3.9 MB), so the
    mechanics tests see the real testbed's skewed pass rates and its short, EOS-terminated answers."""
    from common.demo.tiny_model import BaseRecipe, restore_shipped

    path = tmp_path_factory.mktemp("cache") / f"countdown-base-{BaseRecipe().key()}"
    no_shipped = os.environ.pop(
        "RLVR_NO_SHIPPED", None
    )  # that switch is for runs; the tests need the copy
    try:
        if not restore_shipped(
            path, log=lambda *_: None
        ):  # building it instead would take ~17 minutes
            pytest.fail(
                f"assets/ holds no valid build named {path.name}: rebuild it (docs/development.md)"
            )
    finally:
        if no_shipped is not None:
            os.environ["RLVR_NO_SHIPPED"] = no_shipped
    return str(path)


@pytest.fixture(scope="session")
def built_base(tmp_path_factory) -> str:
    """A base built from a 2-step recipe (the build path itself: SFT, measurement, build_info.json)."""
    import torch

    from common.demo.tiny_model import BaseRecipe, ensure_embedded_base

    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # its measurement is small generate calls: 2.5x faster at 1 thread on a busy 2-core box
    try:
        with _cache(tmp_path_factory.mktemp("build")):
            return str(
                ensure_embedded_base(BaseRecipe(sft_steps=2), log=lambda *_: None, eval_prompts=16)
            )
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory) -> str:
    """An untrained tiny Llama + char tokenizer saved as an HF dir."""
    from common.demo.tiny_model import BaseRecipe, build_char_tokenizer, build_tiny_model

    d = tmp_path_factory.mktemp("random_model")
    tok = build_char_tokenizer()
    build_tiny_model(BaseRecipe(), len(tok)).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def run_script(
    args: list[str], timeout: int = 600, env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **(env_extra or {}))
    r = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )
    if r.returncode != 0:
        raise AssertionError(
            f"{args} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
        )
    return r


def run_main(args: list[str]) -> None:
    """`args` (a script's file name, then its flags) run in this process: its main() called directly, without the
    ~5 s of imports a fresh interpreter pays (for tests that run a script several times, e.g. run, cut, resume)."""
    import importlib

    from common.run.flags import parse_args

    module = importlib.import_module(Path(args[0]).stem)
    module.main(parse_args(module.Args, args[1:]))


# One short real run per script, shared by the tests that read its outputs (core metrics, docs): flags that keep it
# to seconds; --max_completion_length 16 cuts some Countdown answers (two lines of ~7 characters + EOS) and not others;
# binary rewards everywhere (ra_rloo.py's default is the paper's {0, 0.1, 1}), so pass rate and reward mean agree.
SHORT_RUN = [
    "--max_steps",
    "3",
    "--eval_steps",
    "0",
    "--eval_prompts",
    "4",
    "--eval_samples",
    "2",
    "--prompts_per_step",
    "8",
    "--max_completion_length",
    "16",
    "--num_threads",
    "1",
    "--learning_rate",
    "1e-4",
    "--warmup_steps",
    "5",
    # far below the run's gradients: clipping acts at every optimizer step (test_core_metrics)
    "--max_grad_norm",
    "1e-3",
]
SHORT_RUN_FLAGS = {
    "ra_rloo.py": ["--prompt_pool", "64", "--reward", "binary"],
    "ada_seq.py": ["--max_rounds", "2", "--round_repeat", "4"],
    "ada_est.py": ["--prompt_pool", "16"],
    "ps_grpo.py": ["--mode", "text"],
    "pros_ppo.py": [],
}


# The short runs go through this wrapper: torch's thread count starts at 2 (torch's default on a 2-core machine,
# whatever this one has), and the counts in force when the policy loads and at the first generate (the step-0
# evaluation) are printed last, for tests/test_cpu_threads.py; so is the norm of the gradients
# each optimizer step met, with the optimizer's number (in order of first step), for
# tests/test_core_metrics.py.
THREAD_SPY = """
import json, runpy, sys, torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
torch.set_num_threads(2)
optimizers, steps = {}, []
def spy_step(optimizer, args, kwargs):
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    norms = [torch.linalg.vector_norm(g.double()) for g in grads]
    norm = float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0
    steps.append([optimizers.setdefault(id(optimizer), len(optimizers)), norm])
register_optimizer_step_pre_hook(spy_step)
from common.generation import hf as generation
from common.model import policy
seen = {}
load, generate = policy.load_policy, generation.HFGenerator.generate
def spy_load(*a, **k):
    seen.setdefault("load_policy", torch.get_num_threads())
    return load(*a, **k)
def spy_generate(self, *a, **k):
    seen.setdefault("first_generate", torch.get_num_threads())
    return generate(self, *a, **k)
policy.load_policy, generation.HFGenerator.generate = spy_load, spy_generate
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")  # a script ends with SystemExit (its exit status)
finally:
    print("THREADS", seen)
    print("OPTIMIZER_STEPS", json.dumps(steps))
"""


@pytest.fixture(scope="session")
def short_run(tiny_base, tmp_path_factory):
    """`short_run(script)` -> (its --output_dir, its stdout): the script's short run, made on first use."""
    done: dict[str, tuple[Path, str]] = {}

    def run(script: str) -> tuple[Path, str]:
        if script not in done:
            out = tmp_path_factory.mktemp(Path(script).stem)
            r = run_script(
                [
                    "-c",
                    THREAD_SPY,
                    script,
                    "--model_name_or_path",
                    tiny_base,
                    "--output_dir",
                    str(out),
                    *SHORT_RUN,
                    *SHORT_RUN_FLAGS[script],
                ]
            )
            done[script] = (out, r.stdout)
        return done[script]

    return run


# fixtures built once per worker: tests that use one of them run on the same worker (pytest.ini: --dist loadgroup)
SHARED_FIXTURES = ("short_run", "mt_base", "built_base")


@pytest.hookimpl(
    tryfirst=True
)  # before pytest-xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        shared = [name for name in SHARED_FIXTURES if name in getattr(item, "fixturenames", ())]
        if shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
    items.sort(key=_start_order)


# The longest work first, so that neither worker is left alone with a long test at the end: the
# serial group of two-process launches, then the tests that take a minute or more on 2 cores
# (`--durations`); the rest keeps its order (sort is stable)
LONG_TESTS = (
    "test_kernel_paths.py",
    "test_sweep_task.py::test_quick_task_sweep",
    "test_golden_metrics.py",
    "test_gpu_smoke_image.py",
    "test_layout.py::test_real_data_path",
    "test_gpu_smoke.py::test_sigterm",
    "test_torch_compile.py",
    "test_flag_ranges.py",
)


def _start_order(item) -> int:
    group = item.get_closest_marker("xdist_group")
    if group and group.args and group.args[0] == "distributed":
        return 0
    return 1 if any(long in item.nodeid for long in LONG_TESTS) else 2
