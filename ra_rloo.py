"""Replay-Augmented RLOO (RA-RLOO), one file.

Paper: Hao Xu, "Replay-Augmented RLOO: Restoring Within-Group Reward Variance in Sparse-Reward
Policy Gradients", Stanford University course project report. Docs: docs/ra_rloo.md.

Plain RLOO samples K rollouts per prompt and uses the leave-one-out baseline. When all K rewards are
equal (no rollout succeeded), every advantage is 0 and the group gives no gradient. RA-RLOO keeps a
small per-prompt FIFO buffer of past successes and, *on demand* (only in groups with no fresh
success), replaces one rollout by a stored success, importance-weighted by w = min(pi_theta /
pi_old, w_max). Lines marked [RA-RLOO] are what the paper adds to RLOO; `--replay none` never runs
them, except those marked "[RA-RLOO] (also in RLOO: ...)", which run there and change nothing.
[RA-RLOO setup] marks the paper's experimental setup (its training reward, its evaluation), which
both run.

Logged `loss`: the policy-gradient term per sequence, -mean_i A_i log pi(y_i|x) over the step's
samples (the KL term is logged separately as `kl`, per completion token). The optimised loss divides
the same sum, plus beta x the KL summed over the same tokens, by samples x max_new_tokens
(`rloo_loss`: one constant normaliser, so no length bias and beta keeps its weight against the
policy gradient at any --max_completion_length).

As in the paper (Sec. 4): the Countdown training reward is {0 no parse, 0.1 well-formed but wrong, 1
exact} (`--reward tinyzero`, the default here) while evaluation is binary, and besides the periodic
eval_pass@1 / eval_pass@8 at the training temperature the paper's own report is logged:
eval_paper_pass@4 (and @1) from 8 samples per held-out prompt at T = 0.6, top-p 0.95, top-k 20
(`--paper_eval_*`). Every log-prob (the stored log pi_old of fresh and seeded buffer entries, the
weight's numerator, the gradient and the KL) is taken under the sampling distribution logits / T, so
an unchanged policy gives w = 1 at any temperature.

Where this file departs from the paper: the seed is one solver-written solution per training prompt
(the paper seeds from its IPO pipeline's successes), scored under the initial policy; the default
run is 300 steps of 32 prompts on the embedded model (the paper: 600 steps of 2 prompts, Qwen SFT,
LR 1e-6), and training samples at the full distribution (T = --temperature, no top-p/top-k: the
paper does not say what it trains at).

    python ra_rloo.py                                   # embedded Countdown default, CPU, minutes
    python ra_rloo.py --replay none                     # vanilla RLOO baseline
    accelerate launch ra_rloo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --dataset_name openai/gsm8k --dataset_config main --use_vllm --dtype bfloat16 \
        --learning_rate 1e-6
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import Annotated, ClassVar, Literal, Optional

import torch

from common.distributed.ranks import (
    gather_list,
    gathered,
    micro_batches,
    my_slice,
)
from common.generation.hf import SamplingConfig
from common.model.policy import autocast
from common.rl.advantages import zero_variance
from common.rl.logprobs import Forward, score_completions
from common.rl.losses import kl_k3
from common.run.checkpoint import Checkpoints
from common.run.export import export_model
from common.run.flags import (
    DataFlags,
    EvalFlags,
    GenerationFlags,
    LogFlags,
    ModelFlags,
    OutputFlags,
    Range,
    RewardFlags,
    ScaleFlags,
    TrainingFlags,
    parse_args,
)
from common.run.logs import RunLog, first_of_each_kind
from common.run.process import GracefulStop, end_processes
from common.run.setup import (
    load_training_policy,
    make_compiled,
    make_generator,
    make_optimizer,
    make_reference,
    make_task,
    packed_row_tokens,
    prepare_training,
    sampling_configs,
    shard_models,
    start_run,
)
from common.run.step_metrics import rollout_sums
from common.run.summary import run_summary
from common.tasks.evaluation import evaluate, evaluate_policy
from common.tasks.loading import PromptEncoder, PromptSampler


@dataclass
class Args(
    ModelFlags,
    DataFlags,
    RewardFlags,
    GenerationFlags,
    TrainingFlags,
    EvalFlags,
    ScaleFlags,
    OutputFlags,
    LogFlags,
):
    # the method in TRL GRPOConfig's terms, so that a --config GRPOConfig file may say so: the loss
    # divides by samples x max_completion_length (rloo_loss), the advantages are not std-scaled
    trl_equivalents: ClassVar[dict] = {"loss_type": "dr_grpo", "scale_rewards": "none"}
    # the step's hyperparameters (the same names in every script): its length, batch and update
    max_steps: Annotated[int, Range(1)] = 300
    """number of policy updates (one batch of prompts each)"""
    prompts_per_step: Annotated[int, Range(1)] = 32
    """prompts per step across all processes (every rank takes every world-th one; with fewer
    prompts than processes the ranks without one idle through the step)"""
    max_completion_length: Annotated[int, Range(1)] = 48
    """maximum completion length; a completion cut by it gets reward 0 from the built-in rewards
    (never a success), its functions' total from --reward_funcs"""
    mask_truncated_completions: bool = False
    """completions cut by the length limit get no gradient (TRL's flag); `clipped_ratio` is logged
    either way"""
    vllm_importance_sampling_correction: Optional[bool] = None
    """reweight each sampled token by rho = pi_trainer / pi_sampler under the sampling weights
    (TRL's flag); asked for with HF generate, whose log-probs come from its own cached decode, rho
    is about 1 in fp32 (a check rather than a correction; under --dtype bfloat16 the two passes
    differ by up to a few hundredths of a nat) (default: on with --use_vllm, as TRL, off with HF
    generate)"""
    vllm_importance_sampling_mode: Literal[
        "sequence_mask", "sequence_truncate", "token_mask", "token_truncate"
    ] = "sequence_mask"
    """how the ratio enters the policy-gradient term (TRL's modes): per `token` or one per
    `sequence` (the product over its sampled tokens); ratios outside [clip_min, clip_max] are
    zeroed (`mask`) or clipped to the range (`truncate`)"""
    vllm_importance_sampling_clip_max: Annotated[Optional[float], Range(0, lo_open=True)] = 3.0
    """upper bound C_max of the ratio (null in a --config file: none)"""
    vllm_importance_sampling_clip_min: Annotated[Optional[float], Range(0)] = None
    """lower bound C_min of the ratio, below --vllm_importance_sampling_clip_max (default: none)"""
    micro_batch_size: Annotated[int, Range(1)] = 64
    """sequences per forward/backward pass (gradients are accumulated over the step's batch)"""
    max_tokens_per_microbatch: Annotated[int, Range(0, zero="off")] = 0
    """if > 0, micro-batches are cut by this many prompt + completion tokens instead of
    --micro_batch_size sequences, so long and short completions cost what they are"""
    max_grad_norm: Annotated[float, Range(0, lo_open=True)] = 1.0
    """gradient clipping norm"""
    num_generations: Annotated[int, Range(2)] = 4
    """rollouts per prompt (K); RLOO needs K >= 2"""
    beta: Annotated[float, Range(0, zero="off, no reference model")] = 0.05
    """KL coefficient to the reference (initial) policy; per-token k3 estimator exp(r)-r-1, r = log
    ref - log pi"""
    replay: Literal["on_demand", "always", "none"] = "on_demand"
    """[RA-RLOO] when to splice a stored success: only into groups with no fresh success (paper),
    into every group (ablation E3), or never (vanilla RLOO)"""
    buffer_capacity: Annotated[int, Range(1)] = 16
    """[RA-RLOO] per-prompt FIFO capacity C"""
    w_max: Annotated[float, Range(0, lo_open=True)] = 5.0
    """[RA-RLOO] clip of the replay's importance weight w = min(exp(log pi_theta(y|x) - log
    pi_old(y|x)), w_max)"""
    seed_buffer: bool = True
    """[RA-RLOO] seed the buffers at the start with demonstrations scored under the initial policy
    (Countdown: solver solutions; the paper's IPO seed); false = lazy buffers"""
    paper_eval_samples: Annotated[int, Range(0, zero="off")] = 8
    """[RA-RLOO setup] the paper's evaluation, logged as eval_paper_pass@1/@4 at each evaluation:
    samples per held-out prompt"""
    paper_eval_temperature: Annotated[float, Range(0, zero="greedy")] = 0.6
    """[RA-RLOO setup] sampling temperature of the paper's evaluation"""
    paper_eval_top_p: Annotated[float, Range(0, 1, lo_open=True)] = 0.95
    """[RA-RLOO setup] top-p of the paper's evaluation"""
    paper_eval_top_k: Annotated[int, Range(0, zero="off")] = 20
    """[RA-RLOO setup] top-k of the paper's evaluation"""


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_i = R_i - mean_{j != i} R_j  (leave-one-out baseline; = K/(K-1) (R_i - mean R), RA-RLOO eq.
    1). A NaN reward (no function scored the completion) is left out of the others' baselines and
    gets A = 0, as does the only scored completion of a group."""
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError("RLOO needs at least 2 samples per group")
    if not torch.isnan(rewards).any():
        others = (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)
        return rewards - others
    scored = ~torch.isnan(rewards)
    filled = torch.nan_to_num(rewards, nan=0.0)
    count = scored.sum(-1, keepdim=True)
    others = (filled.sum(-1, keepdim=True) - filled) / (count - 1).clamp(min=1)
    return torch.where(scored & (count > 1), filled - others, torch.zeros_like(filled))


def seed_buffers(
    task, model, tokenizer, encode, args, device, temperature: float
) -> dict[int, deque]:
    """[RA-RLOO] One solver solution per training prompt, with its log-prob under the initial
    policy's sampling distribution (logits / temperature, as fresh entries store theirs)."""
    buffers: dict[int, deque] = {}
    if task.name != "countdown":
        return buffers  # real datasets: lazy buffers (no verified demonstrations to seed from)
    from common.demo import countdown

    rng = random.Random(args.seed)
    eos = tokenizer.eos_token_id
    prompts = [encode(example.prompt) for example in task.train]
    demos = [
        tokenizer(
            countdown.solution_text(countdown.sample_steps(example.answer, rng)),
            add_special_tokens=False,
        ).input_ids
        + [eos]
        for example in task.train
    ]
    logprobs = score_completions(
        model, prompts, demos, tokenizer.pad_token_id, 512, device, temperature
    )
    for example, demo, token_lps in zip(task.train, demos, logprobs):
        # a verified solution: the built-in reward 1 (or --success_reward when higher, so that it
        # counts as one)
        entry = (
            torch.tensor(demo, dtype=torch.int32),
            sum(token_lps),
            max(1.0, task.success_reward),
        )
        buffers[example.id] = deque([entry], maxlen=args.buffer_capacity)
    return buffers


