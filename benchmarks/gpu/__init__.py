"""The GPU spell: smoke.py and its parts (warm start, plain, learning, speed, peer, report)."""
