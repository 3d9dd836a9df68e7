"""The method tags tell the truth: each script's baseline run (its baseline flag, one short step, in this process)
never executes a line of a block tagged with the method's tag, by line tracing (sys.settrace).

The convention (README, "The methods"): `# [TAG]` on its own line tags the block below it, down to the next blank
line or the first line indented less than the comment; at the end of a code line it tags that statement (all of
it when the statement opens a block); a function whose docstring starts with `[TAG]` is tagged whole. A block ends
at a blank line, at a line indented less than the comment, or at the next comment line at the comment's indent; a
heading followed by another mark leaves the block to that mark. Of a tagged
`if`, the body is the method's, the test and any `else` branch run either way. Two marks are not checked:
`[TAG setup]` (the paper's experimental setup, e.g. its reward or evaluation: the baseline runs it too) and
`[TAG] (also in <baseline>: ...)` (the method's code that the baseline runs where it changes nothing)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_main

# script: (its method tags, the baseline's flags). ada_seq.py's GRPO-n is its [ADA] code with one round of n (the
# pool is the group), so only its [DAPO] lines are off there; ada_est.py runs no baseline (GRPO-n8 is ada_seq.py's).
BASELINES = {
    "ra_rloo.py": ("ra_rloo.py", ("RA-RLOO",), ["--replay", "none", "--reward", "binary"]),
    "ps_grpo.py multiturn": (
        "ps_grpo.py",
        ("PS",),
        ["--prefix_sampling", "false", "--mode", "multiturn"],
    ),
    "ps_grpo.py text": ("ps_grpo.py", ("PS",), ["--prefix_sampling", "false", "--mode", "text"]),
    "pros_ppo.py": ("pros_ppo.py", ("PROS",), ["--pros", "off"]),
    "ada_seq.py": ("ada_seq.py", ("DAPO",), ["--max_rounds", "1", "--round_repeat", "4"]),
}
TINY = [
    "--max_steps",
    "1",
    "--eval_steps",
    "0",
    "--eval_prompts",
    "2",
    "--eval_samples",
    "1",
    "--prompts_per_step",
    "4",
    "--max_completion_length",
    "8",
    "--num_threads",
    "1",
    "--eval_train_prompts",
    "0",
    "--save_steps",
    "0",
]


def _statement_lines(stmt: ast.stmt) -> set[int]:
    """The lines a tagged statement owns: all of them, but of an `if` only its body (recursively)."""
    if isinstance(stmt, ast.If):
        return {line for child in stmt.body for line in _statement_lines(child)}
    return set(range(stmt.lineno, stmt.end_lineno + 1))


def tagged_lines(source: str, tags: tuple[str, ...]) -> dict[int, int]:
    """{line: the line of the tag that covers it} for every checked tag (setup and 'also in' marks left out)."""
    lines = source.splitlines()
    pattern = re.compile(r"#.*\[(%s)\](?! \(also in)" % "|".join(map(re.escape, tags)))
    any_mark = re.compile(r"#.*\[(%s)( setup)?\]" % "|".join(map(re.escape, tags)))
    statements = [s for s in ast.walk(ast.parse(source)) if isinstance(s, ast.stmt)]
    starting = {}
    for stmt in statements:  # the innermost statement starting on each line
        starting[stmt.lineno] = stmt
    out: dict[int, int] = {}
    for number, text in enumerate(lines, 1):
        if not pattern.search(text):
            continue
        if text.strip().startswith("#"):  # a comment line: the block below it
            indent = len(text) - len(text.lstrip())
            below = number + 1
            while below <= len(lines) and lines[below - 1].strip().startswith("#"):
                if any_mark.search(lines[below - 1]):
                    break  # a heading's block belongs to the next mark below it
                below += 1  # the tag's comment goes on
            if below <= len(lines) and any_mark.search(lines[below - 1]):
                continue
            while (
                below <= len(lines)
                and lines[below - 1].strip()
                and len(lines[below - 1]) - len(lines[below - 1].lstrip()) >= indent
                and not lines[below - 1].startswith(" " * indent + "#")
            ):
                stmt = starting.get(below)
                if stmt is not None:
                    out.update((line, number) for line in _statement_lines(stmt))
                    below = stmt.end_lineno + 1
                else:
                    below += 1
        elif number in starting:  # a trailing tag: its statement
            out.update((line, number) for line in _statement_lines(starting[number]))
    for stmt in statements:  # functions whose docstring opens with the tag
        if (
            isinstance(stmt, (ast.FunctionDef, ast.ClassDef))
            and ast.get_docstring(stmt)
            and re.match(
                r"\[(%s)\](?! \(also in)" % "|".join(map(re.escape, tags)), ast.get_docstring(stmt)
            )
        ):
            out.update(
                (line, stmt.lineno)
                for line in range(stmt.body[0].end_lineno + 1, stmt.end_lineno + 1)
            )
    return out


def executed_lines(script: str, argv: list[str]) -> set[int]:
    """The lines of `script` that run_main([script, *argv]) executes."""
    path = str(ROOT / script)
    seen: set[int] = set()

    def local(frame, event, arg):
        if event == "line":
            seen.add(frame.f_lineno)
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename == path else None

    __import__(Path(script).stem)  # the module's own top level is not the run
    sys.settrace(tracer)
    try:
        run_main([script, *argv])
    finally:
        sys.settrace(None)
    return seen


def test_tag_parser_on_a_constructed_source():
    source = '''
def method():
    """[M] the method's own function"""
    return 1


def main(flag):
    x = 0  # [M setup] the paper's reward: runs in both
    # [M] a block: both statements, up to the blank line
    #     (the tag's comment may go on)
    y = 1
    z = [y,
         2]
    # another comment ends the block
    v = 3
    # ==== [M] a heading
    # [M] (also in the baseline: v is 3 there) the next mark takes the block
    v = 4

    if flag:  # [M] the body only
        x = method()
    else:
        x = 2
    w = x  # [M] (also in the baseline: x is 2 there) not checked
    return w
'''
    got = tagged_lines(source, ("M",))
    assert sorted(got) == [4, 11, 12, 13, 21]
    assert got[21] == 20 and got[4] == 2 and got[11] == 9


@pytest.mark.parametrize("baseline", sorted(BASELINES))
def test_the_baseline_never_runs_a_method_tagged_line(baseline, tiny_base, tmp_path):
    script, tags, flags = BASELINES[baseline]
    source = (ROOT / script).read_text()
    tagged = tagged_lines(source, tags)
    assert len(tagged) > 10  # the file tags its method
    ran = executed_lines(
        script,
        ["--model_name_or_path", tiny_base, "--output_dir", str(tmp_path / "run"), *TINY, *flags],
    )
    assert len(ran) > 100  # the trace saw the loop
    lines = source.splitlines()
    wrong = [
        f"{script}:{n} (tag on line {tagged[n]}): {lines[n - 1].strip()}"
        for n in sorted(ran & set(tagged))
    ]
    assert not wrong, "the baseline runs tagged lines:\n" + "\n".join(wrong)
