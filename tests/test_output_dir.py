"""The output folder: a used folder is refused (or started over with --overwrite_output_dir), rotation removes only
the writing run's checkpoints, a failed checkpoint write stops with one line, and several machines must share it."""

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT

SCRIPTS = ["ra_rloo", "ps_grpo", "pros_ppo", "ada_seq", "ada_est"]
SMALL = [
    "--prompt_pool",
    "48",
    "--prompts_per_step",
    "4",
    "--eval_prompts",
    "4",
    "--eval_samples",
    "2",
    "--max_completion_length",
    "12",
    "--num_threads",
    "1",
    "--eval_steps",
    "0",
]
REFUSED = (
    r"--output_dir .* holds a run \(metrics\.jsonl to step 2, checkpoint-1, checkpoint-2, model/\): add "
    r"--resume_from_checkpoint auto"
)


def _rows(path: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (path / name).read_text().splitlines()]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _ra_rloo(argv: list[str]) -> None:
    import ra_rloo
    from common.run.flags import parse_args

    ra_rloo.main(parse_args(ra_rloo.Args, argv))


def test_a_used_folder_is_refused_and_overwrite_starts_over(tiny_base, tmp_path):
    import importlib

    from common.run.flags import parse_args

    out = tmp_path / "run"
    _ra_rloo(
        [
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--save_steps",
            "1",
            *SMALL,
        ]
    )
    (out / "notes.txt").write_text("the user's own file")
    before = _snapshot(out)
    # the README's command typed twice: one line, no traceback, nothing in the folder touched
    r = subprocess.run(
        [
            sys.executable,
            "ra_rloo.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            "--max_steps",
            "3",
            *SMALL,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1 and re.search(REFUSED, r.stderr), r.stderr[
        -3000:
    ]
    assert "--overwrite_output_dir" in r.stderr and "another --output_dir" in r.stderr
    assert _snapshot(out) == before
    # every script checks before it loads a model (the model path does not exist: loading it would fail otherwise);
    # the other scripts are told whose run it is (--resume_from_checkpoint auto would not continue it)
    for script in SCRIPTS:
        module = importlib.import_module(script)
        with pytest.raises(
            SystemExit,
            match=REFUSED
            if script == "ra_rloo"
            else r"holds a run of ra_rloo\.py \(.*"
            rf"model/\), not of {script}",
        ):
            module.main(
                parse_args(
                    module.Args,
                    [
                        "--model_name_or_path",
                        str(tmp_path / "no-model"),
                        "--output_dir",
                        str(out),
                        *SMALL,
                    ],
                )
            )
    assert _snapshot(out) == before
    # --overwrite_output_dir: the old run's checkpoints and logs go first; the user's file stays
    _ra_rloo(
        [
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            "--max_steps",
            "1",
            "--save_steps",
            "1",
            "--overwrite_output_dir",
            *SMALL,
        ]
    )
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "args.json",
        "checkpoint-1",
        "metrics.jsonl",
        "model",
        "notes.txt",
        "samples.jsonl",
    ]
    assert [row["step"] for row in _rows(out)] == [0, 1] and {
        row["step"] for row in _rows(out, "samples.jsonl")
    } == {1}
    assert json.loads((out / "args.json").read_text())["max_steps"] == 1
    assert (out / "checkpoint-1" / "run.json").read_bytes() != before[
        "checkpoint-1/run.json"
    ]  # the new run's


def test_rotation_never_removes_the_writing_runs_checkpoint(tmp_path, random_model_dir):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.run import checkpoint

    acc = Accelerator(cpu=True)
    tok = AutoTokenizer.from_pretrained(random_model_dir)
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)

    def save(run_id: str, step: int) -> None:
        (tmp_path / checkpoint.MARKER).write_text(json.dumps({"run_id": run_id, "launch": "x"}))
        checkpoint.save_checkpoint(str(tmp_path), step, acc, model, tok, opt, sched, {}, keep=1)

    for step in (10, 11):  # an older run's higher-numbered checkpoints (keep 1 leaves its last)
        save("older", step)
    names = lambda: [path.name for path in checkpoint.list_checkpoints(str(tmp_path))]  # noqa: E731
    assert names() == ["checkpoint-11"]
    for step in (2, 3):
        save("writing", step)
        assert (
            f"checkpoint-{step}" in names()
        )  # the checkpoint just written survives its own rotation
    assert names() == [
        "checkpoint-3",
        "checkpoint-11",
    ]  # its own older one went, the other run's stays
    assert checkpoint.run_id(tmp_path / "checkpoint-3" / "run.json") == "writing"


