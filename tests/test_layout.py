"""The layout promises: one self-contained loop per method file that reads in the loop's order, leaf modules in
common/ shelved by purpose (no import cycle, none a single script's private helper), one flag name per concept, and a
real-data run that never loads the embedded demo."""

import ast
import importlib
import re
from pathlib import Path

import pytest
from conftest import ROOT

SCRIPTS = ("ra_rloo.py", "ada_seq.py", "ada_est.py", "ps_grpo.py", "pros_ppo.py")


MODULES = {
    ".".join(path.relative_to(ROOT).with_suffix("").parts): path
    for path in (ROOT / "common").rglob("*.py")
    if path.stem != "__init__"
}
# each step of the loop, in the order a reader meets it in `main` (the first line matching each pattern)
LOOP_ORDER = (
    # ada_seq samples and verifies round by round (its RoundSampler scores each round, and the
    # rounds go on until a prompt's exit): the sampler built, then the rounds run
    ("sample", r"generator\.generate\(|rollout_\w+\(|RoundSampler\("),
    ("verify", r"\.score\(|fixed_scored\(|multi_round_sampling\("),
    ("advantages", r"\w*advantages\w*\("),
    ("update", r"accelerator\.backward\("),
    ("optimizer step", r"optimizer\.step\(\)"),
    ("push weights", r"generator\.sync_weights\(policy\)"),
    ("metrics", r"= \w+_metrics\("),
    ("evaluation", r"run_log\.evaluation_due\("),
    ("the row", r"run_log\.write_row\("),
    ("checkpoint", r"checkpoints\.save\("),
    ("stop", r"if stopping:"),
)
# the scripts whose step statistics come from the step's tensors in one call at the step's end
# (`run_log.step_metrics`), none fed through the update to a collector
# the common/ modules one script alone imports, and why they are not in that script
SINGLE_USER = {
    "common.rl.gibbs": "PROS's Polya-Gamma Gibbs sampler: the method's own primitive, tested on its own",
    "common.demo.countdown_env": "the embedded multi-turn environment (a task, with its warm-up build)",
    "common.envs.protocol": "Prefix Sampling's agentic setting: your environment class and its calls",
    "common.envs.rollout": "Prefix Sampling's agentic setting: multi-turn rollouts and prefix replay",
    "common.envs.tasks": "Prefix Sampling's agentic setting: an environment's tasks and rewards",
    "common.envs.startup": "Prefix Sampling's agentic setting: your environment checked and "
    "stated before the model loads",
    "common.demo.countdown": "the embedded task, whose solver writes RA-RLOO's seeded demonstrations",
    "common.rl.episode": "the multi-turn rollout record, filled by the environment (common/demo)",
    "common.demo.tiny_model": "the embedded base, which ps_grpo.py's multi-turn warm-up starts from",
    "common.distributed.fsdp": "FSDP2 (the others reach it through common/run/setup.py): pros_ppo.py "
    "also shards its critic and keeps the critic's optimizer shard",
    "common.rl.masking": "the padded layouts (the others reach them through common/rl/logprobs.py's "
    "Forward): pros_ppo.py aligns the generator's log-probs with its old policy's pass",
}
# names a concept had before it took TRL's (or the paper's) one name
RETIRED_FLAGS = {
    "k",
    "n",
    "kl_coef",
    "clip_low",
    "clip_high",
    "eps_low",
    "eps_high",
    "ppo_epochs",
    "final_keep_per_prompt",
    "adv_std_norm",
    "scale_advantages",
    "max_new_tokens",
    "max_prompt_tokens",
    "eval_every",
    "save_every",
    "keep_checkpoints",
    "dataset",
    "train_split",
    "eval_split",
    "resume",
    "vf_clip",
    "num_minibatches",
    "vllm_max_model_len",
}


