"""The learning part: every method against its baseline (RA-RLOO against RLOO, SEQ-BALANCE against GRPO-n4, EST
against GRPO-n8, adaptive Prefix Sampling against GRPO, PPO with PROS against PPO) from the warm-started model,
held-out pass@1 with a 95% interval at start and end, paired by prompt, and the learning-curve PNG."""

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
    shown = [p for p in pairs(learning) if p.get("method") or p.get("baseline")]
    if not shown:
        return "no learning run to draw"
    fig, axes = plt.subplots(len(shown), 2, figsize=(10, 3.8 * len(shown)), squeeze=False)
    for pair, (ax_reward, ax_eval) in zip(shown, axes):
        for arm, style in (("method", "-"), ("baseline", "--")):
            run = pair.get(arm)
            if not run or not run.get("reward_curve"):
                continue
            label = f"{run['label']}{' (baseline)' if arm == 'baseline' else ''}"
            curve = run["reward_curve"]
            window = max(1, len(curve) // 10)  # a moving mean past 20 steps
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
                steps = [0, len(curve)]
                means = [learning["start"]["pass@1"], run["end"]["pass@1"]]
                errors = [learning["start"]["ci95"], run["end"]["ci95"]]
                ax_eval.errorbar(steps, means, yerr=errors, fmt="o" + style, capsize=4, label=label)
        ax_reward.set(
            xlabel="step",
            ylabel="training reward (mean)",
            title=f"{pair['script']}.py: training reward",
        )
        ax_eval.set(xlabel="step", ylabel="held-out pass@1 (95% interval)", title="held-out pass@1")
        for axis in (ax_reward, ax_eval):
            axis.legend(fontsize=8)
    fig.suptitle(
        f"each method against its baseline on {learning.get('device', '?')}, warm-started Qwen2",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


MIN_STEPS = (
    10  # fewer steps a run than this tell nothing about learning: the pair is skipped instead
)


def pairs(learning: dict) -> list[dict]:
    """The method / baseline pairs of a learning report: `learning["methods"]`, or the one ra_rloo.py pair that
    records written before every method was measured keep at the top level."""
    if "methods" in learning:
        return learning["methods"]
    if learning.get("method") or learning.get("baseline"):
        keys = ("method", "baseline", "method_minus_baseline", "method_minus_baseline_end")
        return [{"script": "ra_rloo", **{k: learning[k] for k in keys if k in learning}}]
    return []


def run_arm(
    arm: tuple[str, str, list[str]],
    steps: int,
    model_dir: Path,
    out: Path,
    args: Args,
    stop: Stop,
    start,
) -> dict:
    """One arm of a pair: its run, its reward curve and, unless stopped, its held-out pass@1 paired with `start`."""
    label, script, extra = arm
    flags = [*extra, "--learning_rate", repr(args.learning_lr), "--save_steps", "0"]
    if (
        script == "ra_rloo"
    ):  # the reward the held-out pass@1 counts (ra_rloo.py's default gives partial credit)
        flags += ["--reward", "binary"]
    shutil.rmtree(out, ignore_errors=True)
    result, record = {}, {"label": label, "script": script}
    try:
        result = plain.run_script(script, flags, out, model_dir, steps, args, stop)
        rows = (
            [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
            if (out / "metrics.jsonl").exists()
            else []
        )
        record.update(
            status=result["status"],
            steps=result.get("steps", 0),
            step_s=result.get("step_s"),
            reward_curve=[r["reward_mean"] for r in rows],
            policy_changed_frac=result.get("policy_changed_frac"),
        )
        if rows and not stop.reason:  # past the budget or signalled: no further measurement
            rates = heldout_pass_rates(out / f"checkpoint-{rows[-1]['step']}", args)
            record["end"] = dict(zip(("pass@1", "ci95"), mean_ci(rates)))
            changes = [end - begin for begin, end in zip(start, rates)]  # paired by prompt
            record["paired_change"] = dict(zip(("mean", "ci95"), mean_ci(changes)))
            record["end_rates"] = rates
    except (
        Exception
    ) as error:  # this arm's failure is its own: the other arm still runs and reports
        record["status"] = error_status(error)
    plain.drop_checkpoint(result, args)
    return record


def pair_step_s(report: dict, scripts: set[str], guess: dict) -> float:
    """Seconds a step of the slower script of a pair: its plain run in this command where one finished, else the
    plan's guess."""
    measured = [
        r["step_s"]
        for r in report.get("runs") or []
        if r.get("script") in scripts and r.get("status") == "ok" and r.get("step_s")
    ]
    return max(measured) if measured else guess["step_s"]


def learning_part(
    model_dir: Path, out: Path, args: Args, stop: Stop, guess: dict, device: str, report: dict
) -> dict:
    """Each method of `--learning_methods` and its baseline from the warm-started model, in that order, every pair
    as many steps a run as an equal share of the time left allows (both arms the same). Each arm records its own
    status: an arm that fails leaves the others' figures in `report["learning"]`."""
    methods = [m for m in dict.fromkeys(args.learning_methods.split(",")) if m]
    least = min(MIN_STEPS, args.learning_max_steps)
    # the held-out start measurement costs about one run's fixed cost
    if (
        plan_learning_steps(
            stop.left() - 10 - guess["run_fixed_s"],
            guess["run_fixed_s"],
            guess["step_s"],
            args.learning_max_steps,
        )
        < least
    ):
        return {
            "status": f"skipped: {stop.left():.0f} s left is not enough for two runs of {least} steps"
        }
    learning = {
        "device": device,
        "prompts": args.learning_eval_prompts,
        "samples": args.learning_eval_samples,
        "learning_rate": args.learning_lr,
        "methods": [],
    }
    report["learning"] = learning
    start = heldout_pass_rates(model_dir, args)
    learning["start"] = dict(zip(("pass@1", "ci95"), mean_ci(start)))
    for k, method in enumerate(methods):
        arms = LEARNING[method]
        pair = {"script": method}
        learning["methods"].append(pair)
        step_s = pair_step_s(report, {arm[1] for arm in arms.values()}, guess)
        share = (stop.left() - 10) / (len(methods) - k)  # the pairs left share what is left alike
        steps = plan_learning_steps(share, guess["run_fixed_s"], step_s, args.learning_max_steps)
        if stop.reason or steps < least:
            pair["status"] = (
                f"skipped ({stop.reason})"
                if stop.reason
                else f"skipped: budget ({share:.0f} s of the {stop.left():.0f} s left: {steps} steps a run "
                f"at ~{step_s:.2f} s a step, fewer than {least})"
            )
            continue
        pair["steps_planned"] = steps
        print(
            f"learning {method}: {arms['method'][0]} and {arms['baseline'][0]}, {steps} steps each (~{step_s:.2f} "
            f"s/step), held-out pass@1 on {args.learning_eval_prompts} prompts x {args.learning_eval_samples}",
            flush=True,
        )
        for arm in ("method", "baseline"):
            if stop.reason:
                break
            pair[arm] = run_arm(
                arms[arm], steps, model_dir, out / f"learning-{method}-{arm}", args, stop, start
            )
        if pair.get("method", {}).get("end") and pair.get("baseline", {}).get("end"):
            pair["method_minus_baseline_end"] = (
                pair["method"]["end"]["pass@1"] - pair["baseline"]["end"]["pass@1"]
            )
            # the same held-out prompts for both arms: the difference's interval is paired by prompt
            diffs = [
                m - b for m, b in zip(pair["method"]["end_rates"], pair["baseline"]["end_rates"])
            ]
            pair["method_minus_baseline"] = dict(zip(("mean", "ci95"), mean_ci(diffs)))
        (out / "learning.json").write_text(json.dumps(learning, indent=2))
    (out / "learning.json").write_text(json.dumps(learning, indent=2))
    learning["plot"] = plot_learning(learning, out / "learning.png")
    return learning


def replot(folder: str) -> None:
    """`--plot DIR`: draw learning.png from a finished command's learning.json (e.g. one copied from a GPU)."""
    learning = json.loads((Path(folder) / "learning.json").read_text())
    print(plot_learning(learning, Path(folder) / "learning.png"))
