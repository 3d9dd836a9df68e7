"""The definition check of benchmarks/speed/trl_peer.py: on a fixed batch, TRL's own code (advantages from
`_generate_and_score_completions`, `compute_loss`) against ours (`ada_seq.global_advantages`, ada_seq.py's
summed clipped surrogate): advantages, loss and gradient, each cited to the installed TRL's lines."""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if (
    TYPE_CHECKING
):  # the command's flags; imported for the annotation only (trl_peer.py imports this module)
    from benchmarks.speed.trl_peer import Args

from benchmarks.speed.trl_setup import (
    CountdownReward,
    build_dataset,
    countdown_examples,
    grpo_config,
    load_base,
)


def cite(path: str, needle: str) -> str:
    """`file:line` of the first line of `path` containing `needle`, for the installed TRL version."""
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if needle in line:
            return f"trl/{Path(path).relative_to(Path(path).parents[1]).as_posix()}:{i}"
    return f"({needle!r} not found in {Path(path).name})"


def fixed_batch(examples, tokenizer, max_new_tokens: int):
    """2 prompts x 4 completions of varied length, some correct, one group with rewards (1, 0, 0, 1) and one with
    (0, 0, 0, 1): both with a stop token and truncated at max_new_tokens, an empty answer (stop token only)."""
    from common.demo import countdown

    eos = tokenizer.eos_token_id
    enc = lambda s: tokenizer(s, add_special_tokens=False).input_ids  # noqa: E731
    p0, p1 = examples[0], examples[1]
    sols0, sols1 = countdown.solutions(p0.answer), countdown.solutions(p1.answer)
    right0, other0 = countdown.solution_text(sols0[0]), countdown.solution_text(sols0[-1])
    right1 = countdown.solution_text(sols1[0])
    texts = [
        (p0, enc(right0) + [eos]),
        (
            p0,
            enc(countdown.solution_text(sols0[0][:1])) + [eos],
        ),  # first step only: numbers left unused
        (p0, enc(right0 * 4)[:max_new_tokens]),  # ran to max_new_tokens without a stop token
        (p0, enc(other0) + [eos]),
        (p1, enc("1+1=2\n") + [eos]),
        (p1, [eos]),
        (p1, enc((right1 + "9") * 4)[:max_new_tokens]),
        (p1, enc(right1) + [eos]),
    ]
    return [ex for ex, _ in texts], [c for _, c in texts]


