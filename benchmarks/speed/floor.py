"""Our GRPO step time against a floor: bare `model.generate` + one forward/backward on the same tokens.

The GRPO setting: P prompts x n samples, completions <= L tokens, the embedded policy, one optimizer step
per batch. Three measurements, each the median over `--repeats` (after one warm-up):

1. floor, in this process: `model.generate` on the left-padded batch (nothing else), then one
   forward/backward of the same prompt+completion tokens (logits for the completion positions only) with a
   REINFORCE loss, one gradient clip and one AdamW step: no sampling log-prob pass, no micro-batching;
2. our components, in this process, on the same prompts: `HFGenerator.generate` without log-probs, the
   extra log-prob pass that fills `Generations.logprobs` (`score_completions`), decode + verifier, and
   the scripts' update (micro-batches, padding-free rows as in the scripts, chunked log-probs) + clip + AdamW;
3. our script end to end: a short run of `ada_seq.py --max_rounds 1 --round_repeat n` (GRPO-n; falls
   back to `ra_rloo.py --replay none --beta 0` when ada_seq is missing), median `time_step_s`,
   `time_gen_s`, `time_train_s` of its steps (the first and the last, which evaluates, left out).

The script's logged step is split into generation / log-prob pass / verifier (by the in-process
proportions of (2), since the script times them together as time_gen_s), update (time_train_s) and
book-keeping (the rest of time_step_s, plus the verifier), and reported as a ratio to the floor (1).

    OMP_NUM_THREADS=2 python benchmarks/speed/floor.py --num_threads 2  # -> benchmarks/speed/results/floor.{md,json}
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.sweep.configs import Config, check_config  # noqa: E402
from benchmarks.sweep.run_dirs import machine_info, read_rows  # noqa: E402
from common.run.flags import parse_args  # noqa: E402


@dataclass
class Args:
    prompts: int = 32
    """prompts per step (P)"""
    n: int = 4
    """samples per prompt (GRPO group size)"""
    max_completion_length: int = 32
    """completion length cap (L)"""
    repeats: int = 5
    """timed repeats of the in-process loops (median reported; one extra warm-up first)"""
    script_steps: int = 8
    """steps of the script run (median over steps 2..N-1)"""
    skip_script: bool = False
    """only the in-process measurements"""
    num_threads: int = 1
    """torch threads, here and in the script run"""
    micro_batch_size: int = 64
    """the micro-batch size of our update (the scripts' default)"""
    pack_row_tokens: int = 128
    """our update's padding-free rows (the scripts' CPU default, --pack_row_tokens 0 there); 0 = padded"""
    model_name_or_path: str = "embedded"
    """the policy (`embedded`: the cached tiny Countdown model)"""
    learning_rate: float = 5e-5
    """AdamW learning rate of both loops (the value does not change the timing)"""
    seed: int = 0
    """prompt choice and sampling seed"""
    out_dir: str = ""
    """where floor.md / floor.json go (default: benchmarks/speed/results)"""
    write: bool = True
    """write floor.md and floor.json (false: print only)"""
    torch_compile: bool = False
    """both loops compiled: generation through the compiled decoding step (common/generation/compile.py), the bare loop's
    training forward by torch.compile, ours and the script with --torch_compile; the warm-up repeat takes the
    compile"""


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def in_process(args: Args) -> dict:
    import random

    import numpy as np
    import torch
    from accelerate import Accelerator

    from common.demo.countdown import countdown_task
    from common.distributed.ranks import micro_batches
    from common.generation.hf import HFGenerator, SamplingConfig, cache_kwargs
    from common.model.policy import load_policy
    from common.rl.logprobs import score_completions, token_logprobs
    from common.rl.masking import pad_sequences

    torch.set_num_threads(args.num_threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    path = args.model_name_or_path
    if path == "embedded":  # the cached tiny Countdown model (built once)
        from common.demo.tiny_model import ensure_embedded_base

        path = str(ensure_embedded_base())
    model, tok = load_policy(path, "float32")
    task = countdown_task("binary", 8)
    order = np.random.default_rng(args.seed).permutation(len(task.train))[: args.prompts]
    examples = [task.train[i] for i in order]
    prompts = [tok(ex.prompt).input_ids for ex in examples]
    pad, eos = tok.pad_token_id, tok.eos_token_id
    n_params = sum(p.numel() for p in model.parameters())

    # ---- (1) the floor: bare generate + one forward/backward + AdamW step ----
    import copy

    bare = copy.deepcopy(model)
    bare_opt = torch.optim.AdamW(bare.parameters(), lr=args.learning_rate)
    flat = [p for p in prompts for _ in range(args.n)]
    width = max(map(len, flat))
    ids = torch.full((len(flat), width), pad, dtype=torch.long)
    att = torch.zeros_like(ids)
    for r, p in enumerate(flat):
        ids[r, width - len(p) :] = torch.tensor(p)
        att[r, width - len(p) :] = 1

    def floor_gen():
        bare.eval()
        compiled = {}
        if args.torch_compile:  # the same static cache and compiled step as HFGenerator's
            from common.generation.compile import TorchCompile

            decoding = TorchCompile()
            compiled = {
                "compile_config": decoding.config(bare),
                **cache_kwargs(
                    bare,
                    "static",
                    "float32",
                    decoding.cache_length(width, args.max_completion_length),
                ),
            }
        with torch.no_grad():
            return bare.generate(
                input_ids=ids,
                attention_mask=att,
                do_sample=True,
                temperature=1.0,
                top_p=None,
                top_k=None,
                max_new_tokens=args.max_completion_length,
                eos_token_id=[eos],
                pad_token_id=pad,
                **compiled,
            )

    # --torch_compile: the bare loop's training forward (and backward) compiled too, batch and length dynamic
    bare_forward = torch.compile(bare, dynamic=True) if args.torch_compile else bare

    def floor_update(seqs):
        bare.train()
        mask = torch.cat([att, (seqs[:, width:] != pad).long()], 1)
        # logits only where they are needed (the completion), as any reasonable trainer does
        keep = seqs.shape[1] - width + 1
        logits = bare_forward(input_ids=seqs, attention_mask=mask, logits_to_keep=keep).logits[
            :, :-1
        ]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, seqs[:, width:, None]).squeeze(-1)
        adv = torch.randn(len(seqs))
        loss = -(adv[:, None] * logp * mask[:, width:]).sum() / (
            len(seqs) * args.max_completion_length
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(bare.parameters(), 1.0)
        bare_opt.step()
        bare_opt.zero_grad(set_to_none=True)

    # ---- (2) our components on the same prompts ----
    acc = Accelerator(cpu=not torch.cuda.is_available())
    ours = copy.deepcopy(model)
    opt = torch.optim.AdamW(ours.parameters(), lr=args.learning_rate)
    ours, opt = acc.prepare(ours, opt)
    policy = acc.unwrap_model(ours)
    from common.generation.compile import TorchCompile

    compiled = TorchCompile() if args.torch_compile else None
    gen = HFGenerator(policy, tok, batch_size=256, compiled=compiled)
    cfg = SamplingConfig(max_new_tokens=args.max_completion_length, temperature=1.0, logprobs=False)

    def our_step():
        g, t_gen = timed(lambda: gen.generate(prompts, args.n, cfg))
        comps = g.completion_ids
        _, t_score = timed(
            lambda: score_completions(policy, flat, comps, pad, 256, acc.device, 1.0)
        )

        def verify():
            texts = tok.batch_decode(comps, skip_special_tokens=True)
            return [task.reward_fn(t, examples[i // args.n]) for i, t in enumerate(texts)]

        rewards, t_ver = timed(verify)
        r = torch.tensor(rewards).view(-1, args.n)
        adv = (r - r.mean(1, keepdim=True)).flatten()
        norm = len(comps) * args.max_completion_length

        def update():  # the scripts' update: micro-batches, loss, backward, clip, step
            for rows in micro_batches(len(comps), args.micro_batch_size, acc, ours):
                batch = pad_sequences(
                    [flat[r] for r in rows],
                    [comps[r] for r in rows],
                    pad,
                    pack_tokens=args.pack_row_tokens,
                ).to(acc.device)
                logp, _ = token_logprobs(ours, batch, compiled=compiled)
                acc.backward(-(adv[rows][:, None] * logp * batch.loss_mask).sum() / norm)
            acc.clip_grad_norm_(ours.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        _, t_upd = timed(update)
        return {
            "gen": t_gen,
            "score": t_score,
            "verify": t_ver,
            "update": t_upd,
            "tokens": sum(map(len, comps)),
        }

    floor, comp = [], []
    for rep in range(args.repeats + 1):  # repeat 0 warms up
        seqs, t_g = timed(floor_gen)
        _, t_u = timed(lambda s=seqs: floor_update(s))
        gen_tok = int((seqs[:, width:] != pad).sum())
        c = our_step()
        if rep:
            floor.append({"gen": t_g, "update": t_u, "tokens": gen_tok})
            comp.append(c)
    med = lambda rows, k: _median([r[k] for r in rows])  # noqa: E731
    return {
        "params": n_params,
        "model": path,
        "floor": {k: med(floor, k) for k in ("gen", "update", "tokens")},
        "ours": {k: med(comp, k) for k in ("gen", "score", "verify", "update", "tokens")},
        "floor_raw": floor,
        "ours_raw": comp,
    }


def script_run(args: Args) -> dict:
    grpo = Config(
        "grpo",
        "ada_seq.py",
        (
            "--max_rounds",
            "1",
            "--round_repeat",
            str(args.n),  # the floor has no bonus
            "--num_generations",
            str(args.n),
            "--entropy_coef",
            "0",
        ),
        f"GRPO-n{args.n}",
    )
    rloo = Config(
        "rloo",
        "ra_rloo.py",
        ("--replay", "none", "--beta", "0", "--num_generations", str(args.n)),
        "RLOO",
    )
    cfg = grpo if check_config(grpo) is None else rloo
    why = check_config(cfg)
    if why:
        return {"error": why}
    with tempfile.TemporaryDirectory(prefix="floor-") as tmp:
        cmd = [
            sys.executable,
            cfg.script,
            *cfg.flags,
            "--prompts_per_step",
            str(args.prompts),
            "--max_completion_length",
            str(args.max_completion_length),
            "--max_steps",
            str(args.script_steps),
            "--eval_steps",
            "0",
            "--eval_prompts",
            "8",
            "--eval_samples",
            "2",
            "--save_steps",
            "0",
            "--num_threads",
            str(args.num_threads),
            "--seed",
            str(args.seed),
            "--output_dir",
            tmp,
            "--model_name_or_path",
            args.model_name_or_path,
            "--learning_rate",
            repr(args.learning_rate),
            *(["--torch_compile"] if args.torch_compile else []),
        ]
        env = dict(
            os.environ,
            OMP_NUM_THREADS=str(max(1, args.num_threads)),
            TOKENIZERS_PARALLELISM="false",
        )
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
        if r.returncode != 0:
            return {"error": f"{cfg.script} failed ({r.returncode}): {r.stderr[-2000:]}"}
        rows = [x for x in read_rows(Path(tmp)) if 2 <= x.get("step", 0) < args.script_steps]
    if not rows:
        return {"error": f"no usable steps: use --script_steps >= 3 (got {args.script_steps})"}
    med = lambda k: _median([x[k] for x in rows])  # noqa: E731
    # ada_seq.py (HF backend, one epoch) reads pi_old from its update's forward pass: no scoring pass after
    # sampling (ada_seq.py --old_logprobs auto); ra_rloo.py needs the sampler's log-probs (IS weights)
    return {
        "script": cfg.script,
        "flags": " ".join(cfg.flags),
        "steps": [x["step"] for x in rows],
        "scores": cfg.script != "ada_seq.py",
        "step": med("time_step_s"),
        "gen": med("time_gen_s"),
        "train": med("time_train_s"),
        "tokens": _median([x["gen_tokens"] - p["gen_tokens"] for p, x in zip(rows, rows[1:])])
        if len(rows) > 1
        else None,
    }


def breakdown(res: dict) -> dict:
    """Floor total, our script's step split into parts, and the ratios."""
    f, o, s = res["floor"], res["ours"], res.get("script") or {}
    floor_total = f["gen"] + f["update"]
    scores = s.get("scores", True)  # does the script run the sampling log-prob pass?
    score = o["score"] if scores else 0.0
    out = {
        "floor_total": floor_total,
        "components_total": o["gen"] + score + o["verify"] + o["update"],
    }
    out["components_ratio"] = out["components_total"] / floor_total
    if "step" in s:
        g = o["gen"] + score + o["verify"]
        share = (
            {k: v / g for k, v in (("gen", o["gen"]), ("score", score), ("verify", o["verify"]))}
            if g > 0
            else {"gen": 1.0, "score": 0.0, "verify": 0.0}
        )
        other = max(0.0, s["step"] - s["gen"] - s["train"])
        out["script_parts"] = {
            "generation": s["gen"] * share["gen"],
            "log-prob passes": s["gen"] * share["score"],
            "update": s["train"],
            "bookkeeping": other + s["gen"] * share["verify"],
        }
        out["script_ratio"] = s["step"] / floor_total
    return out


def render(args: Args, res: dict, bd: dict) -> str:
    f, o, s = res["floor"], res["ours"], res.get("script") or {}
    lines = [
        (
            f"GRPO setting: {args.prompts} prompts x n={args.n}, completions <= {args.max_completion_length} tokens, "
            f"{res['params'] / 1e6:.2f}M-parameter policy (`{args.model_name_or_path}`), {args.num_threads} torch "
            f"thread(s); medians of {args.repeats} repeats (in-process) and of script steps "
            f"{s.get('steps', '-')} (`{s.get('script', '-')} {s.get('flags', '')}`). Command: "
            f"`python benchmarks/speed/floor.py --prompts {args.prompts} --n {args.n} "
            f"--max_completion_length {args.max_completion_length} --repeats {args.repeats} --script_steps {args.script_steps} "
            f"--num_threads {args.num_threads}`.\n"
        ),
        "| part | floor (bare loop) | our components (same batch) | our script step (logged, split) |",
        "|---|---|---|---|",
    ]
    sp = bd.get("script_parts", {})
    cell = lambda x: "-" if x is None else f"{x:.3f} s"  # noqa: E731
    lines.append(
        f"| generation | {cell(f['gen'])} | {cell(o['gen'])} | {cell(sp.get('generation'))} |"
    )
    skipped = "" if s.get("scores", True) else " (skipped by the script)"
    lines.append(
        f"| log-prob passes (sampling log-probs) | 0 (the update's forward gives them) | {cell(o['score'])}"
        f"{skipped} | {cell(sp.get('log-prob passes'))} |"
    )
    lines.append(
        f"| update (forward/backward + AdamW) | {cell(f['update'])} | {cell(o['update'])} | "
        f"{cell(sp.get('update'))} |"
    )
    lines.append(
        f"| bookkeeping (decode + verifier, advantages, logging) | 0 | {cell(o['verify'])} (verifier only) | "
        f"{cell(sp.get('bookkeeping'))} |"
    )
    lines.append(
        f"| **total** | **{cell(bd['floor_total'])}** | **{cell(bd['components_total'])}** "
        f"({bd['components_ratio']:.2f}x floor) | **{cell(s.get('step'))}** "
        + (f"(**{bd['script_ratio']:.2f}x floor**)" if "script_ratio" in bd else "")
        + " |"
    )
    lines.append(
        f"\nGenerated tokens per step: floor {f['tokens']:.0f}, components {o['tokens']:.0f}"
        + (f", script {s['tokens']:.0f}" if s.get("tokens") else "")
        + " (sampling noise; same prompts)."
    )
    if s.get("error"):
        lines.append(f"\nScript run not measured: {s['error']}")
    lines.append(
        "\nThe script's `time_gen_s` holds generation, the sampling log-prob pass and the verifier together; "
        "they are split here by the in-process proportions. Bookkeeping is `time_step_s - time_gen_s - "
        "time_train_s` plus the verifier share."
    )
    return "\n".join(lines) + "\n"


def main(args: Args) -> None:
    res = in_process(args)
    if not args.skip_script:
        res["script"] = script_run(args)
    bd = breakdown(res)
    md = render(args, res, bd)
    print(md)
    if args.write:
        out = Path(args.out_dir) if args.out_dir else ROOT / "benchmarks" / "speed" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "floor.md").write_text(md)
        (out / "floor.json").write_text(
            json.dumps(
                {"args": asdict(args), "machine": machine_info(), **res, "breakdown": bd},
                indent=2,
                default=str,
            )
        )
        print(f"wrote {out / 'floor.md'} and {out / 'floor.json'}")


if __name__ == "__main__":
    main(parse_args(Args, description=__doc__.split("\n\n")[0]))
