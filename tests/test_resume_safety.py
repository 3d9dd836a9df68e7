"""A resume never mixes runs: another script's folder or checkpoint, a checkpoint of another shape, changed flags, an
older checkpoint, a second launch into a held folder, a failed write, a link in a folder to overwrite; and a run
stopped by a signal exits with its documented status."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_main

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
    "--save_steps",
    "1",
    "--save_total_limit",
    "0",
]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _steps(folder: Path) -> list[int]:
    return [
        json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()
    ]


def _refused(argv: list[str], pattern: str) -> str:
    """The one line a run stops with, before it loads a model."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as stopped:
            run_main(argv)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    message = str(stopped.value)
    assert "\n" not in message and re.search(pattern, message), message
    return message


@pytest.fixture(scope="module")
def two_steps(tiny_base, tmp_path_factory) -> Path:
    """ra_rloo.py: 2 steps, checkpoint-1 and checkpoint-2 (copied by each test that changes it)."""
    out = tmp_path_factory.mktemp("resume") / "run"
    run_main(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            *SMALL,
        ]
    )
    return out


def _copy(two_steps: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(two_steps, out, symlinks=True)
    return out


def test_a_resume_by_another_script_or_into_another_shape_is_refused_before_any_write(
    two_steps, tmp_path
):
    from common.run.folder_lock import release_all

    out = _copy(two_steps, tmp_path)
    before = _snapshot(out)
    no_model = [
        "--model_name_or_path",
        str(tmp_path / "no-model"),
    ]  # a load would fail: the refusal comes first
    for script in SCRIPTS[1:]:
        _refused(
            [
                f"{script}.py",
                *no_model,
                "--output_dir",
                str(out),
                "--resume_from_checkpoint",
                "auto",
                *SMALL,
            ],
            rf"--output_dir .* holds a run of ra_rloo\.py .*not of {script}\.py",
        )
        fresh = (
            tmp_path / f"into-{script}"
        )  # its checkpoint into an empty folder: the checkpoint names its script
        _refused(
            [
                f"{script}.py",
                *no_model,
                "--output_dir",
                str(fresh),
                "--resume_from_checkpoint",
                str(out / "checkpoint-2"),
                *SMALL,
            ],
            rf"checkpoint-2: written by ra_rloo\.py, not {script}\.py",
        )
        assert not fresh.exists()
    # and ra_rloo.py into a run another script wrote (its records say so)
    other = tmp_path / "other"
    shutil.copytree(out, other)
    for record in [other / ".run.json", *other.glob("checkpoint-*/run.json")]:
        record.write_text(json.dumps({**json.loads(record.read_text()), "script": "ps_grpo"}))
    other_before = _snapshot(other)
    _refused(
        [
            "ra_rloo.py",
            *no_model,
            "--output_dir",
            str(other),
            "--resume_from_checkpoint",
            "auto",
            *SMALL,
        ],
        r"holds a run of ps_grpo\.py .*not of ra_rloo\.py",
    )
    assert _snapshot(other) == other_before
    # the checkpoint's shape: LoRA adapters instead of full weights
    _refused(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            str(json.loads((out / "args.json").read_text())["model_name_or_path"]),
            "--output_dir",
            str(out),
            "--resume_from_checkpoint",
            "auto",
            "--lora_r",
            "4",
            *SMALL,
        ],
        r"checkpoint-2: saved without LoRA adapters, resumed with them \(match --lora_r\)",
    )
    assert _snapshot(out) == before  # args.json and every other file byte for byte
    # a resume that passes the checks (a longer run) and fails while loading (a damaged file) writes nothing
    (out / "checkpoint-2" / "trainer_state.pt").write_bytes(b"cut")
    before = _snapshot(out)
    _refused(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            json.loads((out / "args.json").read_text())["model_name_or_path"],
            "--output_dir",
            str(out),
            "--resume_from_checkpoint",
            "auto",
            "--max_steps",
            "3",
            *SMALL,
        ],
        r"checkpoint-2/trainer_state\.pt: not a checkpoint written by this project",
    )
    release_all()  # the stopped run's hold, which its process would have given back on exit
    assert _snapshot(out) == before


