"""A dataset as TRL reads it (common/tasks/loading.py): the `prompt` column when --prompt_column is
not given, a first line saying whether the chat template renders the prompts, a `Dataset` saved
with save_to_disk, and one line for a hub name that cannot be reached."""

import json

import pytest


def _prompt_rows(path, n=20):
    rows = [{"prompt": f"{i} {i + 1} t{2 * i + 1}\n", "answer": str(2 * i + 1)} for i in range(n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _args(data, **kw):
    from common.run.flags import BaseArgs

    return BaseArgs(dataset_name=str(data), eval_prompts=4, **kw)


def test_the_prompt_column_and_the_chat_template_line(tiny_base, tmp_path):
    from transformers import AutoTokenizer

    from common.tasks.loading import MATH_SUFFIX, hf_task

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    data = _prompt_rows(tmp_path / "trl.jsonl")
    lines = []
    task = hf_task(_args(data), tokenizer, log=lines.append)
    assert task.train[0].prompt.startswith("0 1 t1\n") and task.prompt_column == "prompt"
    head = "prompts: column 'prompt' (found by name; --prompt_column to choose), 20 rows as text: "
    suffix = f"--prompt_suffix {MATH_SUFFIX!r} appended (the default with the built-in math reward"
    assert lines[0].startswith(head + "text is used as it is (the tokenizer has no chat template)")
    assert suffix in lines[0]
    tokenizer.chat_template = (
        "{% for m in messages %}<user>{{ m['content'] }}{% endfor %}<assistant>"
    )
    lines.clear()
    task = hf_task(_args(data, system_prompt="Be brief."), tokenizer, log=lines.append)
    assert task.train[0].prompt.startswith("<user>Be brief.<user>0 1 t1\n") and task.templated
    assert lines[0].startswith(head + "text goes through the tokenizer's chat template")
    assert "--system_prompt 'Be brief.' before it, as a system message" in lines[0]
    assert suffix in lines[0]
    lines.clear()
    task = hf_task(_args(data, use_chat_template="no"), tokenizer, log=lines.append)
    assert task.train[0].prompt.startswith("0 1 t1\n") and not task.templated
    assert "text is used as it is, the chat template left out (--use_chat_template no)" in lines[0]
    assert "no chat template" not in lines[0]
    # message prompts: said as such, with nothing added to them
    rows = [
        {"prompt": [{"role": "user", "content": f"{i} t{i}"}], "answer": "1"} for i in range(20)
    ]
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps(row) + "\n" for row in rows))
    lines.clear()
    task = hf_task(_args(chat), tokenizer, log=lines.append)
    assert task.train[0].prompt == "<user>0 t0<assistant>"
    assert lines[0] == (
        "prompts: column 'prompt' (found by name; --prompt_column to choose), 20 rows as messages: "
        "messages go through the tokenizer's chat template as they are (nothing added)"
    )
    with pytest.raises(SystemExit, match="--use_chat_template no leaves it out"):
        hf_task(_args(chat, use_chat_template="no"), tokenizer)
    # GSM8K's `question` when there is no `prompt`; neither: one line naming both
    (tmp_path / "gsm.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    assert (
        hf_task(_args(tmp_path / "gsm.jsonl"), tokenizer, log=lines.append).prompt_column
        == "question"
    )
    (tmp_path / "q.jsonl").write_text(json.dumps({"q": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(
        SystemExit, match=r"column 'prompt' or 'question' not in --dataset_name \(columns"
    ):
        hf_task(_args(tmp_path / "q.jsonl"), tokenizer)


def test_a_dataset_saved_with_save_to_disk_loads(tiny_base, tmp_path):
    import datasets
    from transformers import AutoTokenizer

    from common.tasks.loading import hf_task

    tokenizer = AutoTokenizer.from_pretrained(tiny_base)
    rows = [
        json.loads(line) for line in _prompt_rows(tmp_path / "rows.jsonl").read_text().splitlines()
    ]
    single = datasets.Dataset.from_list(rows)
    single.save_to_disk(tmp_path / "single")
    lines = []
    task = hf_task(
        _args(tmp_path / "single"), tokenizer, log=lines.append
    )  # one split: its last rows held out
    assert [len(task.train), len(task.eval)] == [16, 4] and task.eval[0].prompt.startswith(
        "16 17 t33"
    )
    assert lines[-1].endswith(
        f"4 held-out prompts from the last 4 rows of {tmp_path / 'single'} (at most "
        "--eval_prompts, at most a fifth of the rows)"
    )
    datasets.DatasetDict({"train": single, "test": single.select(range(3))}).save_to_disk(
        tmp_path / "dict"
    )
    task = hf_task(_args(tmp_path / "dict"), tokenizer, log=lines.append)  # its own splits
    assert [len(task.train), len(task.eval)] == [20, 3]


def test_an_unreachable_hub_dataset_stops_with_one_line(tiny_base, monkeypatch):
    # no network (offline mode stands for it here, so the hub client's retries do not wait): one line naming the
    # dataset and how to use a local copy, no traceback
    import datasets
    import huggingface_hub.constants

    from common.tasks.loading import hf_task

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit) as stop:
        hf_task(_args("someone/unreachable-math"), None)
    assert str(stop.value).startswith(
        "--dataset_name someone/unreachable-math: cannot reach the Hugging Face hub"
    )
    assert "name a local copy: a .jsonl / .json / .parquet / .csv file" in str(stop.value)
    assert "\n" not in str(stop.value)
