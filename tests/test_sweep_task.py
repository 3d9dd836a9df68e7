"""The sweep on a user's task (`benchmarks/sweep/run.py --task`): the task file's checks, and the
word-problem task at smoke-test size through every applicable config and into its report."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from benchmarks.sweep import configs, run
from benchmarks.sweep.report.claims import CLAIMS, NO_RUNS, claim_rows
from benchmarks.sweep.report.curves import build_aggs
from benchmarks.sweep.report.load import Regime, load_runs

QUICK_TASK = ROOT / "tests" / "tasks" / "word_problems_quick.yaml"


def _write(tmp_path, text: str):
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return path


def _apply(tmp_path, text: str, **given) -> tuple[run.Args, object]:
    """run.apply_task as run.py's main calls it, with `given` as flags on the command line."""
    path = _write(tmp_path, text)
    args = run.Args(task=str(path), **given)
    argv = [f"--task={path}"] + [token for k, v in given.items() for token in (f"--{k}", str(v))]
    return args, run.apply_task(args, argv)


def test_task_file_fills_the_settings_and_the_command_line_wins(tmp_path):
    text = (
        "name: mine\nmax_steps: 7\nlearning_rate: 1.0e-5\nseeds: [3, 4]\n"
        "flags:\n  dataset_name: data/train.jsonl\n  prompt_column: problem\n"
        "  reward_funcs: [a.py:f, a.py:g]\n  use_vllm: true\n"
    )
    args, task = _apply(tmp_path, text, max_steps=9)
    settings, runs_dir = run.resolve(args, task)
    assert (settings.max_steps, settings.learning_rate, settings.seeds) == (9, 1e-5, [3, 4])
    assert str(runs_dir) == "runs/sweep-mine"
    cmd = run.build_command(configs.task_config("rloo"), settings, 3, runs_dir / "rloo" / "seed3")
    tail = cmd[cmd.index("--dataset_name") :]
    assert tail[:6] == [
        "--dataset_name",
        "data/train.jsonl",
        "--prompt_column",
        "problem",
        "--reward_funcs",
        "a.py:f,a.py:g",
    ]


@pytest.mark.parametrize(
    "text, says",
    [
        ("flags:\n  ps_ratio: 1\n", "flags.ps_ratio: not a flag the five scripts share"),
        ("flags:\n  seed: 1\n", "flags.seed: set by the sweep"),
        ("max_stepz: 3\n", "key 'max_stepz': not a task key"),
        ("dry_run: true\n", "key 'dry_run': not a task key"),
        ("flags:\n  dtype: half\n", "flags.dtype: 'half' is not one of"),
        ("- a\n- b\n", "expected a mapping"),
        ("name: a b\n", "name 'a b'"),
    ],
)
def test_task_file_errors_name_the_key(tmp_path, text, says):
    with pytest.raises(SystemExit) as err:
        _apply(tmp_path, text)
    assert says in str(err.value) and "task.yaml" in str(err.value)


def test_task_sweep_configs_are_the_text_ones():
    task = configs.task_configs()
    # every config a claim reads runs, each in one data regime
    assert {n for spec in CLAIMS for n in spec.configs} == set(task)
    assert not [n for n in task if n.endswith("_pool2048")]
    ps = [c for c in task.values() if c.script == "ps_grpo.py"]
    assert len(ps) == 4 and all(c.flags[c.flags.index("--mode") + 1] == "text" for c in ps)
    assert all(configs.check_config(c) is None for c in task.values())
    assert configs.task_config("dr_grpo_n4") == configs.BY_NAME["dr_grpo_n4"]


def test_quick_task_sweep_runs_every_config_and_reports_every_claim(tmp_path):
    runs_dir = tmp_path / "runs"
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/sweep/run.py",
            "--task",
            str(QUICK_TASK),
            "--runs_dir",
            str(runs_dir),
            "--progress_every",
            "0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    task = configs.task_configs()
    for name in task:
        meta = json.loads((runs_dir / name / "seed0" / "bench.json").read_text())
        assert meta["finished"], name
    # Prefix Sampling ran in its text mode on the task's data
    ps_cmd = json.loads((runs_dir / "ps_fixed" / "seed0" / "bench.json").read_text())["cmd"]
    assert ps_cmd[ps_cmd.index("--mode") + 1] == "text" and "--dataset_name" in ps_cmd
    runs = load_runs(runs_dir)
    _, aggs = build_aggs(runs, task)
    rows = claim_rows(aggs, Regime("8", ""))
    assert len(rows) == len(CLAIMS)
    for row in rows:  # every claim read its configs' runs (1 seed: no interval yet)
        assert row.verdict != NO_RUNS and not row.verdict.startswith("missing"), row
        assert all(aggs[name].finished for name in row.configs), row
    page = (runs_dir / "results" / "README.md").read_text()
    assert "# Benchmark results: task word_problems_quick" in page
    assert f"run.py --task {QUICK_TASK.relative_to(ROOT)}" in page
    for spec in CLAIMS:
        assert spec.claim.replace("|", "\\|") in page, spec.claim
    cost = page.split("### Cost")[1].split("## ")[0]
    assert all(f"(`{name}`)" in cost for name in task)
    assert "2,048" not in page.split("## The papers' claims")[1].split("## Plots")[0]