def definition_check(args: Args) -> dict:
    import inspect

    import torch
    import trl
    from trl import GRPOTrainer
    from trl.trainer import grpo_trainer
    from trl.trainer import utils as trl_utils

    import ada_seq
    from common.rl.logprobs import token_logprobs
    from common.rl.losses import clipped_surrogate
    from common.rl.masking import pad_sequences, right_align

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is flagged experimental
    n, L = args.num_generations, args.max_completion_length
    if n != 4:
        raise SystemExit(
            "--check uses a fixed batch of 2 prompts x 4 completions: run it with --num_generations 4"
        )
    device = torch.device(args.device)
    ours_model, tokenizer, _ = load_base(args.model_name_or_path)
    trl_model, _, _ = load_base(
        args.model_name_or_path
    )  # TRL patches its model's forward; keep ours untouched
    ours_model.to(device)
    examples, reward_fn = countdown_examples(args.prompt_pool)
    rows, completions = fixed_batch(examples, tokenizer, L)
    prompt_ids = [
        tokenizer(ex.prompt).input_ids for ex in rows
    ]  # as PromptEncoder (Countdown: no chat template)
    rewards = [
        float(reward_fn(tokenizer.decode(c, skip_special_tokens=True), ex))
        for ex, c in zip(rows, completions)
    ]
    # fixed old log-probs: the current ones shifted by a fixed +-0.3 pattern, so some ratios leave [0.8, 1.28]
    with torch.no_grad():
        batch = pad_sequences(prompt_ids, completions, tokenizer.pad_token_id).to(device)
        cur, _ = token_logprobs(ours_model, batch)
    cur = cur.cpu()
    shift = 0.3 * torch.sign(
        torch.sin(torch.arange(batch.completion_width, dtype=torch.float32) * 1.7 + 0.5)
    )
    old = [
        (cur[i, batch.completion_width - len(c) :] + shift[: len(c)]).tolist()
        for i, c in enumerate(completions)
    ]

    # ---- ours: ada_seq with one round of n (advantages), clipped surrogate / (responses x max_new_tokens) ----
    adv_ours = []
    for g in range(0, len(rewards), n):
        adv_ours += ada_seq.global_advantages(
            rewards[g : g + n], rewards[g : g + n], 0.7, False, "none"
        )
    adv_ours_std = []
    for g in range(0, len(rewards), n):
        adv_ours_std += ada_seq.global_advantages(
            rewards[g : g + n], rewards[g : g + n], 0.7, True, "none"
        )
    logp, _ = token_logprobs(ours_model, batch)
    old_t = right_align(old, batch.completion_width).to(device)
    per_token, clipped_tok = clipped_surrogate(
        logp, old_t, torch.tensor(adv_ours, device=device)[:, None], 0.2, 0.28
    )
    loss_sum = (per_token * batch.loss_mask).sum()  # as ada_seq.py's update
    clipped = (clipped_tok * batch.loss_mask).sum()
    loss_ours = loss_sum / (
        len(completions) * L
    )  # ada_seq: norm = prompts_per_step * n / world * max_new_tokens
    loss_ours.backward()

    # ---- TRL: its own scoring/advantage path and compute_loss, fed the same completions ----
    def rollout(prompts, trainer):
        if len(prompts) != len(completions):
            raise RuntimeError(
                f"rollout_func got {len(prompts)} prompts, expected {len(completions)}"
            )
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": old}

    cfg_args = dataclasses.replace(args, steps=1, dtype="float32")  # the check compares fp32 sums
    with tempfile.TemporaryDirectory(prefix="trl-check-") as tmp:
        trainer = GRPOTrainer(
            model=trl_model,
            reward_funcs=[CountdownReward(examples, reward_fn)],
            args=grpo_config(cfg_args, tmp, len(completions), len(completions)),
            train_dataset=build_dataset(examples[:2]),
            processing_class=tokenizer,
            rollout_func=rollout,
        )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = (
        1  # set by Trainer's loop in training; one micro-batch here
    )
    inputs = [{"prompt": ex.prompt, "problem_id": ex.id} for ex in rows]
    scored = trainer._generate_and_score_completions(inputs)
    adv_trl = scored["advantages"].tolist()
    scored["old_per_token_logps"] = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(o) for o in old], batch_first=True
    ).to(device)  # right-padded, TRL's completion layout
    loss_trl = trainer.compute_loss(trainer.model, scored)
    loss_trl.backward()
    with torch.no_grad():
        other = {}
        for lt in (
            "dr_grpo",
            "dapo",
            "grpo",
            "bnpo",
        ):  # TRL's other normalisations on the same batch
            trainer.loss_type = lt
            other[lt] = float(trainer.compute_loss(trainer.model, scored))
        trainer.loss_type = "dr_grpo"
        trainer.scale_rewards = "group"
        adv_trl_std = trainer._generate_and_score_completions(inputs)["advantages"].tolist()
        trainer.scale_rewards = "none"

    g_ours = dict(ours_model.named_parameters())
    g_diff = g_max = 0.0
    for name, p in trl_model.named_parameters():
        q = g_ours[name]
        if p.grad is None or q.grad is None:
            raise RuntimeError(f"no gradient for {name}")
        g_diff = max(g_diff, (p.grad.to(q.grad.device) - q.grad).abs().max().item())
        g_max = max(g_max, q.grad.abs().max().item())

    src, usrc = inspect.getsourcefile(grpo_trainer), inspect.getsourcefile(trl_utils)
    adv_diff = max(abs(a - b) for a, b in zip(adv_ours, adv_trl))
    out = {
        "trl": trl.__version__,
        "rewards": rewards,
        "lengths": [len(c) for c in completions],
        "adv_ours": adv_ours,
        "adv_trl": adv_trl,
        "adv_max_diff": adv_diff,
        "loss_ours": loss_ours.item(),
        "loss_trl": loss_trl.item(),
        "loss_diff": abs(loss_ours.item() - loss_trl.item()),
        "grad_max_diff": g_diff,
        "grad_max_abs": g_max,
        "clipped_tokens": int(clipped),
        "tokens": int(batch.loss_mask.sum()),
        "trl_loss_types": other,
        "adv_ours_std": adv_ours_std,
        "adv_trl_group": adv_trl_std,
        "cites": {
            "group mean": cite(
                src, "mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations)"
            ),
            "A = r - mean": cite(src, "advantages = rewards - mean_grouped_rewards"),
            "/ (std + 1e-4) unless scale_rewards='none'": cite(
                src, "advantages = advantages / (std_rewards + 1e-4)"
            ),
            "std with Bessel's correction (n-1)": cite(usrc, "variance *= correction"),
            "old logps = current (detached) when on-policy": cite(
                src, "old_per_token_logps = per_token_logps.detach() if"
            ),
            "per-token clipped loss": cite(
                src, "per_token_loss = -torch.min(per_token_loss1, per_token_loss2)"
            ),
            "dr_grpo: sum / (B x max_completion_length)": cite(
                src, "/ (per_token_loss.size(0) * self.max_completion_length)"
            ),
        },
    }
    out["agree"] = (
        adv_diff < 1e-6 and out["loss_diff"] < 1e-6 and g_diff <= 1e-4 * max(g_max, 1e-12)
    )
    inspect_ratio = [b / a for a, b in zip(adv_trl_std, adv_ours_std) if abs(a) > 1e-9]
    out["std_ratio_ours_over_trl"] = statistics.mean(inspect_ratio) if inspect_ratio else None
    return out


