"""Reinforce-Ada-Est: per-prompt pass-rate estimates decide how many responses each prompt gets.
One file.

Paper: Xiong, Ye, Liao, Dong, Xu, Monz, Bian, Jiang, Zhang, "Reinforce-Ada: An Adaptive Sampling
Framework under Non-linear RL Objectives" (preprint; code: RLHFlow/Reinforce-Ada), Sec. 3.1 and Alg.
1. Docs: docs/ada_est.md.

Optimising the log-objective E_x[log p(x)] weights each prompt's gradient by 1/p(x) (Sec. 2.2). The
hybrid realisation puts 1/sqrt(p) into the sampling budget and the other 1/sqrt(p) into the
advantage:
  1. before sampling, every prompt of the batch gets N_x responses, N_x ∝ w(p_hat_x), clipped to
     [n_min, n_max], summing exactly to `total_budget` (Alg. 1 line 5); p_hat_x is a discounted
     Beta-prior estimate from the prompt's earlier visits (stable prompt ids across steps and
     epochs);
  2. all N_x responses are trained on, with A_i = (r_i - mean_x) * alpha_x, alpha_x = 1/sqrt(mean_x
     + eps) (Alg. 1 lines 14-16), in a GRPO-style clipped policy gradient;
  3. after the step the estimator absorbs the new counts: N_total <- lam*N_total + n_t, N_pos <-
     lam*N_pos + k_t.
The estimator only helps when prompts recur, so the default trains on a fixed pool of `prompt_pool`
prompts for several epochs. Lines marked [EST] are what the paper adds to plain GRPO.

Choices made here: the allocation is computed for the whole global batch on every rank (the
estimator state is identical everywhere), then each rank samples its slice; integer budgets come
from bisection on the proportionality constant plus largest-remainder rounding (see
`allocate_budget`). Token losses are summed over ALL responses and divided by a constant
(total_budget x max_completion_length), so a prompt's weight in the update grows with its N_x (the
sampling half of the weight). k_t counts responses with reward > positive_threshold (or >=
--success_reward); a cut response scores 0 under the built-in rewards, its functions' total under
--reward_funcs. pi_old is the sampling policy; one optimizer step per batch by default. Logged
`loss`: that surrogate divided by (responses x max_completion_length), as optimised; the optimised
loss also subtracts the entropy bonus (entropy_coef x summed token entropy over the same constant;
the paper's set-up uses 1e-4, the authors' run script 0) and adds beta x the k3 KL summed over the
same tokens and divided by the same constant (one normaliser; `kl` logs it per trained token). The
advantage is Alg. 1 line 16's (r - mean_x) x alpha_x, with no std division (the residual weight
alpha_x is the prompt's scale); its baseline is GRPO-n8 (`ada_seq.py --max_rounds 1 --round_repeat 8
--num_generations 8`, eq. 2), the same inference budget.

    python ada_est.py                       # hybrid 1/sqrt(p) on 2048 recurring Countdown prompts
    python ada_est.py --weighting implicit  # N_x ∝ 1/p, no residual weight (App. C.2 ablation)
    accelerate launch ada_est.py --model_name_or_path Qwen/Qwen2.5-Math-1.5B \
        --dataset_name openai/gsm8k --dataset_config main --prompt_pool 2048 --use_vllm \
        --dtype bfloat16 --learning_rate 1e-6
"""

from __future__ import annotations

