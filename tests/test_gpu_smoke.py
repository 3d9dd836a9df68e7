"""benchmarks/gpu/smoke.py's control of its own time: a budget that fits nothing writes a report and stops cleanly, a
SIGTERM ends the whole command (not only the running script) with its results written, the budget timer stops a
running script; its warm start trains and caches; its small pieces of arithmetic. The full command at CPU size runs
in tests/test_gpu_smoke_image.py."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

from benchmarks.gpu import budget as gpu_budget
from benchmarks.gpu import learning as gpu_learning
from benchmarks.gpu import plain as gpu_plain
from benchmarks.gpu import report as gpu_report
from benchmarks.gpu import speed as gpu_speed
from benchmarks.gpu import warm_start as gpu_warm


def _env(tmp_path) -> dict:
    return dict(
        os.environ,
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
        RLVR_CACHE=str(tmp_path / "cache"),
    )


def _smoke(out, *flags) -> list[str]:
    return [
        sys.executable,
        "benchmarks/gpu/smoke.py",
        "--size",
        "tiny",
        "--dtype",
        "float32",
        "--prompts_per_step",
        "4",
        "--max_completion_length",
        "24",
        "--smoke_eval_prompts",
        "4",
        "--output_dir",
        str(out),
        *flags,
    ]


def test_a_budget_that_fits_nothing_skips_every_part_and_writes_the_report(tmp_path):
    out = tmp_path / "smoke"
    budget = gpu_budget.STOP_MARGIN_S + 1  # one second of work: the model folder, then nothing fits
    r = subprocess.run(
        _smoke(
            out,
            "--budget_s",
            str(budget),
            "--scripts",
            "ra_rloo,ps_grpo",
            "--parts",
            "speed,plain,learning",
        ),
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Plan" in r.stdout and "may not fit" in r.stdout  # the up-front plan said so
    report = json.loads((out / "smoke.json").read_text())
    # the parts are planned in the order --parts names them
    assert [x["part"] for x in report["plan"]] == ["warm start", "speed", "plain", "learning"]
    assert report["runs"] and all(x["status"].startswith("skipped") for x in report["runs"])
    assert not (out / "ra_rloo-plain").exists()  # no run started past the budget
    assert (
        report["verdict"].startswith("policy updated in 0 of 0 runs;")
        and "skipped" in report["verdict"]
    )
    assert report["learning"]["status"].startswith(("not run", "skipped"))
    assert (out / "smoke.md").exists()


def test_sigterm_ends_the_whole_command_with_its_results_written(tmp_path):
    out = tmp_path / "smoke"
    cmd = _smoke(
        out,
        "--budget_s",
        "900",
        "--steps",
        "40",
        "--scripts",
        "ra_rloo,ada_seq",
        "--parts",
        "plain,fsdp",
        "--keep_checkpoints",
    )
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    metrics = out / "ra_rloo-plain" / "metrics.jsonl"
    deadline = time.time() + 240
    while (
        time.time() < deadline and proc.poll() is None
    ):  # wait for the first training step of the first run
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    proc.send_signal(signal.SIGTERM)
    log, _ = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, log[-3000:]
    report = json.loads((out / "smoke.json").read_text())
    first, *rest = report["runs"]
    assert first["script"] == "ra_rloo" and first["status"].startswith("stopped at step")
    assert first["status"].endswith("(signal 15)") and 1 <= first["steps"] < 40
    assert (
        out / "ra_rloo-plain" / f"checkpoint-{first['steps']}"
    ).is_dir()  # the script's own graceful stop
    assert rest and all(
        x["status"] == "skipped (signal 15)" for x in rest
    )  # nothing started after it
    assert not (out / "ada_seq-plain").exists()
    assert report["stopped"] == "signal 15" and "Traceback" not in log


def test_the_budget_timer_stops_the_command_as_ctrl_c_does():
    stop = gpu_budget.Stop(gpu_budget.STOP_MARGIN_S + 0.3)
    try:
        deadline = time.time() + 10
        while stop.reason is None and time.time() < deadline:
            time.sleep(0.05)
        assert stop.reason == "budget" and stop.left() <= 0
        stop.in_run = True  # inside a run the same signal interrupts it (a script's own handler would save first)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        stop.close()


def test_warm_start_trains_a_random_model_and_caches_it(tmp_path):
    args = gpu_budget.Args(
        output_dir=str(tmp_path),
        size="test",
        dtype="float32",
        warm_max_steps=40,
        warm_check_every=20,
        warm_batch_size=16,
        warm_lr=3e-3,
        max_completion_length=24,
    )
    random_dir = gpu_warm.build_model_dir(tmp_path / "model-test", "test")
    stop = gpu_budget.Stop(3600)
    try:
        info = gpu_warm.warm_start(random_dir, tmp_path / "warm", args, stop)
        assert info["status"] == "ok" and info["steps"] in (20, 40) and info["trace"]
        assert info["trace"][-1]["loss"] < info["first_loss"]  # it learned something
        assert (tmp_path / "warm" / "model.safetensors").exists() and (
            tmp_path / "warm" / "warm_start.json"
        ).exists()
        again = gpu_warm.warm_start(random_dir, tmp_path / "warm", args, stop)
        assert again["cached"] and again["steps"] == info["steps"]
    finally:
        stop.close()


def test_learning_steps_fit_what_is_left_and_the_interval_is_over_prompts():
    # 100 s left, 10 s fixed per run (3 held-out measurements ~ 3 fixed costs), 2 s per step, two runs: 17 steps
    assert gpu_learning.plan_learning_steps(100, 10, 2, 500) == 17
    assert (
        gpu_learning.plan_learning_steps(100, 10, 2, 5) == 5
        and gpu_learning.plan_learning_steps(20, 10, 2, 5) == 0
    )
    mean, half = gpu_learning.mean_ci([0.0, 1.0, 0.5, 0.5])
    assert mean == 0.5 and half == pytest.approx(1.959964 * (1 / 6) ** 0.5 / 2)


def test_verdict_counts_errors_as_not_updated_and_names_them():
    runs = [
        {"script": "ra_rloo", "variant": "plain", "status": "ok", "policy_changed_frac": 1.0},
        {"script": "ps_grpo", "variant": "plain", "status": "ok", "policy_changed_frac": 0.0},
        {"script": "pros_ppo", "variant": "lora", "status": "error: RuntimeError: boom"},
        {"script": "ada_seq", "variant": "fsdp", "status": "skipped: budget"},
    ]
    assert gpu_report.verdict(runs) == (
        "policy updated in 1 of 3 runs; not updated: ps_grpo/plain, pros_ppo/lora "
        "(error: RuntimeError: boom); 1 skipped"
    )


def _fake_run(fail_when):
    """run_script's stand-in: writes `steps` + 1 metrics rows (100 tokens and 0.5 s of generation a step), or raises
    for the flags `fail_when` picks."""

    def run(script, flags, out, model_dir, steps, args, stop):
        if fail_when(flags):
            raise RuntimeError("index_copy_(): self and source expected to have the same dtype")
        out.mkdir(parents=True, exist_ok=True)
        rows = [
            {
                "step": s,
                "gen_tokens": 100 * s,
                "time_gen_s": 0.5,
                "reward_mean": 0.1 * s,
                "time_step_s": 30.0 if s == 1 else 1.0,
            }
            for s in range(steps + 1)
        ]
        if "--torch_compile" in flags:  # the first step compiles
            for row in rows:
                row.update(
                    time_compile_s=25.0 if row["step"] == 1 else 0.5 * (row["step"] > 1),
                    compile_recompiles=0,
                )
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {
            "status": "ok",
            "steps": steps,
            "step_s": 1.0,
            "compiled_graphs": 0,
            "policy_changed_frac": 1.0,
        }

    return run


def test_a_failing_speed_run_keeps_the_other_runs_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(
        gpu_plain,
        "run_script",
        _fake_run(lambda flags: flags[-2:] == ["--cache_implementation", "static"]),
    )
    args, report, stop = (
        gpu_budget.Args(output_dir=str(tmp_path), size="tiny", speed_steps=4),
        {"speed": []},
        gpu_budget.Stop(3600),
    )
    try:
        speed = gpu_speed.speed_part(
            tmp_path, tmp_path, args, stop, dict(gpu_budget.GUESS["tiny"]), report
        )
    finally:
        stop.close()
    assert [s["cache_implementation"] for s in speed] == ["dynamic", "static", "torch_compile"]
    assert report["speed"] == speed
    assert speed[0]["status"] == "ok" and speed[0]["gen_tokens_per_s_after_first"] == pytest.approx(
        200.0
    )
    assert speed[1]["status"].startswith("error: RuntimeError: index_copy_()")
    assert "gen_tokens_per_s_after_first" not in speed[1]
    # the compiled run: steps 2+ apart from the first, less the compile time they spent, which is summed apart
    assert speed[2]["status"] == "ok" and speed[2]["step_s_after_first"] == pytest.approx(0.5)
    assert (
        speed[2]["step_s_median_after_first"] == pytest.approx(1.0)
        and speed[0]["step_s_after_first"] == 1.0
    )
    assert speed[2]["first_step_s"] == pytest.approx(30.0) and speed[2][
        "compile_s"
    ] == pytest.approx(26.5)
    assert "compile_s" not in speed[0]


def test_every_method_learns_against_its_baseline_and_a_failing_arm_keeps_the_others(
    tmp_path, monkeypatch
):
    """The learning part runs each method and its baseline (one pair per script, EST's baseline in ada_seq.py), every
    arm with the same steps; a failing arm keeps the others' figures; each pair's difference is paired by prompt; a
    pair the budget cannot give 10 steps a run is skipped with its reason; every arm's flags parse for its script."""
    import importlib

    from common.run.flags import parse_args

    ran = []
    fake = _fake_run(
        lambda flags: "--replay" in flags and flags[flags.index("--replay") + 1] == "none"
    )

    def run(script, flags, *rest):
        ran.append((script, flags))
        return fake(script, flags, *rest)

    monkeypatch.setattr(gpu_plain, "run_script", run)
    rates = iter([[0.25, 0.5, 0.75, 0.5]] + [[0.5, 0.5, 1.0, 0.5]] * 20)
    monkeypatch.setattr(gpu_learning, "heldout_pass_rates", lambda model_dir, args: next(rates))
    monkeypatch.setattr(
        gpu_learning, "plot_learning", lambda learning, path: "no plot in this test"
    )
    args, report, stop = (
        gpu_budget.Args(output_dir=str(tmp_path), size="tiny", learning_max_steps=3),
        {},
        gpu_budget.Stop(3600),
    )
    try:
        learning = gpu_learning.learning_part(
            tmp_path, tmp_path, args, stop, dict(gpu_budget.GUESS["tiny"]), "CPU", report
        )
    finally:
        stop.close()
    assert report["learning"] is learning
    pairs = learning["methods"]
    assert [p["script"] for p in pairs] == ["ra_rloo", "ada_seq", "ada_est", "ps_grpo", "pros_ppo"]
    assert [script for script, _ in ran] == [
        *("ra_rloo", "ra_rloo", "ada_seq", "ada_seq", "ada_est", "ada_seq"),
        *("ps_grpo", "ps_grpo", "pros_ppo", "pros_ppo"),
    ]
    ra = pairs[0]
    assert ra["method"]["status"] == "ok" and ra["method"]["end"]["pass@1"] == pytest.approx(0.625)
    assert (
        ra["baseline"]["status"].startswith("error: RuntimeError") and "end" not in ra["baseline"]
    )
    for pair in pairs[1:]:
        assert pair["method"]["steps"] == pair["baseline"]["steps"] == 3
        assert pair["method_minus_baseline"]["mean"] == 0.0
    saved = json.loads((tmp_path / "learning.json").read_text())
    assert saved["methods"][0]["method"]["steps"] == 3
    for script, flags in ran:  # the pairs' flags exist in their scripts
        parse_args(importlib.import_module(script).Args, flags)
    assert "| pros_ppo | PPO (--pros off) (baseline) | 3 |" in gpu_report.table(
        {
            **{k: "" for k in ("device", "versions")},
            "budget_s": 1,
            "elapsed_s": 1,
            "stopped": None,
            "runs": [],
            "learning": learning,
        }
    )
    # too little time for 10 steps a run: skipped, saying so; what a skipped pair leaves goes to the pairs after it
    stop = gpu_budget.Stop(3600)
    try:
        # 60 s left, 4 s fixed a run, 1 s a step: the first pairs' equal shares give < 10 steps, the last ~18
        stop.budget_s = stop.elapsed() + 60
        learning = gpu_learning.learning_part(
            tmp_path,
            tmp_path,
            gpu_budget.Args(output_dir=str(tmp_path), size="tiny", learning_max_steps=50),
            stop,
            {"run_fixed_s": 4.0, "step_s": 1.0},
            "CPU",
            {},
        )
    finally:
        stop.close()
    assert all(p["status"].startswith("skipped: budget") for p in learning["methods"][:4])
    assert learning["methods"][4]["method"]["steps"] >= 10


def test_the_plan_of_the_spell_says_what_it_leaves_out():
    """The lent spell's default (spell.sh): warm start, plain, speed, peer and the learning floor (10 steps a run
    for all five pairs) within 520 s once the warm start is cached; --torch_compile's speed run and the fsdp /
    gc_lora parts are said to be left out."""
    args = gpu_budget.Args(
        budget_s=520, parts="plain,speed,peer,learning", speed_runs="dynamic,static"
    )
    cost = gpu_budget.plan_costs(args, dict(gpu_budget.GUESS["150m"]), cached=True)
    assert list(cost) == ["warm start", "plain", "speed", "peer", "learning"]
    assert sum(cost.values()) <= 520 - gpu_budget.STOP_MARGIN_S
    assert cost["learning"] == pytest.approx(5 * (2 * (7 + 10) + 2 * 7) + 7)
    assert gpu_budget.left_out(args, args.parts.split(",")) == [
        "part fsdp",
        "part gc_lora",
        "speed run torch_compile (~200 s of compiling at 150m)",
    ]
    spell = (ROOT / "benchmarks" / "gpu" / "spell.sh").read_text()
    assert "--budget_s 520 --parts plain,speed,peer,learning --speed_runs dynamic,static" in spell


def test_a_run_stopped_before_its_checkpoint_reports_its_steps_without_an_update_proof(
    tmp_path, monkeypatch
):
    """A second signal can abort a stopping run's save (a step stuck compiling past the outer time limit): the run
    is reported stopped with the steps it logged, and the command goes on instead of failing on the missing file."""
    import types

    def main(args):  # two logged steps, then the abort: no checkpoint written
        out = tmp_path / "run"
        out.mkdir(exist_ok=True)
        rows = [
            {
                "step": s,
                "gen_tokens": 10 * s,
                "time_gen_s": 0.5,
                "time_train_s": 0.1,
                "time_step_s": 1.0,
                "reward_mean": 0.2,
                "grad_norm": 0.1,
            }
            for s in range(3)
        ]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        raise KeyboardInterrupt

    fake = types.SimpleNamespace(main=main, Args=gpu_budget.Args)
    monkeypatch.setattr(gpu_plain.importlib, "import_module", lambda name: fake)
    monkeypatch.setattr(gpu_plain, "parse_args", lambda cls, argv: None)
    stop = gpu_budget.Stop(3600)
    stop.reason = "budget"
    try:
        result = gpu_plain.run_script(
            "ra_rloo", [], tmp_path / "run", tmp_path, 5, gpu_budget.Args(), stop
        )
    finally:
        stop.close()
    assert result["status"] == "stopped at step 2 of 5 (budget; no checkpoint, update not measured)"
    assert result["steps"] == 2 and "policy_changed_frac" not in result
