"""`--help` of every command a user is told to type: the five method scripts, every `benchmarks/` script, the
commands the README and docs name (`python -m common.run.plot_run`, the report), each through its own `__main__`, exits 0
and prints its usage and flags; a field docstring with any character (`%` included) shows as written."""

import contextlib
import dataclasses
import importlib
import io
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
from conftest import ROOT

from common.run.flags import build_parser, parse_args

METHOD_SCRIPTS = ("ra_rloo.py", "ps_grpo.py", "pros_ppo.py", "ada_seq.py", "ada_est.py")
FLAGLESS = ("benchmarks/speed/memory_table.py",)  # prints a computed table; --help says so
COMMAND = re.compile(r"\bpython3? (-m [A-Za-z_][\w.]*|[\w/]+\.py)")


def entry_points() -> list[str]:
    """`path.py` or `-m module` for every command the README and docs name, every method script and every
    `benchmarks/` script with a `__main__` block."""
    found = set(METHOD_SCRIPTS)
    rooms = [
        ROOT / "benchmarks" / room / "README.md"
        for room in ("", "sweep", "speed", "gpu", "estimates")
    ]
    for page in [ROOT / "README.md", *rooms, *sorted((ROOT / "docs").glob("*.md"))]:
        found.update(COMMAND.findall(page.read_text()))
    found.update(
        str(p.relative_to(ROOT))
        for p in (ROOT / "benchmarks").glob("*/*.py")
        if 'if __name__ == "__main__"' in p.read_text()
    )
    return sorted(c for c in found if c not in ("-m pytest", "-m venv"))


def source(command: str) -> str:
    """The file a command runs (a module's `__main__.py` or its own file)."""
    if not command.startswith("-m "):
        return (ROOT / command).read_text()
    path = ROOT / command[3:].replace(".", "/")
    return (path / "__main__.py" if path.is_dir() else path.with_suffix(".py")).read_text()


# The commands whose flags come from common/run/flags.py run in one interpreter, each as `python X --help` would run it
# (runpy, as __main__), so the imports they share (torch, transformers) are paid once: ~3 s, where a launch each would
# cost a minute. Each one's exit status, output and any traceback are printed between markers. The commands with a
# parser of their own are launched as typed (a launch costs them ~0.1 s: they import no torch).
RUNNER = r"""
import contextlib, io, runpy, sys, traceback
for command in sys.argv[1:]:
    out, status = io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            if command.startswith("-m "):
                sys.argv = [command[3:], "--help"]
                runpy.run_module(command[3:], run_name="__main__", alter_sys=True)
            else:
                sys.argv = [command, "--help"]
                runpy.run_path(command, run_name="__main__")
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc(file=out)
            status = "traceback"
    print(f"=== {command} -> {status}\n{out.getvalue()}=== end", flush=True)
"""


