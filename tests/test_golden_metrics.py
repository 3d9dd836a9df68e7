"""Golden metrics: each script's default run and each baseline the README names, 5 steps at seed 0
and one thread, against the rows recorded before the readability refactor (tests/golden/README.md).
A missing or new key, an integer, string or bool that differs, or a float outside its tolerance
fails with the config, step and key.

The suite runs 3 of the 5 steps (--max_steps 3: the schedule is the warm-up's, which does not read it)
and compares the rows of steps 0-3; the closing evaluation then lands on step 3, where its keys are
checked present, not compared. GOLDEN_FULL=1 runs all 5 and compares every row.

GOLDEN_EXACT=1: floats must be bit-identical (the machine that recorded them).
GOLDEN_ISOLATED=1: each config in its own interpreter (rules out state carried between runs).
`python tests/test_golden_metrics.py --record NAME...` records a config new to configs.json; it
never overwrites a golden (a refactor must reproduce the numbers, not re-record them)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TOKEN_LOGP_TOL

GOLDEN = ROOT / "tests" / "golden"
TABLE = json.loads((GOLDEN / "configs.json").read_text())
CONFIGS: dict = TABLE["configs"]

# Wall-clock seconds differ between two identical runs: neither recorded nor compared
UNPINNED = {
    "time_step_s",
    "time_gen_s",
    "time_train_s",
    "time_reward_s",
    "time_compile_s",
    "pros_gibbs_s",
    # the step's split (common/run/step_metrics.py PHASES, and the rest)
    "time/gen_s",
    "time/logprob_s",
    "time/reward_s",
    "time/update_s",
    "time/eval_s",
    "time/other_s",
}

# One interpreter runs a group's configs one after another (imports and model loads paid once:
# about half the CPU time of a process per config); two groups of about equal cost, one per
# pytest-xdist worker (--dist loadgroup)
GROUP = {
    "ra_rloo.py": "golden-a",
    "ps_grpo.py": "golden-a",
    "ada_est.py": "golden-b",
    "pros_ppo.py": "golden-b",
    "ada_seq.py": "golden-b",
}

# Runs each [name, argv, log] as `python <argv>` would (as __main__, so whatever main() looks like),
# its output into its log, and prints [name, exit status] after each
DRIVER = """
import json, os, runpy, sys, traceback
sys.path.insert(0, os.getcwd())
for name, argv, log in json.loads(sys.argv[1]):
    fd, saved = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), (os.dup(1), os.dup(2))
    os.dup2(fd, 1), os.dup2(fd, 2)
    sys.argv, status = argv, 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(saved[0], 1), os.dup2(saved[1], 2)
    os.close(fd), os.close(saved[0]), os.close(saved[1])
    print(json.dumps([name, status]), flush=True)
