"""`python -m benchmarks.report`: see cli.py."""
from benchmarks.report.cli import cli

cli()