def test_help_of_every_command_exits_0_and_prints_its_flags():
    commands = entry_points()
    assert {
        "ra_rloo.py",
        "benchmarks/gpu/smoke.py",
        "benchmarks/sweep/run.py",
        "-m common.run.plot_run",
        "-m benchmarks.sweep.report",
        "benchmarks/sweep/report.py",
        "benchmarks/speed/default_run.py",
        "benchmarks/speed/trl_peer.py",
        "benchmarks/gpu/smoke.py",
    } <= set(commands), commands
    ours = [c for c in commands if "parse_args(Args" in source(c) or "cli()" in source(c)]
    own = {
        c: subprocess.Popen(
            [sys.executable, *c.split(), "--help"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for c in commands
        if c not in ours
    }
    r = subprocess.run(
        [sys.executable, "-c", RUNNER, *ours], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    runs = re.findall(r"^=== (.+?) -> (.*?)\n(.*?)^=== end$", r.stdout, re.M | re.S)
    statuses, got = {c: s for c, s, _ in runs}, {c: text for c, _, text in runs}
    for command, proc in own.items():
        got[command], statuses[command] = proc.communicate(timeout=60)[0], str(proc.returncode)
    assert sorted(got) == commands, r.stdout[-3000:]
    bad = {
        c: f"{statuses[c]}: {got[c][-1500:]}"
        for c in commands
        if statuses[c] != "0"
        or "Traceback" in got[c]
        or "usage:" not in got[c]
        or "-h, --help" not in got[c]
        or not (re.search(r"--(?!help\b)\w", got[c]) or c in FLAGLESS)
    }
    assert not bad, bad
    # a parser of a command's own: each flag that takes a value (`[--out OUT]` in its usage) ends its entry with
    # one default, never `None` or empty
    silent = {}
    for command in own:
        usage = got[command].split("\n\n")[0]
        entries = {flag: " ".join(rest.split()) for flag, rest in ENTRY.findall(got[command])}
        for flag in re.findall(r"\[--(\w+) [^\]-]", usage):
            entry = entries[flag]
            if not re.search(r" \(default: [^\n]+\)$", entry) or entry.count("(default: ") != 1:
                silent[f"{command} --{flag}"] = entry
            elif "(default: None)" in entry:
                silent[f"{command} --{flag}"] = entry
    assert not silent, silent
    assert {"benchmarks/estimates/table.py --steps", "-m common.run.plot_run --out"} <= {
        f"{c} --{flag}" for c in own for flag in re.findall(r"\[--(\w+) ", got[c])
    }


@dataclass
class PercentArgs:
    warmup: int = 5
    """linear warm-up over 5% of the steps; 100% of %(prog)s's batch, 50%% as typed, %s and %d untouched"""
    name: str = "a%b"
    """any text"""


def test_a_docstring_with_percent_signs_shows_as_written(capsys):
    help_text = " ".join(build_parser(PercentArgs).format_help().split())
    assert (
        "linear warm-up over 5% of the steps; 100% of %(prog)s's batch, 50%% as typed, %s and %d untouched "
        "(default: 5)"
    ) in help_text
    assert "any text (default: a%b)" in help_text
    try:
        parse_args(PercentArgs, ["--help"])
    except SystemExit as e:
        assert e.code == 0
    assert "over 5% of the steps" in capsys.readouterr().out


def test_help_shows_the_flags_in_named_groups_the_methods_own_first():
    # each script's --help: argparse's options (--help, --config), then the method's own group,
    # then the shared groups its Args names on its class line, in that order, each with its flags
    import dataclasses
    import importlib

    for script in METHOD_SCRIPTS:
        args = importlib.import_module(script.removesuffix(".py")).Args
        text = build_parser(args).format_help()
        sections = re.split(r"^(\S[^\n]*):$", text, flags=re.M)[1:]
        flags = {
            title: re.findall(r"^  (?:-h, )?--(\w+)", body, re.M)
            for title, body in zip(sections[::2], sections[1::2])
        }
        own = [name for name in args.__annotations__ if not name.startswith("trl_")]
        groups = {base.__doc__.split(":")[0]: base for base in args.__bases__}
        assert list(flags) == ["options", f"method ({script})", *groups], (script, list(flags))
        assert len(groups) >= 4, script
        assert flags["options"] == ["help", "config"], script
        assert sorted(flags[f"method ({script})"]) == sorted(own), script
        for title, base in groups.items():
            assert flags[title] == [n for n in base.__annotations__ if n not in own], title
        listed = sorted(name for names in flags.values() for name in names)
        assert listed == sorted(["help", *(f.name for f in dataclasses.fields(args))]), script


# Every command whose flags come from common/run/flags.py: the five scripts and the benchmarks that parse an `Args`.
PARSED_COMMANDS = tuple(s.removesuffix(".py") for s in METHOD_SCRIPTS) + tuple(
    sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "benchmarks").rglob("*.py")
        if "parse_args(Args" in p.read_text()
    )
)
ENTRY = re.compile(r"^  (?:-h, )?--(\w+)(.*?)(?=^  -|^\S|\Z)", re.M | re.S)


@pytest.fixture(scope="module")
def shown_help() -> dict[str, tuple[type, str, dict[str, str]]]:
    """{module: (its Args, its --help as `python X --help` prints it, {flag: its entry on one line})}: each
    command's own parse of `--help` (common/run/flags.py `parse_args`, as its `__main__` calls it), in this
    process."""
    shown = {}
    for name in PARSED_COMMANDS:
        module = importlib.import_module(name)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
            parse_args(module.Args, ["--help"], description=module.__doc__.split("\n\n")[0])
        assert stop.value.code in (0, None), (name, stop.value.code)
        text = out.getvalue()
        entries = {flag: " ".join(rest.split()) for flag, rest in ENTRY.findall(text)}
        shown[name] = module.Args, text, entries
    return shown


def test_every_value_flag_states_its_default(shown_help):
    # each flag's entry ends with `(default: X)`, after what it accepts; the command's description heads them
    assert len(PARSED_COMMANDS) >= 10, PARSED_COMMANDS
    for name, (cls, text, entries) in shown_help.items():
        flags = [f.name for f in dataclasses.fields(cls)]
        assert sorted(entries) == sorted(["help", *flags]), name
        silent = [
            flag
            for flag in flags
            if not re.search(r" \(default: [^\n]*\)$", entries[flag])
            or entries[flag].count("(default: ") != 1
        ]
        assert not silent, f"{name} --help: not exactly one default, at the end, for {silent}"
        description = " ".join(importlib.import_module(name).__doc__.split("\n\n")[0].split())
        assert " ".join(text.split("\n\n")[1].split()) == description, name


def test_a_shown_default_is_the_default_used(shown_help):
    # the X of the one `(default: X)` that ends an entry is the value `Args()` holds, but for a flag without a
    # value (None, ""): the words its docstring gives (`(default: --temperature)`), moved to the end; the flags
    # a reader looks for first show theirs
    from common.run.flag_help import field_docs

    checked = worded = 0
    for name, (cls, _, entries) in shown_help.items():
        used, docs, wrong = cls(), field_docs(cls), {}
        for f in dataclasses.fields(cls):
            about, _, shown = entries[f.name].rpartition(" (default: ")
            shown = shown.removesuffix(")")
            value = getattr(used, f.name)
            if (
                f.default is None or f.default == ""
            ):  # (its __post_init__ may resolve it: ada_seq's)
                worded += 1
                doc = " ".join(docs.get(f.name, "").split())
                if not shown or f"(default: {shown})" not in doc or "(default: " in about:
                    wrong[f.name] = (shown, value)
                continue
            checked += 1
            if shown != str(value):
                wrong[f.name] = (shown, value)
        assert not wrong, f"{name} --help shows (shown, used): {wrong}"
    # most defaults are values, checked against Args(); the worded ones are the few unset flags
    assert checked > 3 * worded > 0, (checked, worded)
    expected = {
        "ps_grpo": {"scale_rewards": "False", "num_generations": "8", "max_steps": "150"},
        "ra_rloo": {
            "num_generations": "4",
            "learning_rate": "5e-05",
            "max_steps": "300",
            "w_max": "5.0",
        },
    }
    for name, flags in expected.items():
        cls, _, entries = shown_help[name]
        for flag, value in flags.items():
            assert str(getattr(cls(), flag)) == value, (name, flag)
            assert entries[flag].endswith(f"(default: {value})"), (name, entries[flag])


def test_no_entry_shows_an_empty_or_none_default(shown_help):
    # `None` cannot be typed and `(default: )` says nothing: a flag without a value says in words what it does
    shown = {
        (name, flag): entry
        for name, (_, _, entries) in shown_help.items()
        for flag, entry in entries.items()
        if "(default: None)" in entry or re.search(r"\(default: \)", entry)
    }
    assert not shown, shown


@dataclass
class PlainArgs:  # a tool's flags without --config (the benchmarks')
    max_steps: int = 3
    """steps"""


def test_help_reads_a_config_file_only_for_a_class_that_takes_one(tmp_path, capsys):
    # --help shows what the run would use: a class without --config refuses the file, so its help ignores it
    config = tmp_path / "s.yaml"
    config.write_text("max_steps: 7\n")
    with pytest.raises(SystemExit) as stop:
        parse_args(PlainArgs, ["--config", str(config), "--help"])
    assert stop.value.code in (0, None)
    assert "steps (default: 3)" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit, match="--config"):
        parse_args(PlainArgs, ["--config", str(config)])


