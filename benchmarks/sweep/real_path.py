"""The real path learns: each script trained through the path a user takes — a Hugging Face model directory, `.jsonl`
files read by `datasets`, the chat template, the built-in math reward (math-verify on the last `\\boxed{}` against the
`#### N` gold) or `--reward_funcs` (a format and a correctness function on message prompts) — on the word-problem task
of `benchmarks/sweep/word_problems.py`, from its built base, for a fixed number of steps at fixed `--num_threads`.

Each run is judged on the held-out file, outside the script, by one evaluator for all: the base and the run's final
checkpoint, each loaded as a model directory, `--eval_samples` samples (T=1) of each of `--eval_prompts` held-out
prompts rendered as the run rendered them (`common.tasks.loading.hf_task`), a sample passing when math-verify finds its boxed
answer equal to the gold. pass@1 is the mean over samples; the interval is a 95% normal interval, over prompts, of
the per-prompt difference end - start (paired: the same prompts).

    python benchmarks/sweep/real_path.py                  # -> benchmarks/sweep/results/real_path.json, real_path.png
    python benchmarks/sweep/real_path.py --scripts ra_rloo --rewards math   # one run (the others keep their rows)
    python benchmarks/sweep/report.py --write_docs        # its blocks on docs/custom_task.md and docs/benchmark.md
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.run.flags import parse_args  # noqa: E402

RESULTS = ROOT / "benchmarks" / "sweep" / "results" / "real_path.json"
SCRIPTS = ("ra_rloo", "ps_grpo", "pros_ppo", "ada_seq", "ada_est")
REWARDS = ("math", "funcs")
FUNCS = "examples/boxed_rewards.py:boxed_format_reward,examples/boxed_rewards.py:boxed_correctness_reward"
# ps_grpo.py's default mode is the embedded Countdown environment; ra_rloo.py's second evaluation (the paper's
# sampling) is not what is compared here
SCRIPT_FLAGS = {"ps_grpo": ["--mode", "text"], "ra_rloo": ["--paper_eval_samples", "0"]}


@dataclass
class Args:
    scripts: str = ",".join(SCRIPTS)
    """comma-separated scripts to run"""
    rewards: str = ",".join(REWARDS)
    """comma-separated rewards: `math` (the built-in math reward on text prompts, the default suffix) and `funcs`
    (examples/boxed_rewards.py's format and correctness functions, weights 0.2 and 1, on message prompts)"""
    max_steps: int = 50
    """policy updates per run"""
    learning_rate: float = 1e-4
    """every run's --learning_rate"""
    num_threads: int = 1
    """every run's --num_threads (and the evaluator's torch threads)"""
    eval_prompts: int = 256
    """held-out prompts of the evaluation"""
    eval_samples: int = 4
    """samples per held-out prompt"""
    seed: int = 0
    """every run's --seed and the evaluator's sampling seed"""
    work_dir: str = "runs/real_path"
    """the data files, the runs' output folders (relative to the repo root; not committed)"""
    out: str = str(RESULTS.relative_to(ROOT))
    """results file (relative to the repo root; the plot is written beside it as .png); rows of the runs not made
    keep their figures"""
    refigure: bool = False
    """run nothing: redraw the plot from --out"""

    def validate(self) -> None:
        for flag, given, allowed in (
            ("--scripts", self.scripts, SCRIPTS),
            ("--rewards", self.rewards, REWARDS),
        ):
            unknown = set(given.split(",")) - set(allowed)
            if unknown:
                raise SystemExit(
                    f"{flag} {given}: unknown {sorted(unknown)}; choose from {', '.join(allowed)}"
                )
        if min(self.max_steps, self.num_threads, self.eval_prompts, self.eval_samples) < 1:
            raise SystemExit(
                "--max_steps, --num_threads, --eval_prompts and --eval_samples: need >= 1"
            )


def task_flags(reward: str, data: dict[str, Path]) -> list[str]:
    """The data and reward flags of a run: text prompts with the built-in math reward, or message prompts with the
    reward functions (a sample succeeds at a total >= 1: correct, whatever its format)."""
    if reward == "math":
        return ["--dataset_name", str(data["train"]), "--eval_dataset", str(data["heldout"])]
    return [
        "--dataset_name",
        str(data["train_messages"]),
        "--eval_dataset",
        str(data["heldout_messages"]),
        "--prompt_column",
        "prompt",
        "--reward_funcs",
        FUNCS,
        "--reward_weights",
        "0.2,1",
        "--success_reward",
        "1",
    ]


def run_command(
    args: Args, script: str, reward: str, base: Path, data: dict, out: Path
) -> list[str]:
    return [
        sys.executable,
        f"{script}.py",
        "--model_name_or_path",
        str(base),
        *task_flags(reward, data),
        "--max_steps",
        str(args.max_steps),
        "--learning_rate",
        str(args.learning_rate),
        "--seed",
        str(args.seed),
        "--num_threads",
        str(args.num_threads),
        "--eval_steps",
        "0",
        "--eval_prompts",
        "32",
        "--eval_samples",
        "2",
        "--save_steps",
        "0",
        "--output_dir",
        str(out),
        "--overwrite_output_dir",
        *SCRIPT_FLAGS.get(script, []),
    ]


def heldout_counts(args: Args, model_dir: Path, reward: str, data: dict) -> list[int]:
    """Passing samples per held-out prompt of the model in `model_dir`, its prompts rendered by the real path."""
    import torch

    from common.generation.hf import HFGenerator, SamplingConfig
    from common.model.policy import load_policy
    from common.run.flags import BaseArgs
    from common.tasks.loading import PromptEncoder, hf_task

    model, tokenizer = load_policy(str(model_dir))
    flags = BaseArgs(model_name_or_path=str(model_dir), eval_prompts=args.eval_prompts)
    flags.dataset = flags.eval_dataset = str(
        data["heldout" if reward == "math" else "heldout_messages"]
    )
    flags.prompt_column = "question" if reward == "math" else "prompt"
    task = hf_task(
        flags, tokenizer, log=lambda *_: None
    )  # the built-in math reward scores both kinds
    encode = PromptEncoder(tokenizer, task.templated)
    torch.manual_seed(args.seed)
    gens = HFGenerator(model, tokenizer).generate(
        [encode(e.prompt) for e in task.eval], args.eval_samples, SamplingConfig(max_new_tokens=48)
    )
    texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
    passed = task.eval_success(
        texts,
        [e for e in task.eval for _ in range(args.eval_samples)],
        gens.completion_ids,
        [reason == "length" for reason in gens.finish_reasons],
    )
    n = args.eval_samples
    return [sum(passed[i * n : (i + 1) * n]) for i in range(len(task.eval))]


def paired_interval(start: list[int], end: list[int], n: int) -> list[float]:
    """95% normal interval of the mean per-prompt difference of pass rates (end - start) over prompts."""
    diffs = [(b - a) / n for a, b in zip(start, end)]
    mean = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1))
    half = 1.96 * sd / math.sqrt(len(diffs))
    return [round(mean - half, 4), round(mean + half, 4)]


