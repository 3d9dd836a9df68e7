"""`--torch_compile` measured: each script's default job eager vs compiled, the floor with a compiled bare loop too,
and the TRL peer with `--torch_compile` on ours and with TRL's own `torch_compile=True`.

1. job: for each of `--scripts`, `--rounds` pairs of runs of its default job (`--max_steps --steps`, `--eval_steps 0`),
   eager and `--torch_compile`, alternating which goes first; median over steps 2..N-1, pooled over the rounds, of the
   step time less the compiling done in that step (`time_step_s - time_compile_s`) and of the step's generation
   tokens/s (generated tokens / `time_gen_s`, which holds the sampling log-prob pass and the verifier too), the compile
   time apart (`time_compile_s` summed over the run; each run starts with an empty cache of compiled kernels, as a
   first run on a machine does) and the steps after which compiling has paid for itself (compile time / the per-step
   saving), to set against the script's default `--max_steps`;
2. floor: `benchmarks/speed/floor.py`'s bare loop and our script (GRPO-n4), eager and compiled;
3. peer: `benchmarks/speed/trl_peer.py`'s setting, `--peer_rounds` rounds of four runs (TRL eager, TRL
   `torch_compile=True`, ours eager, ours `--torch_compile`, the order reversed every other round); steps/s ratios of
   each pair.

    OMP_NUM_THREADS=2 python benchmarks/speed/compile_speed.py   # -> benchmarks/speed/results/compile.json (~70 min)
    python benchmarks/sweep/report.py --write_docs               # its block on docs/benchmark.md
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.run.flags import parse_args  # noqa: E402

RESULTS = ROOT / "benchmarks" / "speed" / "results" / "compile.json"
PARTS = ("job", "floor", "peer")
SCRIPTS = ("ra_rloo", "ps_grpo", "pros_ppo", "ada_seq", "ada_est")


@dataclass
class Args:
    scripts: str = ",".join(SCRIPTS)
    """comma-separated scripts of the job part, each run with its defaults"""
    steps: int = 20
    """steps per run of the job part (steps 2..N-1 timed; needs >= 3)"""
    rounds: int = 2
    """eager / compiled pairs of the job part per script, alternating which goes first"""
    num_threads: int = 2
    """torch CPU threads of every run"""
    floor_repeats: int = 5
    """timed repeats of floor.py's in-process loops (after one warm-up, which takes the compile)"""
    floor_script_steps: int = 8
    """steps of floor.py's script run"""
    peer_steps: int = 20
    """optimizer steps of each trainer in the peer part (needs >= 3)"""
    peer_rounds: int = 3
    """rounds of the peer part, each one run of the four trainers"""
    parts: str = "job,floor,peer"
    """comma-separated parts to run (job, floor, peer); the peer part needs trl"""
    refigure: bool = False
    """run nothing: recompute the job part's figures from the per-step times of its runs kept in --out"""
    out: str = str(RESULTS.relative_to(ROOT))
    """results file (relative to the repo root); the parts not run keep their figures from an existing file"""

    def validate(self) -> None:
        unknown = set(self.parts.split(",")) - set(PARTS)
        if unknown:
            raise SystemExit(
                f"--parts {self.parts}: unknown part(s) {sorted(unknown)}; choose from {', '.join(PARTS)}"
            )
        unknown = set(self.scripts.split(",")) - set(SCRIPTS)
        if unknown:
            raise SystemExit(
                f"--scripts {self.scripts}: unknown script(s) {sorted(unknown)}; choose from "
                f"{', '.join(SCRIPTS)}"
            )
        if self.steps < 3 or self.peer_steps < 3:
            raise SystemExit(
                "--steps and --peer_steps: need >= 3 (step 1 and the last step are not timed)"
            )
        if min(self.rounds, self.peer_rounds, self.floor_repeats, self.floor_script_steps) < 1:
            raise SystemExit(
                "--rounds, --peer_rounds, --floor_repeats and --floor_script_steps: need >= 1"
            )


