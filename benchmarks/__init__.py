"""The benchmarks, in three rooms: `sweep/` (every method and its baseline on one harness, the report, the real-path
runs), `speed/` (our step against a bare loop and against TRL, and the other timings) and `gpu/` (the GPU spell)."""