def common_imports(path: Path) -> set[str]:
    """Every `common.X...` module a file imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("common"):
                names = {f"{node.module}.{alias.name}" for alias in node.names}
                found |= (names & set(MODULES)) or {node.module}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("common.")}
    return found & set(MODULES)


def main_function(script: str) -> ast.FunctionDef:
    tree = ast.parse((ROOT / script).read_text())
    return next(
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"
    )


def test_common_import_graph_has_no_cycle():
    graph = {name: common_imports(path) for name, path in MODULES.items()}
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
    assert "common.generation.hf" in graph["common.generation.vllm_backend"]  # one-way


def test_common_folders_are_layers():
    # a folder importing from a folder that imports it back is a cycle a reader meets even when
    # the modules themselves form none (a module of each folder in one direction)
    arrows: dict[str, dict[str, str]] = {}
    for name, path in MODULES.items():
        for dep in common_imports(path):
            if dep.split(".")[1] != name.split(".")[1]:
                arrows.setdefault(name.split(".")[1], {})[dep.split(".")[1]] = f"{name} -> {dep}"
    state: dict[str, str] = {}

    def visit(folder, path):
        if state.get(folder) == "done":
            return
        assert state.get(folder) != "open", "folder cycle: " + "; ".join(
            arrows[a][b]
            for a, b in zip(path[path.index(folder) :], path[path.index(folder) + 1 :] + [folder])
        )
        state[folder] = "open"
        for dep in arrows.get(folder, {}):
            visit(dep, path + [folder])
        state[folder] = "done"

    for folder in sorted(arrows):
        visit(folder, [])
    assert "tasks" in arrows["demo"] and "distributed" in arrows["run"]  # the arrows that stay


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_method_file_holds_its_update_and_its_loop_reads_in_order(script):
    source = (ROOT / script).read_text()
    for piece in (
        "accelerator.backward(",
        "clip_grad_norm_(",
        "optimizer.step()",
        "scheduler.step()",
        "zero_grad(",
        "generator.sync_weights(policy)",
    ):
        assert piece in source, (script, piece)
    main = main_function(script)
    lines = source.splitlines()[main.lineno - 1 : main.end_lineno]
    loop_start = next(
        i for i, line in enumerate(lines) if line.startswith("    for step in range(")
    )
    first = {}
    for name, pattern in LOOP_ORDER:
        hits = [i for i, line in enumerate(lines) if i > loop_start and re.search(pattern, line)]
        assert hits, (script, f"no {name} in main's loop")
        first[name] = hits[0]
    order = sorted(first, key=first.get)
    assert order == [name for name, _ in LOOP_ORDER], (script, order)
    method = script.removesuffix(".py")
    calls = [
        node
        for node in ast.walk(main)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == f"{method}_metrics"
    ]
    assert len(calls) == 1, (script, f"the step's metrics: one call of {method}_metrics")


@pytest.mark.parametrize("script", SCRIPTS)
def test_main_has_no_trailing_comments_but_shape_notes(script):
    import io
    import tokenize

    source = (ROOT / script).read_text()
    main = main_function(script)
    lines = source.splitlines()
    trailing = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        row = token.start[0]
        if token.type != tokenize.COMMENT or not main.lineno <= row <= main.end_lineno:
            continue
        code = lines[row - 1][: token.start[1]]
        if code.strip() and not re.fullmatch(r"# \[[^\]]+\]", token.string):
            trailing.append(f"{script}:{row}: {token.string}")
    assert not trailing, trailing


def test_a_common_module_one_script_alone_imports_is_a_method_primitive():
    users: dict[str, set[str]] = {}
    for script in SCRIPTS:
        for module in common_imports(ROOT / script):
            users.setdefault(module, set()).add(script)
    single = {module: scripts for module, scripts in users.items() if len(scripts) == 1}
    assert set(single) <= set(SINGLE_USER), {
        m: s for m, s in single.items() if m not in SINGLE_USER
    }


def test_one_flag_name_per_concept_across_the_scripts():
    import dataclasses
    import importlib
    import typing

    from common.run.flags import BaseArgs

    shared = {field.name for field in dataclasses.fields(BaseArgs)}
    types: dict[str, dict[str, object]] = {}
    for script in SCRIPTS:
        args = importlib.import_module(script.removesuffix(".py")).Args
        hints = typing.get_type_hints(args, include_extras=False)
        for field in dataclasses.fields(args):
            assert field.name not in RETIRED_FLAGS, (script, field.name)
            # Optional[X]: X with None as "the method's default"
            kinds = [kind for kind in typing.get_args(hints[field.name]) if kind is not type(None)]
            optional = typing.get_origin(hints[field.name]) is typing.Union and len(kinds) == 1
            types.setdefault(field.name, {})[script] = kinds[0] if optional else hints[field.name]
        own = {field.name for field in dataclasses.fields(args)} - shared
        assert "success_reward" not in own, script  # one declaration, in BaseArgs
    # a name two scripts share means one thing: the same type in each
    differing = {
        name: by_script
        for name, by_script in types.items()
        if len(set(map(str, by_script.values()))) > 1
    }
    assert not differing, differing


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_a_step_loop_reads_is_declared_in_its_files_args(script):
    # a reader finds each hyperparameter of the loop in the file's own Args, with its docstring:
    # the flag stays declared there, not only in one of common/run/flags.py's shared groups
    tree = ast.parse((ROOT / script).read_text())
    args = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args"
    )
    body = list(args.body)
    declared = {
        node.target.id
        for node, after in zip(body, body[1:] + [None])
        if isinstance(node, ast.AnnAssign)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }
    loop = next(
        node
        for node in ast.walk(main_function(script))
        if isinstance(node, ast.For) and getattr(node.target, "id", None) == "step"
    )
    read = {
        node.attr
        for node in ast.walk(loop)
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "args"
    }
    assert read, script
    assert read <= declared, (script, sorted(read - declared))


def test_real_data_path_loads_no_demo_code(tmp_path):
    # what a user copies with one method for a real dataset never loads the embedded demo (Countdown, its
    # environment, the tiny-model builder) nor the user reward functions' loader
    from benchmarks.speed import import_footprint

    model_dir, data = import_footprint.make_inputs(tmp_path)
    for script in SCRIPTS:
        modules = import_footprint.footprint(script, model_dir, data, tmp_path)
        assert not set(import_footprint.DEMO_MODULES) & set(modules), (script, sorted(modules))
        # nor what only a flag asks for: the TRL names' table (--config, a TRL flag name), vLLM,
        # compiling, FSDP, LoRA, reward functions, the resume and its checks, trackers, accelerate's
        # settings, several processes' checks
        asked = set(import_footprint.ONLY_WHEN_ASKED) & set(modules)
        assert not asked, (script, sorted(asked))
        # the KL reference model only where --beta's default asks for one
        beta = getattr(importlib.import_module(script.removesuffix(".py")).Args, "beta", 0)
        assert (import_footprint.KL_REFERENCE in modules) == (beta > 0), (script, beta)
        assert sum(modules.values()) <= import_footprint.MAX_LINES, (script, sum(modules.values()))
        assert (
            "common.rl.verifiers" in modules
        )  # it did take the real-data path (math-verify rewards)
        assert "common.tasks.rewards" not in modules  # only with --reward_funcs


def test_no_unrestricted_torch_load():
    # a checkpoint is data: every torch.load keeps the restricted unpickler (tests included)
    folders = ("common", "benchmarks", "tests")
    files = [*ROOT.glob("*.py"), *(p for folder in folders for p in (ROOT / folder).rglob("*.py"))]
    unsafe = (
        "weights_only=" + "False"
    )  # spelled in two parts so that this file does not match itself
    assert not [str(p.relative_to(ROOT)) for p in files if unsafe in p.read_text()]


def test_the_report_package_reads_along_its_pipeline():
    # benchmarks/sweep/report/__init__.py lists its modules in pipeline order; each imports only the ones listed before
    # it, opens with a docstring and stays short enough to read (650 lines as ruff lays them out)
    package = ROOT / "benchmarks" / "sweep" / "report"
    order = re.findall(
        r"^    (\w+)\.py ",
        ast.get_docstring(ast.parse((package / "__init__.py").read_text())),
        re.M,
    )
    assert sorted(order) == sorted(
        p.stem for p in package.glob("*.py") if not p.stem.startswith("__")
    ), order
    for i, name in enumerate(order):
        tree = ast.parse((package / f"{name}.py").read_text())
        assert ast.get_docstring(tree), name
        assert len((package / f"{name}.py").read_text().splitlines()) <= 650, name
        imported = {
            node.module.rsplit(".", 1)[1]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("benchmarks.sweep.report.")
        }
        assert imported <= set(order[:i]), (name, imported - set(order[:i]))


def micro_batch_loops(tree: ast.AST, module: ast.Module) -> list[ast.For]:
    """The loops over micro-batches in `tree`: over `micro_batches(...)`, called in the loop's head
    or bound to a name first, or over a generator of the file that deals them (pros_ppo's
    `minibatch_rows`, shared by the policy's loop and the critic's)."""
    dealers = {"micro_batches"}
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and any(
            isinstance(inner, ast.Yield) for inner in ast.walk(node)
        ):
            if any(
                getattr(call.func, "id", None) == "micro_batches"
                for call in ast.walk(node)
                if isinstance(call, ast.Call)
            ):
                dealers.add(node.name)
    names = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
        if getattr(node.value.func, "id", None) in dealers
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.For)
        and (
            (isinstance(node.iter, ast.Name) and node.iter.id in names)
            or getattr(getattr(node.iter, "func", None), "id", None) in dealers
        )
    ]


@pytest.mark.parametrize("script", SCRIPTS)
def test_step_metrics_are_recorded_where_computed_and_the_method_keeps_its_own(script):
    # a micro-batch's sums stay tensors: `.item()` / `.tolist()` per micro-batch is a host-device
    # sync per row batch on a GPU; the shared keys are derived once (common/run/step_metrics.py),
    # so a method's metrics function holds only its mechanism
    main = main_function(script)
    module = ast.parse((ROOT / script).read_text())
    assert micro_batch_loops(main, module), (script, "no loop over micro-batches found in main")
    # main's and the file's functions' (a critic's step, a scoring pass)
    loops = micro_batch_loops(module, module)
    syncs = sorted(
        f"line {node.lineno}: .{node.func.attr}()"
        for loop in loops
        for node in ast.walk(loop)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("item", "tolist")
    )
    assert not syncs, (script, "a host sync inside a micro-batch loop", syncs)
    method = script.removesuffix(".py")
    tree = ast.parse((ROOT / script).read_text())
    function = next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == f"{method}_metrics"
    )
    lines = function.end_lineno - function.lineno + 1
    arguments = function.args
    params = len(arguments.posonlyargs + arguments.args + arguments.kwonlyargs)
    assert lines <= 40 and params <= 10, (
        script,
        f"{method}_metrics: {lines} lines, {params} params",
    )


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_step_statistics_are_computed_in_one_call_at_the_step_end(script):
    # the update records its micro-batches' sums as data; the statistics come from the step's
    # tensors in one call after the weight push, not from a collector fed through the update
    main = main_function(script)
    source = (ROOT / script).read_text()
    assert "StepMetrics" not in source and "steps.add" not in source, script
    calls = [
        node
        for node in ast.walk(main)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "step_metrics"
    ]
    assert len(calls) == 1, (script, "one call of run_log.step_metrics")
    push = next(
        node.lineno
        for node in ast.walk(main)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "sync_weights"
    )
    assert calls[0].lineno > push, (script, "the statistics come after the weight push")