# ----------------------------------------------------------------------------------------------------
# 1. each script's default job
# ----------------------------------------------------------------------------------------------------


def job_run(args: Args, script: str, compiled: bool, output_dir: str) -> dict:
    cmd = [
        sys.executable,
        f"{script}.py",
        "--max_steps",
        str(args.steps),
        "--eval_steps",
        "0",
        "--save_steps",
        "0",
        "--num_threads",
        str(args.num_threads),
        "--output_dir",
        output_dir,
        *(["--torch_compile"] if compiled else []),
    ]
    # a cache of compiled kernels of its own: every run compiles from scratch, as a first run on a machine does
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.num_threads),
        TOKENIZERS_PARALLELISM="false",
        TORCHINDUCTOR_CACHE_DIR=str(Path(output_dir) / "inductor-cache"),
    )
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    rows = [
        json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [row for row in rows if row["step"] >= 1]
    tokens = [b["gen_tokens"] - a["gen_tokens"] for a, b in zip([{"gen_tokens": 0}] + steps, steps)]
    timed = list(
        range(1, len(steps) - 1)
    )  # steps 2..N-1: not the warm-up, not the final evaluation
    return {
        "wall_s": wall,
        "step_s": [steps[i]["time_step_s"] - steps[i].get("time_compile_s", 0.0) for i in timed],
        "gen_s": [steps[i]["time_gen_s"] for i in timed],
        "tokens": [tokens[i] for i in timed],
        "compile_s": sum(row.get("time_compile_s", 0.0) for row in rows),
        "recompiles": rows[-1].get("compile_recompiles"),
        "eager_passes": rows[-1].get("compile_eager_passes", 0),
        "fallback": "eagerly from here on" in r.stdout + r.stderr,
    }


def job_figures(runs: list[dict]) -> dict:
    step = [x for r in runs for x in r["step_s"]]
    gen = [x for r in runs for x in r["gen_s"]]
    tokens = [x for r in runs for x in r["tokens"]]
    # a median per step, as the step time's: a step that compiles (a recompilation) would dominate a ratio of sums
    return {
        "step_s": statistics.median(step),
        "gen_s": statistics.median(gen),
        "gen_tokens_per_s": statistics.median(
            count / seconds for count, seconds in zip(tokens, gen)
        ),
        "compile_s": statistics.median(r["compile_s"] for r in runs),
        "wall_s": [r["wall_s"] for r in runs],
        "recompiles": max((r["recompiles"] or 0) for r in runs),
        "fallback": any(r["fallback"] or r["eager_passes"] for r in runs),
        "timed_steps": len(step),
    }


def default_max_steps(script: str) -> int:
    import importlib

    return importlib.import_module(script).Args().max_steps


def job_part(args: Args) -> dict:
    out = {}
    for script in args.scripts.split(","):
        raw = {"eager": [], "compiled": []}
        with tempfile.TemporaryDirectory(prefix=f"compile-{script}-") as tmp:
            for k in range(args.rounds):
                for mode in ("eager", "compiled") if k % 2 == 0 else ("compiled", "eager"):
                    print(
                        f"job {script} round {k + 1}/{args.rounds}: {mode}, {args.steps} steps ...",
                        flush=True,
                    )
                    raw[mode].append(
                        job_run(args, script, mode == "compiled", str(Path(tmp) / f"{mode}{k}"))
                    )
        out[script] = {
            **script_figures(script, raw),
            "raw": raw,
            "command": f"python {script}.py --max_steps {args.steps} --eval_steps 0 --save_steps 0 "
            f"--num_threads {args.num_threads} [--torch_compile]",
        }
        print(job_line(script, out[script]), flush=True)
    return out


def script_figures(script: str, raw: dict) -> dict:
    """One script's figures from its runs' per-step times (`raw`: {"eager": [run...], "compiled": [run...]})."""
    eager, compiled = job_figures(raw["eager"]), job_figures(raw["compiled"])
    saving = eager["step_s"] - compiled["step_s"]
    rest = {
        mode: statistics.median(
            step - gen for run in runs for step, gen in zip(run["step_s"], run["gen_s"])
        )
        for mode, runs in raw.items()
    }  # a step less its generation: mostly the update's forward and backward
    return {
        "eager": eager,
        "compiled": compiled,
        "speedup": eager["step_s"] / compiled["step_s"],
        "gen_speedup": compiled["gen_tokens_per_s"] / eager["gen_tokens_per_s"],
        "rest_speedup": rest["eager"] / rest["compiled"],
        "break_even_steps": compiled["compile_s"] / saving if saving > 0 else None,
        "default_max_steps": default_max_steps(script),
    }


def job_summary(jobs: dict) -> str:
    """Where the time goes, over the scripts: which pay within their default run, the compiled share of a step."""
    pays = [
        f"`{script}.py`"
        for script, job in jobs.items()
        if job["break_even_steps"] is not None
        and job["break_even_steps"] < job["default_max_steps"]
    ]

    def span(key: str) -> str:
        return f"{min(job[key] for job in jobs.values()):.2f}-{max(job[key] for job in jobs.values()):.2f}x"

    compile_s = [job["compiled"]["compile_s"] for job in jobs.values()]
    return (
        f"  - in sum: it pays within the default run of {', '.join(pays) if pays else 'no script'}; a step less "
        f"its generation (mostly the update's forward and backward) runs {span('rest_speedup')} as fast compiled, "
        f"generation {span('gen_speedup')}, against {min(compile_s):.0f}-{max(compile_s):.0f} s of compiling"
    )


def job_line(script: str, job: dict) -> str:
    """One script's figures, and whether compiling pays in its default run (its default `--max_steps`)."""
    e, c, even, default = (
        job["eager"],
        job["compiled"],
        job["break_even_steps"],
        job["default_max_steps"],
    )
    if even is None:
        verdict = "it does not pay back: no saving per step"
    else:
        verdict = (
            f"paid back after {even:.0f} steps: "
            + ("it pays" if even < default else "it does not pay")
            + f" within the default {default}-step run"
        )
    return (
        f"  - `{script}.py`: {e['step_s']:.3f} s/step eager, {c['step_s']:.3f} s/step with `--torch_compile` "
        f"({job['speedup']:.2f}x); generation {e['gen_tokens_per_s']:,.0f} vs {c['gen_tokens_per_s']:,.0f} "
        f"tokens/s ({job['gen_speedup']:.2f}x); compiling took {c['compile_s']:.0f} s apart "
        f"({c['recompiles']} recompilation(s)); {verdict}"
        + (" (a pass fell back to eager)" if c["fallback"] else "")
    )


# ----------------------------------------------------------------------------------------------------
# 2. the floor
# ----------------------------------------------------------------------------------------------------


def floor_part(args: Args) -> dict:
    from benchmarks.speed import floor

    out = {}
    for mode in ("eager", "compiled"):
        print(f"floor: {mode} ...", flush=True)
        fargs = floor.Args(
            repeats=args.floor_repeats,
            script_steps=args.floor_script_steps,
            num_threads=args.num_threads,
            write=False,
            torch_compile=mode == "compiled",
        )
        res = floor.in_process(fargs)
        res["script"] = floor.script_run(fargs)
        bd = floor.breakdown(res)
        out[mode] = {
            "floor_s": bd["floor_total"],
            "floor_gen_s": res["floor"]["gen"],
            "floor_update_s": res["floor"]["update"],
            "script_step_s": res["script"].get("step"),
            "script_ratio": bd.get("script_ratio"),
            "components_ratio": bd["components_ratio"],
            "script_error": res["script"].get("error"),
        }
    out["floor_speedup"] = out["eager"]["floor_s"] / out["compiled"]["floor_s"]
    # ours compiled against the bare loop compiled: the floor redefined
    out["compiled_script_vs_compiled_floor"] = out["compiled"]["script_ratio"]
    return out


# ----------------------------------------------------------------------------------------------------
# 3. the TRL peer
# ----------------------------------------------------------------------------------------------------

PEERS = (("trl", False), ("trl", True), ("ours", False), ("ours", True))


def peer_part(args: Args) -> dict:
    from benchmarks.speed import trl_peer

    trl_peer.require_trl()
    base = trl_peer.Args(
        steps=args.peer_steps, repeats=args.peer_rounds, num_threads=args.num_threads
    )
    raw = {f"{who}_{'compiled' if compiled else 'eager'}": [] for who, compiled in PEERS}
    with tempfile.TemporaryDirectory(prefix="compile-peer-") as tmp:
        for k in range(args.peer_rounds):
            for who, compiled in PEERS if k % 2 == 0 else PEERS[::-1]:
                name = f"{who}_{'compiled' if compiled else 'eager'}"
                print(
                    f"peer round {k + 1}/{args.peer_rounds}: {name}, {args.peer_steps} steps ...",
                    flush=True,
                )
                if who == "trl":
                    run = trl_peer.run_trl(
                        replace(base, trl_torch_compile=compiled), str(Path(tmp) / f"{name}{k}")
                    )
                else:
                    run = trl_peer.run_ours(
                        replace(base, torch_compile=compiled), str(Path(tmp) / f"{name}{k}")
                    )
                raw[name].append(run)
    figures = {name: trl_peer.throughput(runs) for name, runs in raw.items()}
    pairs = {
        "ours_eager_vs_trl_eager": ("ours_eager", "trl_eager"),
        "ours_compiled_vs_trl_eager": ("ours_compiled", "trl_eager"),
        "ours_compiled_vs_trl_compiled": ("ours_compiled", "trl_compiled"),
    }
    ratios = {
        pair: trl_peer.compare(figures[b], figures[a])["steps_per_s"]
        for pair, (a, b) in pairs.items()
    }
    rounds = {
        pair: [
            trl_peer.compare(trl_peer.throughput([raw[b][k]]), trl_peer.throughput([raw[a][k]]))[
                "steps_per_s"
            ]
            for k in range(args.peer_rounds)
        ]
        for pair, (a, b) in pairs.items()
    }
    return {
        "figures": figures,
        "ratios": ratios,
        "rounds": rounds,
        "raw": raw,
        "versions": trl_peer.versions(),
    }


def main(args: Args) -> dict:
    from benchmarks.sweep.run_dirs import machine_info

    out = ROOT / args.out
    res = json.loads(out.read_text()) if out.exists() else {}
    for part in PARTS:  # figures kept from an earlier run keep that run's flags and machine
        if part in res and "machine" not in res[part]:
            res[part].update(args=res.get("args", {}), machine=res.get("machine", {}))
    if args.refigure:
        for script, job in res.get("job", {}).items():
            if script in SCRIPTS:
                job.update(script_figures(script, job["raw"]))
        out.write_text(json.dumps(res, indent=2, default=str))
        print(docs_block(out))
        return res
    started = time.perf_counter()
    for part in args.parts.split(","):
        res[part] = {"job": job_part, "floor": floor_part, "peer": peer_part}[part](args)
        res[part].update(args=asdict(args), machine=machine_info(), date=time.strftime("%Y-%m-%d"))
    res.update(args=asdict(args), machine=machine_info(), wall_s=time.perf_counter() - started)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2, default=str))
    print(docs_block(out))
    print(f"wrote {out}")
    return res