def training_rewards(out: Path) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [
        row.get("reward_mean") for row in rows if row.get("step", 0) >= 1 and "reward_mean" in row
    ]


def main(args: Args) -> list[dict]:
    import torch

    from benchmarks.sweep import word_problems
    from benchmarks.sweep.run_dirs import machine_info

    out_path = ROOT / args.out
    rows = json.loads(out_path.read_text()) if out_path.exists() else []
    if args.refigure:
        plot(rows, out_path.with_suffix(".png"))
        print(docs_block(out_path))
        return rows
    torch.set_num_threads(args.num_threads)
    work = ROOT / args.work_dir
    data = word_problems.write_data(work / "data")
    base = word_problems.ensure_base()
    starts = {
        reward: heldout_counts(args, base, reward, data) for reward in args.rewards.split(",")
    }
    env = dict(os.environ, OMP_NUM_THREADS=str(args.num_threads), TOKENIZERS_PARALLELISM="false")
    for script in args.scripts.split(","):
        for reward in args.rewards.split(","):
            run_dir = work / f"{script}-{reward}"
            cmd = run_command(args, script, reward, base, data, run_dir)
            print(f"{script} ({reward}): {args.max_steps} steps ...", flush=True)
            began = time.perf_counter()
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
            seconds = time.perf_counter() - began
            if done.returncode != 0:
                raise SystemExit(
                    f"{' '.join(cmd[1:])} failed ({done.returncode}):\n{done.stderr[-3000:]}"
                )
            final = max(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
            end = heldout_counts(args, final, reward, data)
            start, n = starts[reward], args.eval_samples
            rewards = training_rewards(run_dir)
            row = {
                "script": script,
                "reward": reward,
                "start_pass@1": round(sum(start) / (len(start) * n), 4),
                "end_pass@1": round(sum(end) / (len(end) * n), 4),
                "interval": paired_interval(start, end, n),
                "steps": int(final.name.split("-")[1]),
                "seconds": round(seconds, 1),
                "train_reward_first10": round(sum(rewards[:10]) / len(rewards[:10]), 4),
                "train_reward_last10": round(sum(rewards[-10:]) / len(rewards[-10:]), 4),
                "command": " ".join(["python", *cmd[1:]]).replace(str(ROOT) + "/", ""),
                "settings": {k: v for k, v in asdict(args).items() if k not in ("out", "refigure")},
                "date": time.strftime("%Y-%m-%d"),
                "machine": machine_info(),
            }
            print(row_line(row), flush=True)
            rows = [r for r in rows if (r["script"], r["reward"]) != (script, reward)] + [row]
            rows.sort(key=lambda r: (SCRIPTS.index(r["script"]), REWARDS.index(r["reward"])))
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(
                json.dumps(rows, indent=2) + "\n"
            )  # after every run: a cut sitting keeps its rows
    plot(rows, out_path.with_suffix(".png"))
    print(docs_block(out_path))
    return rows


def row_line(row: dict) -> str:
    lo, hi = row["interval"]
    verdict = "rises" if lo > 0 else ("falls" if hi < 0 else "no change shown")
    return (
        f"`{row['script']}.py`, {'built-in math reward' if row['reward'] == 'math' else 'reward functions'}: "
        f"held-out pass@1 {row['start_pass@1']:.3f} -> {row['end_pass@1']:.3f} (difference 95% interval "
        f"[{lo:+.3f}, {hi:+.3f}]: {verdict}) in {row['steps']} steps, {row['seconds'] / 60:.1f} min"
    )


def plot(rows: list[dict], path: Path) -> None:
    """Held-out pass@1 at the start and end of every run, one panel per reward, the end's bar showing the interval of
    the difference around it."""
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(REWARDS), figsize=(10, 3.6), sharey=True)
    for ax, reward in zip(axes, REWARDS):
        mine = [r for r in rows if r["reward"] == reward]
        xs = range(len(mine))
        ax.bar(
            [x - 0.2 for x in xs],
            [r["start_pass@1"] for r in mine],
            0.4,
            label="start (the base)",
            color="0.7",
        )
        ends = [r["end_pass@1"] for r in mine]
        errs = [
            [r["end_pass@1"] - (r["start_pass@1"] + r["interval"][0]) for r in mine],
            [(r["start_pass@1"] + r["interval"][1]) - r["end_pass@1"] for r in mine],
        ]
        ax.bar(
            [x + 0.2 for x in xs],
            ends,
            0.4,
            yerr=errs,
            capsize=3,
            label="end (95% interval)",
            color="tab:blue",
        )
        ax.set_xticks(list(xs), [r["script"] for r in mine], fontsize=8)
        ax.set_title(
            "built-in math reward" if reward == "math" else "--reward_funcs (format + correctness)"
        )
    axes[0].set_ylabel("held-out pass@1")
    axes[0].set_ylim(0, 1.08)  # room above the bars for the legend
    axes[0].legend(fontsize=8, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def docs_block(path: Path = RESULTS) -> str:
    """The generated block on docs/custom_task.md and docs/benchmark.md (a line saying how to make it when the results
    file is absent)."""
    if not path.exists():
        return (
            textwrap.fill(
                "The real path has not been measured yet: `python benchmarks/sweep/real_path.py` writes "
                "`benchmarks/sweep/results/real_path.json`, then `python benchmarks/sweep/report.py "
                "--write_docs` "
                "puts its figures here.",
                120,
                break_on_hyphens=False,
                break_long_words=False,
            )
            + "\n"
        )
    rows = json.loads(path.read_text())
    settings = rows[0]["settings"]
    missing = [
        f"`{s}.py` ({r})"
        for s in SCRIPTS
        for r in REWARDS
        if not any((row["script"], row["reward"]) == (s, r) for row in rows)
    ]
    head = (
        f"`python benchmarks/sweep/real_path.py` (`benchmarks/sweep/results/real_path.json`, plot "
        f"`real_path.png`): the word-problem base and task of `benchmarks/sweep/word_problems.py`, "
        f"{settings['max_steps']} steps per run at "
        f"`--learning_rate {settings['learning_rate']}` and `--num_threads {settings['num_threads']}` on "
        f"{rows[0].get('machine', {}).get('cpu', 'a CPU')} ({rows[0]['date']}); held-out pass@1 of "
        f"{settings['eval_prompts']} prompts x {settings['eval_samples']} samples, start and end, the 95% "
        "interval over prompts of their difference:"
    )
    lines = [head, ""] + [f"- {row_line(row)}" for row in rows]
    if missing:
        lines.append(f"- not run: {', '.join(missing)}")
    return (
        "\n".join(
            textwrap.fill(
                line,
                120,
                subsequent_indent="  " if line.startswith("- ") else "",
                break_on_hyphens=False,
                break_long_words=False,
            )
            if line
            else ""
            for line in lines
        )
        + "\n"
    )


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