import math
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
from common.rl.ada import (
    count_positive,
    success_threshold,
    trained_advantage_metrics,
    uses_sampler_logprobs,
)
from common.rl.logprobs import Forward
from common.rl.losses import clipped_surrogate, kl_k3
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
from common.tasks.evaluation import evaluate_policy
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
    # TRL's names for what this file does: a constant normaliser, no std scaling
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
    prompt_pool: Annotated[int, Range(0, zero="all")] = 2048
    """[EST] train on only the first N prompts so that they recur and the estimates have history (at
    32 prompts per step a prompt of the 2048 returns every 64 steps)"""
    warmup_steps: Annotated[int, Range(0)] = 10
    """linear warm-up steps, then constant (the Reinforce-Ada paper's set-up, Sec. 4: a 10-step
    warm-up)"""
    total_budget: Annotated[int, Range(0, zero="8 x prompts_per_step")] = 0
    """[EST] responses per step over the whole batch, N_total of Alg. 1 (8 x prompts_per_step is the
    paper's setting, comparable with GRPO-n8)"""
    n_min: Annotated[int, Range(1)] = 2
    """[EST] fewest responses any prompt gets (2: a single response has no group baseline)"""
    n_max: Annotated[int, Range(1)] = 32
    """[EST] most responses any prompt gets (the paper's N_max for its sequential variant)"""
    weighting: Literal["hybrid", "implicit"] = "hybrid"
    """[EST] `hybrid`: N_x ∝ 1/sqrt(p_hat+eps) and residual weight 1/sqrt(mean_x+eps) (the paper's
    main choice); `implicit`: N_x ∝ 1/(p_hat+eps), no residual weight"""
    lam: Annotated[float, Range(0, 1, lo_open=True)] = 0.9
    """[EST] discount lambda of the per-prompt counts at every visit (the public code's 0.9)"""
    prior_alpha: Annotated[float, Range(0, lo_open=True)] = 1.0
    """[EST] Beta prior alpha: p_hat = (N_pos + alpha) / (N_total + alpha + beta) (public
    code: 1)"""
    prior_beta: Annotated[float, Range(0)] = 16.0
    """[EST] Beta prior beta (public code: 16; an unseen prompt starts at p_hat = 1/17, i.e. treated
    as hard)"""
    eps: Annotated[float, Range(0, lo_open=True)] = 0.01
    """[EST] epsilon in w(p_hat) and in the residual weight 1/sqrt(mean_x + eps) (bounds the weight
    of all-fail groups)"""
    positive_threshold: Annotated[float, Range(None, 1, hi_open=True)] = 0.7
    """[EST] a response counts as a success k_t for the estimator when its training reward (in
    [0, 1]) > this"""
    epsilon: Annotated[float, Range(0, 1, hi_open=True)] = 0.2
    """lower clip range of the ratio pi_theta/pi_old (clip-higher setup of the paper:
    [0.2, 0.28])"""
    epsilon_high: Annotated[float, Range(0)] = 0.28
    """upper clip range of the ratio pi_theta/pi_old"""
    num_iterations: Annotated[int, Range(1)] = 1
    """optimizer steps per batch (each a full pass over all responses); with 1 the ratio is 1 and
    clipping is inactive"""
    beta: Annotated[float, Range(0, zero="off, no reference model")] = 0.0
    """KL coefficient to the reference (initial) policy: the k3 estimator summed over the trained
    tokens, divided by the policy gradient's constant (responses x max_completion_length); the paper
    uses none"""
    entropy_coef: Annotated[float, Range(0, zero="off")] = 1e-4
    """entropy bonus: entropy_coef x token entropy is subtracted from the loss (the paper's set-up:
    1e-4)"""
    old_logprobs: Literal["auto", "sampler"] = "auto"
    """where pi_old's log-probs come from: `auto` = the update's own first forward pass when that is
    exact (HF backend, one epoch: the weights that sampled are the weights being updated), else the
    sampler; `sampler` = always the generator's log-probs (an extra scoring pass with the HF
    backend). With the sampler correction on (--vllm_importance_sampling_correction, the default
    with vLLM) pi_old is the trainer's epoch-0 pass and the sampler's log-probs enter through its
    ratio"""

    def budget(self) -> int:
        return self.total_budget or 8 * self.prompts_per_step

    def validate(self) -> None:
        """Combinations of flags (single values: their declarations, common/run/flags.py)."""
        problems = []
        p, b = self.prompts_per_step, self.budget()
        if self.n_min > self.n_max:
            problems.append(f"--n_min {self.n_min} / --n_max {self.n_max}: need n_min <= n_max")
        # (with n_min > n_max no budget fits: that one line says why)
        elif not self.n_min * p <= b <= self.n_max * p:
            problems.append(
                f"--total_budget {b}: must lie in [n_min * prompts_per_step, n_max * "
                f"prompts_per_step] = [{self.n_min * p}, {self.n_max * p}]"
            )
        if problems:
            raise SystemExit("\n".join(problems))


