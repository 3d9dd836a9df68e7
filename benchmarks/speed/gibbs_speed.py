"""Time of one PROS Gibbs update (`--gibbs_sweeps` sweeps over the whole tree) at a given pool size.

pros_ppo.py runs `pg_gibbs` once per iteration over every node of the query tree. This builds a tree of
`--nodes` nodes (roots with `--children_per_root` children each) whose counts look like a pool after many
iterations (pass rates drawn from the model's own prior, forgetting-weighted counts, real-valued), warm-starts
the chain once, then times `--repeats` updates and prints the median. With `--metrics` (a pros_ppo.py run's
metrics.jsonl) it also prints the ratio to that run's median training-step time.

    python benchmarks/speed/gibbs_speed.py --nodes 10000 --metrics runs/pros/metrics.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.rl.gibbs import pg_gibbs  # noqa: E402
from common.run.flags import parse_args  # noqa: E402


@dataclass
class Args:
    nodes: int = 10000
    """pool size (roots + children), pros_ppo.py's default --pool_capacity"""
    children_per_root: int = 4
    """children of each root (the rest of the nodes are roots)"""
    sweeps: int = 10
    """Gibbs sweeps per update (pros_ppo.py's --gibbs_sweeps)"""
    pg_terms: int = 8
    """exact Gamma terms per Pólya-Gamma draw (pros_ppo.py's --pg_terms)"""
    repeats: int = 20
    """timed updates; the median is reported"""
    metrics: Optional[str] = None
    """a pros_ppo.py metrics.jsonl: report the update's time as a fraction of its median time_step_s (default:
    none, the update's time only)"""
    seed: int = 0
    """RNG seed for the synthetic pool and the chain"""


def synthetic_pool(nodes: int, children_per_root: int, rng: np.random.Generator):
    """(parent, s, n) for a two-layer tree of `nodes` nodes; counts are forgetting-weighted (real-valued)."""
    roots = max(1, nodes // (1 + children_per_root))
    parent = np.full(nodes, -1, dtype=np.int64)
    parent[roots:] = rng.integers(0, roots, nodes - roots)
    psi = rng.normal(0.0, 2.0, roots)
    psi = np.concatenate([psi, psi[parent[roots:]] + rng.normal(0.0, 1.0, nodes - roots)])
    n = rng.uniform(0.0, 12.0, nodes)  # e.g. 4 rollouts per visit, a few visits, forgetting 0.95
    s = n * (1 / (1 + np.exp(-psi)))
    return parent, s, n


def main(args: Args) -> dict:
    if args.nodes < 1 or args.sweeps < 1 or args.repeats < 1:
        raise SystemExit("--nodes, --sweeps and --repeats must be >= 1")
    rng = np.random.default_rng(args.seed)
    parent, s, n = synthetic_pool(args.nodes, args.children_per_root, rng)
    psi = np.zeros(args.nodes)
    psi, _ = pg_gibbs(
        psi, parent, s, n, 0.0, 2.0, 1.0, args.sweeps, rng, args.pg_terms
    )  # warm start
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        psi, _ = pg_gibbs(psi, parent, s, n, 0.0, 2.0, 1.0, args.sweeps, rng, args.pg_terms)
        times.append(time.perf_counter() - t)
    out = {"nodes": args.nodes, "sweeps": args.sweeps, "gibbs_update_s": statistics.median(times)}
    print(
        f"{args.nodes} nodes, {args.sweeps} sweeps: median {out['gibbs_update_s'] * 1e3:.1f} ms per update "
        f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}, {args.repeats} repeats)"
    )
    if args.metrics:
        path = Path(args.metrics)
        if not path.is_file():
            raise SystemExit(f"--metrics {path}: no such file")
        steps = [
            json.loads(line).get("time_step_s")
            for line in path.read_text().splitlines()
            if line.strip()
        ]
        steps = [t for t in steps if t]
        if not steps:
            raise SystemExit(f"--metrics {path}: no time_step_s values")
        out["step_s"] = statistics.median(steps)
        out["fraction"] = out["gibbs_update_s"] / out["step_s"]
        print(
            f"median training step of {path}: {out['step_s']:.3f} s -> the Gibbs update is "
            f"{100 * out['fraction']:.2f}% of a step"
        )
    return out


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
