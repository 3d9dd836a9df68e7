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
            return (
                f"not repeatable: the thread count followed the free cores and changed from {before} to {after} "
                f"at step {step}"
            )
    return (
        f"repeatable on a machine with the same free cores: the thread count followed them and held at "
        f"{logged[0][1]}; pass --num_threads {logged[0][1]}"
    )


def test_command_1_prints_one_bar_and_a_true_repeatability_line(tmp_path):
    # the short run's flags less --num_threads (the default policy: the count follows the free cores), a checkpoint
    # after every step, the shipped base restored into a fresh cache as a first run does
    flags = [
        flag
        for i, flag in enumerate(SHORT_RUN)
        if "--num_threads" not in SHORT_RUN[max(0, i - 1) : i + 1]
    ]
    flags[flags.index("--max_steps") + 1] = "2"
    out = tmp_path / "run"
    r = run_script(
        [
            "ra_rloo.py",
            "--output_dir",
            str(out),
            "--save_steps",
            "1",
            *flags,
            *SHORT_RUN_FLAGS["ra_rloo.py"],
        ],
        env_extra={"RLVR_CACHE": str(tmp_path / "cache")},
    )
    assert (out / "checkpoint-1").is_dir() and (out / "checkpoint-2").is_dir()
    # a tqdm bar's every refresh holds its elapsed time, `[00:01...`: what stands before its first ': ' names it
    refreshes = [
        part
        for part in re.split(r"[\r\n]", r.stderr + r.stdout)
        if re.search(r"\[\d\d:\d\d[<,\]]", part)
    ]
    names = {part.strip().split(": ", 1)[0] for part in refreshes}
    assert names == {"ra_rloo"}, names
    assert sum(" 0%|" in part for part in refreshes) == 1, refreshes  # one bar, started once
    lines = r.stdout.rstrip("\n").splitlines()
    assert (
        lines[-1].startswith("  curves:  python -m common.run.plot_run")
        and "run ended at step 2" in r.stdout
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((out / "args.json").read_text())["num_threads"] == 0
    (line,) = [ln.strip() for ln in lines if "repeatable" in ln]
    assert line.startswith(expected_repeatability(rows)), (
        line,
        [row["num_threads"] for row in rows],
    )
    assert "--num_threads" in line


# the printed plot command, run as typed, then the modules it imported (the interpreter's own at start-up left out)
PLOT_SPY = """
import json, runpy, sys
start = set(sys.modules)
sys.argv = sys.argv[1:]
runpy.run_module("common.run.plot_run", run_name="__main__", alter_sys=True)
print(json.dumps(sorted({name.split(".")[0] for name in set(sys.modules) - start})))
"""


def test_the_printed_plot_command_needs_only_what_command_1_installs(tmp_path):
    # command 1 installs requirements.txt (after torch): every package the printed plot command imports must be
    # one it names or one of theirs needs, or the command ends in "plotting needs matplotlib"
    import importlib.metadata as metadata
    import shlex
    import subprocess
    import sys

    from conftest import ROOT
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from common.run.summary import run_summary

    rows = [
        {"step": 0, "eval_pass@1": 0.2},
        {"step": 1, "loss": 0.5},
        {"step": 2, "eval_pass@1": 0.3, "loss": 0.4},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    printed = run_summary(str(tmp_path), ["loss"]).splitlines()[-1].split("curves:", 1)[1]
    python, *argv = shlex.split(printed)
    assert python == "python" and argv[:2] == ["-m", "common.run.plot_run"]
    r = subprocess.run(
        [sys.executable, "-c", PLOT_SPY, "plot_run", *argv[2:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and (tmp_path / "curves.png").exists(), r.stderr[-2000:]
    owners = metadata.packages_distributions()
    imported = {
        canonicalize_name(dist)
        for name in json.loads(r.stdout.splitlines()[-1])
        if name not in sys.stdlib_module_names
        for dist in owners.get(name, [])
    }
    lines = [
        line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
    ]
    todo, installed = [Requirement(line) for line in lines if line] + [Requirement("torch")], set()
    while todo:  # what pip installs for them: each requirement and, in turn, what it requires
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if (
            name in installed
            or requirement.marker
            and not requirement.marker.evaluate({"extra": ""})
        ):
            continue
        installed.add(name)
        todo += [Requirement(text) for text in metadata.requires(name) or []]
    assert "matplotlib" in imported and imported <= installed, sorted(imported - installed)
