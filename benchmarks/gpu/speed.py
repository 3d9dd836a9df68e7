"""The speed part: ra_rloo.py's step time and generated tokens/s eager with the default cache, with the static
cache and with `--torch_compile`, the first step and the compile time reported apart."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from benchmarks.gpu import plain
from benchmarks.gpu.budget import SPEED_RUNS, Args, Stop, error_status


def speed_part(
    model_dir: Path, out: Path, args: Args, stop: Stop, guess: dict, report: dict
) -> list[dict]:
    """ra_rloo.py's step time and generated tokens/s over steps 2+ eager with transformers' default cache, with a static
    one (compiled by transformers on a GPU) and with `--torch_compile`, the first step and the compile time apart;
    each run records its own status, and one that fails leaves the others' figures in `report["speed"]`."""
    results = []
    for cache in dict.fromkeys(r for r in args.speed_runs.split(",") if r):
        extra = SPEED_RUNS[cache]
        if (
            stop.reason
            or stop.left() < guess["run_fixed_s"] + args.speed_steps * guess["step_s"] + 15
        ):
            results.append(
                {
                    "cache_implementation": cache,
                    "status": "skipped: budget" if not stop.reason else f"skipped ({stop.reason})",
                }
            )
            continue
        run_dir = out / f"speed-{cache}"
        shutil.rmtree(run_dir, ignore_errors=True)
        try:
            result = plain.run_script(
                "ra_rloo",
                ["--num_generations", "4", "--save_steps", "0", *extra],
                run_dir,
                model_dir,
                args.speed_steps,
                args,
                stop,
            )
        except (
            Exception
        ) as error:  # this run's failure is its own: the other runs' figures stay in the report
            result = {"status": error_status(error)}
        rows = (
            [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
            if not result["status"].startswith("error") and (run_dir / "metrics.jsonl").exists()
            else []
        )
        plain.drop_checkpoint(result, args)
        entry = {
            "cache_implementation": cache,
            "status": result["status"],
            "compiled_graphs": result.get("compiled_graphs"),
        }
        if len(rows) >= 2:
            later = rows[1:]
            tokens = rows[-1]["gen_tokens"] - rows[0]["gen_tokens"]
            entry["gen_tokens_per_s_after_first"] = tokens / sum(r["time_gen_s"] for r in later)
            # a recompilation in a later step is compile time too: reported apart, not in the step time
            entry["step_s_after_first"] = sum(
                r.get("time_step_s", 0.0) - r.get("time_compile_s", 0.0) for r in later
            ) / len(later)
            entry["step_s_median_after_first"] = statistics.median(
                r.get("time_step_s", 0.0) for r in later
            )
            entry["first_step_s"] = rows[0].get("time_step_s")
            entry["first_step_gen_s"] = rows[0]["time_gen_s"]
            if (
                "time_compile_s" in rows[0]
            ):  # --torch_compile: seconds spent compiling, step 0's evaluation included
                every = [
                    json.loads(line)
                    for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                ]
                entry["compile_s"] = sum(r.get("time_compile_s", 0.0) for r in every)
                entry["compile_recompiles"] = rows[-1].get("compile_recompiles")
        results.append(entry)
        report["speed"] = results
    return results
