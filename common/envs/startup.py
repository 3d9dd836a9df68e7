"""--environment opened before the model loads: the file and the class (a misspelt name gets the
nearest class names of the file), the convention it speaks and its tools, its tasks and their
split, and `reset`'s signature against the first training and held-out task. A line each, or one
line that stops the run."""

from __future__ import annotations

import inspect


def open_environment(args, log=print):
    """(the `Environment`, training tasks, held-out tasks) of --environment, stated in start-up
    lines: its class and convention (`convention_line`), then its tasks' split."""
    from common.envs.protocol import Environment, load_class
    from common.envs.tasks import dataset_tasks, seed_split_line, seed_tasks

    env = Environment(load_class(args.environment))
    log(convention_line(env))
    if args.dataset_name == "countdown":  # no dataset: task i is reset(seed=i)
        train, held_out = seed_tasks(args.prompt_pool, args.eval_prompts)
        log(seed_split_line(train, held_out))
    else:
        train, held_out = dataset_tasks(args, log)
    check_reset(env, train[0].row, "the first training task", args.environment)
    if held_out:
        check_reset(env, held_out[0].row, "the first held-out task", args.environment)
    return env, train, held_out


def convention_line(env) -> str:
    """The class, where it is, the convention it speaks and what prefix replay does with it."""
    where = f"{env.cls.__name__} ({env.file})" if env.file else env.cls.__name__
    if env.text:
        replay = (
            "prefix replay restores its snapshot()"
            if env.restores
            else "no snapshot()/restore(): prefix replay executes the stored actions again"
        )
        return f"environment {where}: the text protocol, reset(**row) then step(action); {replay}"
    reward = "get_reward()" if env.has_reward else "none of its own (no get_reward(): 0)"
    return (
        f"environment {where}: TRL's environment_factory convention (no step); tools, through the "
        f"chat template: {', '.join(env.tool_names)}; reward: {reward}"
    )


def reset_signature(cls) -> inspect.Signature | None:
    """`cls.reset`'s signature as an instance's call sees it (without `self`); None when Python
    cannot tell."""
    try:
        signature = inspect.signature(cls.reset)
    except (TypeError, ValueError):
        return None
    if inspect.isfunction(inspect.getattr_static(cls, "reset")):  # a plain method: drop `self`
        parameters = list(signature.parameters.values())[1:]
        signature = signature.replace(parameters=parameters)
    return signature


def check_reset(env, row: dict, what: str, spec: str) -> None:
    """`reset(**row)` can bind `row`'s keywords, or one line naming the class, its signature and the
    keywords (a dataset's columns, or `seed`)."""
    signature = reset_signature(env.cls)
    if signature is None:
        return
    try:
        signature.bind(**row)
    except TypeError as error:
        keywords = ", ".join(row) or "none"
        raise SystemExit(
            f"--environment {spec}: {env.name}.reset{signature} cannot take {what}'s keywords "
            f"({keywords}): {error}"
        ) from None