def test_a_resume_with_fewer_flags_names_the_command_that_works_and_another_model_stops_in_a_line(
    two_steps, tiny_base, tmp_path
):
    from common.demo.tiny_model import BaseRecipe, build_tiny_model

    out = _copy(two_steps, tmp_path)
    resume = ["--output_dir", str(out), "--resume_from_checkpoint", "auto"]
    # the run's own flags left out: the line names the flags that resume it as it was
    _refused(
        ["ra_rloo.py", *resume, "--max_steps", "3"],
        re.escape(f"resume with the run's values (--config {out / 'args.json'} ")
        + r"--resume_from_checkpoint auto\), or add --accept_changed_flags",
    )
    # a model of another size, accepted as a changed flag: one line, not a size-mismatch traceback
    other = tmp_path / "narrow"
    shutil.copytree(tiny_base, other)
    vocab = json.loads((other / "config.json").read_text())["vocab_size"]
    build_tiny_model(BaseRecipe(hidden_size=64), vocab).save_pretrained(other)
    changed = ["--model_name_or_path", str(other), "--accept_changed_flags", "--max_steps", "3"]
    _refused(
        ["ra_rloo.py", *resume, *changed, *SMALL],
        r"checkpoint-2: the checkpoint's weights do not fit this model \(\d+ differ in shape, "
        r"e\.g\. .*\): resume with the run's --model_name_or_path \(--config .*args\.json",
    )
    # the named command resumes (its args.json names the folder copied here: --output_dir too)
    run_main(["ra_rloo.py", "--config", str(out / "args.json"), *resume, "--max_steps", "3"])
    assert _steps(out) == [0, 1, 2, 3]


def test_changed_flags_stop_unless_accepted_and_are_recorded_with_their_step(
    two_steps, tiny_base, tmp_path, capsys
):
    out = _copy(two_steps, tmp_path)
    before = _snapshot(out)
    argv = [
        "ra_rloo.py",
        "--model_name_or_path",
        tiny_base,
        "--output_dir",
        str(out),
        "--resume_from_checkpoint",
        "auto",
        *SMALL,
    ]
    _refused(
        [*argv, "--num_generations", "8", "--max_steps", "3"],
        r"flags differ from the run's: --num_generations 4 -> 8: .*"
        r"--accept_changed_flags",
    )
    assert _snapshot(out) == before
    capsys.readouterr()
    run_main([*argv, "--num_generations", "8", "--max_steps", "3", "--accept_changed_flags"])
    assert re.search(
        r"checkpoint-2: from step 3 with --max_steps 2 -> 3, --num_generations 4 -> 8 \(in args\.json\)",
        capsys.readouterr().out,
    )
    recorded = json.loads((out / "args.json").read_text())
    assert recorded["num_generations"] == 8 and recorded["resumes"] == [
        {"from_step": 3, "changed": {"num_generations": [4, 8], "max_steps": [2, 3]}}
    ]
    assert _steps(out) == [0, 1, 2, 3]
    # the length alone changes freely (and is recorded); the run's k is now 8
    run_main([*argv, "--num_generations", "8", "--max_steps", "4"])
    assert json.loads((out / "args.json").read_text())["resumes"][-1] == {
        "from_step": 4,
        "changed": {"max_steps": [3, 4]},
    }


def test_an_older_checkpoint_resumes_only_into_one_history(two_steps, tiny_base, tmp_path):
    out = _copy(two_steps, tmp_path)
    before = _snapshot(out)
    argv = [
        "ra_rloo.py",
        "--model_name_or_path",
        tiny_base,
        "--output_dir",
        str(out),
        "--resume_from_checkpoint",
        str(out / "checkpoint-1"),
        "--max_steps",
        "2",
        *SMALL,
    ]
    _refused(
        argv,
        r"holds later checkpoints of this run \(checkpoint-2\): add --discard_later_checkpoints",
    )
    assert _snapshot(out) == before
    run_main([*argv, "--discard_later_checkpoints"])
    assert _steps(out) == [0, 1, 2]
    assert (out / "checkpoint-2" / "trainer_state.pt").read_bytes() != before[
        "checkpoint-2/trainer_state.pt"
    ]


