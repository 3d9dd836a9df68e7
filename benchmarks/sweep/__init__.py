"""The sweep: the runner (run.py), its configs and run folders, the report package, the real-path runs."""