# ----------------------------------------------------------------------------------------------------
# The generated block on docs/benchmark.md
# ----------------------------------------------------------------------------------------------------


def docs_block(path: Path = RESULTS) -> str:
    """docs/benchmark.md's `compile` block from the results file (a line saying how to make it when there is none)."""
    if not path.exists():
        return (
            textwrap.fill(
                "`--torch_compile` has not been measured on this machine yet: `OMP_NUM_THREADS=2 python "
                "benchmarks/speed/compile_speed.py` writes `benchmarks/speed/results/compile.json`, "
                "then `python "
                "benchmarks/sweep/report.py --write_docs` puts its figures here.",
                120,
                break_on_hyphens=False,
                break_long_words=False,
            )
            + "\n"
        )
    res = json.loads(path.read_text())
    a = res.get("args", {})
    lines = [
        "`python benchmarks/speed/compile_speed.py` (`benchmarks/speed/results/compile.json`), each part with its "
        "threads and machine:",
        "",
    ]

    def where(part: str) -> str:
        flags, machine = res[part].get("args", a), res[part].get("machine", res.get("machine", {}))
        return f"{flags.get('num_threads')} threads, {machine.get('cpu', 'CPU')}" + (
            f", {res[part]['date']}" if "date" in res[part] else ""
        )

    if "job" in res:
        jobs = {script: job for script, job in res["job"].items() if script in SCRIPTS}
        flags = res["job"].get("args", a)
        lines += [
            f"- each script's default job ({where('job')}), {flags.get('rounds')} round(s) of "
            f"{flags.get('steps')} steps per mode; median of steps 2..N-1, each less its compiling; compiling "
            "from an empty kernel cache:"
        ]
        lines += [job_line(script, job) for script, job in jobs.items()]
        if jobs and all("rest_speedup" in job for job in jobs.values()):
            lines += [job_summary(jobs)]
    if "floor" in res:
        f = res["floor"]
        lines += [
            f"- the floor ({where('floor')}; bare `generate` + forward/backward + AdamW, 32 prompts x 4, <= "
            "32 tokens; compiled: its decoding step and training forward): "
            f"{f['eager']['floor_s']:.3f} s eager, {f['compiled']['floor_s']:.3f} s compiled "
            f"({f['floor_speedup']:.2f}x); our GRPO-n4 script step {f['eager']['script_ratio']:.2f}x the eager "
            f"floor eager, {f['compiled']['script_ratio']:.2f}x the compiled floor with `--torch_compile`"
        ]
    if "peer" in res:
        p, ratio = res["peer"], res["peer"]["ratios"]
        spread = lambda pair: "/".join(f"{x:.2f}" for x in p["rounds"][pair])  # noqa: E731
        flags = p.get("args", a)
        lines += [
            f"- against TRL {p['versions'].get('trl')} `GRPOTrainer` ({where('peer')}; "
            f"`benchmarks/speed/trl_peer.py`'s setting, {flags.get('peer_rounds')} rounds of "
            f"{flags.get('peer_steps')} "
            "steps), ours / TRL steps/s: both eager "
            f"{ratio['ours_eager_vs_trl_eager']:.2f}x (rounds {spread('ours_eager_vs_trl_eager')}); ours "
            f"`--torch_compile` vs TRL eager {ratio['ours_compiled_vs_trl_eager']:.2f}x (rounds "
            f"{spread('ours_compiled_vs_trl_eager')}); ours `--torch_compile` vs TRL `torch_compile=True` "
            f"{ratio['ours_compiled_vs_trl_compiled']:.2f}x (rounds {spread('ours_compiled_vs_trl_compiled')})"
        ]
    # wrapped at 120 characters, as the hand-written docs are
    return (
        "\n".join(
            textwrap.fill(
                line,
                120,
                subsequent_indent=" " * (len(line) - len(line.lstrip(" -")))
                if line.lstrip().startswith("- ")
                else "",
                break_on_hyphens=False,
                break_long_words=False,
            )
            if line
            else ""
            for line in lines
        )
        + "\n"
    )


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
