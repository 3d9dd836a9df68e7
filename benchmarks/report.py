"""`python benchmarks/report.py`: the benchmark report's command at its old path, the same as
`python -m benchmarks.report` (the code is the benchmarks/report/ package; flags in its cli.py)."""
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.report.cli import cli

    cli()
