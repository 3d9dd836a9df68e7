"""The lines a script prints when its run ends: held-out pass@1 / pass@k at the first and the last
evaluation (read back from metrics.jsonl), whether the run can be repeated number for number (its
thread count), what the output directory holds, the trained model and the command that uploads
it, and the command that draws the run's curves."""

import json
import shlex
from pathlib import Path

from common.run.run_folder import EXPORT, EXPORT_MERGED

LEVELS = ("easy", "mid", "hard")


def read_metrics(output_dir: str) -> list[dict]:
    """The rows of `<output_dir>/metrics.jsonl` (none when it does not exist)."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _number(value) -> bool:
    # None / missing: not logged
    return type(value) in (int, float)


def evaluations(rows: list[dict]) -> tuple[dict, dict, list[tuple[str, str]]] | None:
    """(first, last, [(label, key)]) of the run's held-out evaluations: the first and the last row
    that evaluated, and the pass rates both hold as numbers (pass@1, pass@k at the largest k, by
    level, on training prompts); None when no row evaluated."""
    evals = [row for row in rows if "eval_pass@1" in row]
    if not evals:
        return None
    first, last = evals[0], evals[-1]
    k = max(int(key[10:]) for key in last if key[:10] == "eval_pass@" and key[10:].isdigit())
    names = [
        ("held-out pass@1", "eval_pass@1"),
        (f"held-out pass@{k}", f"eval_pass@{k}") if k > 1 else None,
        *((f"held-out pass@1, {level}", f"eval_pass@1_{level}") for level in LEVELS),
        ("training-prompt pass@1", "eval_train_pass@1"),
    ]
    kept = [
        (label, key)
        for label, key in filter(None, names)
        if _number(first.get(key)) and _number(last.get(key))
    ]
    return first, last, kept


def run_summary(output_dir: str, mechanism: list[str]) -> str:
    """The summary; `mechanism`: the method's own metrics for the plot command (those the run
    logged)."""
    rows = read_metrics(output_dir)
    found = evaluations(rows)
    if found is None:
        return f"{output_dir}: no evaluation in metrics.jsonl to summarise"
    first, last, names = found
    lines = [f"run ended at step {rows[-1]['step']}: {output_dir}"]
    lines += [
        f"  {label:<26} {first[key]:.3f} (step {first['step']}) -> {last[key]:.3f} (step "
        f"{last['step']})"
        for label, key in names
    ]
    lines.append(f"  {repeatability(rows, output_dir)}")
    # dot files (the run's marker, temporary files) left out
    shown = [p for p in Path(output_dir).iterdir() if not p.name.startswith(".")]
    files = ", ".join(sorted(p.name + "/" * p.is_dir() for p in shown))
    lines.append(f"  outputs: {files} (metrics.jsonl: one row per step; the keys: docs/metrics.md)")
    lines += export_lines(output_dir)
    # a baseline: none
    logged = ",".join(key for key in mechanism if any(_number(row.get(key)) for row in rows))
    lines.append(
        f"  curves:  python -m common.run.plot_run {shlex.quote(str(output_dir))}"
        + (f" --metrics {logged}" if logged else "")
    )
    return "\n".join(lines)


def export_lines(output_dir: str) -> list[str]:
    """The lines that name the run's trained model (common/run/export.py) and the command that
    uploads it to the Hugging Face Hub; none when the run wrote none."""
    name = Path(output_dir).resolve().name
    lines = []
    for folder_name, repo, label in (
        (EXPORT, name, "model:"),
        (EXPORT_MERGED, f"{name}-merged", "merged:"),
    ):
        folder = Path(output_dir) / folder_name
        if not folder.is_dir():
            continue
        where = shlex.quote(str(folder))
        what = (
            "a LoRA adapter (AutoPeftModelForCausalLM)"
            if (folder / "adapter_config.json").exists()
            else "a Hugging Face model (from_pretrained, vLLM)"
        )
        lines += [
            f"  {label:<8} {where}: {what}, with its tokenizer and model card (README.md)",
            f"  upload:  hf upload <your-username>/{repo} {where}  (once logged in: hf auth login)",
        ]
    return lines


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
    changes = [(step, old, new) for (_, old), (step, new) in zip(logged, logged[1:]) if old != new]
    counts = sorted({count for _, count in logged})
    if not changes:
        return (
            "repeatable on a machine with the same free cores: the thread count followed them and "
            f"held at {counts[0]}; pass --num_threads {counts[0]} for the same rows on a quiet or "
            "a busy machine"
        )
    more = (
        f" ({len(changes)} changes in all, {counts[0]}..{counts[-1]})" if len(changes) > 1 else ""
    )
    return (
        "not repeatable: the thread count followed the free cores and changed from "
        f"{changes[0][1]} to {changes[0][2]} at step {changes[0][0]}{more}; pass --num_threads N "
        f"(e.g. --num_threads {logged[0][1]}) for a fixed count"
    )
