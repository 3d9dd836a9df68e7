"""The sweep on a user's task (`benchmarks/sweep/run.py --task`): the task file's checks, and the
word-problem task at smoke-test size through configs of every script and into its report."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT

from benchmarks.sweep import configs, run
from benchmarks.sweep.report.claims import CLAIMS, NO_RUNS, NOT_LOGGED, claim_rows, pending
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
    assert tail[:6] == [  # the file's relative paths are read from its folder
        "--dataset_name",
        str(tmp_path / "data" / "train.jsonl"),
        "--prompt_column",
        "problem",
        "--reward_funcs",
        f"{tmp_path / 'a.py'}:f,{tmp_path / 'a.py'}:g",
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


def test_every_problem_of_a_task_file_is_reported_at_once_with_the_nearest_name(tmp_path):
    text = "max_stepz: 3\nlearning_rat: 1.0e-5\nflags:\n  dataset_nam: d.jsonl\n  dtype: half\n"
    with pytest.raises(SystemExit) as err:
        _apply(tmp_path, text)
    lines = str(err.value).splitlines()
    assert len(lines) == 4, lines
    for line, says in zip(
        lines,
        [
            "key 'max_stepz': not a task key (script flags go under `flags:`); the nearest is "
            "'max_steps'",
            "key 'learning_rat': not a task key (script flags go under `flags:`); the nearest is "
            "'learning_rate'",
            "flags.dataset_nam: not a flag the five scripts share (common/run/flags.py BaseArgs); "
            "the nearest is 'dataset_name'",
            "flags.dtype: 'half' is not one of",
        ],
    ):
        assert line.startswith(f"--task {tmp_path / 'task.yaml'}: {says}"), line


def test_task_sweep_configs_are_the_text_ones():
    task = configs.task_configs()
    # every config a claim reads runs, each in one data regime
    assert {n for spec in CLAIMS for n in spec.configs} == set(task)
    assert not [n for n in task if n.endswith("_pool2048")]
    ps = [c for c in task.values() if c.script == "ps_grpo.py"]
    assert len(ps) == 4 and all(c.flags[c.flags.index("--mode") + 1] == "text" for c in ps)
    assert all(configs.check_config(c) is None for c in task.values())
    assert configs.task_config("dr_grpo_n4") == configs.BY_NAME["dr_grpo_n4"]


# The quick sweep's configs: each of the five scripts, and for each paper at least one claim whose configs all run
# (RA-RLOO against RLOO; PS's adaptive controller; EST against GRPO-n8, two scripts; PROS's calibration); a process
# costs ~10 s here, so the other 12 configs are left to `--only`'s wiring and a claim reading them says it has no runs
QUICK_RUN = ("grpo_n8", "rloo", "ra_rloo", "ps_adaptive", "est", "ppo_pros")


def test_quick_task_sweep_runs_configs_of_every_script_and_reports_every_claim(tmp_path):
    runs_dir = tmp_path / "runs"
    task = configs.task_configs()
    ran = [name for name in task if name in QUICK_RUN]  # the runner's order
    assert len(ran) == len(QUICK_RUN)
    assert {task[name].script for name in ran} == {
        "ra_rloo.py",
        "ps_grpo.py",
        "pros_ppo.py",
        "ada_seq.py",
        "ada_est.py",
    }
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/sweep/run.py",
            "--task",
            str(QUICK_TASK),
            "--only",
            ",".join(QUICK_RUN),
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
    for name in task:
        bench = runs_dir / name / "seed0" / "bench.json"
        if name not in QUICK_RUN:
            assert not bench.parent.exists(), name
            continue
        assert json.loads(bench.read_text())["finished"], name
    # Prefix Sampling ran in its text mode on the task's data
    ps_cmd = json.loads((runs_dir / "ps_adaptive" / "seed0" / "bench.json").read_text())["cmd"]
    assert ps_cmd[ps_cmd.index("--mode") + 1] == "text" and "--dataset_name" in ps_cmd
    runs = load_runs(runs_dir)
    _, aggs = build_aggs(runs, task)
    rows = claim_rows(aggs, Regime("8", ""))
    assert len(rows) == len(CLAIMS)
    read = set()
    for spec, row in zip(CLAIMS, rows):
        # its configs' runs were read (1 seed: no interval yet)
        if set(row.configs) <= set(QUICK_RUN):
            assert row.verdict != NO_RUNS and not row.verdict.startswith("missing"), row
            assert all(aggs[name].finished for name in row.configs), row
            read.add(spec.paper)
        elif not row.verdict.startswith(NOT_LOGGED):  # a config that did not run: the row says so
            assert row.verdict == pending(0), row
            for name in set(row.configs) - set(QUICK_RUN):
                assert f"`{name}` 0 finished seeds" in row.measured, row
    assert read == {spec.paper for spec in CLAIMS}
    page = (runs_dir / "results" / "README.md").read_text()
    assert "# Benchmark results: task word_problems_quick" in page
    assert f"run.py --task {QUICK_TASK.relative_to(ROOT)} --only {','.join(ran)}" in page
    for spec in CLAIMS:
        assert spec.claim.replace("|", "\\|") in page, spec.claim
    cost = page.split("### Cost")[1].split("## ")[0]
    assert all((f"(`{name}`)" in cost) == (name in QUICK_RUN) for name in task)
    assert "2,048" not in page.split("## The papers' claims")[1].split("## Plots")[0]


# ---------------------------------------------------------------- the checks before the first run


def _task_dir(tmp_path, flags: str, model: str = '"{word_problems_base}"'):
    """A task file in its own folder, run from elsewhere: its relative paths are the folder's."""
    folder = tmp_path / "task"
    (folder / "data").mkdir(parents=True)
    path = folder / "t.yaml"
    path.write_text(f"name: t\nmodel_name_or_path: {model}\nseeds: [0]\nflags:\n{flags}")
    return folder, path


