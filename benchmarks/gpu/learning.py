"""The learning part: RA-RLOO and its baseline `--replay none` from the warm-started model, held-out pass@1
with a 95% interval at start and end, paired by prompt, and the learning-curve PNG."""

from __future__ import annotations

import gc
import json
import math
import shutil
import statistics
from pathlib import Path

from benchmarks.gpu import plain
from benchmarks.gpu.budget import LEARNING, Args, Stop, error_status


def heldout_pass_rates(model_dir: Path, args: Args) -> list[float]:
    """Per held-out prompt: the fraction of `--learning_eval_samples` samples (T = 1) the binary verifier accepts."""
    import torch

    from common.demo.countdown import countdown_task
    from common.generation.hf import HFGenerator, SamplingConfig
    from common.model.policy import load_policy
    from common.tasks.loading import PromptEncoder

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_policy(str(model_dir))
    model.to(device)
    task = countdown_task("binary", args.learning_eval_prompts)
    n = args.learning_eval_samples
    with torch.random.fork_rng(
        devices=[torch.cuda.current_device()] if device.type == "cuda" else []
    ):
        torch.manual_seed(1234)  # the same draws for every policy measured
        gens = HFGenerator(model, tokenizer, dtype=args.dtype).generate(
            [PromptEncoder(tokenizer, task.templated)(ex.prompt) for ex in task.eval],
            n,
            SamplingConfig(max_new_tokens=args.max_completion_length, logprobs=False),
        )
    texts = tokenizer.batch_decode(gens.completion_ids, skip_special_tokens=True)
    del model
    gc.collect()
    return [
        sum(task.eval_reward_fn(texts[i * n + j], ex) for j in range(n)) / n
        for i, ex in enumerate(task.eval)
    ]


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% interval (normal approximation over prompts; the standard library's
    quantile, since the GPU image has no scipy)."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)
    return mean, statistics.NormalDist().inv_cdf(0.975) * math.sqrt(var / len(values))


def plan_learning_steps(left_s: float, fixed_s: float, step_s: float, max_steps: int) -> int:
    """Steps each of the two learning runs can take in `left_s` (each run also pays `fixed_s`, and the three
    held-out measurements about one run's fixed cost together)."""
    return max(0, min(max_steps, int((left_s - 3 * fixed_s) / 2 / step_s)))


