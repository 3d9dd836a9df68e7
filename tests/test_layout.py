"""The layout promises: one self-contained loop per method file, leaf modules in common/ (no import cycle), and a
real-data run that loads neither the embedded demo nor more than a bounded number of lines of common/."""
import ast
import re
import sys
from pathlib import Path

from conftest import ROOT

SCRIPTS = ("ra_rloo.py", "ada_seq.py", "ada_est.py", "ps_grpo.py", "pros_ppo.py")


def common_imports(path: Path) -> set[str]:
    """Every `common.X` module a file imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "common":
                found |= {f"common.{alias.name}" for alias in node.names}
            elif node.module.startswith("common."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("common.")}
    return found


def test_common_import_graph_has_no_cycle():
    graph = {f"common.{p.stem}": common_imports(p) for p in (ROOT / "common").glob("*.py") if p.stem != "__init__"}
    state = {}

    def visit(node, path):
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import cycle: {' -> '.join(path + [node])}"
        state[node] = "open"
        for dep in graph.get(node, ()):
            visit(dep, path + [node])
        state[node] = "done"

    for module in graph:
        visit(module, [])
    assert "common.generation.hf" in graph["common.generation.vllm_backend"]  # the former cycle, now one-way


def test_each_method_file_holds_its_update_and_is_at_most_700_lines():
    for script in SCRIPTS:
        source = (ROOT / script).read_text()
        assert len(source.splitlines()) <= 700, script
        for piece in ("accelerator.backward(", "clip_grad_norm_(", "optimizer.step()", "scheduler.step()",
                      "zero_grad(", "generator.sync_weights(policy)", "reduce_sums(accelerator"):
            assert piece in source, (script, piece)
        assert max(len(line) for line in source.splitlines()) <= 120, script
        assert not {"common.runtime", "common.ada"} & common_imports(ROOT / script)


def test_real_data_path_loads_no_demo_and_at_most_2990_lines_of_common(tmp_path):
    # what a user copies with one method: the shared flags and their ranges, checkpoints with FSDP hooks, the output
    # folder's claim (its lock, re-checked before each removal, refusal of a used folder and of a resume that would
    # mix runs, the shared-folder check, a failed write stopping every rank), several processes' shares and global
    # batch statistics, a timed-out collective's one-line stop (step and phase), the sample log, the packed layout,
    # the accelerate config mapping, the CPU thread policy, the end-of-run summary, the training-prompt evaluation,
    # the mechanism measures (pros_ppo.py loads the most: the Gibbs sampler), the loaders' switch for library
    # progress bars, the stop tokens (EOS, the model's end-of-turn ids, --stop_token_ids), a KL reference that
    # computes as the policy, the one success rule and the reward statistics every method shares (NaN-aware:
    # completions no reward function scored are left out), the log-prob step recomputed chunk by chunk in backward;
    # common/distributed/fsdp.py, common/run/flags.py and common/model/lora.py load only with --fsdp / --config / --lora_r, so they are
    # not counted here
    from benchmarks.speed import import_footprint

    model_dir, data = import_footprint.make_inputs(tmp_path)
    for script in SCRIPTS:
        modules = import_footprint.footprint(script, model_dir, data, tmp_path)
        assert not set(import_footprint.DEMO_MODULES) & set(modules), (script, sorted(modules))
        assert "common.rl.verifiers" in modules  # it did take the real-data path (math-verify rewards)
        assert "common.tasks.rewards" not in modules  # user reward functions' loader: only with --reward_funcs
        assert sum(modules.values()) <= 2990, (script, sum(modules.values()))


def test_no_line_over_120_characters():
    files = [*SCRIPTS, *(str(p.relative_to(ROOT)) for folder in ("common", "tests")
                         for p in (ROOT / folder).glob("*.py")),
             *(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").rglob("*.py"))]
    long = [f"{name}:{i}" for name in files for i, line in enumerate((ROOT / name).read_text().splitlines(), 1)
            if len(line) > 120]
    assert not long, long


def test_no_unrestricted_torch_load():
    # a checkpoint is data: every torch.load keeps the restricted unpickler (tests included)
    folders = ("common", "benchmarks", "tests")
    files = [*ROOT.glob("*.py"), *(p for folder in folders for p in (ROOT / folder).rglob("*.py"))]
    unsafe = "weights_only=" + "False"  # spelled in two parts so that this file does not match itself
    assert not [str(p.relative_to(ROOT)) for p in files if unsafe in p.read_text()]


def test_the_report_package_reads_along_its_pipeline():
    # benchmarks/sweep/report/__init__.py lists its modules in pipeline order; each imports only the ones listed before
    # it, opens with a docstring and stays short enough to read
    package = ROOT / "benchmarks" / "sweep" / "report"
    order = re.findall(r"^    (\w+)\.py ", ast.get_docstring(ast.parse((package / "__init__.py").read_text())), re.M)
    assert sorted(order) == sorted(p.stem for p in package.glob("*.py") if not p.stem.startswith("__")), order
    for i, name in enumerate(order):
        tree = ast.parse((package / f"{name}.py").read_text())
        assert ast.get_docstring(tree), name
        assert len((package / f"{name}.py").read_text().splitlines()) <= 400, name
        imported = {node.module.rsplit(".", 1)[1] for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks.sweep.report.")}
        assert imported <= set(order[:i]), (name, imported - set(order[:i]))
