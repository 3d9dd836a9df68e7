"""`python benchmarks/sweep/report.py`: the benchmark report's command, the same as
`python -m benchmarks.sweep.report` (the code is the benchmarks/sweep/report/ package; flags in its cli.py)."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.sweep.report.cli import cli

    cli()
