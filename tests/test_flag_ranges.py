"""Every numeric flag of the five scripts declares what it accepts where it is defined (common/run/flags.py): a value
outside that stops the run at once with one line naming the flag, before anything is loaded or written."""

import importlib
import math
import os
import re
import subprocess
import sys
import typing

import pytest
from conftest import ROOT

from common.run.flags import build_parser, declared, parse_args

SCRIPTS = ("ra_rloo", "ps_grpo", "pros_ppo", "ada_seq", "ada_est")
# values their declaration accepts but the script's validate() refuses next to the other flags' defaults
COMBINATIONS = {"ps_grpo": {("deadzone_high", 0.0), ("ratio_max", 0.0)}}  # below their low ends


def numeric_fields(cls) -> dict[str, type]:
    """{field: int or float} for the int / float / Optional[int] / Optional[float] fields of `cls`."""
    found = {}
    for name, hint in typing.get_type_hints(cls).items():
        kinds = (
            [k for k in typing.get_args(hint) if k is not type(None)]
            if typing.get_args(hint)
            else [hint]
        )
        if len(kinds) == 1 and kinds[0] in (int, float):
            found[name] = kinds[0]
    return found


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_numeric_flag_declares_its_range_and_help_states_it(script):
    cls = importlib.import_module(script).Args
    ranges, numeric = declared(cls), numeric_fields(cls)
    assert len(numeric) > 20  # the shared flags are among them
    assert not [name for name in numeric if ranges[name] is None], (
        "numeric flags without a declaration"
    )
    text = build_parser(cls).format_help()
    entries = {
        flag: " ".join(rest.split())
        for flag, rest in re.findall(r"^  --(\w+)(.*?)(?=^  -|^\S|\Z)", text, re.M | re.S)
    }
    for name in numeric:
        # what it accepts, then exactly one default, the entry's last words
        assert re.search(
            rf"\[{re.escape(str(ranges[name]))}\] \(default: [^()]*(\(.*\))?[^()]*\)$",
            entries[name],
        ), (
            name,
            entries[name],
        )
        assert entries[name].count("(default: ") == 1, (name, entries[name])


@pytest.mark.parametrize("script", SCRIPTS)
def test_boundary_values_of_every_numeric_flag(script):
    cls = importlib.import_module(script).Args
    ranges = declared(cls)
    refused_together = []
    for name, kind in numeric_fields(cls).items():
        for value in [0, -1] if kind is int else [0.0, -1.0, math.nan, math.inf]:
            try:
                parse_args(cls, [f"--{name}", str(value)])
                message = None
            except SystemExit as e:
                message = str(e)
                assert "\n" not in message and f"--{name} " in message, (name, value, message)
            if not ranges[name].accepts(value):
                finite = "a finite number " if not math.isfinite(value) else ""
                assert message == f"--{name} {value}: must be {finite}{ranges[name]}", (name, value)
            elif message is not None:
                refused_together.append((name, value, message))
    assert {(name, value) for name, value, _ in refused_together} == COMBINATIONS.get(
        script, set()
    ), refused_together


@pytest.mark.parametrize(
    "script, flag, value",
    [
        ("ra_rloo", "learning_rate", "-1"),  # AdamW's own error, after the model was loaded
        (
            "ps_grpo",
            "env_max_number",
            "0",
        ),  # a multi-turn warm-up for an environment with no problems
        ("pros_ppo", "beta", "nan"),  # NaN weights, found by sampling
        ("ada_seq", "max_completion_length", "0"),  # transformers' error at the first generate
        ("ada_est", "gen_batch_size", "0"),  # range() with step 0
    ],
)
def test_a_bad_value_stops_the_run_with_one_line(tmp_path, script, flag, value):
    out = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            f"{script}.py",
            f"--{flag}",
            value,
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--num_threads",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip()
    assert line.splitlines() == [line] and line.startswith(f"--{flag} ") and ": must be " in line, (
        line
    )
    assert str(float(line.split()[1].rstrip(":"))) == str(
        float(value)
    )  # the value as parsed (-1.0 for -1)
    assert not out.exists()  # no step, no metrics.jsonl, no args.json


def test_a_range_reads_as_the_values_it_accepts():
    # --help and the refusal show it: an open end is a parenthesis, a closed one a bracket
    from common.run.ranges import Range

    assert str(Range(0, 1, lo_open=True)) == "in (0, 1]"
    assert str(Range(0, 1, hi_open=True)) == "in [0, 1)"
    assert str(Range(0, lo_open=True)) == "> 0"
    assert str(Range(hi=1, hi_open=True)) == "< 1"
    assert str(Range(1, zero="off")) == ">= 1; 0 = off"
    assert str(Range()) == "finite"


def test_an_infinite_value_is_refused_as_not_finite_with_its_range():
    from common.run.ranges import Range, refusal

    # `inf` passes a one-sided range's comparison: the line says what is wrong with it
    assert refusal(Range(0, lo_open=True), float("inf")) == "must be a finite number > 0"
    assert refusal(None, float("nan")) == "must be a finite number"
    assert refusal(Range(0, lo_open=True), 0.0) == "must be > 0"
