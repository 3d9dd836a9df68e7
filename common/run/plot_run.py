"""Draw one run's curves from its metrics.jsonl to a PNG: held-out pass@1 (overall, by level, and on
training prompts when logged) at each evaluation, then one panel per named metric over the training
steps.

    # -> runs/ra_rloo-seed0/curves.png
    python -m common.run.plot_run runs/ra_rloo-seed0
    python -m common.run.plot_run runs/ra_rloo-seed0 --metrics ra_replay_fired_frac --out ra.png

Every script prints this command, with its own mechanism metrics, when its run ends. Needs
matplotlib, which requirements.txt installs.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

PASS_KEYS = [
    ("eval_pass@1", "held-out, all"),
    ("eval_pass@1_easy", "held-out, easy"),
    ("eval_pass@1_mid", "held-out, mid"),
    ("eval_pass@1_hard", "held-out, hard"),
    ("eval_train_pass@1", "training prompts, all"),
]


def read_rows(output_dir: str) -> list[dict]:
    path = Path(output_dir) / "metrics.jsonl"
    rows = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )
    if not rows:
        raise SystemExit(
            f"{path}: {'empty' if path.exists() else 'not found'}; nothing to plot (is "
            f"{output_dir} the "
            "--output_dir of a run that logged at least one step?)"
        )
    return rows


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that hold a number under `key` (None and missing skipped)."""
    points = [(row["step"], row[key]) for row in rows if type(row.get(key)) in (int, float)]
    return [s for s, _ in points], [v for _, v in points]


def plot(output_dir: str, metrics: list[str], out: str | None = None) -> Path:
    """Write the figure; returns its path (default <output_dir>/curves.png)."""
    rows = read_rows(output_dir)
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(
            "plotting needs matplotlib: pip install matplotlib (requirements.txt installs it)"
        ) from None
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    missing = [key for key in metrics if not series(rows, key)[0]]
    if missing:  # e.g. a baseline run has none of its method's metrics
        print(f"not logged in {output_dir}/metrics.jsonl, left out: {', '.join(missing)}")
        metrics = [key for key in metrics if key not in missing]
    panels = 1 + len(metrics)
    cols = min(3, panels)
    fig, axes = plt.subplots(
        math.ceil(panels / cols),
        cols,
        figsize=(4.5 * cols, 3.2 * math.ceil(panels / cols)),
        squeeze=False,
    )
    ax = axes.flat[0]
    for key, label in PASS_KEYS:
        steps, values = series(rows, key)
        if steps:
            ax.plot(
                steps, values, marker="o", ms=3, label=label, lw=2 if key == "eval_pass@1" else 1
            )
    ax.set(title="pass@1 at each evaluation", xlabel="step", ylim=(0, 1))
    ax.legend(fontsize=7)
    for ax, key in zip(axes.flat[1:], metrics):
        steps, values = series(rows, key)
        # per-step values are noisy: a running mean over ~5% of the run on top
        window = max(1, len(values) // 20)
        smooth = [
            sum(values[max(0, i - window + 1) : i + 1])
            / len(values[max(0, i - window + 1) : i + 1])
            for i in range(len(values))
        ]
        ax.plot(steps, values, lw=0.8, alpha=0.35)
        ax.plot(steps, smooth, lw=1.5, color=ax.lines[0].get_color())
        ax.set(title=key, xlabel="step")
    for ax in axes.flat[panels:]:
        ax.axis("off")
    fig.suptitle(str(output_dir), fontsize=9)
    fig.tight_layout()
    path = Path(out) if out else Path(output_dir) / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir", help="a run's --output_dir (holds metrics.jsonl)")
    parser.add_argument(
        "--metrics",
        default="",
        help="comma-separated metric names, one panel each over the steps, after the pass@k panel "
        "(default: none, the pass@k panel only)",
    )
    parser.add_argument("--out", default=None, help="PNG path (default: <output_dir>/curves.png)")
    args = parser.parse_args(argv)
    print(plot(args.output_dir, [m for m in args.metrics.split(",") if m], args.out))


if __name__ == "__main__":
    main()
