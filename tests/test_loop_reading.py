"""What a reader meets in a method's step loop: its length in code lines, and the names from common/
it uses, each listed on the method's page ("Reading the file").

    python tests/test_loop_reading.py      # prints each script's two figures
"""

import ast
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the loop's budget of code lines (no blank or comment lines)
LOOP_LINES = {
    "ra_rloo.py": 95,
    "ps_grpo.py": 115,
    "ada_est.py": 115,
    "ada_seq.py": 125,
    "pros_ppo.py": 170,
}
# the names from common/ ra_rloo's loop may use
RA_RLOO_NAMES = 25
# built by common/ but a reader knows them already: torch's and accelerate's own objects
FAMILIAR = {
    "accelerator",
    "optimizer",
    "scheduler",
    "model",
    "policy",
    "ref_model",
    "critic",
    "critic_model",
    "critic_optimizer",
    "critic_scheduler",
    "tokenizer",
}


def step_loop(script: str) -> tuple[ast.FunctionDef, ast.For, list[str]]:
    """main(), its `for step in range(...)` loop and the file's lines."""
    source = (ROOT / script).read_text()
    tree = ast.parse(source)
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    loop = next(
        n
        for n in main.body
        if isinstance(n, ast.For) and isinstance(n.target, ast.Name) and n.target.id == "step"
    )
    return main, loop, source.splitlines()


def loop_code_lines(script: str) -> int:
    """The step loop's lines holding code (blank and comment-only lines left out)."""
    _, loop, lines = step_loop(script)
    source = "\n".join(lines)
    comment_only = {
        token.start[0]
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
        and not lines[token.start[0] - 1][: token.start[1]].strip()
    }
    return sum(
        1
        for row in range(loop.lineno, loop.end_lineno + 1)
        if lines[row - 1].strip() and row not in comment_only
    )


def common_names(script: str) -> list[str]:
    """The names from common/ the step loop uses: functions and classes imported from common/, and
    the attributes (or the call) of objects main() built with them before the loop."""
    main, loop, _ = step_loop(script)
    tree = ast.parse((ROOT / script).read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("common")
        for alias in node.names
    }
    built = set()
    for node in ast.walk(main):
        if isinstance(node, ast.Assign) and node.lineno < loop.lineno:
            call = node.value
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) in imported:
                for target in node.targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            built.add(name.id)
    built -= FAMILIAR
    found = set()
    parents = {child: parent for parent in ast.walk(loop) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(loop):
        if not isinstance(node, ast.Name):
            continue
        if node.id in imported:
            found.add(node.id)
        elif node.id in built:
            parent, chain = parents.get(node), node.id
            while isinstance(parent, ast.Attribute):
                chain, parent = f"{chain}.{parent.attr}", parents.get(parent)
            if chain != node.id:
                found.add(chain)
            elif isinstance(parent, ast.Call) and parent.func is node:
                found.add(f"{node.id}()")
    return sorted(found)


def reading_section(script: str) -> list[str]:
    """The names the method page's "Reading the file" section lists (each line's leading `name`)."""
    page = (ROOT / "docs" / script.replace(".py", ".md")).read_text()
    match = re.search(r"^## Reading the file\n(.*?)(?=^## |\Z)", page, re.S | re.M)
    assert match, f"docs/{script[:-3]}.md: no '## Reading the file' section"
    return sorted(re.findall(r"^- `([^`]+)`", match.group(1), re.M))


@pytest.mark.parametrize("script", sorted(LOOP_LINES))
def test_the_step_loop_fits_its_budget(script):
    assert loop_code_lines(script) <= LOOP_LINES[script], (script, loop_code_lines(script))


def test_ra_rloo_loop_uses_few_names_from_common():
    names = common_names("ra_rloo.py")
    assert len(names) <= RA_RLOO_NAMES, names


@pytest.mark.parametrize("script", sorted(LOOP_LINES))
def test_the_method_page_lists_exactly_the_names_its_loop_uses(script):
    assert reading_section(script) == common_names(script), script


if __name__ == "__main__":
    for script in sys.argv[1:] or (
        "ra_rloo.py",
        "ps_grpo.py",
        "ada_est.py",
        "ada_seq.py",
        "pros_ppo.py",
    ):
        names = common_names(script)
        print(
            f"{script}: loop {loop_code_lines(script)} code lines, {len(names)} names from common/"
        )
        print("   ", " ".join(names))