def test_help_with_a_bad_config_file_reports_its_problems_as_a_run_does(tmp_path, capsys):
    import ada_est

    config = tmp_path / "bad.yaml"
    config.write_text("n_min: abc\nweighting: nope\nw_max: 3\n")
    with pytest.raises(SystemExit) as run:
        parse_args(ada_est.Args, ["--config", str(config)])
    with pytest.raises(SystemExit) as shown:
        parse_args(ada_est.Args, ["--config", str(config), "--help"])
    assert "usage:" in capsys.readouterr().out
    lines = str(run.value.code).splitlines()
    assert len(lines) == 3 and all(f"--config {config}: key " in line for line in lines), lines
    assert shown.value.code == run.value.code
    with pytest.raises(SystemExit) as bare:
        parse_args(ada_est.Args, ["--help", "--config"])
    assert bare.value.code == "argument --config: expected one argument (--help lists every flag)"


def test_a_default_that_accelerate_changes_says_so():
    # `accelerate launch` (its `accelerate config`) changes these defaults (common/run/launch.py,
    # common/run/accelerate_env.py): their help names the variable
    from common.run.flag_help import field_docs
    from common.run.flags import ScaleFlags

    docs = field_docs(ScaleFlags)
    for flag, variable, code in [
        ("dtype", "ACCELERATE_MIXED_PRECISION=bf16", "common/run/mixed_precision.py"),
        ("fsdp", "ACCELERATE_USE_FSDP", "common/run/accelerate_env.py"),
    ]:
        assert variable.partition("=")[0] in (ROOT / code).read_text(), code
        assert variable in docs[flag], (flag, docs[flag])


