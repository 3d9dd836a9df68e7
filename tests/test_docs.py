"""The docs stay true to the code: every metric a script logs is documented, every relative link resolves, the README
stays a front door, and a run ends with a summary whose plot command works."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SHORT_RUN_FLAGS

DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *DOCS]
SCRIPTS = sorted(SHORT_RUN_FLAGS)


def documented(page: Path) -> list[re.Pattern]:
    """The metric names a page documents: every backticked name (`kl`, `ra_is_weight_mean`), `<...>` standing for one
    word or number after at least three literal characters (`eval_pass@<k>`, `ada_active_after_round_<r>`)."""
    def is_name(word: str) -> bool:
        literal = word.split("<")[0]
        return bool(re.fullmatch(r"[a-z][\w@]*(<\w+>[\w@]*)*", word)) and len(literal) >= (3 if "<" in word else 2)

    names = {word for span in re.findall(r"`([^`\n]+)`", page.read_text()) for word in re.split(r"[,\s]+", span)
             if is_name(word)}
    return [re.compile("[A-Za-z0-9]+".join(re.escape(part) for part in re.split(r"<\w+>", name))) for name in names]


def logged_keys(out: Path) -> set[str]:
    return {key for line in (out / "metrics.jsonl").read_text().splitlines() for key in json.loads(line)}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_logged_metric_is_documented(short_run, script):
    out, _ = short_run(script)
    page = ROOT / "docs" / script.replace(".py", ".md")
    patterns = documented(page) + documented(ROOT / "docs" / "metrics.md")
    missing = sorted(key for key in logged_keys(out) if not any(p.fullmatch(key) for p in patterns))
    assert not missing, f"logged by {script} but documented neither in {page.name} nor in metrics.md: {missing}"


def test_the_documented_names_are_matched_strictly():
    # the matcher must not turn prose or paths into wildcards that would accept any key
    patterns = documented(ROOT / "docs" / "metrics.md")
    assert any(p.fullmatch("eval_pass@16") for p in patterns)
    assert not any(p.fullmatch("not_a_metric_anywhere") for p in patterns)
    assert not any(p.fullmatch("eval_pass") for p in patterns)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def figure_pending(target: Path) -> bool:
    """docs/figures/<script>.png are drawn by benchmarks/report.py; until it draws them, a link to one may wait."""
    report = "".join(p.read_text() for p in (ROOT / "benchmarks" / "report").glob("*.py"))
    return target.parent == ROOT / "docs" / "figures" and not re.search(r"docs.{0,12}figures", report)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            if not figure_pending(resolved):
                broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_each_script_has_its_page_and_the_readme_stays_short():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    for script in SCRIPTS:
        page = ROOT / "docs" / script.replace(".py", ".md")
        assert page.exists() and f"docs/{page.name}" in readme, script
        text = page.read_text()
        for section in ("## Overview", "## Usage", "## Logged metrics", "## Implementation details", "## Results",
                        "### 2,048-prompt pool", "## Known limitations"):
            assert section in text, (script, section)


def test_no_issue_numbers_and_no_local_paper_paths():
    files = [*PAGES, *ROOT.glob("*.py"), *(ROOT / "common").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "benchmarks" / "report").glob("*.py")]
    found = [f"{f.relative_to(ROOT)}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
             if re.search(r"issue #?\d|\(#\d+\)|#\d+'s|shared/papers", line, re.IGNORECASE)]
    assert not found, found


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_run_ends_with_its_summary_and_the_plot_command_draws_it(short_run, script, tmp_path):
    out, stdout = short_run(script)
    summary = stdout[stdout.index("run ended at step 3"):]
    assert str(out) in summary and "metrics.jsonl" in summary and "checkpoint-3/" in summary
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0]["eval_pass@1"], rows[-1]["eval_pass@1"]  # the step-0 and the final evaluation
    assert re.search(rf"held-out pass@1 +{first:.3f} \(step 0\) -> {last:.3f} \(step 3\)", summary), summary
    assert "repeatable: yes (--num_threads 1" in summary  # the short runs fix the thread count
    command = shlex.split(re.search(r"curves: +(python -m common\.plot_run .+)", summary).group(1))
    assert "--metrics" in command  # the method's own metrics are plotted too
    pytest.importorskip("matplotlib")
    png = tmp_path / "curves.png"
    subprocess.run([sys.executable, *command[1:], "--out", str(png)], cwd=ROOT, check=True, capture_output=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_the_plot_command_names_what_is_missing(tmp_path):
    r = subprocess.run([sys.executable, "-m", "common.plot_run", str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode != 0 and "metrics.jsonl: not found" in r.stderr
    (tmp_path / "metrics.jsonl").write_text("")
    r = subprocess.run([sys.executable, "-m", "common.plot_run", str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode != 0 and "metrics.jsonl: empty" in r.stderr


def test_the_plot_command_names_matplotlib_when_it_is_missing(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval_pass@1": 0.5}\n')
    hide = ("import sys; sys.modules['matplotlib'] = None; from common.plot_run import main; "
            f"main([{str(tmp_path)!r}])")
    r = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "pip install matplotlib" in r.stderr


# ---------------------------------------------------------------- numbers generated from the committed runs


def test_the_docs_generated_blocks_are_what_the_committed_runs_give():
    """Every method page's results block, the README's durations and claim list and benchmark.md's commands sit
    between report.py's markers; regenerating them in memory from benchmarks/runs must give the pages' text."""
    from benchmarks import report

    runs = report.load_runs(report.RUNS_DIR)
    blocks = report.doc_blocks(runs, report.build_aggs(runs)[1])
    assert {p.name for p in blocks} >= {s.replace(".py", ".md") for s in SCRIPTS} | {"README.md", "benchmark.md"}
    stale = []
    for page, named in blocks.items():
        text = page.read_text()
        for name, body in named.items():
            begin, end = report.MARK_BEGIN.format(name), report.MARK_END.format(name)
            assert text.count(begin) == 1 and text.count(end) == 1, (page.name, name)
            if text.split(begin, 1)[1].split(end, 1)[0].strip("\n") != body.strip("\n"):
                stale.append(f"{page.relative_to(ROOT)}: {name}")
    assert not stale, f"out of date (run `python benchmarks/report.py --write_docs`): {stale}"
    # the same check as report.stale_blocks, which `--write_docs` users can call: a hand-edited figure is caught
    page = ROOT / "docs" / "ada_seq.md"
    row = "| GRPO-n4 (`grpo_n4`) (baseline) | "
    edited = page.read_text().replace(row + "9 |", row + "8 |")
    assert edited != page.read_text() and report.replace_blocks(edited, blocks[page]) != edited


def test_every_committed_run_is_remade_by_a_command_on_the_results_page():
    """The results page lists `python benchmarks/run.py ...` commands built from the runs' bench.json: together they
    cover every committed run, and for each run run.py builds exactly the command its bench.json recorded."""
    from benchmarks import report, run
    from common.cli import parse_args

    page = (ROOT / "benchmarks" / "results" / "README.md").read_text()
    built = {}
    for line in page.splitlines():
        if line.startswith("python benchmarks/run.py "):
            args = parse_args(run.Args, shlex.split(line)[2:])
            settings, runs_dir = run.resolve(args)
            for name in args.only_names():
                for seed in settings.seeds:
                    out = run._portable(runs_dir / name / f"seed{seed}")
                    built[(name, seed)] = run.build_command(run.BY_NAME[name], settings, seed, out)
    recorded = {(cfg, seed): r.meta.get("cmd") for cfg, by in report.load_runs(report.RUNS_DIR).items()
                for seed, r in by.items()}
    assert len(recorded) > 200 and set(built) == set(recorded), set(built) ^ set(recorded)
    wrong = sorted(key for key in recorded if built[key] != recorded[key])
    assert not wrong, wrong
