"""CPU thread policy under contention: s/step of `ra_rloo.py` alone, beside one busy single-threaded process, and
two runs side by side, for each thread option; and (`--startup`) the start of a run: set-up plus the step-0
evaluation, alone and two side by side.

Each option is an environment (set before the script starts, so before torch loads OpenMP) plus `--num_threads`.
A measurement runs `ra_rloo.py` for `--steps` steps (no evaluation in between) and takes the median `time_step_s`
after the first `--skip` steps; "pair" runs two copies at once and reports the slower median of the two. The
options are measured in turn, `--repeats` rounds each, so slow stretches of the machine hit every option alike.

    python benchmarks/speed/threads.py                              # every option, 2 rounds (about 25 minutes)
    python benchmarks/speed/threads.py --options default,policy --repeats 1
    python benchmarks/speed/threads.py --lock /tmp/a.lock --lock /tmp/b.lock   # wait for (and hold) a benchmark's locks
    python benchmarks/speed/threads.py --startup --options threads1,policy,default   # the start of a run (minutes)

Writes benchmarks/speed/results/threads.json (every measurement) and threads.md (the table docs/cpu_threads.md quotes);
with --startup, threads_startup.json / .md: per option, the wall time of a one-step run and the seconds to its first
training step, alone and two side by side, and the cores it used over its whole life (user + sys CPU / wall). Needs a
machine with nothing else running: other jobs change every figure.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.run.flags import parse_args  # noqa: E402  (light: no torch import)

# name -> (environment, --num_threads); "default" is torch's own count (one thread per core, OpenMP's default wait)
# held fixed, "policy" is what the scripts do when nothing is set (common/run/launch.py CpuThreads)
CORES = os.cpu_count() or 1
OPTIONS: dict[str, tuple[dict[str, str], int]] = {
    "default": ({}, CORES),
    "threads1": ({}, 1),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, CORES),
    "spin10k": ({"GOMP_SPINCOUNT": "10000"}, CORES),
    "spin100k": ({"GOMP_SPINCOUNT": "100000"}, CORES),
    "policy": ({}, 0),
}
# the start of a run: the whole step-0 evaluation (256 held-out prompts x 8) and one step, as measured before the
# thread count was set from the first line (the training-prompt evaluation off, so the work is the same)
STARTUP_FLAGS = [
    "--replay",
    "none",
    "--max_steps",
    "1",
    "--prompt_pool",
    "2048",
    "--eval_train_prompts",
    "0",
    "--save_steps",
    "0",
    "--log_samples_every",
    "0",
]
SCENARIOS = ("alone", "busy", "pair")


@dataclass
class Args:
    options: str = ",".join(OPTIONS)
    """comma-separated options to measure (known: default, threads1, passive, spin10k, spin100k, policy)"""
    scenarios: str = ",".join(SCENARIOS)
    """comma-separated scenarios: alone, busy (beside one busy single-threaded process), pair (two runs at once)"""
    steps: int = 16
    """RL steps per measured run"""
    skip: int = 3
    """first steps left out of the median (start-up, first allocations)"""
    repeats: int = 2
    """rounds over all options (the table reports the median over rounds)"""
    max_seconds: float = 150.0
    """a measured run still going after this long is stopped and measured on the steps it finished (two runs of
    torch's default side by side were measured at ~40 s/step)"""
    script: str = "ra_rloo.py"
    """the method script measured (its defaults otherwise)"""
    lock: list[str] = field(default_factory=list)
    """lock files (flock) held for the whole measurement, e.g. the benchmark runners' `--lock` files, so their runs
    and this measurement never overlap"""
    startup: bool = False
    """measure the start of a run instead (a one-step `ra_rloo.py` with its step-0 evaluation, alone and two side by
    side): seconds to the first training step, wall time and cores used; writes threads_startup.json / .md"""
    out_dir: str = "benchmarks/speed/results"
    """where threads.json and threads.md are written"""
    python: str = sys.executable
    """interpreter for the measured runs"""

    def validate(self) -> None:
        bad = [o for o in self.option_list() if o not in OPTIONS]
        if bad:
            raise SystemExit(f"--options: unknown {bad}; known: {', '.join(OPTIONS)}")
        bad = [s for s in self.scenario_list() if s not in SCENARIOS]
        if bad:
            raise SystemExit(f"--scenarios: unknown {bad}; known: {', '.join(SCENARIOS)}")
        if self.steps <= self.skip + 2:
            raise SystemExit(f"--steps {self.steps}: needs at least --skip + 3 = {self.skip + 3}")

    def option_list(self) -> list[str]:
        return [o.strip() for o in self.options.split(",") if o.strip()]

    def scenario_list(self) -> list[str]:
        return [s.strip() for s in self.scenarios.split(",") if s.strip()]


def start_run(args: Args, option: str, out_dir: Path) -> subprocess.Popen:
    env_extra, threads = OPTIONS[option]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    }
    env.update(env_extra, TOKENIZERS_PARALLELISM="false")
    cmd = [
        args.python,
        args.script,
        "--max_steps",
        str(args.steps),
        "--eval_steps",
        "0",
        "--eval_prompts",
        "16",
        "--eval_samples",
        "1",
        "--save_steps",
        "0",
        "--output_dir",
        str(out_dir),
        "--log_samples_every",
        "0",
    ]
    if threads:
        cmd += ["--num_threads", str(threads)]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(out_dir / "stderr", "w")
    )


