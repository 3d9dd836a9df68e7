"""transformers' learning-rate schedules, loaded only for a --lr_scheduler_type other than
`warmup_constant` (common/run/setup.py `make_scheduler`) or an --lr_scheduler_kwargs."""

from __future__ import annotations

import json


def transformers_scheduler(optimizer, args, warmup: int):
    """transformers' `get_scheduler` for --lr_scheduler_type over --max_steps updates, warming up
    over `warmup` of them, with --lr_scheduler_kwargs; a setting it lacks or does not take stops the
    run with one line."""
    from transformers import get_scheduler

    settings = json.loads(args.lr_scheduler_kwargs or "{}")
    try:
        return get_scheduler(
            args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=args.max_steps,
            scheduler_specific_kwargs=settings,
        )
    except (TypeError, ValueError) as error:  # a setting it lacks, or one it does not take
        raise SystemExit(
            f"--lr_scheduler_type {args.lr_scheduler_type} with --lr_scheduler_kwargs "
            f"{args.lr_scheduler_kwargs}: {error}"
        ) from None


def kwargs_problems(text: str) -> list[str]:
    """The line for an --lr_scheduler_kwargs that is not a JSON object (checked with the flags)."""
    try:
        settings = json.loads(text)
    except ValueError:
        settings = None
    if isinstance(settings, dict):
        return []
    return [f"--lr_scheduler_kwargs {text}: must be a JSON object, e.g. '{{\"min_lr_rate\": 0.1}}'"]