def zero_variance_lists(groups: list[list[float]]) -> int:
    """Groups whose rated responses all got the same reward (NaN: no reward, left out)."""
    rated = [[r for r in g if not math.isnan(r)] for g in groups]
    return sum(not g or max(g) - min(g) <= 1e-9 for g in rated)


def estimate(counts: Optional[tuple[float, float]], alpha: float, beta: float) -> float:
    """[EST] p_hat = (N_pos + alpha) / (N_total + alpha + beta) (Sec. 3.1); no history -> the prior
    mean."""
    n_total, n_pos = counts or (0.0, 0.0)
    return (n_pos + alpha) / (n_total + alpha + beta)


def update_counts(
    counts: Optional[tuple[float, float]], n_t: int, k_t: int, lam: float
) -> tuple[float, float]:
    """[EST] N_total <- lam*N_total + n_t, N_pos <- lam*N_pos + k_t (Sec. 3.1): stale visits fade
    out."""
    n_total, n_pos = counts or (0.0, 0.0)
    return lam * n_total + n_t, lam * n_pos + k_t


def allocation_weights(p_hats: list[float], mode: str, eps: float) -> list[float]:
    """[EST] w(p_hat): 1/sqrt(p_hat + eps) (hybrid, Alg. 1 line 5) or 1/(p_hat + eps) (implicit,
    Sec. 2.2)."""
    if mode == "hybrid":
        return [1.0 / math.sqrt(p + eps) for p in p_hats]
    return [1.0 / (p + eps) for p in p_hats]


def allocate_budget(weights: list[float], total: int, n_min: int, n_max: int) -> list[int]:
    """[EST] Integer N_x ∝ weights, each in [n_min, n_max], summing exactly to `total` (Alg. 1
    line 5).

    The real-valued allocation clip(c * w_x, n_min, n_max) is found by bisection on the scale c (its
    sum grows continuously in c); it is then floored, and the missing units go one each to the
    prompts with the largest fractional parts (largest-remainder rounding; ties to the earlier
    prompt), never above n_max.
    """
    k = len(weights)
    if k == 0:
        return []
    if not n_min * k <= total <= n_max * k:
        raise ValueError(
            f"budget {total} cannot be split over {k} prompts within [{n_min}, {n_max}]"
        )
    if min(weights) <= 0:
        raise ValueError("allocation weights must be positive")

    def clipped(c: float) -> list[float]:
        return [min(float(n_max), max(float(n_min), c * w)) for w in weights]

    lo, hi = 0.0, n_max / min(weights)  # at hi every prompt is at n_max
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(clipped(mid)) < total else (lo, mid)
    real = clipped(hi)
    alloc = [min(n_max, math.floor(x + 1e-9)) for x in real]
    order = sorted(range(k), key=lambda i: (-(real[i] - alloc[i]), i))
    while sum(alloc) < total:
        for i in order:
            if sum(alloc) < total and alloc[i] < n_max:
                alloc[i] += 1
    while sum(alloc) > total:  # only from float slack; take back from the smallest remainders
        for i in reversed(order):
            if sum(alloc) > total and alloc[i] > n_min:
                alloc[i] -= 1
    return alloc


def est_advantages(
    rewards: list[float], mode: str, eps: float, threshold: float = 0.7
) -> tuple[list[float], float]:
    """[EST] A_i = (r_i - mean_x) * alpha_x over all of the prompt's responses this step (Alg. 1
    lines 14-16); alpha_x = 1/sqrt(p_x + eps) (hybrid: the residual half of the 1/p weight) or 1
    (implicit). p_x is the step's pass rate, the share of responses with reward > `threshold` (the
    success rule; = mean_x for 0/1 rewards), so a reward of any sign or scale gives a finite weight.
    A NaN reward (no function scored it) is left out of mean_x and p_x and gets A = 0."""
    rated = [r for r in rewards if not math.isnan(r)]
    if not rated:
        return [0.0] * len(rewards), 1.0
    mean = sum(rated) / len(rated)
    alpha = 1.0
    if mode == "hybrid":
        pass_rate = count_positive(rated, threshold) / len(rated)
        alpha = 1.0 / math.sqrt(pass_rate + eps)
    advantages = [0.0 if math.isnan(r) else (r - mean) * alpha for r in rewards]
    return advantages, alpha