def test_a_failed_checkpoint_write_stops_with_one_line_and_the_previous_resumes(
    tiny_base, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    argv = [
        "--model_name_or_path",
        tiny_base,
        "--output_dir",
        str(out),
        "--save_steps",
        "1",
        *SMALL,
    ]
    real_save = torch.save

    def full_disk(obj, path, *args, **kwargs):  # the disk fills while checkpoint-2 is written
        if ".tmp-checkpoint-2" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as stopped:
            _ra_rloo([*argv, "--max_steps", "3"])
    finally:  # the run stopped inside its loop, holding the signals: give them back to pytest
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    message = str(stopped.value)
    assert "\n" not in message and stopped.value.code != 0
    assert re.match(
        rf"checkpoint-2: could not write it in {re.escape(str(out))}: \[Errno 28\] No space left on "
        r"device .*checkpoint-1 is whole: .* --resume_from_checkpoint auto",
        message,
    ), message
    assert not (out / ".tmp-checkpoint-2").exists() and not (out / "checkpoint-2").exists()
    monkeypatch.setattr(torch, "save", real_save)
    _ra_rloo(
        [*argv, "--max_steps", "3", "--resume_from_checkpoint", "auto"]
    )  # the previous checkpoint loads and resumes
    assert [row["step"] for row in _rows(out)] == [0, 1, 2, 3]
    assert [path.name for path in sorted(out.glob("checkpoint-*"))] == [
        "checkpoint-2",
        "checkpoint-3",
    ]


# ---------------- two machines on one host: each machine its own working directory ----------------


def _port() -> int:
    """A free port below Linux's ephemeral range (32768-60999), so that no gloo connection of a running launch can
    take it between this check and the launcher's bind."""
    import random

    for port in random.Random().sample(range(20000, 29000), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-29000")


DIST_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _launch(machines: int, rank: int, port: int, cwd: Path, flags: list[str]) -> subprocess.Popen:
    """One machine's `accelerate launch` of ra_rloo.py (one process per machine, two in all); its output goes to a
    file (a pipe read only after the other machine's could fill up and stall both)."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        str(machines),
        "--machine_rank",
        str(rank),
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(ROOT / "ra_rloo.py"),
        *flags,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    for key in [key for key in env if key.startswith("ACCELERATE_") or key in DIST_ENV]:
        env.pop(
            key
        )  # what an in-process run of this worker left behind would override the launcher's own
    log = open(cwd / f"launch-{port}-{rank}.log", "w+")
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # its own process group: a hung launch is ended whole
    proc.log, proc.cwd = log, str(cwd)
    return proc


def _kill_workers_in(cwds: set[str]) -> None:
    """SIGKILL every process working in one of `cwds`: the launcher's worker may sit in a session of its own."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") in cwds and int(pid) != os.getpid():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:  # gone already, or not ours to read
            continue


def _two_machines(cwds: list[Path], flags: list[str]) -> list[tuple[int, str]]:
    """Both machines' (exit code, output)."""
    port = _port()
    return _finish([_launch(2, rank, port, cwd, flags) for rank, cwd in enumerate(cwds)])


def _shared_run_and_resume(
    copies: list[Path], flags: list[str], shared: Path
) -> list[tuple[int, str]]:
    """2 steps and a checkpoint in one shared folder, then a resume to 4 steps; the last launch's results."""
    for steps, extra in (("2", []), ("4", ["--resume_from_checkpoint", "auto"])):
        results = _two_machines(
            copies, [*flags, "--output_dir", str(shared), "--max_steps", steps, *extra]
        )
        assert all(code == 0 for code, _ in results), [log[-3000:] for _, log in results]
        assert sum(log.count(f"run ended at step {steps}") for _, log in results) == 1
        assert (shared / f"checkpoint-{steps}" / "trainer_state.pt").exists()
    return results


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    """Each launch's (exit code, output). A launch still running after 90 s is ended whole with the others (a hung
    rank left running would hold its port and CPU for the rest of the suite), and the test fails."""
    deadline = time.time() + 90
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        _kill_workers_in({proc.cwd for proc in procs})
        logs = []
        for proc in procs:
            proc.log.seek(0)
            logs.append(proc.log.read()[-2000:])
        pytest.fail("a launch hung; its machines' last output:\n" + "\n-----\n".join(logs))
    results = []
    for proc in procs:
        proc.log.seek(0)
        results.append((proc.returncode, proc.log.read()))
    return results


def _strip(rows: list[dict]) -> list[dict]:
    return [
        {key: value for key, value in row.items() if not key.startswith(("time_", "time/"))}
        for row in rows
    ]


@pytest.mark.xdist_group(
    "distributed"
)  # several launches: one at a time, beside the other two-process tests
def test_two_machines_need_a_shared_folder_and_print_the_summary_once(tiny_base, tmp_path):
    flags = [
        "--model_name_or_path",
        tiny_base,
        *SMALL,
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--seed_buffer",
        "false",
        "--paper_eval_samples",
        "0",
        "--eval_train_prompts",
        "0",
    ]
    # each "machine" starts in its own copy (working directory) with a relative --output_dir: not the same folder
    copies = [tmp_path / "machine0", tmp_path / "machine1"]
    for copy in copies:
        copy.mkdir()
    start = time.time()
    results = _two_machines(copies, [*flags, "--output_dir", "runs/mn", "--max_steps", "2"])
    assert time.time() - start < 60
    for machine, (code, log) in enumerate(results):
        assert code != 0, log[-3000:]
        assert log.count("--output_dir runs/mn: the machine with node rank 1 (host ") == 1, log[
            -3000:
        ]
        assert "must be a folder every machine shares" in log
        # no traceback of the script (the launcher reports the failed process in its own words)
        assert not re.search(r'File ".*(ra_rloo\.py|/common/)', log), log[-3000:]
    assert not (copies[0] / "runs" / "mn" / "metrics.jsonl").exists()  # no step trained
    # one shared folder: 2 steps and a checkpoint, then a resume to 4 steps; the summary is printed once a run
    shared = tmp_path / "shared"
    results = _shared_run_and_resume(copies, flags, shared)
    assert "resumed from" in results[0][1] and "resumed from" not in results[1][1]
    # the same run as 1 machine x 2 processes: the same rows (the same ranks, seeds and gloo sums)
    one = tmp_path / "one"
    launched = _finish(
        [_launch(1, 0, _port(), tmp_path, [*flags, "--output_dir", str(one), "--max_steps", "4"])]
    )
    [(code, log)] = launched
    assert code == 0, log[-3000:]
    assert [row["step"] for row in _rows(shared)] == [0, 1, 2, 3, 4]
    assert _strip(_rows(shared)) == _strip(_rows(one))
    assert _rows(shared, "samples.jsonl") == _rows(one, "samples.jsonl")