def startup_run(args: Args, option: str, out_dir: Path) -> tuple[subprocess.Popen, float]:
    env_extra, threads = OPTIONS[option]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    }
    env.update(env_extra, TOKENIZERS_PARALLELISM="false")
    cmd = [
        args.python,
        args.script,
        *STARTUP_FLAGS,
        "--output_dir",
        str(out_dir),
        "--num_threads",
        str(threads),
    ]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(out_dir / "stderr", "w")
    ), time.time()


def measure_startup(args: Args, option: str, copies: int) -> list[dict]:
    """Per run of `copies` started together: seconds to its first training step (the step-1 row in metrics.jsonl),
    wall seconds to exit, and cores used over its life ((user + sys CPU) / wall, from wait4's rusage)."""
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / f"run{i}" for i in range(copies)]
        for d in dirs:
            d.mkdir()
        runs = [startup_run(args, option, d) for d in dirs]
        first_step: dict[int, float] = {}
        done: dict[int, tuple[float, float]] = {}
        deadline = time.time() + args.max_seconds * 4
        while len(done) < copies:
            for i, ((proc, t0), d) in enumerate(zip(runs, dirs)):
                metrics = d / "metrics.jsonl"
                if i not in first_step and metrics.exists() and '"step": 1,' in metrics.read_text():
                    first_step[i] = time.time() - t0
                if i not in done:
                    pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                    if pid:
                        proc.returncode = os.waitstatus_to_exitcode(status)
                        if proc.returncode != 0:
                            raise SystemExit(
                                f"{option}/startup: {args.script} failed:\n"
                                f"{(d / 'stderr').read_text()[-2000:]}"
                            )
                        done[i] = (time.time() - t0, usage.ru_utime + usage.ru_stime)
            if time.time() > deadline:
                for proc, _ in runs:
                    proc.kill()
                raise SystemExit(
                    f"{option}/startup: still running after {args.max_seconds * 4:.0f} s"
                )
            time.sleep(0.1)
        return [
            {
                "first_step_s": round(first_step.get(i, done[i][0]), 2),
                "wall_s": round(done[i][0], 2),
                "cores_used": round(done[i][1] / done[i][0], 3),
            }
            for i in range(copies)
        ]


def startup_table(results: dict, options: list[str]) -> str:
    head = (
        "| option | alone: s to first step | alone: cores used | pair: s to first step (slower) | pair / alone "
        "| pair: cores used (each) |\n|---|---|---|---|---|---|\n"
    )
    rows = []
    for o in options:
        alone = statistics.median(r[0]["first_step_s"] for r in results[o]["alone"])
        cores = statistics.median(r[0]["cores_used"] for r in results[o]["alone"])
        pair = statistics.median(max(x["first_step_s"] for x in r) for r in results[o]["pair"])
        pair_cores = ", ".join(f"{x['cores_used']:.2f}" for r in results[o]["pair"] for x in r)
        rows.append(
            f"| `{o}` | {alone:.1f} | {cores:.2f} | {pair:.1f} | {pair / alone:.2f}x | {pair_cores} |"
        )
    return head + "\n".join(rows) + "\n"


def main_startup(args: Args, out: Path) -> int:
    options = args.option_list()
    results = {o: {"alone": [], "pair": []} for o in options}
    with held(args.lock):
        for round_ in range(args.repeats):
            for option in options:
                for scenario, copies in (("alone", 1), ("pair", 2)):
                    runs = measure_startup(args, option, copies)
                    results[option][scenario].append(runs)
                    print(
                        f"[round {round_ + 1}/{args.repeats}] {option:>9} startup {scenario:>5}: {runs}",
                        flush=True,
                    )
                    meta = {
                        "script": args.script,
                        "flags": STARTUP_FLAGS,
                        "cpus": CORES,
                        "results": results,
                        "options": {
                            o: {"env": OPTIONS[o][0], "num_threads": OPTIONS[o][1]} for o in options
                        },
                        "date": time.strftime("%Y-%m-%d %H:%M"),
                    }
                    (out / "threads_startup.json").write_text(json.dumps(meta, indent=2))
    md = (
        f"*Written by `benchmarks/speed/threads.py --startup` ({time.strftime('%Y-%m-%d')}, {CORES} cores): "
        f"`{args.script} "
        f"{' '.join(STARTUP_FLAGS)} --num_threads N` (set-up, the step-0 evaluation of 256 held-out prompts x 8 and "
        f"one step), median of {args.repeats} rounds; pair = two started together; cores used = (user + sys CPU) / "
        f"wall over the run's life.*\n\n" + startup_table(results, options)
    )
    (out / "threads_startup.md").write_text(md)
    print(md)
    return 0