def restore_buffers(saved: dict, capacity: int) -> dict[int, deque]:
    """[RA-RLOO] (also in RLOO: empty) A checkpoint's buffers as FIFOs of `capacity`: prompt id ->
    (int32 response, log pi_old(y|x), reward) entries; a checkpoint of the older layout (five
    tensors: every response back to back, with their lengths) is unpacked first."""
    if {"prompt_ids", "logp_old", "rewards", "lengths", "tokens"} <= set(saved):
        ends = saved["lengths"].cumsum(0).tolist()
        unpacked: dict[int, list] = {}
        for prompt_id, end, length, logp_old, reward in zip(
            saved["prompt_ids"].tolist(),
            ends,
            saved["lengths"].tolist(),
            saved["logp_old"].tolist(),
            saved["rewards"].tolist(),
        ):
            response = saved["tokens"][end - length : end].to(torch.int32).clone()
            unpacked.setdefault(prompt_id, []).append((response, logp_old, reward))
        saved = unpacked
    return {prompt_id: deque(entries, maxlen=capacity) for prompt_id, entries in saved.items()}


def splice_replays(
    prompt_ids: list[int],
    completions: list[list[int]],
    rewards: torch.Tensor,
    fresh_success: torch.Tensor,
    buffers: dict[int, deque],
    mode: str,
    rng,
) -> torch.Tensor:
    """[RA-RLOO] Replace the last rollout of each group that needs it by a stored success, in place.

    A group needs it when `mode` is "always", or ("on_demand") when none of its fresh rollouts
    succeeded and its prompt's buffer is non-empty. The spliced slot gets the reward its success was
    stored with (the buffer holds (response, log pi_old, reward); the paper's 1 under a 0/1 reward).
    Returns log pi_old(y|x) of the spliced responses as a [groups, K] tensor, NaN where nothing was
    spliced.
    """
    k = rewards.shape[1]
    replay_logp_old = torch.full(rewards.shape, float("nan"))
    for group, prompt_id in enumerate(prompt_ids):
        needed = mode == "always" or not bool(fresh_success[group].any())
        if needed and buffers.get(prompt_id):
            response, logp_old, reward = rng.choice(buffers[prompt_id])
            slot = k - 1  # rollouts are i.i.d., so which slot is replaced does not matter
            completions[group * k + slot] = torch.as_tensor(response).tolist()
            rewards[group, slot] = reward
            replay_logp_old[group, slot] = logp_old
    return replay_logp_old


