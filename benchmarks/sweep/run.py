"""Run every method and its baseline on one harness: same base policy, prompts, step budget, seeds.

Each (config, seed) is one subprocess of the method's own script writing to
`<runs_dir>/<config>/seed<k>/` (metrics.jsonl, args.json, log.txt, bench.json). A run is finished when its
metrics.jsonl holds the final step's row with eval metrics: finished runs are skipped, unfinished ones are
continued with `--resume_from_checkpoint auto`, so re-running the same command completes a half-finished sweep. A config
whose script or flags do not exist (yet) is reported as "missing" and skipped.

A finished run is compacted (`compact_run`): checkpoints and samples.jsonl deleted, log.txt cut to its last lines.
metrics.jsonl, args.json and bench.json (plus the sweep's sweep.json) are what git tracks under benchmarks/sweep/runs/
(see benchmarks/.gitignore): commit them and a later sitting, on any clone, skips those runs.

    python benchmarks/sweep/run.py                            # the full sweep: 21 configs x seeds 0-4
    python benchmarks/sweep/run.py --quick                    # smoke check: 1 seed, fewer/smaller steps
    python benchmarks/sweep/run.py --only rloo,ra_rloo --seeds 0 --dry_run
    python benchmarks/sweep/run.py --lock /tmp/cpu.lock       # take a lock file around each run (shared machine)
    python benchmarks/sweep/report.py                         # then: table + plots in benchmarks/sweep/results/
    python benchmarks/sweep/run.py --task my_task.yaml        # your model, data and reward (benchmarks/sweep/task.py)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.sweep.configs import (  # noqa: E402
    BY_NAME,
    CONFIGS,
    FULL,
    QUICK,
    TASK_LEFT_OUT,
    Config,
    check_config,
    task_config,
    task_configs,
)
from benchmarks.sweep.run_dirs import (  # noqa: E402
    FileLock,
    compact_run,
    conflict_diff,
    is_finished,
    machine_info,
    read_rows,
    run_state,
    testbed_id,
)
from benchmarks.sweep.task import (  # noqa: E402
    TaskFile,
    check_task,
    left_out_lines,
    load_task,
    runner_types,
)
from common.run.flags import parse_args  # noqa: E402  (light: no torch import)


@dataclass
class Args:
    task: str = ""
    """a task file (YAML: your model, data, reward and budget; format in benchmarks/sweep/task.py):
    runs every method and baseline that applies to a single-turn text task on it, then writes their
    report; flags given here win over the file (default: none, the embedded Countdown task)"""
    only: str = ""
    """comma-separated config names to run (default: all); `--only list` prints the configs and exits"""
    seeds: Optional[list[int]] = None
    """seeds to run (default: 0 1 2 3 4; --quick: 0)"""
    quick: bool = False
    """smoke-check setting: 1 seed, 20 steps of 8 prompts, 2 small evaluations (its duration: docs/benchmark.md); its
    runs go to benchmarks/sweep/runs-quick (with --task: over the file's budget, into its runs
    folder + `-quick`)"""
    dry_run: bool = False
    """print each run's state and command, run nothing"""
    runs_dir: str = ""
    """where runs go (default: benchmarks/sweep/runs, or benchmarks/sweep/runs-quick with --quick)"""
    max_steps: Optional[int] = None
    """policy updates per run, the same for every config (default: 200; --quick: 20)"""
    prompts_per_step: Optional[int] = None
    """prompts per step, the same for every config (default: 32; --quick: 8)"""
    eval_steps: Optional[int] = None
    """held-out evaluation every N steps, plus step 0 and the last (default: 25; --quick: 20)"""
    eval_prompts: Optional[int] = None
    """held-out prompts per evaluation (default: 256; --quick: 32)"""
    eval_samples: Optional[int] = None
    """samples per held-out prompt (default: 8; --quick: 2)"""
    max_completion_length: int = 48
    """completion length cap, the same for every config (answers take up to 4 lines)"""
    prompt_pool: int = 256
    """every config trains on the same first N training prompts, so prompts recur (EST's estimates, RA-RLOO's
    buffers and PROS's pool need recurrence; ada_est.py's own default is 2048, config `est_pool2048`); 0 = the whole
    training set"""
    learning_rate: float = 5e-5
    """learning rate passed to every run (the project's measured default for the embedded model); 0 = each
    script's own default"""
    warmup_steps: int = 5
    """linear warm-up steps passed to every run, so configs differ only in their method (5: what every run of the
    sweep used; the Reinforce-Ada scripts' own default is the paper's 10); 0 = each script's own default"""
    model_name_or_path: str = "embedded"
    """base policy of every run (`embedded`: the cached tiny Countdown model)"""
    num_threads: int = 0
    """torch CPU threads per run (OMP_NUM_THREADS is set to the same); 0 = each run's own policy, a count that
    follows the free cores (docs/cpu_threads.md); two runners side by side: 1 each"""
    extra: str = ""
    """extra flags appended to every run, space-separated (they become part of each run's recorded command)
    (default: none)"""
    lock: str = ""
    """a lock file taken (flock) around each run, so other heavy jobs on a shared machine interleave (do not also
    wrap the runner itself in flock on the same file: it would wait for itself) (default: none, no lock)"""
    keep_checkpoints: bool = False
    """keep the final checkpoint and samples.jsonl of finished runs (false: deleted once finished; only
    metrics.jsonl, args.json and bench.json are needed)"""
    progress_every: float = 60.0
    """seconds between progress lines of a running run (0 = only start and end)"""
    python: str = sys.executable
    """interpreter for the runs"""

    def validate(self) -> None:
        if self.task:
            return  # checked against the task's configs once the file is read (`apply_task`)
        unknown = [n for n in self.only_names() if n not in BY_NAME]
        if unknown and self.only != "list":
            raise SystemExit(f"--only: unknown config(s) {unknown}; known: {', '.join(BY_NAME)}")
        if self.seeds is not None and not self.seeds:
            raise SystemExit("--seeds: give at least one seed")

    def only_names(self) -> list[str]:
        return (
            [n.strip() for n in self.only.split(",") if n.strip()]
            if self.only and self.only != "list"
            else []
        )


