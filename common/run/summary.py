"""The lines a script prints when its run ends: held-out pass@1 / pass@k at the first and the last
evaluation (read back from metrics.jsonl), whether the run can be repeated number for number (its
thread count), what the output directory holds, and the command that draws the run's curves."""

import json
import shlex
from pathlib import Path

LEVELS = ("easy", "mid", "hard")


def run_summary(output_dir: str, mechanism: list[str]) -> str:
    """The summary; `mechanism`: the method's own metrics for the plot command (those the run
    logged)."""
    path = Path(output_dir) / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )
    evals = [row for row in rows if "eval_pass@1" in row]
    if not evals:
        return f"{output_dir}: no evaluation in {path.name} to summarise"
    # None / missing: not logged
    first, last, number = evals[0], evals[-1], lambda v: type(v) in (int, float)
    k = max(int(key[10:]) for key in last if key[:10] == "eval_pass@" and key[10:].isdigit())
    names = [
        ("held-out pass@1", "eval_pass@1"),
        (f"held-out pass@{k}", f"eval_pass@{k}") if k > 1 else None,
        *((f"held-out pass@1, {level}", f"eval_pass@1_{level}") for level in LEVELS),
        ("training-prompt pass@1", "eval_train_pass@1"),
    ]
    lines = [f"run ended at step {rows[-1]['step']}: {output_dir}"]
    lines += [
        f"  {label:<26} {first[key]:.3f} (step {first['step']}) -> {last[key]:.3f} (step "
        f"{last['step']})"
        for label, key in filter(None, names)
        if number(first.get(key)) and number(last.get(key))
    ]
    lines.append(f"  {repeatability(rows, output_dir)}")
    files = ", ".join(
        sorted(
            p.name + "/" * p.is_dir()
            for p in Path(output_dir).iterdir()
            if not p.name.startswith(".")
        )
    )  # dot files: the run's marker, temporary files
    lines.append(f"  outputs: {files} (metrics.jsonl: one row per step; the keys: docs/metrics.md)")
    # a baseline: none
    logged = ",".join(key for key in mechanism if any(number(row.get(key)) for row in rows))
    lines.append(
        f"  curves:  python -m common.run.plot_run {shlex.quote(str(output_dir))}"
        + (f" --metrics {logged}" if logged else "")
    )
    return "\n".join(lines)


def repeatability(rows: list[dict], output_dir: str) -> str:
    """Whether the same command gives the same numbers: on CPU torch's sums depend on the thread
    count, so a run is repeatable anywhere only with a fixed `--num_threads` (args.json); a count
    that followed the free cores (`num_threads` in every row; docs/cpu_threads.md) repeats only
    where it would hold at the same value again."""
    args_path = Path(output_dir) / "args.json"
    fixed = json.loads(args_path.read_text()).get("num_threads", 0) if args_path.exists() else 0
    if fixed:
        return (
            f"repeatable: yes (--num_threads {fixed}: the same command gives the same rows on CPU)"
        )
    logged = [
        (row.get("step"), row["num_threads"]) for row in rows if type(row.get("num_threads")) is int
    ]
    if not logged:
        return (
            "repeatable: unknown (no row logs num_threads); pass --num_threads N for a fixed count"
        )
    changes = [
        (step, before, after)
        for (_, before), (step, after) in zip(logged, logged[1:])
        if before != after
    ]
    counts = sorted({count for _, count in logged})
    if not changes:
        return (
            "repeatable on a machine with the same free cores: the thread count followed them and "
            "held at "
            f"{counts[0]}; pass --num_threads {counts[0]} for the same rows on a quiet or a busy "
            "machine"
        )
    more = (
        f" ({len(changes)} changes in all, {counts[0]}..{counts[-1]})" if len(changes) > 1 else ""
    )
    return (
        "not repeatable: the thread count followed the free cores and changed from "
        f"{changes[0][1]} to "
        f"{changes[0][2]} at step {changes[0][0]}{more}; pass --num_threads N (e.g. --num_threads "
        f"{logged[0][1]}) for a fixed count"
    )
