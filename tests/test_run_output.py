"""What README command 1 (`python ra_rloo.py`, the default thread policy) prints: one progress bar, the step bar (no
bar of transformers' when it loads the policy or writes a checkpoint, none of datasets'), and a closing summary whose
repeatability line says what the rows' logged `num_threads` say."""
import json
import re

from conftest import SHORT_RUN, SHORT_RUN_FLAGS, run_script


def expected_repeatability(rows: list[dict]) -> str:
    """The start of the line the rows call for: the count held at one value, or where it first changed."""
    logged = [(row["step"], row["num_threads"]) for row in rows]
    for (_, before), (step, after) in zip(logged, logged[1:]):
        if before != after:
            return f"not repeatable: the thread count followed the free cores and changed from {before} to {after} " \
                   f"at step {step}"
    return f"repeatable on a machine with the same free cores: the thread count followed them and held at " \
           f"{logged[0][1]}; pass --num_threads {logged[0][1]}"


def test_command_1_prints_one_bar_and_a_true_repeatability_line(tmp_path):
    # the short run's flags less --num_threads (the default policy: the count follows the free cores), a checkpoint
    # after every step, the shipped base restored into a fresh cache as a first run does
    flags = [flag for i, flag in enumerate(SHORT_RUN) if "--num_threads" not in SHORT_RUN[max(0, i - 1):i + 1]]
    flags[flags.index("--max_steps") + 1] = "2"
    out = tmp_path / "run"
    r = run_script(["ra_rloo.py", "--output_dir", str(out), "--save_steps", "1", *flags,
                    *SHORT_RUN_FLAGS["ra_rloo.py"]], env_extra={"RLVR_CACHE": str(tmp_path / "cache")})
    assert (out / "checkpoint-1").is_dir() and (out / "checkpoint-2").is_dir()
    # a tqdm bar's every refresh holds its elapsed time, `[00:01...`: what stands before its first ': ' names it
    refreshes = [part for part in re.split(r"[\r\n]", r.stderr + r.stdout) if re.search(r"\[\d\d:\d\d[<,\]]", part)]
    names = {part.strip().split(": ", 1)[0] for part in refreshes}
    assert names == {"ra_rloo"}, names
    assert sum(" 0%|" in part for part in refreshes) == 1, refreshes  # one bar, started once
    lines = r.stdout.rstrip("\n").splitlines()
    assert lines[-1].startswith("  curves:  python -m common.run.plot_run") and "run ended at step 2" in r.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((out / "args.json").read_text())["num_threads"] == 0
    (line,) = [ln.strip() for ln in lines if "repeatable" in ln]
    assert line.startswith(expected_repeatability(rows)), (line, [row["num_threads"] for row in rows])
    assert "--num_threads" in line