def test_help_after_a_config_file_shows_the_files_values_as_defaults(tmp_path):
    # `--config FILE --help`: a flag the file sets shows the file's value, the value the run would use
    import ra_rloo

    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 1e-6\nnum_generations: 6\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        parse_args(ra_rloo.Args, ["--config", str(config), "--help"])
    assert stop.value.code in (0, None), stop.value.code
    entries = {flag: " ".join(rest.split()) for flag, rest in ENTRY.findall(out.getvalue())}
    assert entries["learning_rate"].endswith("(default: 1e-06)"), entries["learning_rate"]
    assert entries["num_generations"].endswith("(default: 6)"), entries["num_generations"]
    assert entries["max_steps"].endswith("(default: 300)"), entries["max_steps"]


def test_a_flag_a_script_redeclares_shows_the_scripts_own_docstring(shown_help):
    # e.g. ps_grpo's --max_steps counts batches of tasks: its docstring, not TrainingFlags', is the help
    from common.run.flag_help import _own_docs

    redeclared = 0
    for name, (cls, _, entries) in shown_help.items():
        for flag, doc in _own_docs(cls).items():
            if any(_own_docs(base).get(flag, doc) != doc for base in cls.__mro__[1:-1]):
                redeclared += 1
                # compared without spaces: argparse may wrap a line at a hyphen
                assert doc.replace(" ", "") in entries[flag].replace(" ", ""), (name, flag)
    assert redeclared >= 3, redeclared