"""

# Floats from the model's outputs (log-probs, values, gradients) carry another CPU's rounding
# (vector width, summation order). Every other float is a ratio of counts or rewards: exact up to
# float32 summation order (~1e-7 relative) while no sampled token flips, and a flip moves it by one
# sample or token in at most ~1e4 (>= 1e-4).
COUNT_TOL = 1e-6
# The loss and the gradient norm, from the spread measured between CPU kernels on these very runs
# (README.md): 8x-50x the largest difference there, and small enough that a loss scaled by 1.001
# (a normaliser's 0.1%) fails on the gradient norm (AdamW's normalised step hides it elsewhere).
GRAD_NORM_REL = 2e-4
LOSS_ABS, LOSS_REL = 1e-5, 1e-4
MAX_COMPLETION_TOKENS = 48  # --max_completion_length's default: no completion is longer


def tolerance(key: str, golden_row: dict) -> float:
    """Absolute tolerance of the float `key` of a row, between this machine and another CPU."""
    if key == "loss":  # nearly cancelling terms: relative alone fails near 0
        return LOSS_ABS + LOSS_REL * abs(golden_row[key])
    if key in ("entropy", "kl", "sampler_logp_diff"):  # per-token means of log-prob quantities
        return TOKEN_LOGP_TOL
    if key == "ppo_value_loss":  # mean (V - R)^2 moves by 2 |V - R| dV, |V - R| <= 1
        return 2 * TOKEN_LOGP_TOL
    scale = abs(golden_row[key])
    if key == "ra_is_weight_mean":  # exp of a sum of log-prob differences over a completion
        return scale * MAX_COMPLETION_TOKENS * TOKEN_LOGP_TOL
    if key == "grad_norm":
        return scale * GRAD_NORM_REL
    return COUNT_TOL * max(1.0, scale)


# The steps the suite runs: steps 1-3 hold each method's own code (replayed successes, prefix tasks,
# PROS children, DAPO refills, Reinforce-Ada's rounds, ada_est_recurring's revisited prompts) at 3/5
# of the CPU time of the recorded 5
RECORDED_STEPS = int(TABLE["common_args"][TABLE["common_args"].index("--max_steps") + 1])
STEPS = RECORDED_STEPS if os.environ.get("GOLDEN_FULL") == "1" else 3


def command(name: str, output_dir: Path, steps: int = RECORDED_STEPS) -> list[str]:
    config = CONFIGS[name]
    common = list(TABLE["common_args"])
    common[common.index("--max_steps") + 1] = str(steps)
    return [
        config["script"],
        *common,
        *config["args"],
        "--output_dir",
        str(output_dir),
    ]


def script_env(cache: Path) -> dict:
    # a fresh cache: the runs start from the shipped builds in assets/, not from ~/.cache
    env = dict(
        os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", RLVR_CACHE=str(cache)
    )
    env.pop("RLVR_NO_SHIPPED", None)
    return env


def run_configs(names: list[str], out: Path) -> dict[str, str | None]:
    """Runs `names` under `out`: each name -> None, or why it left no rows."""
    failed: dict[str, str | None] = {}
    isolated = os.environ.get("GOLDEN_ISOLATED") == "1"
    for batch in [[name] for name in names] if isolated else [names]:
        jobs = [
            [name, command(name, out / name, STEPS), str(out / f"{name}.log")] for name in batch
        ]
        r = subprocess.run(
            [sys.executable, "-c", DRIVER, json.dumps(jobs)],
            cwd=ROOT,
            env=script_env(out / "cache"),
            capture_output=True,
            text=True,
            timeout=300 * len(batch),
            check=False,
        )
        status = dict(json.loads(line) for line in r.stdout.splitlines() if line.startswith("["))
        for name in batch:
            log = out / f"{name}.log"
            tail = log.read_text()[-3000:] if log.exists() else ""
            if name not in status:
                failed[name] = f"its interpreter died (exit {r.returncode}):\n{tail}\n{r.stderr}"
            else:
                failed[name] = None if status[name] == 0 else f"exit {status[name]}:\n{tail}"
    return failed


def pinned(row: dict) -> dict:
    return {key: value for key, value in row.items() if key not in UNPINNED}


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def agree(key: str, golden, got, golden_row: dict, exact: bool) -> str | None:
    """None when `got` matches `golden`, else why not."""
    if type(got) is not type(golden):
        return f"type {type(golden).__name__} -> {type(got).__name__} ({golden!r} -> {got!r})"
    if not isinstance(golden, float):
        return None if got == golden else f"{golden!r} -> {got!r} (compared exactly)"
    if math.isnan(golden) or math.isnan(got):
        return None if math.isnan(golden) and math.isnan(got) else f"{golden!r} -> {got!r}"
    if exact:
        return None if got == golden else f"{golden!r} -> {got!r} (GOLDEN_EXACT=1: bit for bit)"
    tol, diff = tolerance(key, golden_row), abs(got - golden)
    return None if diff <= tol else f"{golden!r} -> {got!r} (|diff| {diff:.3g} > {tol:.3g})"


def golden_prefix(golden_rows: list[dict], steps: int) -> tuple[list[dict], set[str]]:
    """The recorded rows of steps 0-`steps`, and the keys the closing evaluation adds to the last
    row (a run of `steps` steps evaluates at its step `steps`, the recorded run at its last): the
    step-0 evaluation's keys that the recorded last row holds and its step `steps` row does not."""
    rows = [row for row in golden_rows if row["step"] <= steps]
    evaluation = golden_rows[0].keys() & golden_rows[-1].keys()
    return rows, set(evaluation - rows[-1].keys())