@dataclass
class Settings:
    """The resolved budget every run of this invocation shares."""

    seeds: list[int]
    max_steps: int
    prompts_per_step: int
    eval_steps: int
    eval_prompts: int
    eval_samples: int
    max_completion_length: int = 48
    prompt_pool: int = 256
    learning_rate: float = 5e-5
    warmup_steps: int = 5
    model_name_or_path: str = "embedded"
    num_threads: int = 0
    extra: list[str] = field(default_factory=list)
    task_flags: list[str] = field(default_factory=list)  # a task file's script flags


def apply_task(args: Args, argv: list[str]) -> Optional[TaskFile]:
    """Fill `args` from its task file (a flag on the command line wins); None without --task."""
    if not args.task:
        return None
    task = load_task(args.task, runner_types(Args))
    given = {token[2:].split("=")[0] for token in argv if token.startswith("--")}
    for key, value in task.runner.items():
        # --quick's budget wins over the file's (its runs and page go to a folder of their own)
        if key not in given and not (args.quick and key in QUICK):
            setattr(args, key, value)
    if not args.runs_dir:
        args.runs_dir = f"runs/sweep-{task.name}" + ("-quick" if args.quick else "")
    elif args.quick and "runs_dir" not in given:
        args.runs_dir += "-quick"
    if args.quick:
        task.report_dir = None  # the page goes to <runs_dir>/results, not over the full sweep's
    known = task_configs(bool(task.environment))
    for name in args.only_names():
        if name in known or name in TASK_LEFT_OUT:
            continue
        why = TASK_LEFT_OUT["_pool2048"] if name.endswith("_pool2048") else "unknown"
        raise SystemExit(f"--only {name}: not a config of a task sweep ({why})")
    return task


def resolve(args: Args, task: Optional[TaskFile] = None) -> tuple[Settings, Path]:
    base = QUICK if args.quick else FULL
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else base[name]  # noqa: E731
    s = Settings(
        seeds=list(pick("seeds")),
        max_steps=pick("max_steps"),
        prompts_per_step=pick("prompts_per_step"),
        eval_steps=pick("eval_steps"),
        eval_prompts=pick("eval_prompts"),
        eval_samples=pick("eval_samples"),
        max_completion_length=args.max_completion_length,
        prompt_pool=args.prompt_pool,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
        model_name_or_path=args.model_name_or_path,
        num_threads=args.num_threads,
        extra=args.extra.split(),
        task_flags=list(task.script_flags) if task else [],
    )
    default_runs = ROOT / "benchmarks" / "sweep" / ("runs-quick" if args.quick else "runs")
    runs_dir = Path(args.runs_dir) if args.runs_dir else default_runs
    return s, runs_dir


# ----------------------------------------------------------------------------------------------------
# Commands
# ----------------------------------------------------------------------------------------------------


