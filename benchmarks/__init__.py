"""Side-by-side benchmark of the method scripts: `run.py` (sweep), `report.py` (table + plots),
`floor.py` (step time against a bare generate + forward/backward loop)."""