def _main(path, tmp_path, *extra):
    argv = ["--task", str(path), "--runs_dir", str(tmp_path / "runs"), *extra]
    return run.main(run.parse_args(run.Args, argv), argv)


def test_a_missing_data_file_stops_before_any_run_naming_where_it_looked(tmp_path):
    folder, path = _task_dir(tmp_path, "  dataset_name: data/train.jsonl\n")
    with pytest.raises(SystemExit) as err:
        _main(path, tmp_path)
    line = str(err.value)
    assert "\n" not in line and "flags.dataset_name" in line
    assert str(folder / "data" / "train.jsonl") in line and f"from its folder, {folder}" in line
    assert not (tmp_path / "runs").exists()  # nothing ran, nothing recorded
    folder, path = _task_dir(tmp_path / "m", "  dataset_name: x.jsonl\n", model="../no_model")
    with pytest.raises(SystemExit) as err:
        _main(path, tmp_path)
    assert f"model_name_or_path: {folder.parent / 'no_model'}: no such folder" in str(err.value)
    # the held-out file is checked as the training one is
    flags = "  dataset_name: '{word_problems}/train.jsonl'\n  eval_dataset: data/held_out.jsonl\n"
    folder, path = _task_dir(tmp_path / "e", flags)
    with pytest.raises(SystemExit) as err:
        _main(path, tmp_path)
    line = str(err.value)
    assert "\n" not in line and f"flags.eval_dataset: {folder / 'data' / 'held_out.jsonl'}" in line
    assert not (tmp_path / "runs").exists()


def test_relative_paths_are_read_from_the_task_files_folder(tmp_path):
    folder, path = _task_dir(
        tmp_path,
        "  dataset_name: data/train.jsonl\n  reward_funcs: r.py:f,my_pkg.rewards:g\n",
    )
    path.write_text(path.read_text() + "runs_dir: out/runs\nreport_dir: ../pages\n")
    args = run.Args(task=str(path))
    task = run.apply_task(args, ["--task", str(path)])
    assert args.runs_dir == str(folder / "out" / "runs")
    assert task.report_dir == str(tmp_path / "pages")
    flags = task.script_flags
    assert flags[flags.index("--dataset_name") + 1] == str(folder / "data" / "train.jsonl")
    # a file's function is read from the folder, a module's is imported as given
    assert flags[flags.index("--reward_funcs") + 1] == f"{folder / 'r.py'}:f,my_pkg.rewards:g"
    # the shipped tasks give the same commands their committed runs recorded
    shipped = run.Args(task=str(ROOT / "benchmarks/sweep/tasks/word_problems_funcs.yaml"))
    task = run.apply_task(shipped, ["--task", shipped.task])
    assert shipped.runs_dir == str(ROOT / "benchmarks/sweep/runs-word_problems_funcs")
    funcs = task.script_flags[task.script_flags.index("--reward_funcs") + 1]
    assert funcs.startswith("examples/boxed_rewards.py:boxed_format_reward,")