def replay_weights(seq_logp: torch.Tensor, logp_old: torch.Tensor, w_max: float) -> torch.Tensor:
    """[RA-RLOO] (also in RLOO: computed, unused: no row is a replay) w = min(exp(log pi_theta(y|x)
    - log pi_old(y|x)), w_max); sequence-level IS, no gradient."""
    return torch.exp(seq_logp.detach() - logp_old).clamp(max=w_max)


def weigh_replays(
    advantages: torch.Tensor,
    is_replay: torch.Tensor,
    seq_logp: torch.Tensor,
    logp_old: torch.Tensor,
    w_max: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[RA-RLOO] (also in RLOO: no row is a replay, the advantages unchanged) each replayed row's
    advantage x w = min(pi_theta / pi_old, w_max) (`replay_weights`, no gradient through w), and
    the weights. All [rows]."""
    weight = replay_weights(seq_logp, logp_old, w_max)
    return torch.where(is_replay, advantages * weight, advantages), weight


def rloo_loss(
    pg_sum: torch.Tensor, kl_sum: torch.Tensor | float, beta: float, normaliser: float
) -> torch.Tensor:
    """The optimised loss: the policy-gradient sum -sum_i A_i log pi(y_i|x) plus beta x the k3 KL
    summed over the same tokens, both divided by one constant (samples x max_new_tokens), so the KL
    weighs beta against the policy gradient whatever --max_completion_length is (the paper gives
    beta = 0.05 only)."""
    return (pg_sum + beta * kl_sum) / normaliser


def rloo_normaliser(prompts_per_step: int, k: int, world: int, max_completion_length: int) -> float:
    """`rloo_loss`'s constant on each rank: the batch's samples / world (DDP and FSDP average the
    ranks' gradients) x max_new_tokens."""
    return prompts_per_step * k / world * max_completion_length


def keep_successes(buffers, examples, gens, fresh_success, scored, args, accelerator) -> None:
    """[RA-RLOO] Append each fresh success, with its log pi_old(y|x) from the generator, to its
    prompt's FIFO; gathered over ranks, so every rank keeps the same buffers."""
    k = args.num_generations
    new_successes = []
    for i, ids in enumerate(gens.completion_ids):
        if fresh_success.view(-1)[i]:
            logp_old = float(sum(gens.logprobs[i]))
            new_successes.append((examples[i // k].id, list(ids), logp_old, scored.total[i]))
    for prompt_id, response, logp_old, reward in gather_list(accelerator, new_successes):
        buffer = buffers.setdefault(prompt_id, deque(maxlen=args.buffer_capacity))
        buffer.append((torch.tensor(response, dtype=torch.int32), logp_old, float(reward)))


def ra_rloo_sums(fresh_rewards, rewards, fresh_success, is_replay, truncated, gens) -> dict:
    """The step's sums: the fresh rollouts' (`rollout_sums`, before the splice: a NaN reward is out
    of reward_mean / _std) and [RA-RLOO] (also in RLOO: as before the splice) the groups' after it;
    the replays' importance weights start at 0 (the update adds them). All [groups, K]."""
    success, zero_var = fresh_success.sum(), zero_variance(fresh_rewards).sum()
    groups, cut = len(fresh_rewards), truncated.sum()
    return rollout_sums(groups, fresh_rewards, success, zero_var, cut, gens.completion_ids) | {
        "zero_var_groups_post": zero_variance(rewards).sum(),
        "replay_fired_groups": is_replay.any(-1).sum(),
        "no_success_groups_post": (~(fresh_success | is_replay).any(-1)).sum(),
        "w_sum": 0.0,
        "w_n": 0.0,
    }


def sample_rows(
    prompts,
    completions,
    rewards,
    advantages,
    truncated,
    scored,
    is_replay,
    is_weights,
    tokenizer,
    args,
) -> list[dict]:
    """samples.jsonl rows of the first --log_samples_per_kind rollouts of each kind: fresh ones with
    their reward columns, replayed ones with their importance weight. One entry per rollout
    (`rewards`, `is_replay`: [groups, K])."""
    rewards, is_replay = rewards.view(-1), is_replay.flatten()
    kinds = ["replayed" if replay else "fresh" for replay in is_replay.tolist()]
    rows = []
    for i in first_of_each_kind(kinds, args.log_samples_per_kind):
        replayed = bool(is_replay[i])
        row = {
            "kind": kinds[i],
            "prompt": tokenizer.decode(prompts[i]),
            "completion": tokenizer.decode(completions[i]),
            "reward": rewards[i].item(),
            "advantage": advantages[i].item(),
            "truncated": bool(truncated[i]) and not replayed,
        }
        if replayed:
            row["is_weight"] = is_weights[i].item()
        else:
            row.update(scored.columns(i))
        rows.append(row)
    return rows


def ra_rloo_metrics(totals: dict, buffers: dict[int, deque]) -> dict:
    """[RA-RLOO] (also in RLOO, as its reference) the mechanism's figures, from the step's sums
    over ranks (docs/ra_rloo.md)."""
    groups = max(1.0, totals["groups"])
    return {
        "ra_zero_var_frac_post": totals["zero_var_groups_post"] / groups,
        "ra_replay_fired_frac": totals["replay_fired_groups"] / groups,
        # the paper's degenerate groups (no success); all-pass groups are zero-variance too but
        # never spliced
        "ra_no_success_frac_post": totals["no_success_groups_post"] / groups,
        "ra_is_weight_mean": totals["w_sum"] / totals["w_n"] if totals["w_n"] else None,
        "ra_buffer_prompts": sum(1 for buffer in buffers.values() if buffer),
    }


def main(args: Args) -> None:
    # ---------------- set-up: the launch, policy, reference, optimizer, generator ----------------
    # [RA-RLOO setup] the paper trains on {0, 0.1, 1}; a real dataset's verifier is binary
    if args.reward == "auto":
        args.reward = "tinyzero" if args.dataset_name == "countdown" else "binary"
    accelerator, cpu_threads, log = start_run(args, "ra_rloo")
    device = accelerator.device
    policy, tokenizer, model_path = load_training_policy(args, accelerator, log)
    # the embedded Countdown task or a dataset; --reward_funcs: yours (docs/custom_task.md)
    task = make_task(args, tokenizer, log)
    ref_model = make_reference(policy, args)
    policy, ref_model = shard_models(args, policy, ref_model)
    optimizer, scheduler = make_optimizer(policy, args)
    # `model` is what backward runs through (DDP-wrapped); `policy` is the module itself
    model, optimizer = prepare_training(accelerator, policy, optimizer, args.fsdp)
    encode = PromptEncoder(tokenizer, task.templated)
    sampler = PromptSampler(len(task.train), args.seed)
    compiled = make_compiled(args, log)
    generator = make_generator(args, model_path, policy, tokenizer, accelerator, compiled, log)
    sampling, eval_sampling = sampling_configs(args)
    # every log-prob is taken under the sampling distribution logits / T (greedy samples: T = 1)
    temperature = args.temperature if args.temperature > 0 else 1.0
    pack = packed_row_tokens(args, device)
    # [RA-RLOO setup] the paper's own report: pass@4 of n = 8 at T 0.6, top-p 0.95, top-k 20
    paper_sampling = SamplingConfig(
        max_new_tokens=args.max_completion_length,
        temperature=args.paper_eval_temperature,
        top_p=args.paper_eval_top_p,
        top_k=args.paper_eval_top_k,
        logprobs=False,
    )

    def run_eval() -> dict:
        torch.set_num_threads(cpu_threads.count(torch.get_num_threads()))
        # FSDP with HF generate: whole weights while sampling (otherwise a no-op)
        with gathered(policy, enabled=generator.reads_policy):
            out = evaluate_policy(
                generator, tokenizer, task, encode, eval_sampling, args, accelerator
            )
            # [RA-RLOO setup]
            if args.paper_eval_samples:
                paper = evaluate(
                    generator,
                    tokenizer,
                    task.eval,
                    encode,
                    task.eval_success,
                    paper_sampling,
                    args.paper_eval_samples,
                    accelerator,
                    ks=(1, 4),
                )
                out.update({key.replace("eval_", "eval_paper_"): val for key, val in paper.items()})
        return out

    # ---------------- resume, replay buffers, logs, step-0 evaluation ----------------
    checkpoints = Checkpoints(args, accelerator, model, tokenizer, optimizer, scheduler, log)
    start_step, saved = checkpoints.resume(sampler, generator, policy)
    counters = saved["counters"] if saved else {"rollouts": 0, "gen_tokens": 0}
    # [RA-RLOO] (also in RLOO: empty) prompt id -> FIFO of (int32 response, log pi_old(y|x),
    # reward), the same on every rank
    buffers = restore_buffers(saved["method"]["buffers"] if saved else {}, args.buffer_capacity)
    # [RA-RLOO] demonstrations; under FSDP whole weights only where they are scored (the embedded
    # task: real datasets seed nothing)
    if start_step == 0 and args.replay != "none" and args.seed_buffer:
        with autocast(device, args.dtype), gathered(policy, enabled=task.name == "countdown"):
            buffers = seed_buffers(task, policy, tokenizer, encode, args, device, temperature)
        log(f"[RA-RLOO] seeded {len(buffers)} prompt buffers with demonstrations")

    run_log = RunLog(args, accelerator, "ra_rloo", start_step, saved is not None, log)
    # Ctrl-C / SIGTERM from here on: the run stops after its step, with a checkpoint
    stop = GracefulStop(log)
    if start_step == 0:
        run_log.first_row(run_eval(), compiled)
    k = args.num_generations
    forward = Forward(tokenizer.pad_token_id, device, args.dtype, temperature, pack, compiled)
    # one constant normaliser, samples x max tokens over all ranks: no length bias
    normaliser = rloo_normaliser(
        args.prompts_per_step, k, accelerator.num_processes, args.max_completion_length
    )

    # sampler correction (TRL's vllm_importance_sampling_*, on by default with vLLM): (trainer
    # log-probs, sampler log-probs, known tokens) -> (weights, sums); the module loads only then
    correct_sampler = None
    if args.vllm_importance_sampling_correction:
        from common.rl.sampler_correction import sampler_is_weights

        correct_sampler = partial(
            sampler_is_weights,
            mode=args.vllm_importance_sampling_mode,
            clip_min=args.vllm_importance_sampling_clip_min,
            clip_max=args.vllm_importance_sampling_clip_max,
        )

    for step in range(start_step + 1, args.max_steps + 1):
        # a shared CPU: torch's threads fit the cores other processes leave free (--num_threads)
        run_log.start_step(cpu_threads)

        # ================ sample: K rollouts for each of this rank's prompts ================
        with run_log.timing("gen"):
            # strided: rank r takes every world-th prompt of the step
            prompt_ids = my_slice(sampler.next_ids(args.prompts_per_step), accelerator)
            examples = [task.train[i] for i in prompt_ids]
            prompts = [encode(example.prompt) for example in examples]
            with gathered(policy, enabled=generator.reads_policy):
                gens = generator.generate(prompts, k, sampling)
            # vLLM on a GPU: its memory goes to training; the weight push brings it back
            generator.sleep()
        completions = [list(completion) for completion in gens.completion_ids]

        # ================ verify: cut completions get 0 from the built-in rewards ================
        with run_log.timing("reward"):
            texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in completions]
            truncated = torch.tensor([reason == "length" for reason in gens.finish_reasons])
            prompt_of = [examples[i // k] for i in range(len(texts))]
            scored = task.score(texts, prompt_of, completions, truncated, step)
        # NaN: no reward function scored the completion
        fresh_rewards = torch.tensor(scored.total).view(-1, k).float()  # [groups, K]
        fresh_success = torch.tensor(scored.success, dtype=torch.bool).view(-1, k)  # [groups, K]

        # ================ [RA-RLOO] splice a stored success into groups that need one (Sec. 3.1)
        # [RA-RLOO] (also in RLOO: the fresh rewards, NaN everywhere, no replay)
        rewards = fresh_rewards.clone()
        replay_logp_old = torch.full(rewards.shape, float("nan"))
        # [RA-RLOO]
        if args.replay != "none":
            group_prompt_ids = [example.id for example in examples]
            replay_logp_old = splice_replays(
                group_prompt_ids, completions, rewards, fresh_success, buffers, args.replay, random
            )

        is_replay = ~torch.isnan(replay_logp_old)
        # --mask_truncated_completions: cut completions get no gradient (a replay is a whole
        # success)
        keep = torch.ones(len(texts), dtype=torch.bool)
        if args.mask_truncated_completions:
            keep = ~(truncated & ~is_replay.flatten())

        # ================ advantages: leave-one-out baseline on the (possibly mixed) group, eq. (1)
        advantages = rloo_advantages(rewards).flatten().to(device)
        replay_logp_old = replay_logp_old.flatten().to(device)
        keep = keep.to(device)

        # ================ update: REINFORCE with the LOO baseline + k3 KL to the reference ========
        with run_log.timing("update"):
            flat_prompts = [prompt for prompt in prompts for _ in range(k)]
            # [RA-RLOO] (also in RLOO: all 1) each row's importance weight, for the sample log
            is_weights = torch.ones(len(completions), device=device)
            # the generator's log-probs of the fresh rollouts (a replay has none)
            fresh_logprobs = zip(is_replay.flatten().tolist(), gens.logprobs)
            sampler_logprobs = [[] if replay else lps for replay, lps in fresh_logprobs]
            lengths = [len(prompt) + len(ids) for prompt, ids in zip(flat_prompts, completions)]
            max_rows, max_tokens = args.micro_batch_size, args.max_tokens_per_microbatch
            micro = micro_batches(
                len(completions), max_rows, accelerator, model, (ref_model,), lengths, max_tokens
            )
            update_sums = []
            for rows in micro:
                mb = forward.rows_at(rows, flat_prompts, completions, sampler_logprobs)
                logp, entropy = forward(model, mb)
                mask = mb.loss_mask * keep[rows][:, None]  # [rows, width]
                seq_logp = (logp * mask).sum(-1)  # [rows]
                is_replay_rows = is_replay.view(-1)[rows].to(device)
                # [RA-RLOO] (also in RLOO: `adv` unchanged) the replayed slot's advantage x w
                adv, weight = weigh_replays(
                    advantages[rows], is_replay_rows, seq_logp, replay_logp_old[rows], args.w_max
                )
                is_weights[rows] = torch.where(is_replay_rows, weight, torch.ones_like(weight))
                # the trained fresh rollouts' tokens, whose generator log-probs are known (not a
                # replay's, nor a row --mask_truncated_completions drops)
                fresh_mask = mask * (~is_replay_rows)[:, None]
                # sampler correction: x rho = pi_trainer / pi_sampler per token (this pass is the
                # first: the weights that sampled); a replayed row has its own clipped w above and
                # gets rho = 1
                sampler_weight, is_sums = 1.0, {}
                if correct_sampler:
                    sampler_weight, is_sums = correct_sampler(logp, mb.sampler_logp, fresh_mask)
                pg_sum = -(adv * (logp * mask * sampler_weight).sum(-1)).sum()
                kl_sum = 0.0
                if ref_model is not None:
                    ref_logp, _ = forward(ref_model, mb, grad=False)
                    kl_sum = (kl_k3(logp, ref_logp) * mask).sum()
                accelerator.backward(rloo_loss(pg_sum, kl_sum, args.beta, normaliser))
                # sampler/trainer agreement on fresh rollouts, before any update (this pass is
                # the first)
                gap = (logp.detach() - mb.sampler_logp).abs() * fresh_mask
                # logged `loss`: -A log pi(y|x) per sequence, the KL excluded
                mb_sums = dict(loss_sum=pg_sum, kl_sum=kl_sum, ent_sum=(entropy * mask).sum())
                mb_sums |= dict(tok=mask.sum(), gap_sum=gap.sum(), gap_tok=fresh_mask.sum())
                # [RA-RLOO] (also in RLOO: 0, no replay) the replays' importance weights
                replay_weight = torch.where(is_replay_rows, weight, 0.0)
                mb_sums |= dict(w_sum=replay_weight.sum(), w_n=is_replay_rows.sum())
                update_sums.append(mb_sums | is_sums)
            grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)

        # ================ push the new weights to the generator (a no-op for HF generate) =========
        generator.sync_weights(policy)

        # ================ [RA-RLOO] append each fresh success to its prompt's FIFO ================
        # [RA-RLOO]
        if args.replay != "none":
            keep_successes(buffers, examples, gens, fresh_success, scored, args, accelerator)

        # ================ metrics: the step's sums over ranks, the shared keys, the method's ======
        sums = ra_rloo_sums(fresh_rewards, rewards, fresh_success, is_replay, truncated, gens)
        lr, norms = scheduler.get_last_lr()[0], [grad_norm]
        row, totals = run_log.step_metrics(step, counters, scored, sums, update_sums, norms, lr)
        row |= ra_rloo_metrics(totals, buffers)

        # ================ evaluation, sample log, the row, checkpoint, stop ================
        if run_log.evaluation_due(step):
            with run_log.timing("eval"):
                row.update(run_eval())
        if run_log.samples_due(step):
            rollouts = flat_prompts, completions, rewards, advantages, truncated, scored
            run_log.write_samples(
                step, sample_rows(*rollouts, is_replay, is_weights, tokenizer, args)
            )
        run_log.write_row(row, compiled)
        stopping = stop.any_rank_signalled(accelerator)
        if checkpoints.due(step, stopping):
            # [RA-RLOO] (also in RLOO: empty) the buffers
            method_state = {"buffers": buffers}
            state = {"sampler": sampler.state_dict(), "counters": counters, "method": method_state}
            checkpoints.save(step, state, stopping)
        if stopping:
            break

    run_log.close()
    export_model(args, accelerator, policy, tokenizer, generator.end_ids, "ra_rloo", __doc__)
    # trackers finish and the process group ends now, not at exit: no hang, no abort
    end_processes(accelerator)
    stop.close()
    mechanism = ["ra_zero_var_frac_post", "ra_replay_fired_frac", "ra_is_weight_mean"]
    log(run_summary(args.output_dir, mechanism))


if __name__ == "__main__":
    args = parse_args(Args, description=__doc__.split("\n\n")[0])
    raise SystemExit(main(args) or GracefulStop.exit_status())
