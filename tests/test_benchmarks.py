"""The benchmark harness without training: config/flag checks, skip/resume on fake run dirs (a fake method
script stands in for the real ones), the report's table and 'tokens to reach the baseline' on hand-made
metrics.jsonl files, the plots (when matplotlib is installed), and the floor's breakdown arithmetic."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from scipy import stats

from benchmarks.speed import floor
from benchmarks.sweep import configs, report, run, run_dirs


def _write_rows(d: Path, rows: list[dict]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _settings(**kw) -> run.Settings:
    base = dict(
        seeds=[0], max_steps=4, prompts_per_step=2, eval_steps=2, eval_prompts=2, eval_samples=2
    )
    base.update(kw)
    return run.Settings(**base)


# ----------------------------------------------------------------------------------------------------
# configs and flags
# ----------------------------------------------------------------------------------------------------


def test_every_config_flag_exists_in_its_script():
    # a renamed flag in a method script must show up here (the runner would report the config "missing")
    problems = {c.name: configs.check_config(c) for c in run.CONFIGS if configs.check_config(c)}
    assert not problems, problems
    names = [c.name for c in run.CONFIGS]
    assert len(names) == len(set(names))
    # the 12 the benchmark was built for (GRPO-n4/n8, RLOO, RA-RLOO, PS off/fixed/adaptive, SEQ-POS/BALANCE, EST,
    # PPO, PPO+PROS)
    # plus PROS's random-selection ablation, GRPO / GRPO+PROS, Dr. GRPO-n4 (GRPO-n4 without the std), DAPO's
    # dynamic sampling on GRPO-n4 (Reinforce-Ada's Table 2 baseline) and GRPO-n16 (its SEQ-BALANCE claim)
    pool256 = {
        "grpo_n4",
        "dr_grpo_n4",
        "grpo_n8",
        "grpo_n16",
        "dapo_n4",
        "rloo",
        "ra_rloo",
        "ps_off",
        "ps_fixed",
        "ps_adaptive",
        "seq_pos",
        "seq_balance",
        "est",
        "ppo",
        "ppo_pros",
        "ppo_pros_random",
        "grpo_k4",
        "grpo_pros",
        "ps_adaptive_reset",
        "est_pool2048",
        "grpo_n8_pool2048",
    }
    # the second data regime: a config's twin on the 2,048-prompt pool, paired with its baseline's twin
    assert pool256 | {f"{n}_pool2048" for n in configs.SECOND_REGIME} | {
        "ppo_pros_visit_pool2048"
    } == set(names)
    for name in configs.SECOND_REGIME:
        c, twin = run.BY_NAME[name], run.BY_NAME[f"{name}_pool2048"]
        assert twin.flags == (*c.flags, "--prompt_pool", "2048") and twin.script == c.script
        assert twin.baseline == (c.baseline and f"{c.baseline}_pool2048")
    for c in run.CONFIGS:
        assert c.baseline is None or c.baseline in run.BY_NAME
    # the GRPO-n baselines say which advantage they use, so a changed script default cannot relabel them
    assert "true" in run.BY_NAME["grpo_n4"].flags and "false" in run.BY_NAME["dr_grpo_n4"].flags
    n16 = run.BY_NAME["grpo_n16"].flags
    assert n16[n16.index("--round_repeat") + 1] == n16[n16.index("--num_generations") + 1] == "16"
    # Prefix Sampling runs in the environment (its paper's agentic setting), baseline included
    ps = [c for c in run.CONFIGS if c.script == "ps_grpo.py"]
    assert len([c for c in ps if not c.name.endswith("_pool2048")]) == 4
    assert all(c.flags[c.flags.index("--mode") + 1] == "multiturn" for c in ps)
    # the paper's controller (one EMA) is `ps_adaptive`, ours (EMA reset) a named variant; Reinforce-Ada
    # runs its own default advantage (r - mean(pool), recorded in args.json), not an explicit std flag
    flag = lambda name, key: run.BY_NAME[name].flags[run.BY_NAME[name].flags.index(key) + 1]  # noqa: E731
    assert (
        flag("ps_adaptive", "--ema_reset") == "false"
        and flag("ps_adaptive_reset", "--ema_reset") == "true"
    )
    assert all("--scale_rewards" not in run.BY_NAME[n].flags for n in ("seq_pos", "seq_balance"))
    # EST on its own 2,048-prompt pool is measured against GRPO-n8 on that pool: GRPO-n8's flags plus the pool only
    pooled = run.BY_NAME["grpo_n8_pool2048"].flags
    assert run.BY_NAME["est_pool2048"].baseline == "grpo_n8_pool2048"
    assert pooled[:-2] == run.BY_NAME["grpo_n8"].flags and pooled[-2:] == ("--prompt_pool", "2048")


def test_shared_settings_reach_every_run_and_a_config_flag_wins(tmp_path):
    s, _ = run.resolve(run.Args())
    cmd = run.build_command(run.BY_NAME["est_pool2048"], s, 0, tmp_path)
    assert cmd.count("--prompt_pool") == 1 and cmd[cmd.index("--prompt_pool") + 1] == "2048"
    cmd = run.build_command(run.BY_NAME["seq_pos"], s, 3, tmp_path)
    assert (
        cmd[cmd.index("--prompt_pool") + 1] == "256" and cmd[cmd.index("--warmup_steps") + 1] == "5"
    )
    assert cmd[cmd.index("--seed") + 1] == "3" and cmd[cmd.index("--output_dir") + 1] == str(
        tmp_path
    )


def test_check_config_reports_missing_script_flag_and_choice(tmp_path):
    (tmp_path / "m.py").write_text(
        textwrap.dedent('''
        from typing import Literal
        from dataclasses import dataclass
        from common.run.flags import BaseArgs
        @dataclass
        class Args(BaseArgs):
            mode: Literal["a", "b"] = "a"
            """doc"""
    ''')
    )
    ok = configs.Config("x", "m.py", ("--mode", "b", "--max_steps", "3"), "x")
    assert configs.check_config(ok, root=tmp_path) is None  # own field + a BaseArgs field
    assert "no --nope" in configs.check_config(
        configs.Config("x", "m.py", ("--nope", "1"), "x"), root=tmp_path
    )
    assert "no choice 'c'" in configs.check_config(
        configs.Config("x", "m.py", ("--mode", "c"), "x"), root=tmp_path
    )
    assert "does not exist" in configs.check_config(
        configs.Config("x", "gone.py", (), "x"), root=tmp_path
    )
    (tmp_path / "bad.py").write_text("def f(:\n")
    assert configs.check_config(configs.Config("x", "bad.py", (), "x"), root=tmp_path).startswith(
        "missing:"
    )


def test_budget_flags_are_shared_and_quick_overrides():
    full, _ = run.resolve(run.Args())
    quick, qdir = run.resolve(run.Args(quick=True))
    assert full.seeds == [0, 1, 2, 3, 4] and quick.seeds == [0] and quick.max_steps < full.max_steps
    assert (
        full.max_steps,
        full.prompts_per_step,
        full.eval_steps,
        full.eval_prompts,
        full.eval_samples,
    ) == (200, 32, 25, 256, 8)
    assert (quick.max_steps, quick.prompts_per_step, quick.eval_prompts, quick.eval_samples) == (
        20,
        8,
        32,
        2,
    )
    assert (
        full.max_completion_length == quick.max_completion_length == 48
        and qdir.name == "runs-quick"
    )
    mine, _ = run.resolve(run.Args(quick=True, max_steps=7, seeds=[3, 4]))
    assert mine.max_steps == 7 and mine.seeds == [3, 4] and mine.eval_prompts == quick.eval_prompts
    a = run.build_command(run.BY_NAME["rloo"], full, 1, Path("d"))
    b = run.build_command(run.BY_NAME["ps_fixed"], full, 1, Path("d"))
    tail = run.shared_flags(full, 1, Path("d"))
    assert a[-len(tail) :] == b[-len(tail) :] == tail  # every config gets the same budget flags
    assert "--resume_from_checkpoint" not in a and a[a.index("--max_steps") + 1] == str(
        full.max_steps
    )


def test_every_runner_and_report_flag_is_documented():
    from common.run.flag_help import field_docs

    for cls in (run.Args, report.Args, floor.Args):
        docs = field_docs(cls)
        assert not [f.name for f in fields(cls) if not docs.get(f.name)], cls


# ----------------------------------------------------------------------------------------------------
# run state: skip / resume / conflict on fake run dirs
# ----------------------------------------------------------------------------------------------------


def test_run_state_on_fake_dirs(tmp_path):
    cmd = ["ra_rloo.py", "--max_steps", "4"]
    d = tmp_path / "r"
    assert run_dirs.run_state(d, cmd, 4) == "new"
    d.mkdir()
    (d / "bench.json").write_text(json.dumps({"cmd": cmd, "attempts": 1}))
    assert run_dirs.run_state(d, cmd, 4) == "restart"  # tried, nothing to resume from
    _write_rows(d, [{"step": 0, "eval_pass@1": 0.1}, {"step": 1}, {"step": 2, "eval_pass@1": 0.2}])
    assert run_dirs.run_state(d, cmd, 4) == "restart"
    (d / "checkpoint-2").mkdir()
    assert run_dirs.run_state(d, cmd, 4) == "restart"  # an interrupted save has no trainer_state.pt
    (d / "checkpoint-2" / "trainer_state.pt").write_text("x")
    assert run_dirs.run_state(d, cmd, 4) == "resume"
    _write_rows(d, [{"step": 0, "eval_pass@1": 0.1}, {"step": 4}])
    assert (
        run_dirs.run_state(d, cmd, 4) == "resume"
    )  # last step without its evaluation is not finished
    with (d / "metrics.jsonl").open("a") as f:
        f.write(
            json.dumps({"step": 4, "eval_pass@1": 0.3}) + "\n" + '{"step": 5, "tru'
        )  # torn last line
    assert run_dirs.run_state(d, cmd, 4) == "done"
    assert (
        run_dirs.run_state(d, cmd + ["--seed", "1"], 4) == "conflict"
    )  # another command's run: never overwritten
    stray = tmp_path / "stray"
    _write_rows(stray, [{"step": 0}])
    assert run_dirs.run_state(stray, cmd, 4) == "conflict"  # files without bench.json: not ours


def test_a_committed_finished_run_is_done_on_a_fresh_clone(tmp_path):
    # what git tracks of a finished run (metrics.jsonl, args.json, bench.json): no checkpoint, no log, no samples
    s = _settings(seeds=[0])
    cfg = run.BY_NAME["rloo"]
    d = tmp_path / "runs" / "rloo" / "seed0"
    cmd = run.build_command(cfg, s, 0, run._portable(d))
    _write_rows(
        d,
        [
            {"step": 0, "eval_pass@1": 0.1},
            {"step": 2, "eval_pass@1": 0.2},
            {"step": 4, "eval_pass@1": 0.3},
        ],
    )
    (d / "args.json").write_text("{}")
    testbed = run_dirs.testbed_id(s.model_name_or_path)
    meta = {"cmd": cmd, "attempts": 1, "finished": True, "testbed": testbed}
    (d / "bench.json").write_text(json.dumps(meta))
    assert run_dirs.run_state(d, cmd, 4) == "done"
    args = run.Args(only="rloo", runs_dir=str(tmp_path / "runs"), seeds=[0])
    (item,) = run.plan(args, s, tmp_path / "runs")
    assert item["state"] == "done" and item["cmd"] == cmd


def test_a_run_on_another_testbed_is_stale_not_skipped(tmp_path, monkeypatch):
    # a finished run of the same command on an older embedded task or base must not count for the current one
    s = _settings(seeds=[0])
    d = tmp_path / "runs" / "rloo" / "seed0"
    cmd = run.build_command(run.BY_NAME["rloo"], s, 0, run._portable(d))
    _write_rows(d, [{"step": 0, "eval_pass@1": 0.1}, {"step": 4, "eval_pass@1": 0.3}])
    now = run_dirs.testbed_id("embedded")
    assert (
        now.startswith("countdown-base-")
        and run_dirs.testbed_id("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    )
    for recorded, state in ((now, "done"), ("countdown-base-0000000000", "stale"), (None, "stale")):
        (d / "bench.json").write_text(
            json.dumps({"cmd": cmd, "attempts": 1, "finished": True, "testbed": recorded})
        )
        assert run_dirs.run_state(d, cmd, 4, now) == state, recorded
    # the testbed id follows the task's levels, not only the base recipe
    from common.demo import countdown

    monkeypatch.setattr(countdown, "LEVELS", countdown.LEVELS[:2])
    assert run_dirs.testbed_id("embedded") != now


def test_compact_run_keeps_what_git_tracks(tmp_path):
    d = tmp_path / "r"
    _write_rows(d, [{"step": 4, "eval_pass@1": 0.3}])
    for name in ("args.json", "bench.json", "samples.jsonl"):
        (d / name).write_text("{}")
    (d / "checkpoint-4").mkdir()
    (d / "checkpoint-4" / "trainer_state.pt").write_text("x")
    (d / "log.txt").write_text("".join(f"line {i}\n" for i in range(500)))
    run_dirs.compact_run(d, keep_checkpoints=True)
    assert (d / "checkpoint-4").exists() and (d / "samples.jsonl").exists()
    log = (d / "log.txt").read_text().splitlines()
    assert (
        len(log) == run_dirs.LOG_KEEP_LINES + 1
        and log[-1] == "line 499"
        and "300 earlier lines cut" in log[0]
    )
    run_dirs.compact_run(d)
    assert sorted(p.name for p in d.iterdir()) == [
        "args.json",
        "bench.json",
        "log.txt",
        "metrics.jsonl",
    ]
    assert (d / "log.txt").read_text().splitlines() == log  # compacting again changes nothing


FAKE = '''
"""A stand-in method script: one metrics row and one checkpoint per step; SIGINT = stop after this step."""
import argparse, json, signal, sys, time
from pathlib import Path
from dataclasses import dataclass
BaseArgs = object  # the runner reads `class Args(BaseArgs)` from the source; nothing is imported

@dataclass
class Args(BaseArgs):
    knob: int = 0
    """a method flag"""

stop_requested = []
signal.signal(signal.SIGINT, lambda *_: stop_requested.append(1))
p = argparse.ArgumentParser()
for name in ("--seed", "--max_steps", "--eval_steps", "--output_dir", "--resume_from_checkpoint", "--knob", "--stop_at", "--sleep"):
    p.add_argument(name)
a, _ = p.parse_known_args()
out = Path(a.output_dir)
out.mkdir(parents=True, exist_ok=True)
ckpts = sorted(out.glob("checkpoint-*"), key=lambda q: int(q.name.split("-")[1]))
start = int(ckpts[-1].name.split("-")[1]) if a.resume_from_checkpoint == "auto" and ckpts else 0
with open(out / "calls.txt", "a") as f:
    f.write(f"resume={a.resume_from_checkpoint} start={start}\\n")
rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()] if start else []
rows = [r for r in rows if r["step"] <= start] or [{"step": 0, "eval_pass@1": 0.1, "gen_tokens": 0}]
stop = int(a.stop_at or 10**9)
for s in range(start + 1, int(a.max_steps) + 1):
    time.sleep(float(a.sleep or 0))
    r = {"step": s, "gen_tokens": 10 * s, "rollouts": s, "time_step_s": 0.01, "time_gen_s": 0.005}
    if s % int(a.eval_steps) == 0 or s == int(a.max_steps):
        r["eval_pass@1"] = 0.1 + 0.01 * s
    rows.append(r)
    (out / f"checkpoint-{s}").mkdir(exist_ok=True)
    (out / f"checkpoint-{s}" / "trainer_state.pt").write_text("x")
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
    if s == stop:
        sys.exit(3)  # a crash
    if stop_requested:
        sys.exit(0)  # graceful stop, like the real scripts
'''


def _fake_sweep(tmp_path, monkeypatch, extra=""):
    script = tmp_path / "fake_method.py"
    script.write_text(FAKE)
    cfgs = (
        configs.Config("fake_a", str(script), ("--knob", "1"), "A"),
        configs.Config("fake_b", str(script), ("--knob", "2"), "B", baseline="fake_a"),
        configs.Config("fake_missing", str(script), ("--no_such_flag", "1"), "M"),
    )
    monkeypatch.setattr(run, "CONFIGS", cfgs)
    monkeypatch.setattr(run, "BY_NAME", {c.name: c for c in cfgs})
    argv = [
        "--runs_dir",
        str(tmp_path / "runs"),
        "--seeds",
        "0",
        "--max_steps",
        "4",
        "--eval_steps",
        "2",
        "--progress_every",
        "0",
        *extra.split(),
    ]
    return argv, tmp_path / "runs"


def test_runner_ctrl_c_stops_gracefully_and_the_same_command_continues(
    tmp_path, monkeypatch, capsys
):
    # 40 steps of 0.2 s: room for the interrupt to land mid-run on a loaded machine
    argv, runs = _fake_sweep(
        tmp_path, monkeypatch, "--only fake_a --max_steps 40 --extra=--sleep=0.2"
    )
    # the runner turns Ctrl-C into KeyboardInterrupt: make sure no earlier in-process code left another handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    d = runs / "fake_a" / "seed0"

    def interrupt_once_running():  # Ctrl-C once the run has written its first step
        for _ in range(400):
            if len(run_dirs.read_rows(d)) >= 2:
                break
            time.sleep(0.025)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_running, daemon=True).start()
    assert run.main(run.parse_args(run.Args, argv), argv) == 0
    out = capsys.readouterr().out
    assert "interrupted" in out and "sweep interrupted" in out
    stopped_at = run_dirs.read_rows(d)[-1]["step"]
    recorded = json.loads((d / "bench.json").read_text())["cmd"]
    assert 1 <= stopped_at < 40 and run_dirs.run_state(d, recorded, 40) == "resume"
    assert run.main(run.parse_args(run.Args, argv), argv) == 0
    assert _calls(d)[-1] == f"resume=auto start={stopped_at}"
    assert [r["step"] for r in run_dirs.read_rows(d)] == list(range(41))


def _calls(d: Path) -> list[str]:
    return (d / "calls.txt").read_text().splitlines()


def test_runner_runs_skips_finished_and_resumes_unfinished(tmp_path, monkeypatch, capsys):
    argv, runs = _fake_sweep(tmp_path, monkeypatch)
    args = run.parse_args(run.Args, argv)
    assert run.main(args, argv) == 0
    out = capsys.readouterr().out
    assert "fake_missing seed0: missing: " in out and "no --no_such_flag" in out
    a, b = runs / "fake_a" / "seed0", runs / "fake_b" / "seed0"
    assert run_dirs.is_finished(run_dirs.read_rows(a), 4) and run_dirs.is_finished(
        run_dirs.read_rows(b), 4
    )
    assert not list(
        a.glob("checkpoint-*")
    )  # finished: checkpoints removed (only metrics are needed)
    assert json.loads((a / "bench.json").read_text())["finished"]
    assert json.loads((runs / "sweep.json").read_text())["invocations"][0]["command"].startswith(
        "python benchmarks/sweep/run.py"
    )

    # second invocation: both finished -> skipped, the fake script is not called again
    assert run.main(args, argv) == 0
    assert "finished, skipped" in capsys.readouterr().out
    assert len(_calls(a)) == 1

    # make fake_b unfinished with a checkpoint at step 2: the runner continues it with --resume_from_checkpoint auto
    _write_rows(b, run_dirs.read_rows(b)[:3])
    (b / "checkpoint-2").mkdir()
    (b / "checkpoint-2" / "trainer_state.pt").write_text("x")
    assert run_dirs.run_state(b, json.loads((b / "bench.json").read_text())["cmd"], 4) == "resume"
    assert run.main(args, argv) == 0
    assert "fake_b seed0: resume from step 2" in capsys.readouterr().out
    assert _calls(b)[-1] == "resume=auto start=2" and len(_calls(a)) == 1
    assert [r["step"] for r in run_dirs.read_rows(b)] == [0, 1, 2, 3, 4]

    # changed budget -> conflict, nothing overwritten
    argv2 = [x if x != "4" else "6" for x in argv]
    assert run.main(run.parse_args(run.Args, argv2), argv2) == 0
    assert capsys.readouterr().out.count("CONFLICT") == 2 and len(_calls(a)) == 1


def test_runner_dry_run_and_failure(tmp_path, monkeypatch, capsys):
    argv, runs = _fake_sweep(tmp_path, monkeypatch, "--dry_run --only fake_a")
    assert run.main(run.parse_args(run.Args, argv), argv) == 0
    out = capsys.readouterr().out
    assert "fake_a seed0: new" in out and "--knob 1" in out and not runs.exists()
    # a run that crashes after step 2: reported as failed (sweep exit code 1), resumable afterwards
    argv, runs = _fake_sweep(tmp_path, monkeypatch, "--only fake_a --extra=--stop_at=2")
    assert run.main(run.parse_args(run.Args, argv), argv) == 1
    d = runs / "fake_a" / "seed0"
    out = capsys.readouterr().out
    assert "FAILED (exit code 3)" in out and "summary: failed 1" in out
    assert run_dirs.run_state(d, json.loads((d / "bench.json").read_text())["cmd"], 4) == "resume"


# ----------------------------------------------------------------------------------------------------
# report: table, tokens to reach the baseline, plots
# ----------------------------------------------------------------------------------------------------


def _fake_run(
    runs: Path,
    cfg: str,
    seed: int,
    evals: dict[int, float],
    tok_per_step: int,
    max_steps: int = 4,
    extra: dict | None = None,
    finished: bool = True,
    levels: bool = False,
    step_s: float = 1.0,
    train_gap: float | None = None,
):
    def at(v):  # held-out pass@1 by difficulty (the newer runs log it): hard v/2, easy (1+v)/2
        out = {"eval_pass@1_hard": v / 2, "eval_pass@1_easy": (1 + v) / 2} if levels else {}
        if (
            train_gap is not None
        ):  # the same evaluation on training-pool prompts (the newer runs log it)
            out["eval_train_pass@1"] = v + train_gap
        return out

    rows = [
        {"step": 0, "eval_pass@1": evals[0], "eval_pass@2": 0.4, "eval_pass@8": 0.5, **at(evals[0])}
    ]
    for s in range(1, max_steps + 1):
        r = {
            "step": s,
            "gen_tokens": tok_per_step * s,
            "rollouts": 4 * s,
            "time_step_s": step_s + (s == 2) * 50,
            "time_gen_s": 0.6,
            "time_train_s": 0.3,
            "frac_zero_var_groups": 0.4,
        }
        if s in evals:
            r.update(
                {"eval_pass@1": evals[s], "eval_pass@2": 0.5, "eval_pass@8": 0.6, **at(evals[s])}
            )
        r.update((extra or {}).get(s, {}))
        rows.append(r)
    if not finished:
        rows = rows[:-1]
    d = runs / cfg / f"seed{seed}"
    _write_rows(d, rows)
    (d / "bench.json").write_text(json.dumps({"cmd": [f"{cfg}.py", "--max_steps", str(max_steps)]}))


def _fake_results(tmp_path) -> Path:
    runs = tmp_path / "runs"
    # baseline RLOO: final pass@1 mean over seeds = (0.30 + 0.34) / 2 = 0.32
    _fake_run(runs, "rloo", 0, {0: 0.2, 2: 0.25, 4: 0.30}, 100, levels=True)
    _fake_run(runs, "rloo", 1, {0: 0.2, 2: 0.27, 4: 0.34}, 100, levels=True)
    # RA-RLOO: seed mean 0.33 at step 2 (>= 0.32) with 2x the tokens per step of RLOO
    post = {s: {"ra_zero_var_frac_post": v} for s, v in zip(range(1, 5), (0.4, 0.2, 0.1, 0.0))}
    _fake_run(runs, "ra_rloo", 0, {0: 0.2, 2: 0.32, 4: 0.36}, 200, extra=post, levels=True)
    _fake_run(runs, "ra_rloo", 1, {0: 0.2, 2: 0.34, 4: 0.40}, 200, extra=post, levels=True)
    _fake_run(
        runs, "ra_rloo", 2, {0: 0.2, 2: 0.30}, 200, finished=False
    )  # unfinished: listed, not counted
    # PPO+PROS never reaches PPO's final
    _fake_run(runs, "ppo", 0, {0: 0.2, 4: 0.5}, 50)
    _fake_run(runs, "ppo_pros", 0, {0: 0.2, 4: 0.4}, 50)
    return runs


def test_report_numbers_on_hand_made_runs(tmp_path):
    runs = _fake_results(tmp_path)
    order, aggs = report.build_aggs(report.load_runs(runs))
    assert order == ["rloo", "ra_rloo", "ppo", "ppo_pros"]  # the harness's config order
    ra, rl = aggs["ra_rloo"], aggs["rloo"]
    assert len(ra.finished) == 2 and len(ra.unfinished) == 1
    assert ra.final[0] == pytest.approx(0.38) and ra.final[1] == pytest.approx(0.02828, abs=1e-4)
    assert rl.final[0] == pytest.approx(0.32) and ra.start == pytest.approx(0.2)
    assert ra.k == rl.k == "8"  # the largest pass@k logged (not @2, not eval_pass@1_hard)
    # RA-RLOO's seed-mean pass@1 is 0.33 at step 2: the first evaluation at or above RLOO's final 0.32
    hit = report.reach(ra.curve, rl.final[0])
    assert hit["step"] == 2 and hit["gen_tokens"] == 400 and hit["rollouts"] == 8
    assert (
        report.reach(rl.curve, rl.final[0])["step"] == 4
    )  # RLOO itself gets there at the end: 400 tokens
    tgt, tok, smp = report.reach_cells(ra, aggs)
    assert (
        tgt.startswith("0.320 (rloo)")
        and tok == "400 (1.00x) @ step 2"
        and smp.startswith("8 (0.50x)")
    )
    assert report.reach_cells(aggs["ppo_pros"], aggs)[1] == "not reached"
    # a baseline that ends below its start: "reaching" its final pass@1 at step 0 is reported as such
    _fake_run(tmp_path / "down", "ppo", 0, {0: 0.3, 4: 0.25}, 50)
    _fake_run(tmp_path / "down", "ppo_pros", 0, {0: 0.3, 4: 0.2}, 50)
    _, down = report.build_aggs(report.load_runs(tmp_path / "down"))
    assert report.reach_cells(down["ppo_pros"], down)[1:] == ("target <= step 0", "-")
    # wall time: step 2 evaluates, so its 51 s (evaluation included) is replaced by gen + train + book-keeping
    walls = report.step_walls(run_dirs.read_rows(runs / "rloo" / "seed0"))
    assert walls[2] == pytest.approx(0.6 + 0.3 + 0.1) and walls[1] == 1.0
    assert ra.step_s == pytest.approx(1.0)
    m = ra.mechanism["ra_zero_var_frac_post"]
    assert (
        m["early"] == pytest.approx(0.4)
        and m["late"] == pytest.approx(0.0)
        and m["mean"] == pytest.approx(0.175)
    )
    assert ra.mechanism["ra_replay_fired_frac"] is None  # not in these rows: shown as "not logged"
    table = report.results_table(order, aggs)
    assert (
        "**0.380** ± 0.028" in table
        and "**0.400** (1 seed)" in table
        and "not reached" in table
        and "`ra_replay_fired_frac` not logged" in table
    )
    assert "2 (+1 unfinished)" in table


def test_paired_t_interval_on_known_numbers(tmp_path):
    iv = report.t_interval([0.01, 0.03, 0.02])
    # mean 0.02, std 0.01, t(0.975, 2 dof) = 4.302653: half-width 4.302653 * 0.01 / sqrt(3)
    assert (
        iv.mean == pytest.approx(0.02)
        and iv.n == 3
        and iv.half == pytest.approx(4.302653 * 0.01 / 3**0.5)
    )
    assert (iv.lo, iv.hi) == (
        pytest.approx(0.02 - 0.024841, abs=1e-6),
        pytest.approx(0.02 + 0.024841, abs=1e-6),
    )
    assert (
        "⚠" not in iv.text() and "⚠" in report.t_interval([0.0, 0.1, 0.05]).text()
    )  # half-width above 0.03
    assert report.t_interval([0.5]).half is None and report.t_interval([]) is None
    # the quantiles are scipy's, and scipy's are the textbook's (t table, F table at 97.5%)
    for dof, table in ((1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042), (120, 1.980)):
        assert (
            report.t975(dof)
            == pytest.approx(stats.t.ppf(0.975, dof), abs=1e-12)
            == pytest.approx(table, abs=6e-4)
        )
    for (dof1, dof2), table in (((4, 4), 9.6045), ((2, 8), 6.0595), ((8, 2), 39.373)):
        assert report.f_quantile(0.975, dof1, dof2) == pytest.approx(
            stats.f.ppf(0.975, dof1, dof2), abs=1e-12
        )
        assert report.f_quantile(0.975, dof1, dof2) == pytest.approx(table, abs=1e-3)
    # the spread ratio's interval: sqrt(ratio / F(dx, dy)) .. sqrt(ratio * F(dy, dx)), the F test's bounds
    xs, ys = [0.1, 0.3, 0.2, 0.5, 0.4], [0.2, 0.25, 0.22]
    ratio = np.var(xs, ddof=1) / np.var(ys, ddof=1)
    got = report.std_ratio_interval(xs, ys)
    assert got == pytest.approx(
        (
            ratio**0.5,
            (ratio / stats.f.ppf(0.975, 4, 2)) ** 0.5,
            (ratio * stats.f.ppf(0.975, 2, 4)) ** 0.5,
        )
    )
    # paired by seed: config minus baseline on the seeds both finished (seed 2 of ra_rloo is unfinished)
    _, aggs = report.build_aggs(report.load_runs(_fake_results(tmp_path)))
    diff = report.paired(aggs, "ra_rloo", "rloo", report.final_value)
    assert diff.n == 2 and diff.mean == pytest.approx(0.06) and diff.half == pytest.approx(0.0)
    hard = report.paired(aggs, "ra_rloo", "rloo", lambda r: report.final_value(r, "hard"))
    assert hard.mean == pytest.approx(0.03)  # hard = pass@1 / 2 in the fake rows
    assert (
        report.paired(aggs, "ppo_pros", "ppo", lambda r: report.final_value(r, "hard")) is None
    )  # not logged


def test_verdict_rules_on_constructed_intervals():
    iv = report.Interval
    greater = lambda m, h, **kw: report.verdict_greater(iv(m, h, 5), 0.03, **kw)  # noqa: E731
    assert greater(0.02, 0.01) == "reproduced"  # [0.01, 0.03] above 0
    assert greater(-0.05, 0.01) == "worse"  # [-0.06, -0.04] below 0
    assert (
        greater(0.014, 0.014) == "no gain as large as 0.03"
    )  # [0.000, 0.028]: not below 0, a 0.03 gain excluded
    assert (
        greater(-0.005, 0.02) == "no gain as large as 0.03"
    )  # [-0.025, 0.015]: neither side of 0 excluded
    assert greater(0.01, 0.03) == "inconclusive"  # [-0.02, 0.04]
    assert report.verdict_greater(iv(0.2, 0.3, 5), 1.0, "1 group") == "no gain as large as 1 group"
    # in order: above 0, below 0 (however small the paper's effect: the sign is resolved); then, for an interval
    # holding 0, the paper's own effect below the margin or below what the seeds resolve: no verdict
    assert (
        greater(0.05, 0.01, paper_effect=0.023) == "reproduced"
    )  # [0.04, 0.06]: above 0, not holding +0.023
    assert (
        report.verdict_greater(iv(0.05, 0.01, 5), 0.03, paper_effect=0.04)
        == "reproduced (the interval holds the paper's +0.04)"
    )
    # RA-RLOO on the paper's metric (pass@4; the paper: +0.023 < m): the 256 pool's cell and the 2,048 pool's
    assert greater(-0.024, 0.023, paper_effect=0.023) == "worse"  # [-0.047, -0.001]
    assert (
        greater(0.046, 0.025, paper_effect=0.023)
        == "reproduced (the interval holds the paper's +0.023)"
    )
    assert (
        greater(0.01, 0.02, paper_effect=0.023) == "cannot resolve at this precision"
    )  # holds 0; 0.023 < m
    assert (
        report.verdict_greater(iv(0.01, 0.05, 5), 0.03, paper_effect=0.04)
        == "cannot resolve at this precision"
    )
    assert (
        report.verdict_greater(iv(0.02, 0.03, 5), 0.03, paper_effect=0.04) == "inconclusive"
    )  # 0.04: resolvable
    assert (
        report.verdict_greater(iv(0.0, 0.02, 5), 0.03, paper_effect=0.04)
        == "no gain as large as 0.03"
    )
    assert report.verdict_greater(iv(0.1, None, 1), 0.03) == "inconclusive (1 seed)"
    assert report.verdict_greater(None, 0.03) == "inconclusive (no runs)"
    not_below = lambda m, h: report.verdict_not_below(iv(m, h, 5), 0.03)  # noqa: E731
    assert not_below(-0.01, 0.015) == "reproduced"  # [-0.025, 0.005]: at most 0.03 worse
    assert not_below(-0.02, 0.025) == "inconclusive"  # [-0.045, 0.005]
    assert not_below(-0.02, 0.015) == "worse"  # [-0.035, -0.005]: below 0
    within = lambda m, h: report.verdict_within(iv(m, h, 5), 0.4, 0.6)  # noqa: E731
    assert within(0.5, 0.05) == "reproduced" and within(0.75, 0.1) == "outside the band"
    assert within(0.58, 0.05) == "inconclusive"
    # every interval-drawn verdict counts in the README's tally; pending and unresolved ones do not
    assert all(
        report.judged(v)
        for v in (
            "reproduced",
            "worse",
            "no gain as large as 0.03",
            "inconclusive",
            "outside the band",
            "reproduced (the interval holds the paper's +0.023)",
        )
    )
    assert not any(
        report.judged(v)
        for v in (
            "cannot resolve at this precision",
            "runs pending (1 seed)",
            "no 2,048-pool config",
        )
    )


def test_fewer_steps_verdict_when_most_seeds_never_reach_the_baseline(tmp_path):
    # PS off ends at 0.30 on every seed; PS (fixed) gets there on seed 2 only: no interval, the count is the verdict
    runs = tmp_path / "runs"
    for seed in range(3):
        _fake_run(runs, "ps_off", seed, {0: 0.2, 2: 0.25, 4: 0.30}, 50)
        _fake_run(runs, "ps_fixed", seed, {0: 0.2, 2: 0.22, 4: 0.31 if seed == 2 else 0.25}, 50)
    _, aggs = report.build_aggs(report.load_runs(runs))
    (row,) = [c for c in report.claim_rows(aggs) if c.claim.startswith("PS (fixed): fewer steps")]
    assert row.verdict == "not reached (1/3 seeds)" and report.judged(row.verdict)
    assert "(reached in 1/3 seeds)" in row.measured


def test_readme_claims_block_shows_scope_effect_and_rules(tmp_path):
    # 256 pool: PPO+PROS +0.001 on PPO (no gain as large as 0.03); 2,048 pool: +0.052 (reproduced)
    _two_regime_runs(tmp_path / "runs")
    _, aggs = report.build_aggs(report.load_runs(tmp_path / "runs"))
    block = report.readme_block(aggs)
    scope, table = block.split("\n\n", 1)
    decided = [
        c for r in report.REGIMES for c in report.claim_rows(aggs, r) if report.judged(c.verdict)
    ]
    assert len(decided) == 4  # PPO+PROS beats PPO and takes PPO's time per step, on both pools
    flat = " ".join(scope.split())
    assert "~1M-parameter model" in flat and "3-3 paired seeds, 95% intervals" in flat
    assert "of 4 verdicts ~0 would flip by chance alone" in " ".join(scope.split())
    assert "(benchmarks/sweep/results/README.md#the-papers-claims-verdicts)" in scope.replace(
        "\n", ""
    )
    (row,) = [ln for ln in table.splitlines() if ln.startswith("| PROS | PPO+PROS beats PPO")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2].startswith("no gain as large as 0.03: +0.001 [") and cells[2].endswith("]")
    assert cells[3].startswith("reproduced: +0.052 [")
    # the conclusion under the table is drawn from these verdicts: it follows them when one changes
    (conclusion,) = [p for p in block.split("\n\n") if p.startswith("In short")]
    conclusion = " ".join(conclusion.split())
    assert conclusion == (
        "In short: mechanisms 2 of 2 reproduced (PROS 2 of 2); outcomes (final pass@1 or pass@4, "
        "steps to the baseline's final pass@1, spread over seeds) 2: reproduced 1 (PPO+PROS beats "
        "PPO, 2,048-prompt pool), no gain as large as the margin 1."
    )
    # no word-problem runs: its column says so, and so does the sentence across the tasks
    assert cells[4] == "runs pending (0 seeds)"
    assert "word-problem sweep has no judged verdict yet" in " ".join(block.split())


def test_readme_claims_block_compares_the_two_tasks(tmp_path):
    # the 256-pool runs stand in for the word-problem task: every verdict judged on both is the same
    _two_regime_runs(tmp_path / "runs")
    _, aggs = report.build_aggs(report.load_runs(tmp_path / "runs"))
    block = report.readme_block(aggs, word=aggs)
    (row,) = [ln for ln in block.splitlines() if ln.startswith("| PROS | PPO+PROS beats PPO")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == cells[2]  # the word-problem cell is read from its own runs
    across = " ".join(block.split("Across tasks")[1].split())
    assert across.startswith("(Countdown's 256-prompt pool against word problems, the 2 claims")
    assert "the same verdict on 2" in across and "opposite verdicts 0" in across


def _pros_runs(runs: Path, gain: float, seeds=(0, 1, 2)):
    for seed in seeds:
        base = 0.30 + 0.01 * seed
        calib = {s: {"pros_calib_error": 0.4 - 0.1 * s + 0.01 * seed} for s in range(1, 5)}
        _fake_run(runs, "ppo", seed, {0: 0.2, 4: base}, 50)
        _fake_run(
            runs,
            "ppo_pros",
            seed,
            {0: 0.2, 4: base + gain + 0.002 * seed},
            50,
            extra=calib,
            step_s=1.02,
        )
        _fake_run(runs, "ppo_pros_random", seed, {0: 0.2, 4: base + gain - 0.01}, 50, step_s=1.5)


def test_claim_verdicts_on_constructed_runs(tmp_path):
    _pros_runs(tmp_path / "up", gain=0.05)
    _, aggs = report.build_aggs(report.load_runs(tmp_path / "up"))
    rows = {c.claim: c for c in report.claim_rows(aggs)}
    assert rows["PPO+PROS beats PPO (final pass@1)"].verdict == "reproduced"
    assert "+0.052 [" in rows["PPO+PROS beats PPO (final pass@1)"].measured
    assert rows["GRPO+PROS beats GRPO (final pass@1)"].verdict == "runs pending (0 seeds)"
    assert rows["Bayesian selection beats random selection (final pass@1)"].verdict == "reproduced"
    calib = [c for c in rows.values() if c.claim.startswith("The pass-rate model's calibration")][0]
    assert (
        calib.verdict == "reproduced"
    )  # 0.3 lower in the last quarter than in the first, every seed
    times = [c for c in rows.values() if "time per step of `ppo`" in c.claim][0]
    assert times.verdict == "reproduced" and "1.02" in times.measured  # 1.02 s vs 1.00 s per step
    # every paper has its lines; configs without runs say so
    assert {c.paper for c in rows.values()} == {
        "RA-RLOO",
        "Prefix Sampling",
        "Reinforce-Ada",
        "PROS",
    }
    assert (
        rows["Lower seed-to-seed spread of final pass@1 than RLOO"].verdict
        == "runs pending (0 seeds)"
    )
    # no gain: the interval excludes +0.03 but not 0 -> no gain as large as 0.03; 1 seed -> runs pending
    _pros_runs(tmp_path / "flat", gain=0.0)
    _, aggs = report.build_aggs(report.load_runs(tmp_path / "flat"))
    assert [c.verdict for c in report.claim_rows(aggs) if c.claim.startswith("PPO+PROS beats")] == [
        "no gain as large as 0.03"
    ]
    _pros_runs(tmp_path / "one", gain=0.05, seeds=(0,))
    _, aggs = report.build_aggs(report.load_runs(tmp_path / "one"))
    assert [c.verdict for c in report.claim_rows(aggs) if c.claim.startswith("PPO+PROS beats")] == [
        "runs pending (1 seed)"
    ]


def test_ra_rloo_claim_on_groups_without_a_success(tmp_path):
    # the paper's degenerate groups (no reward-1 rollout) are judged on ra_no_success_frac_post; the strict
    # zero-variance fraction (all-pass groups included) keeps its own line; runs without the metric are left out
    runs = tmp_path / "runs"
    for seed in range(3):
        post = {
            s: {"ra_no_success_frac_post": 0.01 * seed, "ra_zero_var_frac_post": 0.15}
            for s in range(1, 5)
        }
        post[4]["eval_paper_pass@4"] = (
            0.55 + 0.01 * seed
        )  # the paper's metric, logged with the final evaluation
        _fake_run(runs, "ra_rloo", seed, {0: 0.2, 4: 0.3 + 0.01 * seed}, 50, extra=post)
        rloo = {s: {"ra_no_success_frac_post": 0.6} for s in range(1, 5)}
        rloo[4]["eval_paper_pass@4"] = 0.50 + 0.01 * seed
        _fake_run(runs, "rloo", seed, {0: 0.2, 4: 0.3}, 50, extra=rloo)
    _fake_run(runs, "ra_rloo", 3, {0: 0.2, 4: 0.3}, 50)  # an older run: no such metric
    _, aggs = report.build_aggs(report.load_runs(runs))
    rows = [c for c in report.claim_rows(aggs) if c.paper == "RA-RLOO"]
    assert rows[0].claim.startswith("Splicing leaves no group without a success")
    assert (
        rows[0].verdict == "reproduced"
        and "(3 seeds log it)" in rows[0].measured
        and "0.600" in rows[0].measured
    )
    assert rows[1].claim.startswith(
        "Splicing stored successes leaves about no zero-variance groups"
    )
    assert rows[1].verdict == "outside the band"
    beats = {c.claim.split(" (")[0]: c for c in rows if c.claim.startswith("RA-RLOO beats RLOO")}
    assert (
        beats["RA-RLOO beats RLOO"].verdict == "inconclusive"
    )  # +0.01 [-0.015, +0.035]: neither side of 0.03
    paper4 = [c for c in rows if "paper's metric" in c.claim][0]
    # +0.05 every seed: above 0, so reproduced although the paper's +0.023 is below the 0.03 margin
    assert paper4.verdict == "reproduced" and "+0.050" in paper4.measured
    assert paper4.effect.startswith("+0.050 [")


def test_ada_sample_allocation_claims_compare_hard_with_mid(tmp_path):
    # SEQ-BALANCE gives both ends the full budget (hard: no success; easy: no failures for its balanced exit); the
    # paper claims hard > mid for both SEQ variants, and SEQ-BALANCE's easy > mid (it collects failure cases)
    runs = tmp_path / "runs"
    for seed in range(3):
        for name, easy, mid, hard in (
            ("seq_pos", 8.0, 12.0, 28.0),
            ("seq_balance", 31.5, 17.0, 31.0),
        ):
            per = {
                s: {
                    "ada_samples_per_prompt_easy": easy,
                    "ada_samples_per_prompt_mid": mid + 0.1 * seed,
                    "ada_samples_per_prompt_hard": hard,
                    "ada_samples_per_prompt_mean": mid,
                }
                for s in range(1, 5)
            }
            _fake_run(runs, name, seed, {0: 0.2, 4: 0.3}, 50, extra=per)
    _, aggs = report.build_aggs(report.load_runs(runs))
    rows = {c.claim: c for c in report.claim_rows(aggs)}
    pos = rows["SEQ-POS draws more samples for hard prompts than for mid-difficulty ones"]
    assert pos.verdict == "reproduced" and "hard - mid samples per prompt +15.90" in pos.measured
    bal = rows["SEQ-BALANCE draws more samples for hard prompts than for mid-difficulty ones"]
    assert bal.verdict == "reproduced" and "+13.90" in bal.measured
    easy = [
        c
        for c in rows.values()
        if c.claim.startswith("SEQ-BALANCE also draws more samples for easy")
    ][0]
    assert easy.verdict == "reproduced" and "easy - mid samples per prompt +14.40" in easy.measured
    # a balanced run whose hard prompts got no more than its mid ones: the claim fails
    for seed in range(3):
        per = {
            s: {
                "ada_samples_per_prompt_easy": 31.5,
                "ada_samples_per_prompt_mid": 17.0 + 0.1 * seed,
                "ada_samples_per_prompt_hard": 12.0,
            }
            for s in range(1, 5)
        }
        _fake_run(tmp_path / "flat", "seq_balance", seed, {0: 0.2, 4: 0.3}, 50, extra=per)
    _, aggs = report.build_aggs(report.load_runs(tmp_path / "flat"))
    rows = {c.claim: c for c in report.claim_rows(aggs)}
    assert (
        rows["SEQ-BALANCE draws more samples for hard prompts than for mid-difficulty ones"].verdict
        == "worse"
    )


def test_tokens_to_reach_the_baseline(tmp_path):
    curve = [
        {"step": 0, "pass1": 0.2, "gen_tokens": 0},
        {"step": 2, "pass1": 0.3, "gen_tokens": 400},
        {"step": 4, "pass1": 0.4, "gen_tokens": 800},
    ]
    assert report.cost_to_reach(curve, 0.35) == pytest.approx(
        600
    )  # halfway between the evaluations
    assert report.cost_to_reach(curve, 0.35, "step") == pytest.approx(3)
    assert report.cost_to_reach(curve, 0.3) == 400 and report.cost_to_reach(curve, 0.1) == 0.0
    assert report.cost_to_reach(curve, 0.5) is None
    # RLOO's final seed mean is 0.32. RLOO seed 0 never reaches it (denominator: its final spend, 400 tokens, step 4);
    # seed 1 crosses it between 0.27 (200 tokens) and 0.34 (400): 200 + 200 * 5/7 tokens, step 2 + 2 * 5/7.
    # RA-RLOO seed 0 hits 0.32 at step 2 (400 tokens); seed 1 between 0.20 (0 tokens) and 0.34 (400): 400 * 12/14.
    order, aggs = report.build_aggs(report.load_runs(_fake_results(tmp_path)))
    iv, reached, seeds = report.reach_ratios(aggs, "ra_rloo")
    assert (reached, seeds) == (2, 2)
    assert iv.mean == pytest.approx((400 / 400 + 400 * 12 / 14 / (200 + 200 * 5 / 7)) / 2)
    steps, _, _ = report.reach_ratios(aggs, "ra_rloo", "step")
    assert steps.mean == pytest.approx((2 / 4 + 2 * 12 / 14 / (2 + 2 * 5 / 7)) / 2)
    assert report.reach_ratios(aggs, "ppo_pros") == (None, 0, 1)  # never reaches PPO's final 0.5
    table = report.difference_table(order, aggs)
    row = [line for line in table.splitlines() if "(`ra_rloo`)" in line][0]
    assert "| `rloo` | 2 |" in row and "+0.060 [+0.060, +0.060] ±0.000" in row and "(2/2)" in row
    assert "0.190 ± 0.014" in row  # hard: 0.38 / 2 mean, std of (0.18, 0.20)
    assert "(0/1)" in [line for line in table.splitlines() if "(`ppo_pros`)" in line][0]


def test_pass1_at_equal_generated_tokens(tmp_path):
    curve = [
        {"step": 0, "pass1": 0.2, "gen_tokens": 0},
        {"step": 2, "pass1": 0.3, "gen_tokens": 400},
    ]
    assert report.value_at(curve, 100) == pytest.approx(0.225) and report.value_at(curve, 0) == 0.2
    assert report.value_at(curve, 500) is None
    # RLOO spends 400 tokens in 4 steps, RA-RLOO 800: both are read at 400 tokens, RA-RLOO's step 2 (0.32, 0.34)
    # against RLOO's step 4 (0.30, 0.34), so the per-seed differences are +0.02 and 0.00
    order, aggs = report.build_aggs(report.load_runs(_fake_results(tmp_path)))
    iv = report.equal_tokens_diffs(aggs, "ra_rloo")
    assert iv.n == 2 and iv.mean == pytest.approx(0.01)
    assert report.equal_tokens_diffs(aggs, "ppo_pros").mean == pytest.approx(
        -0.1
    )  # same tokens: 0.4 - 0.5
    assert (
        report.equal_tokens_diffs(aggs, "rloo") is None
    )  # a baseline has nothing to be compared with
    row = [
        line for line in report.difference_table(order, aggs).splitlines() if "(`ra_rloo`)" in line
    ][0]
    assert "+0.010 [" in row


def test_seeds_needed_for_the_target_width():
    values = [0.0, 0.05, -0.05, 0.1, -0.1]  # sd 0.0791: 1.96 * 0.0791 / 0.03 = 5.17, squared 26.7
    assert report.seeds_for(report.t_interval(values)) == 27
    assert (
        report.seeds_for(report.t_interval([0.0, 0.001, -0.001])) == 3
    )  # already narrow: the seeds it has
    assert report.seeds_for(report.t_interval([0.5])) is None


def test_report_page_without_plots(tmp_path):
    runs = _fake_results(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "commentary.md").write_text("Hand-written note.\n")
    page = report.write_report(runs, tmp_path / "out", plots=False).read_text()
    assert "| RA-RLOO (`ra_rloo`)" in page and "Hand-written note." in page
    assert "`ra_rloo` seed 2: at step 3/4" in page and not list((tmp_path / "out").glob("*.png"))
    # the claims with a row per pool, the per-config table of both pools, the mechanism tables with the floor note
    assert "| RA-RLOO beats RLOO (final held-out pass@1) | 256 | **reproduced** |" in page
    assert "| ″ | 2,048 | **runs pending (0 seeds)** | `ra_rloo_pool2048` 0 finished seeds;" in page
    assert "| RA-RLOO (`ra_rloo`) | 2 | 0.380 ± 0.028 | - | runs pending (0 seeds) |" in page
    assert "`pros_calib_excess` subtracts that floor" in page


def test_report_writes_the_plots(tmp_path):
    pytest.importorskip(
        "matplotlib",
        reason="matplotlib (requirements.txt) is not installed; the plots "
        "are not tested without it",
    )
    runs = _fake_results(tmp_path)
    page = report.write_report(runs, tmp_path / "out", plots=True).read_text()
    for name in (
        "pass1_vs_tokens.png",
        "pass1_vs_wall.png",
        "zero_var.png",
        "mechanisms.png",
        "pass1_by_difficulty.png",
    ):
        png = tmp_path / "out" / name
        assert (
            png.exists()
            and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            and png.stat().st_size > 5000
        )
        assert f"]({name})" in page


# ----------------------------------------------------------------------------------------------------
# report: the two data regimes (256 / 2,048-prompt pool), the train - held-out gap, the docs' figures
# ----------------------------------------------------------------------------------------------------


def _two_regime_runs(
    runs: Path, seeds256=(0, 1, 2), seeds2048=(0, 1, 2), base2048=None, extra=None
):
    # 256 pool: PPO+PROS about equal to PPO (+0.001 on average), training prompts 0.10 / 0.12-0.14 above held-out;
    # 2,048 pool: PPO+PROS 0.052 above PPO on average, gaps 0.02 / 0.03. Step 2 evaluates too, with another
    # training-prompt score, so that only the final evaluation gives the gap.
    mid = {2: {"eval_train_pass@1": 0.9}}
    for seed in seeds256:
        base = 0.30 + 0.01 * seed
        _fake_run(runs, "ppo", seed, {0: 0.2, 2: 0.25, 4: base}, 50, train_gap=0.10, extra=mid)
        _fake_run(
            runs,
            "ppo_pros",
            seed,
            {0: 0.2, 2: 0.25, 4: base + 0.001 * seed},
            50,
            train_gap=0.12 + 0.01 * seed,
            extra={**mid, **(extra or {}).get("ppo_pros", {})},
        )
    for seed in seeds2048:
        _fake_run(
            runs,
            "ppo_pros_pool2048",
            seed,
            {0: 0.2, 4: 0.38 + 0.012 * seed},
            50,
            train_gap=0.03,
            extra=(extra or {}).get("ppo_pros_pool2048"),
        )
    for seed in seeds2048 if base2048 is None else base2048:
        _fake_run(runs, "ppo_pool2048", seed, {0: 0.2, 4: 0.33 + 0.01 * seed}, 50, train_gap=0.02)


def _claim(rows, regime: str, text: str):
    (row,) = [c for c in rows if c.regime == regime and c.claim == text]
    return row


def test_each_claim_has_a_row_per_regime_on_the_twin_configs(tmp_path):
    _two_regime_runs(tmp_path / "runs")
    _, aggs = report.build_aggs(report.load_runs(tmp_path / "runs"))
    small, large = (report.claim_rows(aggs, r) for r in report.REGIMES)
    assert [c.claim for c in small] == [c.claim for c in large] == [s.claim for s in report.CLAIMS]
    beats = "PPO+PROS beats PPO (final pass@1)"
    row256, row2048 = _claim(small, "256", beats), _claim(large, "2,048", beats)
    assert row256.configs == ("ppo_pros", "ppo") and row2048.configs == (
        "ppo_pros_pool2048",
        "ppo_pool2048",
    )
    assert (
        row256.verdict == "no gain as large as 0.03"
        and "`ppo_pros` - `ppo`: +0.001 [" in row256.measured
    )
    assert (
        row2048.verdict == "reproduced"
        and "`ppo_pros_pool2048` - `ppo_pool2048`: +0.052 [" in row2048.measured
    )
    # EST's claim reads the harness's own EST / GRPO-n8 twins on the 2,048 pool
    assert _claim(
        large, "2,048", "EST beats GRPO-n8, the same inference budget (final pass@1)"
    ).verdict.startswith("runs pending")
    assert (
        "est_pool2048" in report.POOL2048.name("est")
        and report.POOL256.name("ppo_pros_visit") is None
    )
    # a config without a 2,048-pool twin: the row says so
    fixed = _claim(
        large,
        "2,048",
        "PS (fixed): more valid (trained) tasks per batch than the baseline",
    )
    assert fixed.verdict == "no 2,048-pool config" and "`ps_fixed`" in fixed.measured
    # on the page: the 256 row, then the 2,048 row of the same claim
    page = report.claims_table(aggs).splitlines()
    i = next(
        k
        for k, line in enumerate(page)
        if line.startswith(f"| {beats} | 256 | **no gain as large as 0.03** |")
    )
    assert page[i + 1].startswith(
        "| ″ | 2,048 | **reproduced** | final pass@1 `ppo_pros_pool2048` - `ppo_pool2048`"
    )


def test_runs_pending_under_two_paired_seeds(tmp_path):
    # 2,048 pool: PPO+PROS on seeds 0-1, PPO on seeds 1-2: one paired seed, so no figure yet
    _two_regime_runs(tmp_path / "runs", seeds2048=(0, 1), base2048=(1, 2))
    _, aggs = report.build_aggs(report.load_runs(tmp_path / "runs"))
    beats = "PPO+PROS beats PPO (final pass@1)"
    row = _claim(report.claim_rows(aggs, report.POOL2048), "2,048", beats)
    assert row.verdict == "runs pending (1 seed)" and row.seeds == 1
    assert row.measured == "`ppo_pros_pool2048` 2 finished seeds; `ppo_pool2048` 2 finished seeds"
    assert (
        _claim(report.claim_rows(aggs), "256", beats).verdict == "no gain as large as 0.03"
    )  # 3 paired seeds
    page = report.claims_table(aggs).splitlines()
    i = next(k for k, line in enumerate(page) if line.startswith(f"| {beats} | 256 |"))
    assert page[i + 1].startswith(
        "| ″ | 2,048 | **runs pending (1 seed)** | `ppo_pros_pool2048` 2 finished seeds;"
    )
    # no 2,048-pool runs at all: 0 seeds, also in the per-config table
    _two_regime_runs(tmp_path / "none", seeds2048=())
    order, aggs = report.build_aggs(report.load_runs(tmp_path / "none"))
    assert (
        _claim(report.claim_rows(aggs, report.POOL2048), "2,048", beats).verdict
        == "runs pending (0 seeds)"
    )
    (ppo,) = [
        ln for ln in report.regime_table(order, aggs).splitlines() if ln.startswith("| PPO (`ppo`)")
    ]
    assert (
        ppo.count("runs pending (0 seeds)") == 2
    )  # the 2,048 pool's seeds and the pool's paired effect


def test_train_minus_heldout_gap_at_the_final_evaluation(tmp_path):
    runs = tmp_path / "runs"
    _two_regime_runs(runs)
    _fake_run(
        runs, "ppo_pros_random", 0, {0: 0.2, 4: 0.3}, 50
    )  # a run made before eval_train_pass@1 was logged
    order, aggs = report.build_aggs(report.load_runs(runs))
    assert report.final_gaps(aggs["ppo_pros"]) == pytest.approx(
        [0.12, 0.13, 0.14]
    )  # step 2's 0.9 left out
    assert report.gap_cell(aggs, "ppo_pros") == "`ppo_pros` +0.130 (3)"
    assert report.gap_cell(aggs, "ppo_pros_random") == "`ppo_pros_random` -"
    steps, train, n = report.train_curve(aggs["ppo"].finished)
    assert (
        steps == [0, 2, 4]
        and n == 3
        and train[1] == pytest.approx(0.9)
        and train[2] == pytest.approx(0.41)
    )
    page = report.claims_table(aggs).splitlines()
    beats = [ln for ln in page if ln.startswith("| PPO+PROS beats PPO")][0]
    assert beats.endswith("| `ppo_pros` +0.130 (3) | `ppo` +0.100 (3) |")
    assert page[page.index(beats) + 1].endswith(
        "| `ppo_pros_pool2048` +0.030 (3) | `ppo_pool2048` +0.020 (3) |"
    )
    random = [ln for ln in page if ln.startswith("| Bayesian selection beats random")][0]
    assert random.endswith("| `ppo_pros` +0.130 (3) | `ppo_pros_random` - |")
    # the per-config table: both pools' gaps, and the pool's own effect paired by seed (+0.08 + 0.001 x seed)
    (row,) = [
        ln
        for ln in report.regime_table(order, aggs).splitlines()
        if ln.startswith("| PPO+PROS (`ppo_pros`)")
    ]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["3", "0.311 ± 0.011", "+0.130 (3)"] and cells[4:7] == [
        "3",
        "0.392 ± 0.012",
        "+0.030 (3)",
    ]
    assert cells[7].startswith("+0.081 [") and cells[7].endswith("(3)")


def test_mechanism_tables_and_the_calibration_floor(tmp_path):
    # E|p - Bin(4, p)/4|: 0.1875 at p 0.5, 0.20736 at p 0.4, 0 where the outcome is certain
    assert report.binomial_abs_floor(0.5) == pytest.approx(0.1875)
    assert report.binomial_abs_floor(0.4) == pytest.approx(0.20736)
    assert report.binomial_abs_floor(0.0) == report.binomial_abs_floor(1.0) == 0
    pros = {
        s: {"pros_calib_error": 0.3, "pros_calib_excess": 0.05 - 0.01 * (s > 2)}
        for s in range(1, 5)
    }
    pooled = {
        s: {"pros_calib_error": 0.2, "pros_calib_excess": 0.01, "pros_pick_root_frac": 0.25}
        for s in range(1, 5)
    }
    _two_regime_runs(tmp_path / "runs", extra={"ppo_pros": pros, "ppo_pros_pool2048": pooled})
    order, aggs = report.build_aggs(report.load_runs(tmp_path / "runs"))
    text = report.mechanism_tables(order, aggs)
    lines = text.splitlines()
    (small,) = [ln for ln in lines if ln.startswith("| `ppo_pros` | 256 |")]
    assert small.startswith(
        "| `ppo_pros` | 256 | 3/3 | 0.3 (0.3 → 0.3) | 0.045 (0.05 → 0.04) | - |"
    )
    (large,) = [ln for ln in lines if ln.startswith("| `ppo_pros_pool2048` | 2,048 |")]
    assert large.startswith(
        "| `ppo_pros_pool2048` | 2,048 | 3/3 | 0.2 (0.2 → 0.2) | 0.01 (0.01 → 0.01) |"
    )
    assert large.endswith("| 0.25 (0.25 → 0.25) |")
    assert not [ln for ln in lines if ln.startswith("| `ppo`")]  # PROS off logs none of them
    assert (
        "0.19-0.21 for p in 0.4-0.5" in text and "`pros_calib_excess` subtracts that floor" in text
    )
    # the calibration claim reports the excess beside the error
    calib = [
        c
        for c in report.claim_rows(aggs)
        if c.claim.startswith("The pass-rate model's calibration")
    ][0]
    assert "`pros_calib_excess` +0.050 [" in calib.measured and "(3 seeds log it)" in calib.measured


def test_report_writes_the_docs_figures(tmp_path):
    pytest.importorskip(
        "matplotlib",
        reason="matplotlib (requirements.txt) is not installed; the plots "
        "are not tested without it",
    )
    runs = tmp_path / "runs"
    _two_regime_runs(runs)
    figures = tmp_path / "docs" / "figures"
    page = report.write_report(runs, tmp_path / "out", plots=True, figures_dir=figures).read_text()
    assert set(report.DOC_FIGURES) == {"ra_rloo", "ps_grpo", "pros_ppo", "ada_seq", "ada_est"}
    for script in report.DOC_FIGURES:
        png = figures / f"{script}.png"
        assert (
            png.exists()
            and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            and png.stat().st_size > 5000
        )
        assert f"](../docs/figures/{script}.png)" in page
    # a report on other runs into another --out_dir leaves the docs' figures alone: they go under that out_dir
    report.main(report.Args(runs_dir=str(runs), out_dir=str(tmp_path / "other")))
    assert sorted(p.name for p in (tmp_path / "other" / "figures").glob("*.png")) == sorted(
        f"{s}.png" for s in report.DOC_FIGURES
    )


def test_both_report_commands_write_the_same_page(tmp_path):
    # `python benchmarks/sweep/report.py` and `python -m benchmarks.sweep.report` take the same flags
    runs = _fake_results(tmp_path)
    pages = []
    for command in (["benchmarks/sweep/report.py"], ["-m", "benchmarks.sweep.report"]):
        out = tmp_path / "out"  # the same folder: the page names it
        subprocess.run(
            [
                sys.executable,
                *command,
                "--runs_dir",
                str(runs),
                "--out_dir",
                str(out),
                "--plots",
                "false",
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        pages.append(
            (out / "README.md").read_text().split("\n", 3)[3]
        )  # less the "Generated ... on <time>" line
    assert pages[0] == pages[1] and "| RA-RLOO (`ra_rloo`)" in pages[0]
    with pytest.raises(SystemExit, match="--runs_dir .*none: does not exist"):
        report.cli(["--runs_dir", str(tmp_path / "none")])


def test_modules_do_not_import_matplotlib_or_torch_at_import_time():
    code = (
        "import sys; import benchmarks.sweep.run, benchmarks.sweep.report, benchmarks.speed.floor; "
        "bad = [m for m in ('matplotlib', 'torch') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ----------------------------------------------------------------------------------------------------
# floor: the breakdown arithmetic
# ----------------------------------------------------------------------------------------------------


def test_floor_breakdown_parts_sum_to_the_script_step():
    res = {
        "floor": {"gen": 0.5, "update": 0.1, "tokens": 100},
        "ours": {"gen": 0.6, "score": 0.1, "verify": 0.1, "update": 0.2, "tokens": 100},
        "script": {"step": 1.5, "gen": 1.0, "train": 0.3},
    }
    bd = floor.breakdown(res)
    assert bd["floor_total"] == pytest.approx(0.6) and bd["script_ratio"] == pytest.approx(2.5)
    parts = bd["script_parts"]
    assert sum(parts.values()) == pytest.approx(1.5)
    assert parts["generation"] == pytest.approx(0.75) and parts["log-prob passes"] == pytest.approx(
        0.125
    )
    assert parts["bookkeeping"] == pytest.approx(0.2 + 0.125) and parts["update"] == pytest.approx(
        0.3
    )
    md = floor.render(floor.Args(), {**res, "params": 1e6}, bd)
    assert "2.50x floor" in md
    # a script that skips the sampling log-prob pass: none of its step is attributed to it
    res["script"]["scores"] = False
    bd = floor.breakdown(res)
    assert bd["script_parts"]["log-prob passes"] == 0.0 and sum(
        bd["script_parts"].values()
    ) == pytest.approx(1.5)
    assert bd["script_parts"]["generation"] == pytest.approx(1.0 * 0.6 / 0.7)
    assert bd["components_total"] == pytest.approx(0.9)
    assert "skipped by the script" in floor.render(floor.Args(), {**res, "params": 1e6}, bd)


def test_gibbs_speed_reports_the_fraction_of_a_step(tmp_path, capsys):
    from benchmarks.speed import gibbs_speed

    parent, s, n = gibbs_speed.synthetic_pool(50, 4, __import__("numpy").random.default_rng(0))
    assert (
        len(parent) == 50
        and (parent[:10] == -1).all()
        and (parent[10:] >= 0).all()
        and (parent[10:] < 10).all()
    )
    assert ((s >= 0) & (s <= n)).all()
    _write_rows(
        tmp_path,
        [
            {"step": 1, "time_step_s": 2.0},
            {"step": 2, "time_step_s": 4.0},
            {"step": 3, "time_step_s": 3.0},
        ],
    )
    out = gibbs_speed.main(
        gibbs_speed.Args(nodes=50, repeats=3, metrics=str(tmp_path / "metrics.jsonl"))
    )
    assert out["step_s"] == 3.0 and out["fraction"] == pytest.approx(out["gibbs_update_s"] / 3.0)
    assert "% of a step" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--metrics"):
        gibbs_speed.main(
            gibbs_speed.Args(nodes=50, repeats=1, metrics=str(tmp_path / "nope.jsonl"))
        )


def test_memory_table_arithmetic():
    from benchmarks.speed import memory_table as mt

    gib = 2**30
    # 7B, DDP: 16 bytes per trained parameter (fp32 weights, grads, 2 Adam moments) + a bf16 reference (2 bytes)
    assert mt.state_gib(7.616e9, 0, 1, False, False, False) == pytest.approx(18 * 7.616e9 / gib)
    # FSDP shards the policy and the reference, not the vLLM copy; DDP's per-GPU figure does not depend on GPUs
    assert mt.state_gib(7.616e9, 0, 8, True, False, True) == pytest.approx(
        (18 * 7.616e9 / 8 + 2 * 7.616e9) / gib
    )
    assert mt.state_gib(1e9, 0, 8, False, False, False) == mt.state_gib(
        1e9, 0, 1, False, False, False
    )
    # under DDP the reference keeps its embedding and norms in fp32 (2 more bytes each); FSDP shards a bf16 one
    fp32 = mt.reference_fp32_params(3584, 28, 152064)
    assert fp32 == 152064 * 3584 + 3584 * 57
    assert mt.state_gib(7.616e9, 0, 1, False, False, False, fp32) == pytest.approx(
        (18 * 7.616e9 + 2 * fp32) / gib
    )
    assert mt.state_gib(7.616e9, 0, 8, True, False, False, fp32) == pytest.approx(
        18 * 7.616e9 / 8 / gib
    )
    # LoRA: frozen bf16 base (2 bytes) + 16 bytes per adapter parameter, no second copy for the reference
    assert mt.state_gib(1e9, 1e7, 1, False, True, False) == pytest.approx((2e9 + 16e7) / gib)
    assert mt.activation_mib_per_1k_tokens(1000, 10, True) < mt.activation_mib_per_1k_tokens(
        1000, 10, False
    )
    # PPO's critic: the backbone (an untied head left out) + a scalar head, 16 bytes per parameter, sharded by FSDP
    critic = mt.critic_params(7.616e9, 3584, 152064, False)
    assert (
        critic == 7.616e9 - 152064 * 3584 + 3584 + 1
        and mt.critic_params(1e9, 10, 100, True) == 1e9 + 11
    )
    assert (
        mt.critic_gib(critic, 8, True)
        == pytest.approx(16 * critic / 8 / gib)
        == mt.critic_gib(critic, 1, False) / 8
    )
    # its scoring pass: FSDP holds one root (embedding + untied head + final norm) and one layer in bf16; DDP the
    # autocast's bf16 copies of the policy and the critic (with LoRA: of the adapters and the critic)
    root = 2 * 152064 * 3584 + 3584
    assert mt.scoring_gib(
        7.616e9, 3584, 28, 152064, False, 4e7, critic, True, False
    ) == pytest.approx(2 * (root + (7.616e9 - root) / 28) / gib)
    assert mt.scoring_gib(1e9, 10, 2, 100, True, 1e7, 9e8, False, False) == pytest.approx(
        2 * (1e9 + 9e8) / gib
    )
    assert mt.scoring_gib(1e9, 10, 2, 100, True, 1e7, 9e8, False, True) == pytest.approx(
        2 * (1e7 + 9e8) / gib
    )
    table, lines = mt.table(), mt.gathers().splitlines()
    assert (
        "Qwen2.5-7B" in table
        and table.count("\n") == 1 + 3 * 3
        and table.splitlines()[2].count("|") == 8
    )
    # one line per script (after the heading): the policy gathered whole for HF generation, 2 bytes per parameter
    assert [line.split(":")[0] for line in lines[1:]] == [
        f"- {script}" for script, *_ in mt.GATHERS
    ]
    assert {script for script, *_ in mt.GATHERS} == {
        "ra_rloo.py",
        "ada_seq.py",
        "ada_est.py",
        "ps_grpo.py",
        "pros_ppo.py",
    }
    assert all(f"{2 * 7.616e9 / gib:.1f} GiB; --use_vllm: none" in line for line in lines[1:])
    # the log-prob step: the fp32 hidden state and target per token now, 4 x V (8 x V with the entropy) before; the
    # chunk is common/rl/logprobs.py's, and --measure's saved-tensor figures agree with the formula
    from common.rl.logprobs import CHUNK_TOKENS

    assert mt.CHUNK_TOKENS == CHUNK_TOKENS
    assert mt.logprob_kept_per_token(3584, 152064, True, False) == 4 * 3584 + 8
    before = [mt.logprob_kept_per_token(3584, 152064, entropy, True) for entropy in (False, True)]
    assert before == [4 * 152064, 8 * 152064]
    for name, _, hidden, _, _, vocab, _ in mt.MODELS:
        for key, value in mt.measured()[name].items():
            formula = mt.logprob_kept_per_token(
                hidden, vocab, key.endswith("entropy"), key.startswith("before")
            )
            assert abs(value - formula) <= 16, (name, key)
    logprob = mt.logprob_table().splitlines()
    assert len(logprob) == 2 + len(mt.MODELS) and all(row.count("|") == 7 for row in logprob)


def test_packing_benchmark_times_both_layouts(tiny_base):
    from benchmarks.speed import packing

    rows = packing.main(
        packing.Args(
            caps="16",
            row_tokens="64",
            sequences=6,
            repeats=1,
            num_threads=1,
            model_name_or_path=tiny_base,
        )
    )
    padded, packed = rows
    assert padded["layout"] == "padded" and packed["layout"] == "packed, rows of 64"
    assert (
        packed["computed_tokens"] < padded["computed_tokens"]
        and padded["seconds"] > 0
        and packed["seconds"] > 0
    )


def test_the_measured_default_run_heads_the_durations_block(tmp_path):
    from benchmarks.speed import default_run
    from benchmarks.sweep.report import docs_blocks

    rows = [
        {"step": 0, "eval_pass@1": 0.2, "eval_pass@8": 0.5, "num_threads": 2},
        *({"step": s, "loss": 0.1, "num_threads": 2} for s in range(1, 300)),
        {"step": 300, "eval_pass@1": 0.29, "eval_pass@8": 0.66, "num_threads": 2},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = default_run.summarize(tmp_path / "metrics.jsonl", 301.4, "python ra_rloo.py")
    assert record["k"] == 8 and record["steps"] == 300 and record["num_threads"] == [2]
    assert record["first"]["eval_pass@1"] == 0.2 and record["last"]["eval_pass@8"] == 0.66
    line = " ".join(docs_blocks.measured_default_line(record).split())
    assert "`python ra_rloo.py` (RA-RLOO, 300 steps): **5 min 01 s** measured" in line
    assert "held-out pass@1 0.200 -> 0.290, pass@8 0.500 -> 0.660" in line