def render_check(c: dict) -> str:
    f = lambda xs: "[" + ", ".join(f"{x:+.4f}" for x in xs) + "]"  # noqa: E731
    lines = [
        f"Fixed batch: 2 prompts x 4 completions, lengths {c['lengths']} (tokens incl. the stop token; two ran to "
        f"max_new_tokens), rewards {c['rewards']} (repo binary verifier); fixed old log-probs = current +-0.3, so "
        f"{c['clipped_tokens']} of {c['tokens']} tokens are clipped. TRL's numbers come from TRL {c['trl']}'s "
        "own code: "
        "`GRPOTrainer._generate_and_score_completions` (fed the fixed completions through `rollout_func`) and "
        "`GRPOTrainer.compute_loss`, on a second copy of the same model.",
        "",
        "| quantity | ours | TRL (`loss_type='dr_grpo'`, `scale_rewards='none'`) | max abs diff |",
        "|---|---|---|---|",
        f"| advantages | {f(c['adv_ours'])} | {f(c['adv_trl'])} | {c['adv_max_diff']:.1e} |",
        f"| loss | {c['loss_ours']:.8f} | {c['loss_trl']:.8f} | {c['loss_diff']:.1e} |",
        f"| gradient (all parameters) | | | {c['grad_max_diff']:.1e} (largest entry {c['grad_max_abs']:.1e}) |",
        "",
        f"**{'Agree' if c['agree'] else 'DO NOT agree'}** (advantages and loss to 1e-6; gradient to 1e-4 of its "
        "largest entry, fp32 sums in different orders). "
        "Ours (Dr. GRPO-n4 = `ada_seq.py --max_rounds 1 --round_repeat 4 --scale_rewards false --entropy_coef 0`, "
        "`--prompt_weight none`) corresponds to TRL `loss_type='dr_grpo'`, `scale_rewards='none'`, `beta=0`, "
        "`epsilon=0.2`, `epsilon_high=0.28`.",
        "",
        "TRL's other normalisations on the same batch: "
        + ", ".join(f"`{k}` {v:.6f}" for k, v in c["trl_loss_types"].items())
        + " (`dapo`/`bnpo` divide by the token count, `grpo` by each completion's length: they differ from ours "
        "whenever completion lengths vary).",
        "",
        f"With std scaling the two differ: ours `--scale_rewards` {f(c['adv_ours_std'])} vs TRL `scale_rewards='group'` "
        f"{f(c['adv_trl_group'])}: ours divides by the population std + 1e-6, TRL by the sample (n-1) std + 1e-4 "
        + (
            f"(ratio ours/TRL {c['std_ratio_ours_over_trl']:.4f}, about sqrt(n/(n-1)) = 1.1547 for n = 4)."
            if c["std_ratio_ours_over_trl"]
            else "."
        ),
        "",
        "Where TRL defines it (installed version):",
        "",
        *[f"- {k}: `{v}`" for k, v in c["cites"].items()],
    ]
    return "\n".join(lines)
