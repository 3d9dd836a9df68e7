"""`python -m benchmarks.sweep.report`: see cli.py."""

from benchmarks.sweep.report.cli import cli

cli()
