"""The CPU thread policy (common/run/launch.py `CpuThreads`): --num_threads wins; otherwise the count follows
the cores the rest of the machine leaves free, read from /proc at every step (measured: benchmarks/speed/threads.py)."""

import pytest

from common.run.launch import CpuThreads


def _write(proc, busy, idle, own):
    """A /proc with `busy` / `idle` jiffies summed over all cores and `own` jiffies of this process."""
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    fields = (
        ["S"] + ["0"] * 10 + [str(own), "0"] + ["0"] * 30
    )  # utime is the 14th field of /proc/<pid>/stat
    (proc / "self" / "stat").write_text("4242 (python -c busy) " + " ".join(fields) + "\n")


def test_thread_count_follows_the_free_cores(tmp_path):
    proc = tmp_path / "proc"
    _write(proc, busy=0, idle=0, own=0)
    threads = CpuThreads(0, cores=2, proc=str(proc))
    # alone: over 200 jiffies (100 per core) we were busy 190 of them, nobody else: both cores
    _write(proc, busy=190, idle=10, own=190)
    assert threads.count(default=2) == 2
    # a busy single-threaded process beside us: 100 more busy jiffies that are not ours -> one core left
    _write(proc, busy=190 + 195, idle=15, own=190 + 95)
    assert threads.count(default=2) == 1
    # it goes away: both cores again
    _write(proc, busy=385 + 120, idle=15 + 80, own=285 + 120)
    assert threads.count(default=2) == 2
    # a 4-core machine with 2.6 cores taken by others: 1 left (rounded), never below 1 however busy
    four = CpuThreads(0, cores=4, proc=str(proc))
    _write(proc, busy=505 + 360, idle=95 + 40, own=405 + 100)
    assert four.count(default=4) == 1
    _write(proc, busy=865 + 400, idle=135, own=505)
    assert four.count(default=4) == 1


def test_num_threads_wins_and_without_proc_torch_keeps_its_default(tmp_path):
    proc = tmp_path / "proc"
    _write(proc, busy=0, idle=0, own=0)
    fixed = CpuThreads(3, cores=2, proc=str(proc))
    _write(proc, busy=400, idle=0, own=0)  # the machine is full of others: --num_threads still wins
    assert fixed.count(default=2) == 3
    missing = CpuThreads(0, cores=2, proc=str(tmp_path / "nowhere"))
    assert missing.count(default=7) == 7 and missing.count(default=7) == 7
    stalled = CpuThreads(0, cores=2, proc=str(proc))
    assert stalled.count(default=5) == 5  # no time passed between two reads: nothing to measure


def test_settle_measures_the_machine_at_set_up(tmp_path, monkeypatch):
    """The call right after the arguments are parsed has no earlier sample: it measures over `settle` seconds."""
    import common.run.launch as launch

    proc = tmp_path / "proc"
    _write(proc, busy=0, idle=0, own=0)
    threads = CpuThreads(0, cores=2, proc=str(proc))
    # during the settle window another process keeps one core busy
    monkeypatch.setattr(
        launch.time, "sleep", lambda seconds: _write(proc, busy=100, idle=100, own=0)
    )
    assert threads.count(default=2, settle=0.2) == 1
    assert (
        CpuThreads(1, cores=2, proc=str(proc)).count(default=2, settle=0.2) == 1
    )  # fixed: no measuring