def est_normaliser(total_budget: int, world: int, max_completion_length: int) -> float:
    """The loss's one constant on each rank: the step's responses (the total budget) / world (DDP
    and FSDP average the ranks' gradients) x max_completion_length, so no length bias."""
    return total_budget / world * max_completion_length


def est_loss(
    surrogate_sum: torch.Tensor,
    entropy_sum: torch.Tensor,
    kl_sum: torch.Tensor | float,
    entropy_coef: float,
    beta: float,
    normaliser: float,
) -> torch.Tensor:
    """The optimised loss: the clipped surrogate's sum less entropy_coef x the entropy's, plus beta
    x the k3 KL's, all over the same tokens and divided by one constant (`est_normaliser`)."""
    loss = (surrogate_sum - entropy_coef * entropy_sum) / normaliser
    return loss + beta * kl_sum / normaliser


def update_estimator(counts, examples, groups, threshold, lam, accelerator) -> list[tuple]:
    """[EST] Add this step's trials and successes to each prompt's Beta counts (Alg. 1 line 19),
    every rank the same. Returns the global batch's visits, per prompt: its id, trials n_t (the
    responses given a reward: NaN, none from any function, is left out) and successes k_t."""
    my_visits = []
    for example, group_rewards in zip(examples, groups):
        n_t = sum(not math.isnan(reward) for reward in group_rewards)
        k_t = count_positive(group_rewards, threshold)
        my_visits.append((example.id, n_t, k_t))
    visits = gather_list(accelerator, my_visits)
    # in global batch order, so that every rank applies the same updates
    for prompt_id, n_t, k_t in visits:
        counts[prompt_id] = update_counts(counts.get(prompt_id), n_t, k_t, lam)
    return visits


def ada_est_sums(groups, scored, truncated, completions, alphas, threshold) -> dict:
    """The step's sums: the responses' (`rollout_sums`; a NaN reward is out of reward_mean / _std),
    the responses trained on (`seqs`, the loss's divisor) and [EST] the residual weights; the clip
    count starts at 0 (the update adds it)."""
    success, zero_var = count_positive(scored.total, threshold), zero_variance_lists(groups)
    rollouts = rollout_sums(
        len(groups), scored.total, success, zero_var, truncated.sum(), completions
    )
    return rollouts | {"seqs": len(completions), "alpha_sum": sum(alphas), "clip_sum": 0.0}


def sample_rows(
    tokenizer, flat_prompts, completions, scored, advantages, truncated, budgets, p_hats, args
) -> list[dict]:
    """samples.jsonl rows of the first --log_samples_per_kind responses, with their prompt's budget
    N_x and estimate p_hat."""
    rows = []
    for g in first_of_each_kind(["fresh"] * len(completions), args.log_samples_per_kind):
        row = {
            "kind": "fresh",
            "prompt": tokenizer.decode(flat_prompts[g]),
            "completion": tokenizer.decode(completions[g]),
            "reward": scored.total[g],
            "advantage": advantages[g].item(),
            "truncated": bool(truncated[g]),
            "ada_budget": budgets[g],
            "ada_p_hat": p_hats[g],
            **scored.columns(g),
        }
        rows.append(row)
    return rows