def test_overwrite_refuses_a_linked_checkpoint_and_removes_nothing(two_steps, tmp_path):
    out = _copy(two_steps, tmp_path)
    outside = tmp_path / "elsewhere"
    shutil.move(out / "checkpoint-1", outside)
    (out / "checkpoint-1").symlink_to(outside, target_is_directory=True)
    before, kept = _snapshot(out), _snapshot(outside)
    _refused(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            str(tmp_path / "no-model"),
            "--output_dir",
            str(out),
            "--overwrite_output_dir",
            *SMALL,
        ],
        r"--overwrite_output_dir: .*checkpoint-1 is a link.*nothing was "
        r"removed",
    )
    assert (
        _snapshot(out) == before
        and _snapshot(outside) == kept
        and (out / "checkpoint-1").is_symlink()
    )


def test_a_held_folder_refuses_a_second_launch_and_a_dead_holder_is_reported(
    tiny_base, tmp_path, capsys
):
    out = tmp_path / "run"
    # the first launch holds the folder while it loads its model (nothing else written yet)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from common.run.folder_lock import hold; hold(Path(sys.argv[1]), 'token', 'ps_grpo'); "
            "print('held', flush=True); time.sleep(120)",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = [
            "ra_rloo.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            "--max_steps",
            "1",
            *SMALL,
        ]
        for extra in ([], ["--overwrite_output_dir"]):
            _refused(
                [*argv, *extra],
                rf"--output_dir .*: another launch writes there \(ps_grpo, process "
                rf"{holder.pid} on ",
            )
        assert sorted(path.name for path in out.iterdir()) == [
            ".run.lock"
        ]  # the holder's record only
    finally:
        holder.kill()  # dies holding it: the lock goes with the process, its record stays
        holder.wait()
    capsys.readouterr()
    run_main(argv)
    assert re.search(
        r"the launch that held it \(ps_grpo, process \d+ .*\) ended without releasing it",
        capsys.readouterr().out,
    )
    assert _steps(out) == [0, 1] and not (out / ".run.lock").exists()  # released when the run ended


def test_a_failed_weights_write_stops_with_one_line_and_the_previous_checkpoint_resumes(
    two_steps, tiny_base, tmp_path, monkeypatch
):
    from safetensors import SafetensorError
    from transformers import modeling_utils

    out = _copy(two_steps, tmp_path)
    argv = [
        "ra_rloo.py",
        "--model_name_or_path",
        tiny_base,
        "--output_dir",
        str(out),
        "--resume_from_checkpoint",
        "auto",
        "--max_steps",
        "3",
        *SMALL,
    ]

    def full_disk(*args, **kwargs):
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(modeling_utils, "safe_save_file", full_disk)
    message = _refused(
        argv,
        r"checkpoint-3: could not write it in .*: Error while serializing: .*No space left "
        r"on device .*checkpoint-2 is whole: .*--resume_from_checkpoint auto",
    )
    assert not (out / ".tmp-checkpoint-3").exists() and not (out / "checkpoint-3").exists(), message
    monkeypatch.undo()
    run_main(argv)
    assert _steps(out) == [0, 1, 2, 3]


def test_a_real_full_disk_stops_the_run_with_one_line_and_the_previous_checkpoint_resumes(
    tiny_base, tmp_path
):
    from common.run.folder_lock import release_all
    from common.run.logs import append_rows

    with pytest.raises(
        SystemExit,
        match=r"^/dev/full: could not append a row \(\[Errno 28\] No space left on "
        r"device\); .*--resume_from_checkpoint auto$",
    ):
        append_rows(Path("/dev/full"), [{"step": 1}])  # a device that is always full
    disk = tmp_path / "disk"
    disk.mkdir()
    # 18 MB: the logs and checkpoint-1 (12 MB) fit, checkpoint-2 does not
    if (
        not shutil.which("mount")
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=18m", "tmpfs", str(disk)], capture_output=True
        ).returncode
    ):
        return  # no tmpfs here (not root): the patched write above and /dev/full stand for it
    try:
        out = disk / "run"
        argv = [
            "ra_rloo.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            *SMALL,
        ]
        _refused(
            argv,
            rf"^checkpoint-2: could not write it in {re.escape(str(out))}: .* MiB free there\); the run "
            r"stops here\. checkpoint-1 is whole: make room .*--resume_from_checkpoint auto$",
        )
        assert not list(out.glob(".tmp-checkpoint-*")) and _steps(out) == [0, 1, 2]
        release_all()  # the stopped run's hold (its process would have exited)
        subprocess.run(["mount", "-o", "remount,size=40m", str(disk)], check=True)  # room made
        run_main([*argv, "--resume_from_checkpoint", "auto"])
        assert _steps(out) == [0, 1, 2] and (out / "checkpoint-2" / "trainer_state.pt").exists()
    finally:
        release_all()
        subprocess.run(["umount", str(disk)], check=True)


