"""Reinforce-Ada-Est: per-prompt pass-rate estimates decide how many responses each prompt gets. One file.

Paper: Xiong, Ye, Liao, Dong, Xu, Monz, Bian, Jiang, Zhang, "Reinforce-Ada: An Adaptive Sampling Framework under
Non-linear RL Objectives" (preprint; code: RLHFlow/Reinforce-Ada), Sec. 3.1 and Alg. 1. Docs: docs/ada_est.md.

Optimising the log-objective E_x[log p(x)] weights each prompt's gradient by 1/p(x) (Sec. 2.2). The hybrid
realisation puts 1/sqrt(p) into the sampling budget and the other 1/sqrt(p) into the advantage:
  1. before sampling, every prompt of the batch gets N_x responses, N_x ∝ w(p_hat_x), clipped to
     [n_min, n_max], summing exactly to `total_budget` (Alg. 1 line 5); p_hat_x is a discounted Beta-prior
     estimate from the prompt's earlier visits (stable prompt ids across steps and epochs);
  2. all N_x responses are trained on, with A_i = (r_i - mean_x) * alpha_x, alpha_x = 1/sqrt(mean_x + eps)
     (Alg. 1 lines 14-16), in a GRPO-style clipped policy gradient;
  3. after the step the estimator absorbs the new counts: N_total <- lam*N_total + n_t, N_pos <- lam*N_pos + k_t.
The estimator only helps when prompts recur, so the default trains on a fixed pool of `prompt_pool`
prompts for several epochs. Lines marked [EST] are what the paper adds to plain GRPO.

Choices made here: the allocation is computed for the whole global batch on every rank (the estimator
state is identical everywhere), then each rank samples its slice; integer budgets come from bisection on
the proportionality constant plus largest-remainder rounding (see `allocate_budget`). Token losses are
summed over ALL responses and divided by a constant (total_budget x max_new_tokens), so a prompt's weight
in the update grows with its N_x (the sampling half of the weight). k_t counts responses with reward >
positive_threshold (or >= --success_reward); a cut response scores 0 under the built-in rewards, its
functions' total under --reward_funcs. pi_old is the sampling policy; one optimizer step per batch by
default. Logged `loss`: that surrogate divided by (responses x max_new_tokens), as
optimised; the optimised loss also subtracts the entropy bonus (entropy_coef x summed token entropy over the same
constant; the paper's set-up uses 1e-4, the authors' run script 0) and adds beta x the k3 KL summed over the same
tokens and divided by the same constant (one normaliser; `kl` logs it per trained token). The advantage is
Alg. 1 line 16's (r - mean_x) x alpha_x, with no std division (the residual weight alpha_x is the prompt's scale);
its baseline is GRPO-n8 (`ada_seq.py --max_rounds 1 --round_repeat 8 --num_generations 8`, eq. 2), the same
inference budget.

    python ada_est.py                                  # hybrid 1/sqrt(p) on 2048 recurring Countdown prompts
    python ada_est.py --weighting implicit             # N_x ∝ 1/p, no residual weight (App. C.2 ablation)
    accelerate launch ada_est.py --model_name_or_path Qwen/Qwen2.5-Math-1.5B --dataset_name openai/gsm8k \
        --dataset_config main --prompt_pool 2048 --use_vllm --dtype bfloat16 --learning_rate 1e-6
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Annotated, Literal, Optional

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from common.run import checkpoint
from common.run.flags import BaseArgs, Range
from common.run.flags import parse_args
from common.tasks.loading import PromptEncoder, PromptSampler
from common.tasks.scoring import reward_moments, reward_sums
from common.distributed.ranks import GracefulStop, collective_timeout, end_processes, gather_list, gathered, micro_batches, my_slice, reduce_sums
from common.generation.hf import HFGenerator, SamplingConfig, end_token_ids
from common.run.launch import CpuThreads, resolve_accelerate_precision, resolve_accelerate_sharding
from common.rl.logprobs import token_logprobs
from common.rl.losses import clipped_surrogate, kl_k3
from common.rl.masking import pad_sequences, right_align
from common.run.logs import MetricsLogger, SampleLogger, check_tracker
from common.tasks.evaluation import evaluate, evaluate_train_prompts, train_prompt_sample
from common.rl.advantages import trained_advantage_metrics
from common.run.output_dir import claim_output_dir
from common.model.policy import autocast, frozen_reference, load_policy
from common.run.summary import run_summary
from common.tasks.loading import make_task


@dataclass
class Args(BaseArgs):
    prompt_pool: Annotated[int, Range(0, zero="all")] = 2048
    """[EST] train on only the first N prompts so that they recur and the estimates have history (at 32 prompts per
    step a prompt of the 2048 returns every 64 steps)"""
    warmup_steps: Annotated[int, Range(0)] = 10
    """linear warm-up steps, then constant (the Reinforce-Ada paper's set-up, Sec. 4: a 10-step warm-up)"""
    total_budget: Annotated[int, Range(0, zero="8 x prompts_per_step")] = 0
    """[EST] responses per step over the whole batch, N_total of Alg. 1 (8 x prompts_per_step is the paper's setting,
    comparable with GRPO-n8)"""
    n_min: Annotated[int, Range(1)] = 2
    """[EST] fewest responses any prompt gets (2: a single response has no group baseline)"""
    n_max: Annotated[int, Range(1)] = 32
    """[EST] most responses any prompt gets (the paper's N_max for its sequential variant)"""
    weighting: Literal["hybrid", "implicit"] = "hybrid"
    """[EST] `hybrid`: N_x ∝ 1/sqrt(p_hat+eps) and residual weight 1/sqrt(mean_x+eps) (the paper's main choice);
    `implicit`: N_x ∝ 1/(p_hat+eps), no residual weight"""
    lam: Annotated[float, Range(0, 1, lo_open=True)] = 0.9
    """[EST] discount lambda of the per-prompt counts at every visit (the public code's 0.9)"""
    prior_alpha: Annotated[float, Range(0, lo_open=True)] = 1.0
    """[EST] Beta prior alpha: p_hat = (N_pos + alpha) / (N_total + alpha + beta) (public code: 1)"""
    prior_beta: Annotated[float, Range(0)] = 16.0
    """[EST] Beta prior beta (public code: 16; an unseen prompt starts at p_hat = 1/17, i.e. treated as hard)"""
    eps: Annotated[float, Range(0, lo_open=True)] = 0.01
    """[EST] epsilon in w(p_hat) and in the residual weight 1/sqrt(mean_x + eps) (bounds the weight of all-fail
    groups)"""
    positive_threshold: Annotated[float, Range(None, 1, hi_open=True)] = 0.7
    """[EST] a response counts as a success k_t for the estimator when its training reward (in [0, 1]) > this"""
    epsilon: Annotated[float, Range(0, 1, hi_open=True)] = 0.2
    """lower clip range of the ratio pi_theta/pi_old (clip-higher setup of the paper: [0.2, 0.28])"""
    epsilon_high: Annotated[float, Range(0)] = 0.28
    """upper clip range of the ratio pi_theta/pi_old"""
    num_iterations: Annotated[int, Range(1)] = 1
    """optimizer steps per batch (each a full pass over all responses); with 1 the ratio is 1 and clipping is
    inactive"""
    beta: Annotated[float, Range(0, zero="off, no reference model")] = 0.0
    """KL coefficient to the reference (initial) policy: the k3 estimator summed over the trained tokens, divided by
    the policy gradient's constant (responses x max_new_tokens); the paper uses none"""
    entropy_coef: Annotated[float, Range(0, zero="off")] = 1e-4
    """entropy bonus: entropy_coef x token entropy is subtracted from the loss (the paper's set-up: 1e-4)"""
    old_logprobs: Literal["auto", "sampler"] = "auto"
    """where pi_old's log-probs come from: `auto` = the update's own first forward pass when that is exact (HF
    backend, one epoch: the weights that sampled are the weights being updated), else the sampler; `sampler` =
    always the generator's log-probs (an extra scoring pass with the HF backend)"""

    def budget(self) -> int:
        return self.total_budget or 8 * self.prompts_per_step

    def validate(self) -> None:  # single values: their declarations (common/run/flags.py); here, combinations
        p, b = self.prompts_per_step, self.budget()
        if self.n_min > self.n_max:
            raise SystemExit(f"--n_min {self.n_min} / --n_max {self.n_max}: need n_min <= n_max")
        if not self.n_min * p <= b <= self.n_max * p:
            raise SystemExit(f"--total_budget {b}: must lie in [n_min * prompts_per_step, n_max * prompts_per_step]"
                             f" = [{self.n_min * p}, {self.n_max * p}]")


def count_positive(rewards: list[float], threshold: float) -> int:
    """[ADA] Responses counting as positive: reward > threshold (strict, so shaped partial credit can stay negative)."""
    return sum(1 for reward in rewards if reward > threshold)


def zero_variance_lists(groups: list[list[float]]) -> int:
    """Groups whose rated responses all got the same reward (NaN: no reward, left out)."""
    rated = [[r for r in g if not math.isnan(r)] for g in groups]
    return sum(not g or max(g) - min(g) <= 1e-9 for g in rated)


def estimate(counts: Optional[tuple[float, float]], alpha: float, beta: float) -> float:
    """[EST] p_hat = (N_pos + alpha) / (N_total + alpha + beta) (Sec. 3.1); no history -> the prior mean."""
    n_total, n_pos = counts or (0.0, 0.0)
    return (n_pos + alpha) / (n_total + alpha + beta)


def update_counts(counts: Optional[tuple[float, float]], n_t: int, k_t: int, lam: float) -> tuple[float, float]:
    """[EST] N_total <- lam*N_total + n_t, N_pos <- lam*N_pos + k_t (Sec. 3.1): stale visits fade out."""
    n_total, n_pos = counts or (0.0, 0.0)
    return lam * n_total + n_t, lam * n_pos + k_t


def allocation_weights(p_hats: list[float], mode: str, eps: float) -> list[float]:
    """[EST] w(p_hat): 1/sqrt(p_hat + eps) (hybrid, Alg. 1 line 5) or 1/(p_hat + eps) (implicit, Sec. 2.2)."""
    if mode == "hybrid":
        return [1.0 / math.sqrt(p + eps) for p in p_hats]
    return [1.0 / (p + eps) for p in p_hats]


def allocate_budget(weights: list[float], total: int, n_min: int, n_max: int) -> list[int]:
    """[EST] Integer N_x ∝ weights, each in [n_min, n_max], summing exactly to `total` (Alg. 1 line 5).

    The real-valued allocation clip(c * w_x, n_min, n_max) is found by bisection on the scale c (its sum
    grows continuously in c); it is then floored, and the missing units go one each to the prompts with the
    largest fractional parts (largest-remainder rounding; ties to the earlier prompt), never above n_max.
    """
    k = len(weights)
    if k == 0:
        return []
    if not n_min * k <= total <= n_max * k:
        raise ValueError(f"budget {total} cannot be split over {k} prompts within [{n_min}, {n_max}]")
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


def est_advantages(rewards: list[float], mode: str, eps: float, threshold: float = 0.7) -> tuple[list[float], float]:
    """[EST] A_i = (r_i - mean_x) * alpha_x over all of the prompt's responses this step (Alg. 1 lines 14-16);
    alpha_x = 1/sqrt(p_x + eps) (hybrid: the residual half of the 1/p weight) or 1 (implicit). p_x is the step's
    pass rate, the share of responses with reward > `threshold` (the success rule; = mean_x for 0/1 rewards), so a
    reward of any sign or scale gives a finite weight. A NaN reward (no function scored it) is left out of mean_x
    and p_x and gets A = 0."""
    rated = [r for r in rewards if not math.isnan(r)]
    if not rated:
        return [0.0] * len(rewards), 1.0
    mean = sum(rated) / len(rated)
    alpha = 1.0 / math.sqrt(count_positive(rated, threshold) / len(rated) + eps) if mode == "hybrid" else 1.0
    return [0.0 if math.isnan(r) else (r - mean) * alpha for r in rewards], alpha


def main(args: Args) -> None:
    # ---------------- set-up: accelerator, seeds, output dir ----------------
    args.fsdp, args.dtype = resolve_accelerate_sharding(args.fsdp), resolve_accelerate_precision(args.dtype)
    cpu_threads = CpuThreads(args.num_threads, hold=args.torch_compile)  # --num_threads, or free cores: launch.py
    torch.set_num_threads(cpu_threads.count(torch.get_num_threads(), settle=0.2))  # before any torch work
    check_tracker(args.report_to)
    args.output_dir = args.output_dir or f"runs/ada_est-seed{args.seed}"
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), project_dir=args.output_dir,
                              log_with=None if args.report_to == "none" else args.report_to,
                              kwargs_handlers=collective_timeout(args.collective_timeout))  # one line on expiry
    device, world = accelerator.device, accelerator.num_processes
    log = lambda msg: print(msg, flush=True) if accelerator.is_main_process else None  # noqa: E731  (once a run)
    rank_seed = args.seed + accelerator.process_index  # ranks sample different rollouts
    random.seed(rank_seed)
    np.random.seed(rank_seed)
    torch.manual_seed(rank_seed)
    claim_output_dir(args, accelerator, log)  # before any model: refuses a used or unshared folder

    # ---------------- policy, frozen reference, optimizer ----------------
    model_path = args.model_name_or_path
    if model_path == "embedded":  # the tiny Countdown model: rank 0 builds it once, the others find it cached
        from common.demo.tiny_model import ensure_embedded_base

        with accelerator.main_process_first():
            model_path = str(ensure_embedded_base(log=log))
    policy, tokenizer = load_policy(model_path)  # fp32 master weights; --dtype is the compute dtype (autocast)
    policy.to(device).train()  # training mode: from_pretrained returns eval mode (checkpointing needs train)
    if args.gradient_checkpointing:  # activations recomputed in backward (training passes only; generate is eval)
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora_r:  # LoRA: only the adapters train (fp32); the frozen base is stored in the compute dtype
        from common.model.lora import AdaptersOff, add_lora

        policy = add_lora(policy, args.lora_r, args.lora_alpha, args.lora_target_modules, args.dtype)
    task = make_task(args, tokenizer, log)  # Countdown or a dataset; --reward_funcs: yours (docs/custom_task.md)
    ref_model = None
    if args.beta > 0:  # the KL reference: the initial weights, frozen
        ref_model = AdaptersOff(policy) if args.lora_r else \
            frozen_reference(policy, args.dtype, args.fsdp)  # computes as the policy at step 0
    if args.fsdp:  # FSDP2: each rank keeps 1/world of every weight (common/distributed/fsdp.py); the optimizer sees the shards
        from common.distributed.fsdp import shard

        policy, ref_model = shard(policy, args.dtype), None if ref_model is None else shard(ref_model, args.dtype)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=args.weight_decay)
    warmup = max(1, args.warmup_steps)  # linear warm-up, then constant
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    # `model`: DDP-wrapped for the backward pass (FSDP: the sharded policy is its own wrapper)
    model, optimizer = (policy, accelerator.prepare(optimizer)) if args.fsdp else accelerator.prepare(policy, optimizer)

    # ---------------- data and generator ----------------
    encode = PromptEncoder(tokenizer, task.templated)
    sampler = PromptSampler(len(task.train), args.seed)
    compiled = None  # --torch_compile: the decoding step and the packed training forward compiled (common/generation/compile.py)
    if args.torch_compile:
        from common.generation.compile import TorchCompile

        compiled = TorchCompile(log=log)
    if args.use_vllm:
        from common.generation.vllm_backend import VLLMGenerator

        generator = VLLMGenerator(model_path, policy, tokenizer, seed=args.seed, dtype=args.dtype,
                                  max_model_len=args.vllm_max_model_length,
                                  gpu_memory_utilization=args.vllm_gpu_memory_utilization, accelerator=accelerator)
    else:
        generator = HFGenerator(policy, tokenizer, batch_size=args.gen_batch_size, dtype=args.dtype,
                                cache_implementation=args.cache_implementation, compiled=compiled)
    generator.end_ids = end_token_ids(tokenizer, policy, args.stop_token_ids, log)  # EOS, end-of-turn, flag
    # pi_old from the sampler only where it differs from the update's own first pass (`--old_logprobs`)
    sampler_logprobs = args.old_logprobs == "sampler" or args.use_vllm or args.num_iterations > 1
    sampling = SamplingConfig(max_new_tokens=args.max_completion_length, temperature=args.temperature,
                              logprobs=sampler_logprobs)
    eval_temperature = args.temperature if args.eval_temperature is None else args.eval_temperature  # 0: greedy
    eval_sampling = SamplingConfig(max_new_tokens=args.max_completion_length, temperature=eval_temperature, logprobs=False)
    temperature = args.temperature if args.temperature > 0 else 1.0  # the generator scores greedy samples at T=1
    pack = (args.pack_row_tokens or (2048 if device.type == "cuda" else 128)) if args.padding_free else 0  # rows

    def run_eval() -> dict:
        torch.set_num_threads(cpu_threads.count(torch.get_num_threads()))  # fit the free cores
        with gathered(policy, enabled=generator.reads_policy):  # FSDP + HF generate: whole weights (else no-op)
            score = lambda examples: evaluate(generator, tokenizer, examples, encode, task.eval_success,  # noqa: E731
                                              eval_sampling, args.eval_samples, accelerator)
            train_fit = evaluate_train_prompts(score, train_prompt_sample(task.train, args.eval_train_prompts))
            return {**score(task.eval), **train_fit}  # eval_train_*: the pool's fit, to compare with held-out

    # ---------------- resume ----------------
    start_step, counters, method_state = 0, {"rollouts": 0, "gen_tokens": 0}, {}
    resume_from = checkpoint.resolve_resume(args.resume_from_checkpoint, args.output_dir)
    if resume_from is not None:
        start_step, state = checkpoint.load_checkpoint(resume_from, accelerator, model, optimizer, scheduler)
        sampler.load_state_dict(state["sampler"])
        counters, method_state = state["counters"], state["method"]
        generator.sync_weights(policy)
        log(f"resumed from {resume_from} at step {start_step}")
    # [EST] prompt id (Example.id) -> discounted (N_total, N_pos); identical on every rank, checkpointed
    counts: dict[int, tuple[float, float]] = {prompt_id: tuple(value)
                                              for prompt_id, value in method_state.get("counts", {}).items()}

    # ---------------- logging, step-0 evaluation, graceful stop ----------------
    logger = MetricsLogger(args.output_dir, accelerator, args.report_to, vars(args),
                           resume_step=start_step if resume_from is not None else None)
    sample_log = SampleLogger(args.output_dir, accelerator, args.log_samples_every, args.log_samples_per_kind,
                              resume_step=start_step if resume_from is not None else None)
    warned_logp_diff = False
    if start_step == 0:
        row = {"step": 0, **run_eval(), "num_threads": torch.get_num_threads(),
               **(compiled.metrics(accelerator) if compiled else {})}
        logger.log(row)
        log(f"step 0 (starting policy): {row}")
    stop = GracefulStop(log)
    progress = tqdm(range(start_step + 1, args.max_steps + 1), initial=start_step, total=args.max_steps,
                    desc="ada_est", disable=not accelerator.is_main_process)
    threshold, total_budget = args.positive_threshold, args.budget()
    if args.success_reward is not None:  # reward >= success_reward: > the float just below it
        threshold = math.nextafter(args.success_reward, -math.inf)
    # constant normaliser: the global sample count / world (DDP averages), times max length
    normaliser = total_budget / world * args.max_completion_length

    for step in range(start_step + 1, args.max_steps + 1):
        t_start = time.time()
        threads = cpu_threads.count(torch.get_num_threads())  # a shared CPU: fit the free cores
        torch.set_num_threads(threads)
        batch_ids = sampler.next_ids(args.prompts_per_step)  # the global batch: every rank allocates all of it

        # ================ [EST] allocate the budget from the estimates made before this step (Alg. 1 l. 4-5) ======
        p_hats = [estimate(counts.get(prompt_id), args.prior_alpha, args.prior_beta) for prompt_id in batch_ids]
        allocation = allocate_budget(allocation_weights(p_hats, args.weighting, args.eps), total_budget,
                                     args.n_min, args.n_max)
        mine = my_slice(list(range(len(batch_ids))), accelerator)
        examples = [task.train[batch_ids[j]] for j in mine]
        sizes = [allocation[j] for j in mine]
        prompts = [encode(example.prompt) for example in examples]

        # ================ sample N_x responses per prompt (one generate call: prompt x repeated N_x times) =======
        flat_prompts = [p for p, size in zip(prompts, sizes) for _ in range(size)]
        owner = [i for i, size in enumerate(sizes) for _ in range(size)]
        with gathered(policy, enabled=generator.reads_policy):  # FSDP + HF generate: whole weights (else no-op)
            gens = generator.generate(flat_prompts, 1, sampling)
        generator.sleep()  # vLLM on a GPU: its memory goes to training; the push brings the weights back
        t_gen = time.time() - t_start
        completions = [list(c) for c in gens.completion_ids]

        # ================ verify (a cut completion: the built-in rewards give 0, --reward_funcs their total) ======
        texts = [tokenizer.decode(c, skip_special_tokens=True) for c in completions]  # ([] for [])
        truncated = torch.tensor([reason == "length" for reason in gens.finish_reasons], dtype=torch.bool)
        scored = task.score(texts, [examples[owner[g]] for g in range(len(texts))], completions, truncated, step)
        rewards = scored.total
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        groups = [rewards[start:start + size] for start, size in zip(starts, sizes)]

        # ================ [EST] advantages from each prompt's own step mean, x the residual weight alpha_x ======
        adv_list, alphas = [], []
        for group_rewards in groups:
            group_adv, alpha = est_advantages(group_rewards, args.weighting, args.eps, threshold)
            adv_list += group_adv
            alphas.append(alpha)
        advantages = torch.tensor(adv_list, dtype=torch.float32, device=device)
        old_logps = gens.logprobs
        # --mask_truncated_completions: cut completions get no gradient
        keep = ~truncated if args.mask_truncated_completions else torch.ones(len(texts), dtype=torch.bool)

        # ================ update: GRPO-style clipped surrogate on ALL responses; pi_old = the sampler ===========
        t_train_start = time.time()
        sums = {"loss_sum": 0.0, "kl_sum": 0.0, "ent_sum": 0.0, "tok": 0.0, "clip_sum": 0.0,
                "gap_sum": 0.0, "gap_tok": 0.0}
        grad_norms = []
        lengths = [len(p) + len(c) for p, c in zip(flat_prompts, completions)]  # --max_tokens_per_microbatch
        for epoch in range(args.num_iterations):
            for rows in micro_batches(len(completions), args.micro_batch_size, accelerator, model, peers=(ref_model,),
                                      lengths=lengths, max_tokens=args.max_tokens_per_microbatch):
                batch = pad_sequences([flat_prompts[r] for r in rows], [completions[r] for r in rows],
                                      tokenizer.pad_token_id, pack_tokens=pack).to(device)  # packed: --padding_free
                with autocast(device, args.dtype):  # bf16 compute over fp32 weights with --dtype bfloat16
                    logp, entropy = token_logprobs(model, batch, temperature, entropy_grad=args.entropy_coef > 0,
                                                   compiled=compiled)
                mask = batch.loss_mask * keep[rows].to(device)[:, None]
                # without sampler log-probs pi_old is this very pass (one epoch, HF weights: exact, ratio 1)
                old_logp = right_align([old_logps[r] for r in rows], batch.completion_width).to(device) \
                    if sampler_logprobs else logp.detach()
                if epoch == 0 and sampler_logprobs:  # sampler/trainer agreement, before any update (the first pass)
                    sums["gap_sum"] += ((logp.detach() - old_logp).abs() * batch.loss_mask).sum().item()
                    sums["gap_tok"] += batch.loss_mask.sum().item()
                per_token, clipped = clipped_surrogate(logp, old_logp, advantages[rows, None], args.epsilon,
                                                       args.epsilon_high)
                surrogate_sum = (per_token * mask).sum()
                entropy_sum = (entropy * mask).sum()
                loss = (surrogate_sum - args.entropy_coef * entropy_sum) / normaliser  # entropy bonus (Sec. 4 set-up)
                if ref_model is not None:
                    with torch.no_grad(), autocast(device, args.dtype):
                        ref_logp, _ = token_logprobs(ref_model, batch, temperature, compiled=compiled)
                    kl = kl_k3(logp, ref_logp) * mask
                    loss = loss + args.beta * kl.sum() / normaliser  # one constant for PG and KL
                accelerator.backward(loss)
                if epoch == 0:  # the on-policy epoch's numbers are the ones logged
                    sums["loss_sum"] += surrogate_sum.item() / args.max_completion_length
                    sums["ent_sum"] += entropy_sum.item()
                    sums["tok"] += mask.sum().item()
                    sums["clip_sum"] += (clipped * mask).sum().item()
                    if ref_model is not None:
                        sums["kl_sum"] += kl.sum().item()
            grad_norms.append(float(accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        t_train = time.time() - t_train_start

        # ================ push the new weights to the generator, once per update phase (no-op for HF) ============
        generator.sync_weights(policy)

        # ================ [EST] update the estimator with this step's counts (Alg. 1 line 19), all ranks ========
        # trials: the responses that got a reward (NaN: none from any function, left out of the Beta counts)
        records = gather_list(accelerator, [(example.id, sum(not math.isnan(r) for r in group_rewards),
                                             count_positive(group_rewards, threshold))
                                            for example, group_rewards in zip(examples, groups)])
        had_history = [prompt_id in counts for prompt_id in batch_ids]
        calibration = [abs(p_hat - k_t / n_t) for (_, n_t, k_t), p_hat, seen in zip(records, p_hats, had_history)
                       if seen and n_t]
        for prompt_id, n_t, k_t in records:  # in global batch order, so every rank applies the same updates
            counts[prompt_id] = update_counts(counts.get(prompt_id), n_t, k_t, args.lam)

        # ================ metrics: one reduce of named sums over ranks, each ratio next to its name ================
        totals = reduce_sums(accelerator, {
            "groups": len(groups), "rollouts": len(completions), "gen_tokens": sum(map(len, completions)),
            **reward_sums(rewards),  # NaN (no function scored it): out of reward_mean / _std
            "success": count_positive(rewards, threshold),
            "zero_var": float(zero_variance_lists(groups)),
            "truncated": sum(reason == "length" for reason in gens.finish_reasons), "seqs": len(completions),
            **sums, "alpha_sum": sum(alphas), "t_gen": t_gen, "t_train": t_train,
        })
        counters["rollouts"] += int(totals["rollouts"])
        counters["gen_tokens"] += int(totals["gen_tokens"])
        samples, tokens = max(1.0, totals["rollouts"]), max(1.0, totals["tok"])
        reward_mean, reward_std = reward_moments(totals, totals["rollouts"])  # over the completions given a reward
        row = {
            "step": step, "rollouts": counters["rollouts"], "gen_tokens": counters["gen_tokens"],
            "reward_mean": reward_mean, "reward_std": reward_std,
            "pass_rate": totals["success"] / samples, **scored.metrics(accelerator),
            "frac_zero_var_groups": totals["zero_var"] / max(1.0, totals["groups"]),
            "completion_len_mean": totals["gen_tokens"] / samples,
            "clipped_ratio": totals["truncated"] / samples,  # responses cut by max_new_tokens
            "loss": totals["loss_sum"] / max(1.0, totals["seqs"]),  # surrogate / (responses x max_new_tokens)
            "kl": totals["kl_sum"] / tokens, "entropy": totals["ent_sum"] / tokens,
            "grad_norm": float(np.mean(grad_norms)), "lr": scheduler.get_last_lr()[0],
            "time_gen_s": totals["t_gen"] / world, "time_train_s": totals["t_train"] / world,
            "sampler_logp_diff": totals["gap_sum"] / totals["gap_tok"] if totals["gap_tok"] else None,
            # [EST] mechanism metrics (allocation, p_hat, history: the global batch, the same on every rank)
            "est_p_hat_mean": sum(p_hats) / len(p_hats),
            "est_calibration_error": sum(calibration) / len(calibration) if calibration else None,
            "est_frac_prompts_with_history": sum(had_history) / len(batch_ids),
            "est_alloc_min": min(allocation), "est_alloc_mean": sum(allocation) / len(allocation),
            "est_alloc_max": max(allocation), "est_samples_step": sum(allocation),
            "est_residual_weight_mean": totals["alpha_sum"] / max(1.0, totals["groups"]),
            "est_prompts_tracked": len(counts),
            "est_clip_frac": totals["clip_sum"] / tokens,
        }
        trained = gather_list(accelerator, [(adv, examples[owner[g]].tag) for g, adv in enumerate(adv_list)])
        row.update(trained_advantage_metrics(trained))  # [ADA] every response trains: their mean A per level

        gap = row["sampler_logp_diff"]  # None: not measured this step
        if not warned_logp_diff and gap is not None and gap >= args.logp_diff_warn:
            warned_logp_diff = True
            log(f"warning: sampler_logp_diff {gap:.4f} >= --logp_diff_warn {args.logp_diff_warn}: "
                "the generator does not sample from the policy being trained (stale weights, dtype, temperature?)")

        # ================ sample log / evaluate / log / checkpoint / stop ================
        evaluating = (args.eval_steps and step % args.eval_steps == 0) or step == args.max_steps
        if sample_log.due(step, evaluating):  # a few fresh rollouts with [EST] N_x and p_hat -> samples.jsonl
            sample_log.log(step, [{"kind": "fresh", "prompt": tokenizer.decode(flat_prompts[g]),
                                   "completion": tokenizer.decode(completions[g]), "reward": rewards[g],
                                   "advantage": advantages[g].item(), "truncated": bool(truncated[g]),
                                   "ada_budget": sizes[owner[g]], "ada_p_hat": p_hats[mine[owner[g]]],
                                   **scored.columns(g)}
                                  for g in sample_log.pick(["fresh"] * len(completions))])
        if evaluating:
            row.update(run_eval())
        row.update(compiled.metrics(accelerator) if compiled else {})  # --torch_compile: compile time, recompiles
        row["time_step_s"] = time.time() - t_start
        row["num_threads"] = threads  # the step's count: with a fixed one the run repeats exactly
        logger.log(row)
        progress.update(1)
        progress.set_postfix({"reward": f"{row['reward_mean']:.3f}", "zero_var": f"{row['frac_zero_var_groups']:.2f}",
                              **({"eval": f"{row['eval_pass@1']:.3f}"} if "eval_pass@1" in row else {})})
        stopping = stop.agreed(accelerator)
        if (args.save_steps and step % args.save_steps == 0) or step == args.max_steps or stopping:
            state = {"sampler": sampler.state_dict(), "counters": counters,
                     "method": {"counts": dict(counts)}}
            path = checkpoint.save_checkpoint(args.output_dir, step, accelerator, model, tokenizer, optimizer,
                                              scheduler, state, args.save_total_limit, args.lora_merged_export)
            if stopping:
                log(f"stopped at step {step}; continue with --resume_from_checkpoint auto (checkpoint {path})")
                break
    progress.close()
    end_processes(accelerator)  # trackers finish and the process group ends now, not at exit: no hang, no abort
    stop.close()
    log(run_summary(args.output_dir, ["est_calibration_error", "est_alloc_max", "ada_adv_mean_trained"]))


if __name__ == "__main__":
    raise SystemExit(main(parse_args(Args, description=__doc__.split("\n\n")[0])) or GracefulStop.exit_status())
