"""`--torch_compile` measured: the default `ra_rloo.py` job eager vs compiled, the floor with a compiled bare loop too,
and the TRL peer with `--torch_compile` on ours and with TRL's own `torch_compile=True`.

1. job: `--rounds` pairs of `ra_rloo.py` runs (its defaults, `--max_steps --steps`, `--eval_every 0`), eager and
   `--torch_compile`, alternating which goes first; median `time_step_s` and `time_gen_s` over steps 2..N-1 pooled over
   the rounds, generation tokens/s (generated tokens / `time_gen_s`, which holds the sampling log-prob pass and the
   verifier too), the compile time apart (`time_compile_s` summed over the run; each run starts with an empty cache of
   compiled kernels, as a first run on a machine does) and the steps after which compiling has paid for itself
   (compile time / the per-step saving);
2. floor: `benchmarks/floor.py`'s bare loop and our script (GRPO-n4), eager and compiled;
3. peer: `benchmarks/trl_peer.py`'s setting, `--peer_rounds` rounds of four runs (TRL eager, TRL `torch_compile=True`,
   ours eager, ours `--torch_compile`, the order reversed every other round); steps/s ratios of each pair.

    OMP_NUM_THREADS=2 python benchmarks/compile_speed.py          # -> benchmarks/results/compile.json (~20 min quiet)
    python benchmarks/report.py --write_docs                        # its block on docs/benchmark.md
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

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.cli import parse_args  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "compile.json"
PARTS = ("job", "floor", "peer")


@dataclass
class Args:
    steps: int = 40
    """ra_rloo.py steps per run of the job part (steps 2..N-1 timed; needs >= 3)"""
    rounds: int = 2
    """eager / compiled pairs of the job part, alternating which goes first"""
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
    out: str = str(RESULTS.relative_to(ROOT))
    """results file (relative to the repo root); the parts not run keep their figures from an existing file"""

    def validate(self) -> None:
        unknown = set(self.parts.split(",")) - set(PARTS)
        if unknown:
            raise SystemExit(f"--parts {self.parts}: unknown part(s) {sorted(unknown)}; choose from {', '.join(PARTS)}")
        if self.steps < 3 or self.peer_steps < 3:
            raise SystemExit("--steps and --peer_steps: need >= 3 (step 1 and the last step are not timed)")
        if min(self.rounds, self.peer_rounds, self.floor_repeats, self.floor_script_steps) < 1:
            raise SystemExit("--rounds, --peer_rounds, --floor_repeats and --floor_script_steps: need >= 1")


# ----------------------------------------------------------------------------------------------------
# 1. the default job
# ----------------------------------------------------------------------------------------------------

def job_run(args: Args, compiled: bool, output_dir: str) -> dict:
    cmd = [sys.executable, "ra_rloo.py", "--max_steps", str(args.steps), "--eval_every", "0", "--save_every", "0",
           "--num_threads", str(args.num_threads), "--output_dir", output_dir,
           *(["--torch_compile"] if compiled else [])]
    # a cache of compiled kernels of its own: every run compiles from scratch, as a first run on a machine does
    env = dict(os.environ, OMP_NUM_THREADS=str(args.num_threads), TOKENIZERS_PARALLELISM="false",
               TORCHINDUCTOR_CACHE_DIR=str(Path(output_dir) / "inductor-cache"))
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    rows = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row["step"] >= 1]
    tokens = [b["gen_tokens"] - a["gen_tokens"] for a, b in zip([{"gen_tokens": 0}] + steps, steps)]
    timed = list(range(1, len(steps) - 1))  # steps 2..N-1: not the warm-up, not the final evaluation
    return {"wall_s": wall, "step_s": [steps[i]["time_step_s"] for i in timed],
            "gen_s": [steps[i]["time_gen_s"] for i in timed], "tokens": [tokens[i] for i in timed],
            "compile_s": sum(row.get("time_compile_s", 0.0) for row in rows),
            "recompiles": rows[-1].get("compile_recompiles"), "fallback": "eagerly from here on" in r.stdout}


def job_figures(runs: list[dict]) -> dict:
    step = [x for r in runs for x in r["step_s"]]
    gen = [x for r in runs for x in r["gen_s"]]
    tokens = [x for r in runs for x in r["tokens"]]
    return {"step_s": statistics.median(step), "gen_s": statistics.median(gen),
            "gen_tokens_per_s": sum(tokens) / sum(gen),
            "compile_s": statistics.median(r["compile_s"] for r in runs), "wall_s": [r["wall_s"] for r in runs],
            "recompiles": max((r["recompiles"] or 0) for r in runs), "fallback": any(r["fallback"] for r in runs),
            "timed_steps": len(step)}


def job_part(args: Args) -> dict:
    raw = {"eager": [], "compiled": []}
    with tempfile.TemporaryDirectory(prefix="compile-job-") as tmp:
        for k in range(args.rounds):
            for mode in ("eager", "compiled") if k % 2 == 0 else ("compiled", "eager"):
                print(f"job round {k + 1}/{args.rounds}: {mode}, {args.steps} steps ...", flush=True)
                raw[mode].append(job_run(args, mode == "compiled", str(Path(tmp) / f"{mode}{k}")))
    eager, compiled = job_figures(raw["eager"]), job_figures(raw["compiled"])
    saving = eager["step_s"] - compiled["step_s"]
    return {"eager": eager, "compiled": compiled, "speedup": eager["step_s"] / compiled["step_s"],
            "gen_speedup": compiled["gen_tokens_per_s"] / eager["gen_tokens_per_s"],
            "break_even_steps": compiled["compile_s"] / saving if saving > 0 else None, "raw": raw,
            "command": f"python ra_rloo.py --max_steps {args.steps} --eval_every 0 --save_every 0 --num_threads "
                       f"{args.num_threads} [--torch_compile]"}


# ----------------------------------------------------------------------------------------------------
# 2. the floor
# ----------------------------------------------------------------------------------------------------

def floor_part(args: Args) -> dict:
    from benchmarks import floor

    out = {}
    for mode in ("eager", "compiled"):
        print(f"floor: {mode} ...", flush=True)
        fargs = floor.Args(repeats=args.floor_repeats, script_steps=args.floor_script_steps,
                           num_threads=args.num_threads, write=False, torch_compile=mode == "compiled")
        res = floor.in_process(fargs)
        res["script"] = floor.script_run(fargs)
        bd = floor.breakdown(res)
        out[mode] = {"floor_s": bd["floor_total"], "floor_gen_s": res["floor"]["gen"],
                     "floor_update_s": res["floor"]["update"], "script_step_s": res["script"].get("step"),
                     "script_ratio": bd.get("script_ratio"), "components_ratio": bd["components_ratio"],
                     "script_error": res["script"].get("error")}
    out["floor_speedup"] = out["eager"]["floor_s"] / out["compiled"]["floor_s"]
    # ours compiled against the bare loop compiled: the floor redefined
    out["compiled_script_vs_compiled_floor"] = out["compiled"]["script_ratio"]
    return out


# ----------------------------------------------------------------------------------------------------
# 3. the TRL peer
# ----------------------------------------------------------------------------------------------------

PEERS = (("trl", False), ("trl", True), ("ours", False), ("ours", True))


def peer_part(args: Args) -> dict:
    from benchmarks import trl_peer

    trl_peer.require_trl()
    base = trl_peer.Args(steps=args.peer_steps, repeats=args.peer_rounds, num_threads=args.num_threads)
    raw = {f"{who}_{'compiled' if compiled else 'eager'}": [] for who, compiled in PEERS}
    with tempfile.TemporaryDirectory(prefix="compile-peer-") as tmp:
        for k in range(args.peer_rounds):
            for who, compiled in PEERS if k % 2 == 0 else PEERS[::-1]:
                name = f"{who}_{'compiled' if compiled else 'eager'}"
                print(f"peer round {k + 1}/{args.peer_rounds}: {name}, {args.peer_steps} steps ...", flush=True)
                if who == "trl":
                    run = trl_peer.run_trl(replace(base, trl_torch_compile=compiled), str(Path(tmp) / f"{name}{k}"))
                else:
                    run = trl_peer.run_ours(replace(base, torch_compile=compiled), str(Path(tmp) / f"{name}{k}"))
                raw[name].append(run)
    figures = {name: trl_peer.throughput(runs) for name, runs in raw.items()}
    pairs = {"ours_eager_vs_trl_eager": ("ours_eager", "trl_eager"),
             "ours_compiled_vs_trl_eager": ("ours_compiled", "trl_eager"),
             "ours_compiled_vs_trl_compiled": ("ours_compiled", "trl_compiled")}
    ratios = {pair: trl_peer.compare(figures[b], figures[a])["steps_per_s"] for pair, (a, b) in pairs.items()}
    rounds = {pair: [trl_peer.compare(trl_peer.throughput([raw[b][k]]), trl_peer.throughput([raw[a][k]]))
                     ["steps_per_s"] for k in range(args.peer_rounds)] for pair, (a, b) in pairs.items()}
    return {"figures": figures, "ratios": ratios, "rounds": rounds, "raw": raw, "versions": trl_peer.versions()}


def main(args: Args) -> dict:
    from benchmarks.run import machine_info

    out = ROOT / args.out
    res = json.loads(out.read_text()) if out.exists() else {}
    started = time.perf_counter()
    for part in args.parts.split(","):
        res[part] = {"job": job_part, "floor": floor_part, "peer": peer_part}[part](args)
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
        return textwrap.fill("`--torch_compile` has not been measured on this machine yet: `OMP_NUM_THREADS=2 python "
                             "benchmarks/compile_speed.py` writes `benchmarks/results/compile.json`, then `python "
                             "benchmarks/report.py --write_docs` puts its figures here.", 120,
                             break_on_hyphens=False, break_long_words=False) + "\n"
    res = json.loads(path.read_text())
    a, m = res.get("args", {}), res.get("machine", {})
    lines = [f"`python benchmarks/compile_speed.py` ({a.get('num_threads')} threads, {m.get('cpu', 'CPU')}; "
             f"`benchmarks/results/compile.json`):", ""]
    if "job" in res:
        j, e, c = res["job"], res["job"]["eager"], res["job"]["compiled"]
        even = j["break_even_steps"]
        lines += [f"- the default `ra_rloo.py` job, {a.get('rounds')} rounds of {a.get('steps')} steps, median of "
                  f"steps 2..N-1: {e['step_s']:.3f} s/step eager, {c['step_s']:.3f} s/step with `--torch_compile` "
                  f"({j['speedup']:.2f}x); generation {e['gen_tokens_per_s']:,.0f} vs {c['gen_tokens_per_s']:,.0f} "
                  f"tokens/s ({j['gen_speedup']:.2f}x); compiling (from an empty kernel cache) took "
                  f"{c['compile_s']:.0f} s apart ({c['recompiles']} recompilation(s)), paid back after "
                  + (f"{even:.0f} steps" if even is not None else "no number of steps (no saving per step)")
                  + (" (a compile failed: the run fell back to eager)" if c["fallback"] else "")]
    if "floor" in res:
        f = res["floor"]
        lines += ["- the floor (bare `generate` + forward/backward + AdamW, 32 prompts x 4, <= 32 tokens; compiled: "
                  "its decoding step and training forward): "
                  f"{f['eager']['floor_s']:.3f} s eager, {f['compiled']['floor_s']:.3f} s compiled "
                  f"({f['floor_speedup']:.2f}x); our GRPO-n4 script step {f['eager']['script_ratio']:.2f}x the eager "
                  f"floor eager, {f['compiled']['script_ratio']:.2f}x the compiled floor with `--torch_compile`"]
    if "peer" in res:
        p, ratio = res["peer"], res["peer"]["ratios"]
        spread = lambda pair: "/".join(f"{x:.2f}" for x in p["rounds"][pair])  # noqa: E731
        lines += [f"- against TRL {p['versions'].get('trl')} `GRPOTrainer` (`benchmarks/trl_peer.py`'s setting, "
                  f"{a.get('peer_rounds')} rounds of {a.get('peer_steps')} steps), ours / TRL steps/s: both eager "
                  f"{ratio['ours_eager_vs_trl_eager']:.2f}x (rounds {spread('ours_eager_vs_trl_eager')}); ours "
                  f"`--torch_compile` vs TRL eager {ratio['ours_compiled_vs_trl_eager']:.2f}x (rounds "
                  f"{spread('ours_compiled_vs_trl_eager')}); ours `--torch_compile` vs TRL `torch_compile=True` "
                  f"{ratio['ours_compiled_vs_trl_compiled']:.2f}x (rounds {spread('ours_compiled_vs_trl_compiled')})"]
    # wrapped at 120 characters, as the hand-written docs are
    return "\n".join(textwrap.fill(line, 120, subsequent_indent="  " if line.startswith("- ") else "",
                                   break_on_hyphens=False, break_long_words=False) if line else ""
                     for line in lines) + "\n"


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