def ada_est_metrics(
    totals: dict,
    accelerator,
    trained_records: list,
    p_hats: list[float],
    had_history: list[bool],
    allocation: list[int],
    visits: list[tuple],
    counts: dict,
) -> dict:
    """[EST] the mechanism's figures, from the step's sums over ranks and the global batch's
    estimates, allocation and visits (the same on every rank); each trained response's (advantage,
    tag) is gathered from all ranks (names: docs/ada_est.md)."""
    # |p_hat - the step's pass rate| of the prompts the estimator had seen before
    calibration = []
    for (_, n_t, k_t), p_hat, seen in zip(visits, p_hats, had_history):
        if seen and n_t:
            calibration.append(abs(p_hat - k_t / n_t))
    return {
        "est_p_hat_mean": sum(p_hats) / len(p_hats),
        "est_calibration_error": sum(calibration) / len(calibration) if calibration else None,
        "est_frac_prompts_with_history": sum(had_history) / len(had_history),
        "est_alloc_min": min(allocation),
        "est_alloc_mean": sum(allocation) / len(allocation),
        "est_alloc_max": max(allocation),
        "est_samples_step": sum(allocation),
        "est_residual_weight_mean": totals["alpha_sum"] / max(1.0, totals["groups"]),
        "est_prompts_tracked": len(counts),
        "est_clip_frac": totals["clip_sum"] / max(1.0, totals["tok"]),
        # [ADA] every response trains: their mean advantage per level
        **trained_advantage_metrics(gather_list(accelerator, trained_records)),
    }


