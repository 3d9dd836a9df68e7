"""The lines that stop a run on a dataset it cannot use (a missing column, a row that is not a
prompt); loaded only then, by common/tasks/loading.py `hf_task`."""

from __future__ import annotations


def missing_column(args, column: str, prompt_column: str, flag: str, columns: list[str]) -> str:
    """The line for a prompt or answer column that `flag`'s dataset lacks."""
    named = repr(column)
    if column == prompt_column and not args.prompt_column:  # neither default column
        named = "'prompt' or 'question'"
    return f"--prompt_column/--answer_column: column {named} not in {flag} (columns: {columns})"


def bad_row(args, name: str, row_i: int, prompt_column: str, need_answer: bool, q, a) -> str:
    """The line for a row whose prompt is neither text nor messages, or that has no answer where
    the built-in reward needs one (`need_answer`)."""
    return (
        f"{name} row {row_i}: {prompt_column!r} must be text or a list of "
        "{role, content} messages"
        + (f" and {args.answer_column!r} present" if need_answer else "")
        + f" (got {q!r:.80}, {a!r:.40})"
    )


def needs_chat_template(args, name: str, row_i: int, tokenizer) -> str:
    """The line for a message-format prompt with no chat template to render it."""
    how = (
        "--use_chat_template no leaves it out (auto or yes to use it)"
        if tokenizer.chat_template
        else f"the tokenizer of {args.model_name_or_path} has none"
    )
    return f"{name} row {row_i}: a message-format prompt needs a chat template: {how}"