@pytest.mark.parametrize(
    "script", ["ra_rloo.py", "ada_seq.py", "ada_est.py", "ps_grpo.py", "pros_ppo.py"]
)
def test_num_threads_holds_from_set_up_and_the_step_0_evaluation(short_run, script):
    """--num_threads 1 is in force when the policy loads and at the first generate (the step-0 evaluation), not
    only from the first training step: torch's default (forced to 2 by conftest's THREAD_SPY) never runs the set-up."""
    import ast

    from conftest import ROOT

    _, stdout = short_run(script)
    seen = ast.literal_eval(stdout.split("THREADS", 1)[1].strip().splitlines()[0])
    assert seen == {"load_policy": 1, "first_generate": 1}, seen
    main = (ROOT / script).read_text().split("def main(", 1)[1]
    assert main.index("start_run(") < main.index("load_training_policy("), script
    setup = (ROOT / "common" / "run" / "setup.py").read_text()
    start_run = setup.split("def start_run(", 1)[1].split("\ndef ", 1)[0]
    assert "torch.set_num_threads(" in start_run  # the thread count is set before any model loads


def test_the_same_command_at_a_fixed_thread_count_gives_the_same_rows(
    short_run, tiny_base, tmp_path
):
    """Repeatable runs: the short run again, same command and --num_threads 1, gives the same metrics rows, every
    field but the timings (time_*, time/*) equal, floats to the last bit; the thread count is in every row."""
    import json

    from conftest import SHORT_RUN, SHORT_RUN_FLAGS, run_script

    def rows(out):
        return [
            {k: v for k, v in json.loads(line).items() if not k.startswith(("time_", "time/"))}
            for line in (out / "metrics.jsonl").read_text().splitlines()
        ]

    first, _ = short_run("ra_rloo.py")
    again = tmp_path / "again"
    r = run_script(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(again),
            *SHORT_RUN,
            *SHORT_RUN_FLAGS["ra_rloo.py"],
        ]
    )
    assert rows(again) == rows(first) and all(row["num_threads"] == 1 for row in rows(again))
    assert "repeatable: yes (--num_threads 1" in r.stdout


def test_the_summary_says_whether_a_run_is_repeatable(tmp_path):
    import json

    from common.run.summary import repeatability

    rows = [
        {"step": 0, "num_threads": 2},
        {"step": 1, "num_threads": 1},
        {"step": 2, "num_threads": 2},
    ]
    (tmp_path / "args.json").write_text(json.dumps({"num_threads": 0}))
    assert repeatability(rows, str(tmp_path)) == (
        "not repeatable: the thread count followed the free cores and changed from 2 to 1 at step 1 (2 changes in "
        "all, 1..2); pass --num_threads N (e.g. --num_threads 2) for a fixed count"
    )
    assert repeatability(rows[:2], str(tmp_path)).startswith(
        "not repeatable: the thread count followed the free "
        "cores and changed from 2 to 1 at step 1; pass"
    )
    held = [{"step": s, "num_threads": 2} for s in range(3)]
    assert repeatability(held, str(tmp_path)) == (
        "repeatable on a machine with the same free cores: the thread count followed them and held at 2; pass "
        "--num_threads 2 for the same rows on a quiet or a busy machine"
    )
    assert repeatability([{"step": 0}], str(tmp_path)).startswith(
        "repeatable: unknown (no row logs num_threads)"
    )
    (tmp_path / "args.json").write_text(json.dumps({"num_threads": 3}))
    assert repeatability(rows, str(tmp_path)).startswith("repeatable: yes (--num_threads 3")


def test_hold_keeps_the_first_count_for_the_whole_run(tmp_path):
    """--torch_compile's policy: torch.compile guards its graphs on the thread count, so a count that followed the
    free cores would recompile every graph at each change; held, the first measurement stays."""
    proc = tmp_path / "proc"
    _write(proc, busy=0, idle=0, own=0)
    held, following = (
        CpuThreads(0, cores=2, proc=str(proc), hold=True),
        CpuThreads(0, cores=2, proc=str(proc)),
    )
    _write(proc, busy=190, idle=10, own=190)  # alone: both cores
    assert held.count(default=2) == 2 and following.count(default=2) == 2
    _write(proc, busy=190 + 195, idle=15, own=190 + 95)  # a busy process beside us: one core left
    assert following.count(default=2) == 1
    assert held.count(default=2) == 2
