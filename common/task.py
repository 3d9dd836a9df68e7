"""The run's task, as every script builds it: the embedded Countdown task (common/countdown.py, imported only for it)
or a real dataset (common/data.py), scored by the built-in rewards or by your --reward_funcs (common/rewards.py,
imported only with them)."""
from __future__ import annotations

import math

from common.data import Task, hf_task


def make_task(args, tokenizer, log=print) -> Task:
    """The run's task: the embedded Countdown task or a real dataset; with --reward_funcs / --eval_reward_funcs
    their functions (common/rewards.py, imported only then) score it instead of the built-in rewards."""
    if args.dataset == "countdown":  # the embedded demo task, imported only here
        from common.countdown import countdown_task

        task = countdown_task(args.reward, args.eval_prompts, args.prompt_pool)
    else:
        task = hf_task(args, tokenizer, log)
    task.success_reward = 1.0 if args.success_reward is None else args.success_reward
    if args.success_reward is None and getattr(args, "positive_threshold", None) is not None:
        # ada_seq / ada_est unset: reward > --positive_threshold (>= the next float up), training and evaluation
        task.success_reward = math.nextafter(args.positive_threshold, math.inf)
    task.warn, task.max_new_tokens = log, args.max_new_tokens
    task.mask_truncated = bool(getattr(args, "mask_truncated_completions", False))
    if args.reward_funcs or args.eval_reward_funcs:
        from common.rewards import RewardFuncs

        task.reward_funcs = RewardFuncs(args.reward_funcs, args.reward_weights, dtype=args.dtype) \
            if args.reward_funcs else None
        task.eval_reward_funcs = RewardFuncs(args.eval_reward_funcs, None, "--eval_reward_funcs", args.dtype) \
            if args.eval_reward_funcs else task.reward_funcs
        for funcs in {id(f): f for f in (task.reward_funcs, task.eval_reward_funcs) if f}.values():
            funcs.fill_state(args, len(task.train), log)
    return task
