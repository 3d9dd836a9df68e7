"""A dataset split from the Hugging Face hub or from a folder written by `datasets`' `save_to_disk`,
loaded only for a source that is not a local file (common/tasks/loading.py reads those)."""

from __future__ import annotations

from pathlib import Path


def saved_to_disk(name: str) -> str | None:
    """`dataset` or `dict` when `name` is a folder written by `save_to_disk` (of one `Dataset`, of
    a `DatasetDict`), else None."""
    path = Path(name)
    if (path / "dataset_dict.json").is_file():
        return "dict"
    if (path / "state.json").is_file() and (path / "dataset_info.json").is_file():
        return "dataset"
    return None


def load_split(name: str, config, split: str, flag: str, required: bool):
    """`split` of a `save_to_disk` folder (a saved `Dataset` holds one split: any `split` reads it
    whole) or of a hub dataset; None when it is not `required` and absent. A hub name that cannot be
    reached stops the run with one line."""
    import datasets

    from common.model.policy import library_bars_off

    path = Path(name)
    saved = saved_to_disk(name)
    if saved:
        loaded = datasets.load_from_disk(str(path))
        if saved == "dataset":
            return loaded
        if split in loaded:
            return loaded[split]
        if required:
            raise SystemExit(f"{flag} {name}: no split {split!r} (splits: {list(loaded)})")
        return None
    if name.startswith(("./", "../", "/", "~")) and not path.exists():  # a path, not a hub name
        raise SystemExit(f"{flag} {name}: no such file or folder")
    try:
        with library_bars_off(datasets):
            return datasets.load_dataset(name, config, split=split)
    except ConnectionError as error:  # no network, or the hub down: the cause in a few words
        raise SystemExit(
            f"{flag} {name}: cannot reach the Hugging Face hub ({str(error)[:120]}); without a "
            "network, name a local copy: a .jsonl / .json / .parquet / .csv file, or a folder "
            "written by `datasets`' save_to_disk (e.g. `--dataset_name data/train.jsonl`)"
        ) from None
    except datasets.exceptions.DatasetNotFoundError as error:
        raise SystemExit(f"{flag} {name}: not a local file or folder, nor a hub dataset ({error})")
    except ValueError as e:  # unknown split
        if required:
            raise SystemExit(f"{flag} {name}: cannot load split {split!r} ({e})")
        return None