def compare(golden_rows: list[dict], rows: list[dict], exact: bool) -> list[str]:
    problems = []
    steps = [row.get("step") for row in rows]
    golden_steps = [row.get("step") for row in golden_rows]
    if steps != golden_steps:
        problems.append(f"rows for steps {steps}, the golden has {golden_steps}")
    for golden, row in zip(golden_rows, rows):
        where, row = f"step {golden.get('step')}", pinned(row)
        if missing := sorted(golden.keys() - row.keys()):
            problems.append(f"{where}: key(s) missing from the run's row: {missing}")
        if new := sorted(row.keys() - golden.keys()):
            problems.append(f"{where}: new key(s) not in the golden: {new} (timing: UNPINNED)")
        for key in sorted(golden.keys() & row.keys()):
            if why := agree(key, golden[key], row[key], golden, exact):
                problems.append(f"{where}: {key}: {why}")
    return problems


_failed: dict[str, str | None] = {}  # this worker's runs: config -> None, or why it left no rows


@pytest.fixture(scope="session")
def golden_out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("golden")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xdist_group(GROUP[config["script"]]))
        for name, config in CONFIGS.items()
    ],
)
def test_golden_metrics(name, request, golden_out):
    if name not in _failed:  # the group's first test here runs the group's selected configs
        group = GROUP[CONFIGS[name]["script"]]
        selected = [
            item.callspec.params["name"]
            for item in request.session.items
            if getattr(item, "originalname", None) == "test_golden_metrics"
        ]
        _failed.update(
            run_configs(
                [n for n in selected if n not in _failed and GROUP[CONFIGS[n]["script"]] == group],
                golden_out,
            )
        )
    assert _failed[name] is None, (
        f"{name} (python {' '.join(command(name, golden_out / name, STEPS))}): {_failed[name]}"
    )
    exact = os.environ.get("GOLDEN_EXACT") == "1"
    golden, closing = golden_prefix(read_rows(GOLDEN / f"{name}.jsonl"), STEPS)
    rows = read_rows(golden_out / name / "metrics.jsonl")
    # the closing evaluation ran at the last step: its keys are there, its numbers are not recorded
    if rows and closing:
        assert closing <= rows[-1].keys(), (name, sorted(closing - rows[-1].keys()))
        rows[-1] = {key: value for key, value in rows[-1].items() if key not in closing}
    problems = compare(golden, rows, exact)
    assert not problems, (
        f"{name}: {len(problems)} difference(s) from tests/golden/{name}.jsonl:\n"
        + "\n".join(problems[:40])
    )


def record(names: list[str], out: Path) -> None:
    """Each config as its own `python <script>` process, as a user runs it; writes only goldens
    that do not exist yet."""
    for name in names:
        target = GOLDEN / f"{name}.jsonl"
        if target.exists():
            raise SystemExit(f"{target} exists: goldens are never re-recorded (README.md there)")
        r = subprocess.run(
            [sys.executable, *command(name, out / name)],
            cwd=ROOT,
            check=False,
            env=script_env(out / "cache"),
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise SystemExit(f"{name} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        rows = [pinned(row) for row in read_rows(out / name / "metrics.jsonl")]
        target.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"{target}: {len(rows)} rows")


if __name__ == "__main__":
    import tempfile

    names = sys.argv[2:]
    if sys.argv[1:2] != ["--record"] or not names or not set(names) <= CONFIGS.keys():
        raise SystemExit(f"usage: {sys.argv[0]} --record NAME... (names from configs.json)")
    record(names, Path(tempfile.mkdtemp(prefix="golden-record-")))