def shared_flags(s: Settings, seed: int, out_dir: Path) -> list[str]:
    flags = [
        "--seed",
        str(seed),
        "--max_steps",
        str(s.max_steps),
        "--prompts_per_step",
        str(s.prompts_per_step),
        "--eval_steps",
        str(s.eval_steps),
        "--eval_prompts",
        str(s.eval_prompts),
        "--eval_samples",
        str(s.eval_samples),
        "--max_completion_length",
        str(s.max_completion_length),
        "--prompt_pool",
        str(s.prompt_pool),
        "--model_name_or_path",
        s.model_name_or_path,
        "--num_threads",
        str(s.num_threads),
        # checkpoints at every evaluation make an interrupted run resumable; keep only the latest
        "--save_steps",
        str(s.eval_steps or s.max_steps),
        "--save_total_limit",
        "1",
        "--output_dir",
        str(out_dir),
    ]
    if s.learning_rate > 0:
        flags += ["--learning_rate", repr(s.learning_rate)]
    if s.warmup_steps > 0:
        flags += ["--warmup_steps", str(s.warmup_steps)]
    return flags + list(s.task_flags) + list(s.extra)


def build_command(cfg: Config, s: Settings, seed: int, out_dir: Path) -> list[str]:
    """The run's command without interpreter and without `--resume_from_checkpoint` (this is what bench.json records). A flag the
    config sets itself (e.g. `est_pool2048`'s --prompt_pool) wins: the shared one is left out."""
    own = {t for t in cfg.flags if t.startswith("--")}
    shared, kept = shared_flags(s, seed, out_dir), []
    i = 0
    while i < len(shared):
        takes_value = i + 1 < len(shared) and not shared[i + 1].startswith("--")
        if shared[i] not in own:
            kept += shared[i : i + 1 + takes_value]
        i += 1 + takes_value
    return [cfg.script, *cfg.flags, *kept]


# ----------------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------------


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM to the runner: stop its run gracefully, like Ctrl-C


def _eval_summary(rows: list[dict]) -> str:
    ev = [r for r in rows if r.get("eval_pass@1") is not None]
    if not ev:
        return "no evaluation yet"
    return (
        f"eval_pass@1 {ev[0]['eval_pass@1']:.3f} (step {ev[0]['step']}) -> "
        f"{ev[-1]['eval_pass@1']:.3f} (step {ev[-1]['step']})"
    )


# the line a script prints once its task is loaded: the counts it uses (a text task's prompts,
# common/tasks/loading.py, or an environment's tasks, common/envs/tasks.py)
USED_DATA = re.compile(
    r"(\d+) training (?:prompts|tasks) from .*; (\d+) held-out (?:prompts|tasks) from "
)


def used_data(log: Path) -> dict:
    """{"train_prompts", "eval_prompts"}: what the run's task used, from the last such line of its
    log (the data can give fewer than --prompt_pool / --eval_prompts ask); {} when none."""
    try:
        found = USED_DATA.findall(log.read_text(errors="replace"))
    except OSError:
        return {}
    return {"train_prompts": int(found[-1][0]), "eval_prompts": int(found[-1][1])} if found else {}