def test_the_reward_functions_are_called_on_a_few_rows_before_any_run(tmp_path):
    flags = "  dataset_name: data/train.jsonl\n  reward_funcs: r.py:ok,r.py:wrong\n"
    folder, path = _task_dir(tmp_path, flags)
    (folder / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(6))
    )
    (folder / "r.py").write_text(
        "def ok(completions, answer, **kw):\n    return [float(a in c) for c, a in "
        "zip(completions, answer)]\n\ndef wrong(completions, **kw):\n    return ['yes'] * "
        "len(completions)\n"
    )
    with pytest.raises(SystemExit) as err:
        _main(path, tmp_path, "--dry_run")
    assert "flags.reward_funcs on the first 4 rows of" in str(err.value)
    assert "reward function wrong: value 0 is 'yes', not a number" in str(err.value)
    path.write_text(path.read_text().replace(",r.py:wrong", ""))
    (folder / "r.py").write_text("def ok(completions, **kw):\n    return [1 / 0]\n")
    with pytest.raises(SystemExit) as err:
        _main(path, tmp_path, "--dry_run")
    assert f"reward function ok raised ({folder / 'r.py'}, line 2): ZeroDivisionError" in str(
        err.value
    )
    (folder / "r.py").write_text(
        "def ok(completions, answer, **kw):\n    return [float(a in c) for c, a in "
        "zip(completions, answer)]\n"
    )
    assert _main(path, tmp_path, "--dry_run", "--only", "rloo") == 0


def test_no_page_when_no_run_finished(tmp_path, capsys):
    _, path = _task_dir(tmp_path, "  dataset_name: '{word_problems}/train.jsonl'\n")
    # an interpreter that fails at once: every run fails, fast
    code = _main(path, tmp_path, "--only", "rloo", "--python", "false", "--progress_every", "0")
    out = capsys.readouterr().out
    assert code == 1 and "FAILED (exit code 1)" in out
    assert "report: none written, no run in" in out
    assert not (tmp_path / "runs" / "results").exists()
    # the runner says what it leaves out, the multi-turn configs among them
    assert "left out: Prefix Sampling's multi-turn configs" in out and "left out: dr_grpo_n4" in out


# ---------------------------------------------------------------- a task sweep's page


def _funcs_runs(tmp_path, seeds=(0, 1, 2, 3, 4)):
    """A copy of the committed word-problem runs with reward functions (rloo, ra_rloo)."""
    import shutil

    runs = tmp_path / "runs"
    for cfg in ("rloo", "ra_rloo"):
        for seed in seeds:
            src = ROOT / "benchmarks/sweep/runs-word_problems_funcs" / cfg / f"seed{seed}"
            shutil.copytree(src, runs / cfg / f"seed{seed}")
    shutil.copy(ROOT / "benchmarks/sweep/runs-word_problems_funcs/sweep.json", runs)
    return runs


def _page(runs, tmp_path) -> str:
    from benchmarks.sweep.report.page import render_report

    return render_report(runs, tmp_path / "out", plots=False)[0]


