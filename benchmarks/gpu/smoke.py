"""GPU smoke and learning check: every method script on a real architecture, in one short GPU spell.

One command, `python benchmarks/gpu/smoke.py`, sized for one lent GPU (at most `--budget_s`, default 480 s, wall time):

0. **Model and warm start.** A randomly initialised Qwen2-architecture model (~143M parameters, `--size 150m`) and a
   byte-level BPE tokenizer trained here on generated Countdown text (nothing is downloaded), then supervised
   fine-tuning on generated Countdown demonstrations (the embedded base's recipe: solver solutions, a share of
   careless answers on the 3- and 5-number levels, loss on the answer only) until greedy pass@1 on training prompts
   reaches `--warm_target`, so every run below sees successes and failures. Cached in the model folder
   (`model-<size>-warm/warm_start.json`): a second command skips it. `--size tiny` (a CPU check) starts from the
   shipped embedded base instead, which is already warm.
1. **Parts, in priority order** (`--parts`): every script `plain`; then `fsdp` (FSDP2 on one process: its wrapping,
   gathers and checkpoint paths); then `gc_lora` (gradient checkpointing, LoRA r 16); then `learning` (each method
   of `--learning_methods` against its baseline, an equal share of the budget left each, held-out pass@1 with a 95%
   interval at start and end, a learning-curve PNG); then `speed` (one script's step time and generated tokens/s
   eager with HF generate's dynamic cache, with `--cache_implementation static`, which transformers compiles on a
   GPU, and with `--torch_compile`, its compile time reported apart); then `peer` (TRL's GRPOTrainer against ours,
   `benchmarks/speed/trl_peer.py`, at TRL's default cache and at ours, when trl imports or its wheels lie in
   `.whl/`). `--parts` in another order runs them
   in that order (the learning part takes whatever budget is left, so it belongs last when named with others).
   The plan printed first says what fits; a part that does not fit is skipped, a run never starts past the budget,
   and a timer stops a running script at the budget (its graceful stop: it saves and returns).
2. **Every run proves its update**: mean reward, the fraction of policy weights that changed (LoRA: adapter B entries
   that left zero; pros_ppo also the critic's), mean grad norm, ps_grpo's trained groups. The table ends with a
   verdict line, "policy updated in N of M runs", naming every run that did not.

Results go to `<output_dir>/smoke.json` and `smoke.md` after every run. SIGTERM or Ctrl-C ends the whole command:
the running script saves and stops, nothing more starts, and what was measured is written.

Needs, beyond PyTorch and transformers: accelerate, tokenizers, safetensors, numpy, tqdm and peft (all on the lent
GPU image, see docs/scaling.md); matplotlib for the PNG (else the command to draw it later is printed). Not needed:
datasets, math-verify, vllm.

    python benchmarks/gpu/smoke.py                                   # one CUDA GPU, <= 8 minutes
    bash benchmarks/gpu/spell.sh                                     # the same, small results copied to $OUT
    python benchmarks/gpu/smoke.py --parts learning,speed,peer       # a second spell: what did not fit
    python benchmarks/gpu/smoke.py --size tiny --steps 2 --parts plain --budget_s 300   # CPU check
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu.budget import (  # noqa: E402
    GUESS,
    PART_VARIANTS,
    PARTS,
    SCRIPT_FLAGS,
    VARIANTS,
    Args,
    Stop,
    error_status,
    left_out,
    plan_costs,
)
from benchmarks.gpu.learning import learning_part, replot  # noqa: E402
from benchmarks.gpu.peer import run_peer  # noqa: E402
from benchmarks.gpu.plain import drop_checkpoint, run_script  # noqa: E402
from benchmarks.gpu.report import table, write  # noqa: E402
from benchmarks.gpu.speed import speed_part  # noqa: E402
from benchmarks.gpu.warm_start import build_model_dir, embedded_warm_dir, warm_start  # noqa: E402
from common.run.flags import parse_args  # noqa: E402


def main(args: Args) -> dict:
    import torch
    import transformers

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stop = Stop(args.budget_s)
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else "CPU (no GPU: a check of this script)"
    report = {
        "device": device,
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {sys.version.split()[0]}",
        "budget_s": args.budget_s,
        "args": asdict(args),
        "plan": [],
        "runs": [],
        "warm_start": None,
        "learning": None,
        "speed": [],
        "peer": None,
    }
    guess = dict(GUESS[args.size])
    scripts, parts = (
        args.scripts.split(","),
        list(dict.fromkeys(p for p in args.parts.split(",") if p)),
    )
    try:
        # ---------------- plan ----------------
        run_s = lambda steps: guess["run_fixed_s"] + steps * guess["step_s"]  # noqa: E731
        warm_dir = out / f"model-{args.size}-warm"
        cached = (warm_dir / "warm_start.json").exists() or args.size == "tiny"
        cost = plan_costs(args, guess, cached)
        total, usable = 0.0, stop.left()
        print(
            f"gpu_smoke on {device}: budget {args.budget_s:.0f} s, {usable:.0f} s left for the work. Plan (first "
            "guesses, revised as runs finish):"
        )
        for name, seconds in cost.items():
            total += seconds
            fits = "fits" if total <= usable else "may not fit: runs only if time is left"
            report["plan"].append(
                {"part": name, "estimate_s": round(seconds), "cumulative_s": round(total)}
            )
            print(
                f"  {name:<10} ~{seconds:5.0f} s   cumulative ~{total:5.0f} s   {fits}", flush=True
            )
        for line in left_out(args, parts):  # what this command does not try, said once
            print(f"  not planned: {line}", flush=True)

        # ---------------- model and warm start ----------------
        if args.size == "tiny":
            model_dir = embedded_warm_dir(warm_dir)
            report["warm_start"] = json.loads((model_dir / "warm_start.json").read_text())
        else:
            random_dir = build_model_dir(out / f"model-{args.size}", args.size)
            report["warm_start"] = warm_start(random_dir, warm_dir, args, stop)
            model_dir = warm_dir
        write(report, out, stop)

        # ---------------- the parts, in priority order ----------------
        measured = []  # (fixed_s, step_s) of finished smoke runs: the plan's guesses are revised from them
        for part in parts:
            if stop.reason and part not in PART_VARIANTS:
                continue  # said below; the smoke parts list each run they skip
            print(f"\n=== part {part} ({stop.left():.0f} s left) ===", flush=True)
            if part in PART_VARIANTS:
                for script in scripts:
                    for variant in PART_VARIANTS[part]:
                        entry = {"script": script, "variant": variant, "part": part}
                        if stop.reason or stop.left() < run_s(args.steps):
                            report["runs"].append(
                                {
                                    **entry,
                                    "status": "skipped: budget"
                                    if not stop.reason
                                    else f"skipped ({stop.reason})",
                                }
                            )
                            continue
                        print(f"--- {script} / {variant} ({stop.left():.0f} s left)", flush=True)
                        lr = args.learning_rate * (10 if variant == "lora" else 1)
                        flags = [
                            *VARIANTS[variant],
                            *SCRIPT_FLAGS.get(script, []),
                            "--learning_rate",
                            repr(lr),
                        ]
                        try:
                            result = run_script(
                                script,
                                flags,
                                out / f"{script}-{variant}",
                                model_dir,
                                args.steps,
                                args,
                                stop,
                            )
                        except (
                            Exception
                        ) as error:  # a smoke run reports its failure and the command goes on
                            result = {"status": error_status(error)}
                        drop_checkpoint(result, args)
                        report["runs"].append({**entry, **result})
                        if result["status"] == "ok":
                            measured.append((result["fixed_s"], result["step_s"]))
                            guess["run_fixed_s"] = sum(m[0] for m in measured) / len(measured)
                            guess["step_s"] = sum(m[1] for m in measured) / len(measured)
                        write(report, out, stop)
            else:
                try:
                    if part == "learning":
                        report["learning"] = learning_part(
                            model_dir, out, args, stop, guess, device, report
                        )
                    elif part == "speed":
                        report["speed"] = speed_part(model_dir, out, args, stop, guess, report)
                    elif stop.left() < guess["peer_s"]:
                        report["peer"] = {
                            "status": f"skipped: {stop.left():.0f} s left, the peer needs "
                            f"~{guess['peer_s']:.0f}"
                        }
                    else:
                        report["peer"] = run_peer(
                            model_dir, out / "peer", args, stop, stop.left() - 5
                        )
                except Exception as error:  # a part reports its failure, keeps what it recorded; the command goes on
                    failed = {"status": error_status(error)}
                    if part == "speed":  # the runs it finished stay, each with its own status
                        report["speed"] = [
                            *report["speed"],
                            {"cache_implementation": "-", **failed},
                        ]
                    else:
                        report[part] = {**(report.get(part) or {}), **failed}
            write(report, out, stop)
        for part in PARTS:  # what the budget left out, said once
            if (
                part in parts
                and part not in ("plain", "fsdp", "gc_lora")
                and report.get(part) in (None, [])
            ):
                report[part] = (
                    {"status": f"not run ({stop.reason or 'budget'})"}
                    if part != "speed"
                    else [
                        {
                            "cache_implementation": "-",
                            "status": f"not run ({stop.reason or 'budget'})",
                        }
                    ]
                )
    finally:
        write(report, out, stop)
        stop.close()
    print("\n" + table(report), flush=True)
    if stop.reason and stop.reason.startswith("signal"):
        raise SystemExit(
            128 + int(stop.reason.split()[1])
        )  # interrupted: the shell sees it; results are written
    return report


if __name__ == "__main__":
    if sys.argv[1:2] == ["--plot"]:
        replot(sys.argv[2])
    else:
        main(parse_args(Args, description=__doc__.split("\n\n")[0]))