def test_a_signal_stops_with_its_status_and_resume_auto_finishes(tiny_base, tmp_path):
    out = tmp_path / "run"
    argv = ["--model_name_or_path", tiny_base, "--output_dir", str(out), *SMALL]
    # 50 steps: the run cannot end before the signal arrives, however slowly this test reads its output
    run = subprocess.Popen(
        [sys.executable, "ra_rloo.py", *argv, "--max_steps", "50"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    seen = b""
    while (
        b"ra_rloo:" not in seen
    ):  # the progress bar: the loop has begun, the signals are the run's
        chunk = os.read(run.stdout.fileno(), 4096)
        assert chunk, seen[-3000:]
        seen += chunk
    run.send_signal(signal.SIGTERM)
    seen += run.stdout.read()
    assert run.wait(timeout=120) == 128 + signal.SIGTERM, seen[-3000:]
    stopped = int(
        re.search(
            rb"stopped at step (\d+); continue with --resume_from_checkpoint auto", seen
        ).group(1)
    )
    assert stopped < 50 and _steps(out) == list(range(stopped + 1))
    run_main(
        ["ra_rloo.py", *argv, "--max_steps", str(stopped + 1), "--resume_from_checkpoint", "auto"]
    )  # the run's length may change
    assert _steps(out) == list(range(stopped + 2))


# The launched script: fails one write on one rank, as a full disk would (SPY_FAIL: "metrics:RANK:STEP", the
# metrics.jsonl row of that step, or "checkpoint:RANK:STEP", that rank's first file of checkpoint-STEP)
FULL_DISK_SPY = """
import errno, os, runpy, sys
import torch
what, rank, step = os.environ["SPY_FAIL"].split(":")
full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
if os.environ["RANK"] == rank and what == "metrics":
    write = os.write
    def spy_write(fd, data):
        row = data.startswith(b'{"step": %s,' % step.encode())
        if row and os.readlink(f"/proc/self/fd/{fd}").endswith("metrics.jsonl"):
            raise full
        return write(fd, data)
    os.write = spy_write
elif os.environ["RANK"] == rank:
    save = torch.save
    def spy_save(obj, path, *args, **kwargs):
        if f".tmp-checkpoint-{step}" in str(path):
            raise full
        return save(obj, path, *args, **kwargs)
    torch.save = spy_save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.xdist_group(
    "distributed"
)  # accelerate's default rendezvous port, as in tests/test_fsdp.py
def test_a_failed_write_on_one_rank_stops_every_rank_with_one_line(tiny_base, tmp_path):
    out, spy = tmp_path / "run", tmp_path / "spy.py"
    spy.write_text(FULL_DISK_SPY)
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(spy),
        "ra_rloo.py",
        "--model_name_or_path",
        tiny_base,
        "--output_dir",
        str(out),
        *SMALL,
    ]

    def stopped(fail: str, flags: list[str], line: str) -> None:
        run = subprocess.run(
            [*launch, *flags],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, OMP_NUM_THREADS="1", SPY_FAIL=fail, PYTHONPATH=str(ROOT)),
        )
        said = run.stdout + run.stderr
        assert run.returncode != 0 and len(re.findall(line, said)) == 1, said[-4000:]
        # the ranks stopped themselves with status 1 (the launcher may end the slower one with SIGTERM once the
        # first has exited: both were past the line and their collectives), none aborted, no traceback passes
        # through our files (the launcher prints its own summary of the failed ranks)
        statuses = re.findall(r"exitcode\s*: (-?\d+) ", said)
        assert len(statuses) == 2 and "1" in statuses and set(statuses) <= {"1", "-15"}, said[
            -4000:
        ]
        assert not re.search(r'File ".*(ra_rloo\.py|common/)', said), said[-4000:]

    # rank 0 cannot append step 2's row: rank 1 stops as well, and checkpoint-1 is whole
    stopped(
        "metrics:0:2",
        ["--max_steps", "3"],
        rf"{re.escape(str(out))}/metrics.jsonl: could not append a row "
        r"\(\[Errno 28\] No space left on device\); the run stops here",
    )
    assert _steps(out) == [0, 1] and sorted(path.name for path in out.glob("*checkpoint-*")) == [
        "checkpoint-1"
    ]
    # the resume from it: rank 1 cannot write its part of checkpoint-3 (rank 0 could): both stop, the partial goes
    stopped(
        "checkpoint:1:3",
        ["--max_steps", "3", "--resume_from_checkpoint", "auto"],
        rf"checkpoint-3: could not write it in {re.escape(str(out))}: \[Errno 28\] No space left on device .*"
        r"checkpoint-2 is whole",
    )
    assert _steps(out) == [0, 1, 2, 3] and sorted(
        path.name for path in out.glob("*checkpoint-*")
    ) == ["checkpoint-1", "checkpoint-2"]


def test_a_launch_that_lost_its_folder_stops_before_removing_anything(tmp_path, random_model_dir):
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.run import checkpoint
    from common.run.folder_lock import LOCK, hold, release
    from common.run.logs import MetricsLogger

    acc, folder = Accelerator(cpu=True), tmp_path / "run"
    tok, model = (
        AutoTokenizer.from_pretrained(random_model_dir),
        AutoModelForCausalLM.from_pretrained(random_model_dir),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    hold(folder, "mine", "ra_rloo")
    (folder / checkpoint.MARKER).write_text(json.dumps({"run_id": "mine"}))
    logger = MetricsLogger(str(folder), acc)
    logger.log({"step": 1})
    checkpoint.save_checkpoint(str(folder), 1, acc, model, tok, opt, sched, {}, keep=1)
    # the folder is cleared by hand (its lock file goes) and another launch takes it
    (folder / LOCK).unlink()
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from common.run.folder_lock "
            "import hold; hold(Path(sys.argv[1]), 'theirs', 'ps_grpo'); print('held', flush=True); "
            "sys.stdin.read()",
            str(folder),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline() == "held\n"
        lost = (
            rf"^--output_dir {re.escape(str(folder))}: this launch no longer holds it \(now held by ps_grpo, "
            rf"process {other.pid} .*\); the run stops before removing anything there$"
        )
        before = _snapshot(folder)
        with pytest.raises(SystemExit, match=lost):  # rotation would remove checkpoint-1
            checkpoint.save_checkpoint(str(folder), 2, acc, model, tok, opt, sched, {}, keep=1)
        with pytest.raises(SystemExit, match=lost):
            logger.log({"step": 2})
        assert _snapshot(folder) == before and not list(folder.glob(".tmp-*"))
        release(folder)  # this launch ends: the other launch's lock file stays
        assert json.loads((folder / LOCK).read_text())["launch"] == "theirs"
    finally:
        other.communicate("", timeout=30)


def test_a_run_recorded_before_the_auto_cache_resumes_under_it(two_steps, tiny_base, tmp_path):
    # checkpoints written while the KV cache defaulted to None record that value; the cache is a
    # speed setting, so today's default `auto` continues them without --accept_changed_flags
    out = _copy(two_steps, tmp_path)
    for record in [out / "checkpoint-2" / "run.json", out / ".run.json", out / "args.json"]:
        data = json.loads(record.read_text())
        flags = data.get("args", data)
        assert flags["cache_implementation"] == "auto", record
        flags["cache_implementation"] = None
        record.write_text(json.dumps(data))
    argv = ["ra_rloo.py", "--model_name_or_path", tiny_base, "--output_dir", str(out)]
    run_main([*argv, "--resume_from_checkpoint", "auto", "--max_steps", "3", *SMALL])
    assert (out / "checkpoint-3").is_dir()