def test_a_task_page_says_what_failed_and_keeps_the_flags_it_was_run_with(tmp_path):
    runs = _funcs_runs(tmp_path)
    # one run stopped early: its log says why
    seed3 = runs / "ra_rloo" / "seed3"
    rows = (seed3 / "metrics.jsonl").read_text().splitlines()
    (seed3 / "metrics.jsonl").write_text("\n".join(rows[:5]) + "\n")
    (seed3 / "log.txt").write_text("step 4\nRuntimeError: out of memory\n")
    # every run with a smaller evaluation than the task file gives
    for meta in runs.glob("*/seed*/bench.json"):
        data = json.loads(meta.read_text())
        data["settings"]["eval_prompts"] = 64
        meta.write_text(json.dumps(data))
    page = _page(runs, tmp_path)
    assert "**1 of 10 runs did not finish**" in page.split("## Table")[0]
    assert "- `ra_rloo` seed 3: at step 4/30; its log ends: `RuntimeError: out of memory`" in page
    command = next(line for line in page.splitlines() if line.startswith("python "))
    assert command == (
        "python benchmarks/sweep/run.py --task benchmarks/sweep/tasks/word_problems_funcs.yaml "
        f"--only rloo,ra_rloo --eval_prompts 64 --runs_dir {runs}"
    )
    # the page names the task's reward, not the Countdown one, and what a task sweep leaves out
    assert "0.2 x `boxed_format_reward` + 1 x `boxed_correctness_reward`" in page
    assert "{0, 0.1, 1}" not in page
    assert "- Prefix Sampling's multi-turn configs (`ps_off`" in page and "- `dr_grpo_n4`:" in page


def test_a_task_page_reads_one_seed_and_a_mechanism_that_never_fired(tmp_path):
    runs = _funcs_runs(tmp_path, seeds=(0,))
    page = _page(runs, tmp_path)
    assert "**One seed per config: no verdict.**" in page.split("## Table")[0]
    runs = _funcs_runs(tmp_path / "idle", seeds=(0, 1))
    for path in runs.glob("ra_rloo/seed*/metrics.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows:
            if "ra_replay_fired_frac" in row:
                row["ra_replay_fired_frac"] = 0.0
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    page = _page(runs, tmp_path / "idle")
    row = next(line for line in page.splitlines() if line.startswith("| RA-RLOO beats RLOO (final"))
    assert (
        "**the mechanism never fired (`ra_replay_fired_frac` 0 at every step of 2 run(s))**" in row
    )
    assert "no gain as large as" not in row


def test_the_report_without_plots_names_no_png(tmp_path, capsys):
    from benchmarks.sweep.report import Args, main

    runs = _funcs_runs(tmp_path, seeds=(0,))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "zero_var.png").write_bytes(b"an earlier report's")
    main(Args(runs_dir=str(runs), out_dir=str(tmp_path / "out"), plots=False))
    out = capsys.readouterr().out
    assert "wrote" in out and ".png" not in out  # an earlier PNG was not written now


def test_quick_mode_on_a_task_has_its_own_budget_folder_and_page(tmp_path):
    _, path = _task_dir(tmp_path, "  dataset_name: x.jsonl\n")
    path.write_text(path.read_text() + "max_steps: 100\nruns_dir: out\nreport_dir: pages\n")
    args = run.Args(task=str(path), quick=True)
    task = run.apply_task(args, ["--task", str(path), "--quick"])
    settings, runs_dir = run.resolve(args, task)
    assert (settings.max_steps, settings.seeds) == (configs.QUICK["max_steps"], [0])
    assert str(runs_dir).endswith("out-quick") and task.report_dir is None


def test_the_task_page_states_the_sizes_the_runs_used_and_a_config_that_never_earned_a_reward(
    tmp_path,
):
    import shutil

    from benchmarks.sweep.report.page import render_report

    runs_dir = tmp_path / "runs"
    shutil.copytree(ROOT / "benchmarks" / "sweep" / "runs-word_problems_funcs", runs_dir)
    log = "64 training prompts from d.jsonl; 16 held-out prompts from the last 16 rows of d.jsonl\n"
    for bench in runs_dir.glob("*/seed*/bench.json"):  # what the runner reads from each run's log
        (bench.parent / "log.txt").write_text(f"compute dtype float32\n{log}step 0 ...\n")
        meta = json.loads(bench.read_text())
        meta["data"] = run.used_data(bench.parent / "log.txt")
        bench.write_text(json.dumps(meta))
    for metrics in (runs_dir / "rloo").glob("seed*/metrics.jsonl"):  # rloo never earned a reward
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        rows = [{**row, "reward_mean": 0.0} if "reward_mean" in row else row for row in rows]
        metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    page, _ = render_report(runs_dir, tmp_path / "out", plots=False, draw=False)
    setting = next(line for line in page.splitlines() if line.startswith("**Setting**"))
    assert (
        "pool of 64 training prompts (what the data gave; --prompt_pool asked for 128)" in setting
    )
    assert "on 16 prompts (what the data gave; --eval_prompts asked for 128) x 4 samples" in setting
    assert (
        "**No reward**: These configs (`rloo`) earned a training reward of 0 at every step" in page
    )
    # the committed runs used what they asked for, and earned rewards: neither note
    page, _ = render_report(
        ROOT / "benchmarks" / "sweep" / "runs-word_problems_funcs",
        tmp_path / "out2",
        plots=False,
        draw=False,
    )
    assert "what the data gave" not in page and "**No reward**" not in page


