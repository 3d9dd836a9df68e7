"""README command 1's own figure: `python ra_rloo.py` as a new user types it, timed from start to exit, alone on this
machine; writes `benchmarks/speed/results/default_run.json` (wall time, thread counts, held-out pass@1 and pass@k at the
first and last evaluation), which the README's generated durations block reads.

    python benchmarks/speed/default_run.py            # ~5 min on 2 quiet cores; keep the machine otherwise idle
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "speed" / "results" / "default_run.json"


def summarize(metrics: Path, wall_s: float, command: str) -> dict:
    """The record of one finished default run, from its metrics.jsonl."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    evals = [row for row in rows if "eval_pass@1" in row]
    k = max(
        int(key[10:]) for key in evals[-1] if key.startswith("eval_pass@") and key[10:].isdigit()
    )
    return {
        "command": command,
        "wall_s": round(wall_s, 1),
        "steps": rows[-1]["step"],
        "num_threads": sorted({row["num_threads"] for row in rows if "num_threads" in row}),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "k": k,
        "first": {key: evals[0][key] for key in ("step", "eval_pass@1", f"eval_pass@{k}")},
        "last": {key: evals[-1][key] for key in ("step", "eval_pass@1", f"eval_pass@{k}")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        default=str(RESULT),
        help=f"where the record goes (default: {RESULT.relative_to(ROOT)})",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "ra_rloo-default"
        start = time.time()
        subprocess.run(
            [sys.executable, "ra_rloo.py", "--output_dir", str(run_dir)], cwd=ROOT, check=True
        )
        record = summarize(run_dir / "metrics.jsonl", time.time() - start, "python ra_rloo.py")
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