def execute(
    cfg: Config,
    s: Settings,
    seed: int,
    run_dir: Path,
    cmd: list[str],
    state: str,
    args: Args,
    testbed: str,
) -> str:
    """Run (or continue) one run as a subprocess; returns done | failed | interrupted | incomplete."""
    run_dir.mkdir(parents=True, exist_ok=True)
    meta_path = run_dir / "bench.json"
    meta = (
        json.loads(meta_path.read_text())
        if meta_path.exists()
        else {
            "config": cfg.name,
            "script": cfg.script,
            "seed": seed,
            "cmd": cmd,
            "attempts": 0,
            "wall_s": 0.0,
            "testbed": testbed,
        }
    )
    meta["attempts"] += 1
    meta["settings"] = asdict(s)
    meta_path.write_text(json.dumps(meta, indent=2))
    full = [args.python, *cmd] + (
        ["--resume_from_checkpoint", "auto"] if state in ("resume", "restart") else []
    )
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    env.pop("OMP_NUM_THREADS", None)
    if s.num_threads > 0:
        env["OMP_NUM_THREADS"] = str(s.num_threads)
    rc, t0 = None, time.time()
    with FileLock(args.lock), open(run_dir / "log.txt", "a") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(full)}\n")
        log.flush()
        t0 = time.time()
        # its own session: a terminal Ctrl-C reaches only this runner, which forwards it exactly once
        proc = subprocess.Popen(
            full, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            while rc is None:
                try:
                    rc = proc.wait(timeout=args.progress_every if args.progress_every > 0 else None)
                except subprocess.TimeoutExpired:
                    rows = read_rows(run_dir)
                    last = rows[-1]["step"] if rows else 0
                    print(
                        f"    ... step {last}/{s.max_steps}, {time.time() - t0:.0f} s, {_eval_summary(rows)}",
                        flush=True,
                    )
        except KeyboardInterrupt:
            # the scripts' first SIGINT means: finish this step, checkpoint, exit 130; a second one aborts
            proc.send_signal(signal.SIGINT)
            print(
                "    interrupted: the run saves a checkpoint after its current step (Ctrl-C again aborts it)",
                flush=True,
            )
            try:
                proc.wait()
            except KeyboardInterrupt:
                proc.kill()
                proc.wait()
            rc = "interrupted"
        finally:
            signal.signal(signal.SIGTERM, old_term)
    wall = time.time() - t0
    meta["wall_s"] = meta.get("wall_s", 0.0) + wall
    rows = read_rows(run_dir)
    finished = is_finished(rows, s.max_steps)
    meta["finished"] = finished
    data = used_data(run_dir / "log.txt")
    if data:
        meta["data"] = data
    meta_path.write_text(json.dumps(meta, indent=2))
    if rc == "interrupted":
        return "interrupted"
    if finished:
        compact_run(run_dir, args.keep_checkpoints)
        print(
            f"    done in {wall:.0f} s ({wall / max(1, s.max_steps):.2f} s/step incl. start-up and evals): "
            f"{_eval_summary(rows)}",
            flush=True,
        )
        return "done"
    tail = (run_dir / "log.txt").read_text().splitlines()[-15:]
    print(
        f"    FAILED (exit code {rc}) after {wall:.0f} s; last lines of {run_dir / 'log.txt'}:",
        flush=True,
    )
    for line in tail:
        print(f"      | {line}", flush=True)
    return "failed" if rc != 0 else "incomplete"


def _portable(path: Path) -> Path:
    """A run directory as the recorded command names it: relative to the repo root when inside it,
    else absolute (the runs start in the repo root, wherever the runner was started)."""
    try:
        return path.resolve().relative_to(ROOT)
    except ValueError:
        return path.resolve()


def sweep_configs(args: Args, task: Optional[TaskFile]) -> dict[str, Config]:
    """{name: config} this invocation runs: --only's, or every config (of a task sweep: those that
    apply to a text task)."""
    environment = bool(task and task.environment)
    every = task_configs(environment) if task else {c.name: c for c in CONFIGS}
    names = args.only_names() or list(every)
    return {n: task_config(n, environment) if task else BY_NAME[n] for n in names}


def plan(args: Args, s: Settings, runs_dir: Path, task: Optional[TaskFile] = None) -> list[dict]:
    """Every (config, seed) with its directory, command and state; seed-major, so that a partly finished
    sweep already has every config at seed 0."""
    configs = sweep_configs(args, task)
    names = list(configs)
    missing = {n: check_config(configs[n]) for n in names}
    testbed = testbed_id(s.model_name_or_path)
    items = []
    for seed in s.seeds:
        for n in names:
            cfg = configs[n]
            run_dir = runs_dir / n / f"seed{seed}"
            cmd = build_command(cfg, s, seed, _portable(run_dir))
            state = missing[n] or run_state(run_dir, cmd, s.max_steps, testbed)
            items.append(
                {
                    "cfg": cfg,
                    "seed": seed,
                    "dir": run_dir,
                    "cmd": cmd,
                    "state": state,
                    "testbed": testbed,
                }
            )
    return items


def record_invocation(
    runs_dir: Path, s: Settings, argv: list[str], task: Optional[TaskFile] = None
) -> None:
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / "sweep.json"
    data = json.loads(path.read_text()) if path.exists() else {"invocations": []}
    data["settings"] = asdict(s)
    if task:
        data["task"] = {"name": task.name, "file": str(_portable(task.path))}
        if task.environment:
            data["task"]["environment"] = task.environment
    data["machine"] = machine_info()
    data["invocations"].append(
        {
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": shlex.join(["python", "benchmarks/sweep/run.py", *argv]),
        }
    )
    path.write_text(json.dumps(data, indent=2))


def any_finished(runs_dir: Path, max_steps: int) -> bool:
    """Whether a run under `runs_dir` holds its final step's evaluation."""
    return any(
        is_finished(read_rows(d), max_steps) for d in Path(runs_dir).glob("*/seed*") if d.is_dir()
    )


def write_task_report(task: TaskFile, runs_dir: Path) -> Path:
    """The task sweep's report: the results page in its report_dir (default <runs_dir>/results)."""
    from benchmarks.sweep.report.page import write_report  # scipy, matplotlib: only here

    out_dir = Path(task.report_dir) if task.report_dir else runs_dir / "results"
    return write_report(runs_dir, out_dir, plots=True, figures_dir=None, task=task.name)


def main(args: Args, argv: list[str]) -> int:
    task = apply_task(args, argv)
    if args.only == "list":
        for c in task_configs(bool(task.environment)).values() if task else CONFIGS:
            print(
                f"{c.name:12s} {c.label:20s} {c.script} {' '.join(c.flags)}   (baseline: {c.baseline or '-'})"
            )
        return 0
    s, runs_dir = resolve(args, task)
    if task:  # seconds, before any run: a missing file or a broken reward stops here
        print(f"checking task {task.name} ({args.task})", flush=True)
        check_task(task, s.model_name_or_path)
    items = plan(args, s, runs_dir, task)
    if task:
        what = "play its environment" if task.environment else "apply to a text task"
        print(f"task {task.name} ({args.task}): the configs that {what}", flush=True)
        for line in left_out_lines(bool(task.environment)):
            print(f"  left out: {line.replace('`', '')}", flush=True)
    print(
        f"benchmark: {len(items)} runs in {runs_dir} (steps {s.max_steps}, prompts/step {s.prompts_per_step}, "
        f"eval every {s.eval_steps} on {s.eval_prompts}x{s.eval_samples}, seeds {s.seeds})",
        flush=True,
    )
    if not args.dry_run:
        record_invocation(runs_dir, s, argv, task)
    results: dict[str, int] = {}
    for i, it in enumerate(items, 1):
        cfg, seed, state = it["cfg"], it["seed"], it["state"]
        head = f"[{i}/{len(items)}] {cfg.name} seed{seed}"
        if state.startswith("missing"):
            print(f"{head}: {state}", flush=True)
            results["missing"] = results.get("missing", 0) + 1
            continue
        if state == "done":
            print(f"{head}: finished, skipped ({_eval_summary(read_rows(it['dir']))})", flush=True)
            results["skipped (finished)"] = results.get("skipped (finished)", 0) + 1
            continue
        if state == "conflict":
            print(
                f"{head}: CONFLICT, skipped: {it['dir']} holds a run of another command; delete it or use "
                f"another --runs_dir\n        {conflict_diff(it['dir'], it['cmd'])}",
                flush=True,
            )
            results["conflict"] = results.get("conflict", 0) + 1
            continue
        if state == "stale":
            recorded = json.loads((it["dir"] / "bench.json").read_text()).get(
                "testbed", "not recorded"
            )
            print(
                f"{head}: STALE, skipped: {it['dir']} holds a run on another testbed ({recorded}; now "
                f"{it['testbed']}); delete it to run this one again",
                flush=True,
            )
            results["stale"] = results.get("stale", 0) + 1
            continue
        resume = state in ("resume", "restart")
        full = [args.python, *it["cmd"]] + (["--resume_from_checkpoint", "auto"] if resume else [])
        if args.dry_run:
            threads = f"OMP_NUM_THREADS={s.num_threads} " if s.num_threads > 0 else ""
            print(f"{head}: {state}\n    {threads}{' '.join(full)}", flush=True)
            results[f"would run ({state})"] = results.get(f"would run ({state})", 0) + 1
            continue
        rows = read_rows(it["dir"])
        where = f" from step {rows[-1]['step']}" if resume and rows else ""
        print(f"{head}: {state}{where} -> {it['dir']}", flush=True)
        out = execute(cfg, s, seed, it["dir"], it["cmd"], state, args, it["testbed"])
        results[out] = results.get(out, 0) + 1
        if out == "interrupted":
            print("sweep interrupted; run the same command again to continue", flush=True)
            break
    print("summary: " + ", ".join(f"{k} {v}" for k, v in results.items()), flush=True)
    if task and not args.dry_run and "interrupted" not in results:
        if any_finished(runs_dir, s.max_steps):
            print(f"report: {write_task_report(task, runs_dir)}", flush=True)
        else:
            print(
                f"report: none written, no run in {runs_dir} finished (each failure is above)",
                flush=True,
            )
    return 1 if results.get("failed") or results.get("incomplete") else 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    raise SystemExit(main(parse_args(Args, argv, description=__doc__.split("\n\n")[0]), argv))
