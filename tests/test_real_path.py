"""The real path learns: the word-problem task and its base (benchmarks/word_problems.py) ship as their recipe builds
them, the path renders each row as the base was trained on it, and a short seeded run through it (a model directory,
a .jsonl file, the chat template, the default suffix, math-verify) raises its training reward."""
import json
import sys
from dataclasses import asdict

import pytest
import torch

from conftest import ROOT, run_main

sys.path.insert(0, str(ROOT / "benchmarks"))
import word_problems  # noqa: E402

from common import tiny_model  # noqa: E402

RECIPE = word_problems.ModelRecipe()


@pytest.fixture(scope="module")
def word_base(tmp_path_factory):
    """The shipped word-problem base, copied into a cache of its own (no SFT)."""
    path = tmp_path_factory.mktemp("wpcache") / f"wordproblems-base-{RECIPE.key()}"
    if not tiny_model.restore_shipped(path, log=lambda *_: None):
        pytest.fail(f"assets/ holds no valid build named {path.name}: rebuild it (python benchmarks/word_problems.py)")
    return path


def test_the_shipped_word_problem_base_and_data_match_their_recipe(word_base, tmp_path):
    info = json.loads((word_base / "build_info.json").read_text())
    assert info["recipe"] == json.loads(json.dumps(asdict(RECIPE)))
    assert info["data_sha256"] == word_problems.data_sha256(RECIPE.data)  # the generator gives the shipped rows
    assert tiny_model.weights_sha256(word_base) == info["weights_sha256"]
    # the name hashes the recipe, not the code: a changed init, tokenizer or SFT step must show in its first losses
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the build's own setting (build_info: torch_threads)
    try:
        tokenizer = word_problems.build_tokenizer()
        with torch.random.fork_rng(devices=[]):
            model = word_problems.build_model(RECIPE, tokenizer)
            got = word_problems.sft(model, tokenizer, RECIPE, stop_after=len(info["sft_loss_trace"]),
                                    log=lambda *_: None)
    finally:
        torch.set_num_threads(threads)
    assert got["sft_loss_trace"] == pytest.approx(info["sft_loss_trace"], abs=1e-4)
    # the real path (AutoTokenizer on the directory, common.data on the .jsonl files) renders both kinds of row as
    # the base was trained on them: the chat template, the default suffix, the system message
    from transformers import AutoTokenizer

    from common.args import BaseArgs
    from common.data import hf_task

    shipped = AutoTokenizer.from_pretrained(word_base)
    data = word_problems.write_data(tmp_path)
    rows, _ = word_problems.make_rows(RECIPE.data)
    text = hf_task(BaseArgs(dataset=str(data["train"])), shipped, log=lambda *_: None)
    messages = hf_task(BaseArgs(dataset=str(data["train_messages"]), prompt_column="prompt"), shipped,
                       log=lambda *_: None)
    for i in (0, 1, 2):
        assert [text.train[i].prompt, messages.train[i].prompt] == word_problems.renderings(rows[i], tokenizer)
        ids = shipped(text.train[i].prompt, add_special_tokens=False).input_ids
        assert ids == tokenizer(text.train[i].prompt, add_special_tokens=False).input_ids
        assert shipped.decode(ids) == text.train[i].prompt
