"""The tasks of an environment: what `reset(**row)` gets. With a dataset, its rows (every column a
keyword); without one, `reset(seed=i)` for task i of a pool, the held-out tasks being the seeds that
follow the pool, so that a task is the same in every run."""

from __future__ import annotations

from dataclasses import dataclass, field

# the training pool without a dataset and without --prompt_pool
SEED_POOL = 1024


@dataclass
class EnvTask:
    """One task: the keywords of `reset`, and a tag (eval_pass@1_<tag>; "" for none)."""

    row: dict = field(default_factory=dict)
    tag: str = ""


def seed_tasks(pool: int, n_eval: int) -> tuple[list[EnvTask], list[EnvTask]]:
    """(train, held out): seeds 0..pool-1 (SEED_POOL for pool 0), then the next n_eval seeds, so
    no held-out seed is a training seed."""
    pool = pool or SEED_POOL
    train = [EnvTask({"seed": i}) for i in range(pool)]
    return train, [EnvTask({"seed": pool + i}) for i in range(n_eval)]


def seed_split_line(train: list[EnvTask], held_out: list[EnvTask]) -> str:
    """The start-up line of `seed_tasks`' split."""
    first = held_out[0].row["seed"] if held_out else len(train)
    return (
        f"{len(train)} training tasks from reset(seed=i), seeds 0-{len(train) - 1} (--prompt_pool; "
        f"no --dataset_name); {len(held_out)} held-out tasks from the seeds after them, "
        f"{first}-{first + len(held_out) - 1} (--eval_prompts)"
    )


def dataset_tasks(args, log=print) -> tuple[list[EnvTask], list[EnvTask]]:
    """(train, held out) rows of --dataset_name, split as a text task's prompts are
    (common/tasks/loading.py): the held-out rows from --eval_dataset or the dataset's test split,
    else the last min(--eval_prompts, rows / 5) rows of a one-split source (a local file), kept
    out of training; then the first --prompt_pool training rows (when > 0). One line states it."""
    from common.tasks.loading import held_out_source, hold_out_last, load_splits

    train, held = load_splits(args)
    train = list(train)
    split = held is not None
    if split:
        held, source = list(held)[: args.eval_prompts], held_out_source(args)
    else:
        train, held, source = hold_out_last(train, args)
    rows = len(train) + len(held)
    if not train:
        raise SystemExit(f"--dataset_name {args.dataset_name}: no training row")
    if args.prompt_pool > 0:
        train = train[: args.prompt_pool]
    trained = f"{len(train)} training tasks from {args.dataset_name}, reset(**row) on each row"
    held_line = (
        f"{len(held)} held-out tasks from {source}" if held else no_held_out(args, split, rows)
    )
    log(f"{trained}; {held_line}")
    return [EnvTask(dict(row)) for row in train], [EnvTask(dict(row)) for row in held]


def no_held_out(args, split: bool, rows: int) -> str:
    """The start-up line's end when no row is held out: there is no held-out evaluation, and how
    to get one (`split`: the held-out rows were to come from a split or --eval_dataset, else from
    the last of the training source's `rows` rows)."""
    from common.tasks.loading import held_out_source

    if split:
        return f"no held-out evaluation: {held_out_source(args)} has no row"
    return (
        f"no held-out evaluation: a one-split source holds out at most a fifth of its rows, and "
        f"the {rows} rows of {args.dataset_name} give none (give it 5 rows or more, or held-out "
        "rows with --eval_dataset)"
    )


def reward_funcs(args, train_size: int, log=print):
    """--reward_funcs loaded as TRL calls them (common/tasks/rewards.py), trainer_state filled."""
    from common.tasks.rewards import RewardFuncs

    funcs = RewardFuncs(args.reward_funcs, args.reward_weights, dtype=args.dtype)
    funcs.fill_state(args, train_size, log)
    return funcs


def conversation_rewards(funcs, tokenizer, episodes: list, rows: list[dict], step):
    """`funcs` on whole conversations, with TRL's keywords: `prompts` and `completions` in TRL's
    conversational format in its environment_factory convention (the prompt's messages; the
    assistant's messages and tool results after them), else as text (the first observation; every
    turn after it, actions and observations), `completion_ids` their tokens, `environments` the
    episodes' instances, and every column of the task's row but `prompt`. Returns (totals,
    values)."""

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    columns = {key: [row.get(key) for row in rows] for key in (rows[0] if rows else {})}
    for dropped in ("prompt", "completion", "completion_ids"):
        columns.pop(dropped, None)
    columns["environments"] = [episode.env for episode in episodes]
    chats = [episode.chat for episode in episodes]
    if chats and all(chats):
        prompts = [chat[0] for chat in chats]
        completions = [[message for turn in chat[1:] for message in turn] for chat in chats]
    else:
        prompts = [decode(episode.prompt) for episode in episodes]
        completions = [decode(episode.ids) for episode in episodes]
    return funcs(prompts, completions, [list(episode.ids) for episode in episodes], columns, step)