def plot_learning(learning: dict, path: Path) -> str:
    """The learning curve PNG (training reward per step, and held-out pass@1 at start and end with its interval);
    returns what was done."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no matplotlib here: draw it later with python benchmarks/gpu/smoke.py --plot {path.parent}"
    fig, (ax_reward, ax_eval) = plt.subplots(1, 2, figsize=(10, 3.8))
    for arm, style in (("method", "-"), ("baseline", "--")):
        run = learning.get(arm)
        if not run or not run.get("reward_curve"):
            continue
        label = f"{run['label']}{' (baseline)' if arm == 'baseline' else ''}"
        curve, window = (
            run["reward_curve"],
            max(1, len(run["reward_curve"]) // 10),
        )  # a moving mean past 20 steps
        smooth = (
            [
                sum(curve[max(0, i - window + 1) : i + 1])
                / len(curve[max(0, i - window + 1) : i + 1])
                for i in range(len(curve))
            ]
            if len(curve) > 20
            else curve
        )
        ax_reward.plot(range(1, len(curve) + 1), smooth, style, label=label)
        if "end" in run:
            steps = [0, len(run["reward_curve"])]
            means = [learning["start"]["pass@1"], run["end"]["pass@1"]]
            errors = [learning["start"]["ci95"], run["end"]["ci95"]]
            ax_eval.errorbar(steps, means, yerr=errors, fmt="o" + style, capsize=4, label=label)
    ax_reward.set(
        xlabel="step", ylabel="training reward (mean)", title="training reward (fresh rollouts)"
    )
    ax_eval.set(xlabel="step", ylabel="held-out pass@1 (95% interval)", title="held-out pass@1")
    for axis in (ax_reward, ax_eval):
        axis.legend(fontsize=8)
    fig.suptitle(f"ra_rloo.py on {learning.get('device', '?')}, warm-started Qwen2", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def learning_part(
    model_dir: Path, out: Path, args: Args, stop: Stop, guess: dict, device: str, report: dict
) -> dict:
    """ra_rloo.py and `--replay none` from the warm-started model, as many steps each as the budget leaves. Each arm
    records its own status: an arm that fails leaves the other's figures in `report["learning"]`."""
    steps = plan_learning_steps(
        stop.left() - 10, guess["run_fixed_s"], guess["step_s"], args.learning_max_steps
    )
    if steps < 2:
        return {
            "status": f"skipped: {stop.left():.0f} s left is not enough for two runs of 2 steps"
        }
    learning = {
        "device": device,
        "steps_planned": steps,
        "prompts": args.learning_eval_prompts,
        "samples": args.learning_eval_samples,
        "learning_rate": args.learning_lr,
    }
    report["learning"] = learning
    print(
        f"learning: 2 runs x {steps} steps (~{guess['step_s']:.2f} s/step measured), held-out pass@1 on "
        f"{args.learning_eval_prompts} prompts x {args.learning_eval_samples}",
        flush=True,
    )
    start = heldout_pass_rates(model_dir, args)
    learning["start"] = dict(zip(("pass@1", "ci95"), mean_ci(start)))
    for arm, label in (("method", "RA-RLOO"), ("baseline", "RLOO (--replay none)")):
        if stop.reason:
            break
        flags = [
            *LEARNING[arm],
            "--num_generations",
            "4",
            "--learning_rate",
            repr(args.learning_lr),
            "--save_steps",
            "0",
            "--reward",
            "binary",
        ]
        run_dir = out / f"learning-{arm}"
        shutil.rmtree(run_dir, ignore_errors=True)
        result = {}
        try:
            result = plain.run_script("ra_rloo", flags, run_dir, model_dir, steps, args, stop)
            rows = (
                [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][
                    1:
                ]
                if (run_dir / "metrics.jsonl").exists()
                else []
            )
            learning[arm] = {
                "label": label,
                "status": result["status"],
                "steps": result.get("steps", 0),
                "step_s": result.get("step_s"),
                "reward_curve": [r["reward_mean"] for r in rows],
                "policy_changed_frac": result.get("policy_changed_frac"),
            }
            if rows and not stop.reason:  # past the budget or signalled: no further measurement
                rates = heldout_pass_rates(run_dir / f"checkpoint-{rows[-1]['step']}", args)
                learning[arm]["end"] = dict(zip(("pass@1", "ci95"), mean_ci(rates)))
                changes = [end - begin for begin, end in zip(start, rates)]  # paired by prompt
                learning[arm]["paired_change"] = dict(zip(("mean", "ci95"), mean_ci(changes)))
                learning[arm]["end_rates"] = rates
        except (
            Exception
        ) as error:  # this arm's failure is its own: the other arm still runs and reports
            learning[arm] = {**learning.get(arm, {"label": label}), "status": error_status(error)}
        plain.drop_checkpoint(result, args)
    if learning.get("method", {}).get("end") and learning.get("baseline", {}).get("end"):
        learning["method_minus_baseline_end"] = (
            learning["method"]["end"]["pass@1"] - learning["baseline"]["end"]["pass@1"]
        )
        # the same held-out prompts for both arms: the difference's interval is paired by prompt
        diffs = [
            m - b
            for m, b in zip(learning["method"]["end_rates"], learning["baseline"]["end_rates"])
        ]
        learning["method_minus_baseline"] = dict(zip(("mean", "ci95"), mean_ci(diffs)))
    (out / "learning.json").write_text(json.dumps(learning, indent=2))
    learning["plot"] = plot_learning(learning, out / "learning.png")
    return learning


def replot(folder: str) -> None:
    """`--plot DIR`: draw learning.png from a finished command's learning.json (e.g. one copied from a GPU)."""
    learning = json.loads((Path(folder) / "learning.json").read_text())
    print(plot_learning(learning, Path(folder) / "learning.png"))