def median_step(out_dir: Path, skip: int) -> float:
    """Median time_step_s after the first `skip` steps (all finished steps when a stopped run has too few)."""
    path = out_dir / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )
    times = [r["time_step_s"] for r in rows if "time_step_s" in r]
    if not times:
        return float("nan")
    return statistics.median(times[skip:] if len(times) >= skip + 2 else times)


def measure(args: Args, option: str, scenario: str) -> float:
    """Median s/step of `option` in `scenario` (pair: the slower of the two runs)."""
    with tempfile.TemporaryDirectory() as tmp:
        dirs = [Path(tmp) / f"run{i}" for i in range(2 if scenario == "pair" else 1)]
        busy = (
            subprocess.Popen([args.python, "-c", "while True: pass"])
            if scenario == "busy"
            else None
        )
        try:
            for d in dirs:
                d.mkdir()
            runs = [start_run(args, option, d) for d in dirs]
            deadline = time.time() + args.max_seconds
            for d, run in zip(dirs, runs):
                try:
                    run.wait(timeout=max(1.0, deadline - time.time()))
                except subprocess.TimeoutExpired:  # collapsed: measure the steps it finished
                    for other in runs:
                        other.kill()
                        other.wait()
                    break
                if run.returncode != 0:
                    tail = (d / "stderr").read_text()[-2000:]
                    raise SystemExit(f"{option}/{scenario}: {args.script} failed:\n{tail}")
            return max(median_step(d, args.skip) for d in dirs)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()


@contextlib.contextmanager
def held(paths: list[str]):
    fds = []
    try:
        for path in paths:
            fd = os.open(path, os.O_CREAT | os.O_RDWR)
            print(f"waiting for the lock {path} ...", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
            fds.append(fd)
        yield
    finally:
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def table(results: dict, options: list[str], scenarios: list[str]) -> str:
    med = {
        o: {s: statistics.median(results[o][s]) for s in scenarios if results[o].get(s)}
        for o in options
    }
    base = med.get("default", {}).get("alone")
    head = (
        "| option | "
        + " | ".join(f"{s} s/step" for s in scenarios)
        + " | busy / alone | pair / alone | "
        "alone / default's alone |\n|---|" + "---|" * (len(scenarios) + 3) + "\n"
    )
    rows = []
    for o in options:
        m = med[o]
        ratio = lambda a, b: f"{a / b:.2f}x" if a is not None and b else "-"  # noqa: E731
        cells = [
            f"{m[s]:.2f} ({', '.join(f'{x:.2f}' for x in results[o][s])})" if s in m else "-"
            for s in scenarios
        ]
        rows.append(
            f"| `{o}` | " + " | ".join(cells) + f" | {ratio(m.get('busy'), m.get('alone'))} | "
            f"{ratio(m.get('pair'), m.get('alone'))} | {ratio(m.get('alone'), base)} |"
        )
    return head + "\n".join(rows) + "\n"


def main(args: Args) -> int:
    options, scenarios = args.option_list(), args.scenario_list()
    out = ROOT / args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    if args.startup:
        return main_startup(args, out)
    results: dict[str, dict[str, list[float]]] = {o: {s: [] for s in scenarios} for o in options}
    started = time.time()
    with held(args.lock):
        for round_ in range(args.repeats):
            for option in options:
                for scenario in scenarios:
                    t0 = time.time()
                    value = measure(args, option, scenario)
                    results[option][scenario].append(value)
                    print(
                        f"[round {round_ + 1}/{args.repeats}] {option:>9} {scenario:>5}: {value:.3f} s/step "
                        f"({time.time() - t0:.0f} s; {time.time() - started:.0f} s so far)",
                        flush=True,
                    )
                    meta = {
                        "script": args.script,
                        "steps": args.steps,
                        "skip": args.skip,
                        "cpus": os.cpu_count(),
                        "options": {
                            o: {"env": OPTIONS[o][0], "num_threads": OPTIONS[o][1]} for o in options
                        },
                        "results": results,
                        "date": time.strftime("%Y-%m-%d %H:%M"),
                    }
                    (out / "threads.json").write_text(
                        json.dumps(meta, indent=2)
                    )  # kept after every measurement
    md = (
        f"*Written by `benchmarks/speed/threads.py` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores): median "
        f"`time_step_s` of `{args.script}` over steps {args.skip + 1}-{args.steps}, median of {args.repeats} rounds "
        f"(each round's figure in brackets); pair = the slower of two runs side by side.*\n\n"
        + table(results, options, scenarios)
    )
    (out / "threads.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(parse_args(Args, description=__doc__.split("\n\n")[0])))