def main(args: Args) -> None:
    # ---------------- set-up: the launch, policy, reference, optimizer, generator ----------------
    accelerator, cpu_threads, log = start_run(args, "ada_est")
    device = accelerator.device
    policy, tokenizer, model_path = load_training_policy(args, accelerator, log)
    # Countdown or a dataset; --reward_funcs: yours (docs/custom_task.md)
    # [ADA] a success: a reward above --positive_threshold (unless --success_reward)
    task = make_task(args, tokenizer, log, args.positive_threshold)
    ref_model = make_reference(policy, args)
    policy, ref_model = shard_models(args, policy, ref_model)
    optimizer, scheduler = make_optimizer(policy, args)
    # `model`: DDP-wrapped for the backward pass
    model, optimizer = prepare_training(accelerator, policy, optimizer, args.fsdp)
    encode = PromptEncoder(tokenizer, task.templated)
    sampler = PromptSampler(len(task.train), args.seed)
    compiled = make_compiled(args, log)
    generator = make_generator(args, model_path, policy, tokenizer, accelerator, compiled, log)
    # pi_old's log-probs from the sampler only where the update's own first pass differs
    # the sampler correction reads the generator's log-probs (with HF generate too, when asked)
    sampler_logprobs = uses_sampler_logprobs(args) or args.vllm_importance_sampling_correction
    sampling, eval_sampling = sampling_configs(args, logprobs=sampler_logprobs)
    # greedy samples are scored at T = 1
    temperature = args.temperature if args.temperature > 0 else 1.0
    pack = packed_row_tokens(args, device)

    def run_eval() -> dict:
        # a shared CPU: fit the free cores; FSDP + HF generate: whole weights
        torch.set_num_threads(cpu_threads.count(torch.get_num_threads()))
        with gathered(policy, enabled=generator.reads_policy):
            return evaluate_policy(
                generator,
                tokenizer,
                task,
                encode,
                eval_sampling,
                args,
                accelerator,
                train_prompts_first=True,
            )

    # ---------------- resume, the estimates, logs, step-0 evaluation ----------------
    checkpoints = Checkpoints(args, accelerator, model, tokenizer, optimizer, scheduler, log)
    start_step, saved = checkpoints.resume(sampler, generator, policy)
    counters = saved["counters"] if saved else {"rollouts": 0, "gen_tokens": 0}
    # [EST] prompt id (Example.id) -> discounted (N_total, N_pos); identical on every rank,
    # checkpointed
    counts: dict[int, tuple[float, float]] = {}
    if saved:
        saved_counts = saved["method"]["counts"]
        counts = {prompt_id: tuple(value) for prompt_id, value in saved_counts.items()}
    run_log = RunLog(args, accelerator, "ada_est", start_step, saved is not None, log)
    # Ctrl-C / SIGTERM from here on: the run stops after its step, with a checkpoint
    stop = GracefulStop(log)
    if start_step == 0:
        run_log.first_row(run_eval(), compiled)
    threshold = success_threshold(args)
    total_budget = args.budget()
    # one constant normaliser, the global sample count / world (DDP averages) x
    # --max_completion_length: no length bias
    normaliser = est_normaliser(total_budget, accelerator.num_processes, args.max_completion_length)

    forward = Forward(tokenizer.pad_token_id, device, args.dtype, temperature, pack, compiled)

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
        # the global batch: every rank allocates all of it
        batch_ids = sampler.next_ids(args.prompts_per_step)

        # ===== [EST] allocate the budget from the estimates made before this step (Alg. 1 l. 4-5)
        p_hats = [
            estimate(counts.get(prompt_id), args.prior_alpha, args.prior_beta)
            for prompt_id in batch_ids
        ]
        had_history = [prompt_id in counts for prompt_id in batch_ids]
        weights = allocation_weights(p_hats, args.weighting, args.eps)
        allocation = allocate_budget(weights, total_budget, args.n_min, args.n_max)
        mine = my_slice(list(range(len(batch_ids))), accelerator)
        examples = [task.train[batch_ids[j]] for j in mine]
        sizes = [allocation[j] for j in mine]
        prompts = [encode(example.prompt) for example in examples]

        # ======== sample N_x responses per prompt (one generate call: prompt x repeated N_x times)
        flat_prompts = [prompt for prompt, size in zip(prompts, sizes) for _ in range(size)]
        # each response's prompt: its index in this rank's slice
        owner = [i for i, size in enumerate(sizes) for _ in range(size)]
        with run_log.timing("gen"):
            # FSDP + HF generate: whole weights
            with gathered(policy, enabled=generator.reads_policy):
                gens = generator.generate(flat_prompts, 1, sampling)
            # vLLM on a GPU: its memory goes to training; the push brings the weights back
            generator.sleep()
        completions = [list(completion) for completion in gens.completion_ids]

        # ======== verify: a cut completion gets 0 from the built-in rewards, its total from yours
        truncated = torch.tensor([reason == "length" for reason in gens.finish_reasons])
        with run_log.timing("reward"):
            texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in completions]
            prompt_of = [examples[i] for i in owner]
            scored = task.score(texts, prompt_of, completions, truncated, step)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        groups = [scored.total[start : start + size] for start, size in zip(starts, sizes)]

        # ======== [EST] advantages from each prompt's own step mean, x the residual weight alpha_x
        adv_list = []
        alphas = []
        for group_rewards in groups:
            group_adv, alpha = est_advantages(group_rewards, args.weighting, args.eps, threshold)
            adv_list += group_adv
            alphas.append(alpha)
        trained_records = list(zip(adv_list, [examples[i].tag for i in owner]))
        advantages = torch.tensor(adv_list, dtype=torch.float32, device=device)
        # --mask_truncated_completions: cut completions get no gradient
        keep = ~truncated if args.mask_truncated_completions else torch.ones_like(truncated)
        keep = keep.to(device)

        # ======== update: GRPO-style clipped surrogate on ALL responses; pi_old = the sampler
        with run_log.timing("update"):
            lengths = [len(prompt) + len(ids) for prompt, ids in zip(flat_prompts, completions)]
            old_logprobs = gens.logprobs if sampler_logprobs else None
            max_rows, max_tokens = args.micro_batch_size, args.max_tokens_per_microbatch
            update_sums, grad_norms = [], []
            # sampler correction: each micro-batch's (pi_old, rho, sums) from epoch 0, by first row
            epoch0 = {}
            for epoch in range(args.num_iterations):
                micro = micro_batches(
                    len(completions),
                    max_rows,
                    accelerator,
                    model,
                    (ref_model,),
                    lengths,
                    max_tokens,
                )
                for rows in micro:
                    mb = forward.rows_at(rows, flat_prompts, completions, old_logprobs)
                    # the entropy bonus of the paper's set-up (Sec. 4) needs its gradient
                    logp, entropy = forward(model, mb, entropy_grad=args.entropy_coef > 0)
                    mask = mb.loss_mask * keep[rows][:, None]
                    # one epoch with the HF weights: pi_old is this very pass (exact, ratio 1)
                    old_logp = mb.sampler_logp if sampler_logprobs else logp.detach()
                    # sampler correction: pi_old is the trainer's epoch-0 pass (the weights that
                    # sampled), kept for later epochs with rho = pi_old / pi_sampler per token;
                    # TRL's rule: rho multiplies the clipped surrogate
                    if correct_sampler and epoch == 0:
                        weights_and_sums = correct_sampler(logp, mb.sampler_logp, mask)
                        epoch0[rows[0]] = (logp.detach(), *weights_and_sums)
                    old_logp, sampler_weight, is_sums = epoch0.get(rows[0], (old_logp, 1.0, {}))
                    per_token, clipped = clipped_surrogate(
                        logp, old_logp, advantages[rows, None], args.epsilon, args.epsilon_high
                    )
                    surrogate_sum = (per_token * sampler_weight * mask).sum()
                    entropy_sum = (entropy * mask).sum()
                    kl_sum = 0.0
                    if ref_model is not None:
                        ref_logp, _ = forward(ref_model, mb, grad=False)
                        kl_sum = (kl_k3(logp, ref_logp) * mask).sum()
                    # one constant for the policy gradient, the entropy and the KL
                    loss = est_loss(
                        surrogate_sum, entropy_sum, kl_sum, args.entropy_coef, args.beta, normaliser
                    )
                    accelerator.backward(loss)
                    # the on-policy epoch's numbers are the ones logged; `loss`: the surrogate /
                    # (responses x max_completion_length), in float64 as the sum is kept
                    if epoch == 0:
                        loss_sum = surrogate_sum.detach().double() / args.max_completion_length
                        mb_sums = dict(loss_sum=loss_sum, ent_sum=entropy_sum, tok=mask.sum())
                        mb_sums |= dict(clip_sum=(clipped * mask).sum(), kl_sum=kl_sum)
                        # sampler/trainer agreement, before any update (this pass is the first)
                        if sampler_logprobs:
                            gap = (logp.detach() - mb.sampler_logp).abs() * mb.loss_mask
                            mb_sums |= dict(gap_sum=gap.sum(), gap_tok=mb.loss_mask.sum())
                        update_sums.append(mb_sums | is_sums)
                grad_norms.append(
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                )
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)

        # ======== push the new weights to the generator, once per update phase (no-op for HF) =====
        generator.sync_weights(policy)

        # ======== [EST] update the estimator with this step's counts (Alg. 1 line 19), all ranks
        visits = update_estimator(counts, examples, groups, threshold, args.lam, accelerator)

        # ================ metrics: the step's sums over ranks, the shared keys, the method's ======
        sums = ada_est_sums(groups, scored, truncated, completions, alphas, threshold)
        lr = scheduler.get_last_lr()[0]
        row, totals = run_log.step_metrics(
            step, counters, scored, sums, update_sums, grad_norms, lr, loss_per="seqs"
        )
        estimator = p_hats, had_history, allocation, visits, counts
        row |= ada_est_metrics(totals, accelerator, trained_records, *estimator)

        # ================ evaluation, sample log, the row, checkpoint, stop ================
        if run_log.evaluation_due(step):
            with run_log.timing("eval"):
                row.update(run_eval())
        # a few responses with [EST] N_x and p_hat
        if run_log.samples_due(step):
            budgets, response_p_hats = [sizes[i] for i in owner], [p_hats[mine[i]] for i in owner]
            rollouts = flat_prompts, completions, scored, advantages, truncated
            picked = sample_rows(tokenizer, *rollouts, budgets, response_p_hats, args)
            run_log.write_samples(step, picked)
        run_log.write_row(row, compiled)
        stopping = stop.any_rank_signalled(accelerator)
        if checkpoints.due(step, stopping):
            # the method's state: the estimator's counts
            method = {"counts": dict(counts)}
            state = {"sampler": sampler.state_dict(), "counters": counters, "method": method}
            checkpoints.save(step, state, stopping)
        if stopping:
            break
    run_log.close()
    export_model(args, accelerator, policy, tokenizer, generator.end_ids, "ada_est", __doc__)
    # trackers finish and the process group ends now, not at exit: no hang, no abort
    end_processes(accelerator)
    stop.close()
    summary = ["est_calibration_error", "est_alloc_max", "ada_adv_mean_trained"]
    log(run_summary(args.output_dir, summary))


if __name__ == "__main__":
    raise SystemExit(
        main(parse_args(Args, description=__doc__.split("\n\n")[0])) or GracefulStop.exit_status()
    )