def test_an_environment_sweep_page_names_its_environment_and_reward(tmp_path):
    """A sweep of a task file's `environment`: the page names the class and its reward, not the
    math reward nor the Countdown environment, and only the claims its configs answer."""
    import shutil

    runs = tmp_path / "runs"
    spec = "examples/merge_game.py:MergeGame"
    for source, name in (("rloo", "ps_off"), ("ra_rloo", "ps_fixed")):  # stand-in curves
        for seed in (0, 1):
            dst = runs / name / f"seed{seed}"
            src = ROOT / "benchmarks/sweep/runs-word_problems_funcs" / source / f"seed{seed}"
            shutil.copytree(src, dst)
            meta = json.loads((dst / "bench.json").read_text())
            meta.update(config=name, script="ps_grpo.py")
            meta["settings"]["task_flags"] = ["--environment", spec]
            (dst / "bench.json").write_text(json.dumps(meta))
    sweep = json.loads((ROOT / "benchmarks/sweep/runs-word_problems_funcs/sweep.json").read_text())
    sweep["settings"]["task_flags"] = ["--environment", spec]
    sweep["task"] = {"name": "merge", "environment": spec}
    (runs / "sweep.json").write_text(json.dumps(sweep))
    page = _page(runs, tmp_path)
    assert f"**Environment**: `MergeGame` (`{spec}`)" in page.split("## Table")[0]
    assert (
        "Reward on this task: the environment's own reward (`MergeGame`'s: the reward of its last "
        "`step`, or `get_reward()` in TRL's convention; logged as `rewards/MergeGame/mean`)."
    ) in page
    assert "Prefix Sampling's baseline in your environment (one action per turn)" in page
    assert "math reward" not in page and "Countdown environment" not in page
    assert "warm-up" not in page
    # Prefix Sampling's claims only: the other methods never run in an environment
    assert "**Prefix Sampling**" in page
    assert all(f"**{paper}**" not in page for paper in ("RA-RLOO", "Reinforce-Ada", "PROS"))
    # the sizes an environment's runs used, as for a text task's prompts
    log = tmp_path / "log.txt"
    log.write_text(
        "36 training tasks from rows.jsonl, reset(**row) on each row; 4 held-out tasks from the "
        "last 4 rows of rows.jsonl (at most --eval_prompts, at most a fifth of the rows)\n"
    )
    assert run.used_data(log) == {"train_prompts": 36, "eval_prompts": 4}


def test_no_reward_reads_only_the_runs_that_finished():
    """A run cut short says nothing of whether its config earns a reward: the "No reward" line
    reads finished runs only, and a config none of whose runs finished is not named."""
    from benchmarks.sweep.report.load import RunData
    from benchmarks.sweep.report.page import never_rewarded

    def run(name, seed, finished, reward):
        return RunData(name, seed, [{"step": 0, "reward_mean": reward}], 4, finished, {})

    runs = {
        "silent": {0: run("silent", 0, True, 0.0), 1: run("silent", 1, False, 0.5)},
        "cut": {0: run("cut", 0, False, 0.0)},
        "learns": {0: run("learns", 0, True, 0.0), 1: run("learns", 1, True, 0.25)},
    }
    assert never_rewarded(runs) == ["silent"]
