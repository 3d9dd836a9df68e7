"""--stop_token_ids read and checked against the model's vocabulary, loaded only when it is given
(common/generation/hf.py `end_token_ids`)."""

from __future__ import annotations


def checked_stop_token_ids(stop_token_ids: str | list[int], tokenizer, model) -> list[int]:
    """The ids (given as ids, or as --stop_token_ids's comma-separated text), each a token id of the
    model; one line naming the first that is not."""
    if isinstance(stop_token_ids, str):
        try:
            stop_token_ids = [int(token) for token in stop_token_ids.split(",") if token.strip()]
        except ValueError:
            raise SystemExit(
                f"--stop_token_ids {stop_token_ids!r}: expected comma-separated token ids"
            ) from None
    if stop_token_ids:
        vocab = getattr(model.config.get_text_config(), "vocab_size", None) or len(tokenizer)
        for token in stop_token_ids:
            if not 0 <= token < vocab:
                raise SystemExit(
                    f"--stop_token_ids {token}: not a token id of this model (0 to {vocab - 1})"
                )
    return stop_token_ids
