"""The real path learns: the word-problem task and its base (benchmarks/sweep/word_problems.py) ship as their recipe
builds them, the path renders each row as the base was trained on it, and a short seeded run through it (a model
directory, a .jsonl file, the chat template, the default suffix, math-verify) raises its training reward."""

import json
import sys
from dataclasses import asdict

import pytest
import torch
from conftest import ROOT, run_main

sys.path.insert(0, str(ROOT / "benchmarks" / "sweep"))
import word_problems  # noqa: E402

from common.demo import tiny_model  # noqa: E402

RECIPE = word_problems.ModelRecipe()
RETRACE = 10  # SFT steps retraced (of the 20 whose losses build_info.json keeps)


@pytest.fixture(scope="module")
def word_base(tmp_path_factory):
    """The shipped word-problem base, copied into a cache of its own (no SFT)."""
    path = tmp_path_factory.mktemp("wpcache") / f"wordproblems-base-{RECIPE.key()}"
    if not tiny_model.restore_shipped(path, log=lambda *_: None):
        pytest.fail(
            f"assets/ holds no valid build named {path.name}: rebuild it "
            "(python benchmarks/sweep/word_problems.py)"
        )
    return path


def test_the_shipped_word_problem_base_and_data_match_their_recipe(word_base, tmp_path):
    info = json.loads((word_base / "build_info.json").read_text())
    assert info["recipe"] == json.loads(json.dumps(asdict(RECIPE)))
    assert info["data_sha256"] == word_problems.data_sha256(
        RECIPE.data
    )  # the generator gives the shipped rows
    assert tiny_model.weights_sha256(word_base) == info["weights_sha256"]
    # the name hashes the recipe, not the code: a changed init, tokenizer or SFT step must show in its first losses
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the build's own setting (build_info: torch_threads)
    try:
        tokenizer = word_problems.build_tokenizer()
        with torch.random.fork_rng(devices=[]):
            model = word_problems.build_model(RECIPE, tokenizer)
            got = word_problems.sft(
                model, tokenizer, RECIPE, stop_after=RETRACE, log=lambda *_: None
            )
    finally:
        torch.set_num_threads(threads)
    assert got["sft_loss_trace"] == pytest.approx(info["sft_loss_trace"][:RETRACE], abs=1e-4)
    assert (
        got["sft_loss_trace"][-1] < got["sft_loss_trace"][0] - 0.3
    )  # it is learning, not a constant
    # the real path (AutoTokenizer on the directory, common.tasks.loading on the .jsonl files) renders both kinds of row as
    # the base was trained on them: the chat template, the default suffix, the system message
    from transformers import AutoTokenizer

    from common.run.flags import BaseArgs
    from common.tasks.loading import hf_task

    shipped = AutoTokenizer.from_pretrained(word_base)
    data = word_problems.write_data(tmp_path)
    rows, _ = word_problems.make_rows(RECIPE.data)
    text = hf_task(BaseArgs(dataset_name=str(data["train"])), shipped, log=lambda *_: None)
    messages = hf_task(
        BaseArgs(dataset_name=str(data["train_messages"]), prompt_column="prompt"),
        shipped,
        log=lambda *_: None,
    )
    for i in (0, 1, 2):
        assert [text.train[i].prompt, messages.train[i].prompt] == word_problems.renderings(
            rows[i], tokenizer
        )
        ids = shipped(text.train[i].prompt, add_special_tokens=False).input_ids
        assert ids == tokenizer(text.train[i].prompt, add_special_tokens=False).input_ids
        assert shipped.decode(ids) == text.train[i].prompt


def test_a_short_seeded_run_on_the_real_path_raises_its_training_reward(word_base, tmp_path):
    # the path a user takes, whole: a model directory, .jsonl files through `datasets`, the tokenizer's chat template,
    # the default suffix, math-verify on the last \boxed{} against the `#### N` gold. The base passes ~0.23 of its
    # samples and RL moves it fast (measured: steps 1-3 mean 0.23, steps 8-10 0.57); a prompt the base was not
    # trained on (measured without the chat template: steps 1-3 mean 0.09, steps 8-10 0.07), an answer never parsed
    # or a reward that inverts starts near 0 or does not rise.
    data = word_problems.write_data(tmp_path / "data")
    out = tmp_path / "run"
    run_main(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            str(word_base),
            "--dataset_name",
            str(data["train"]),
            "--eval_dataset",
            str(data["heldout"]),
            "--max_steps",
            "10",
            "--prompts_per_step",
            "16",
            "--learning_rate",
            "3e-4",
            "--beta",
            "0",
            "--num_threads",
            "1",
            "--eval_steps",
            "0",
            "--eval_prompts",
            "4",
            "--eval_samples",
            "1",
            "--paper_eval_samples",
            "0",
            "--save_steps",
            "0",
            "--seed",
            "0",
            "--output_dir",
            str(out),
        ]
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward_mean"] for row in rows if row["step"] >= 1]
    assert len(rewards) == 10
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    # a mean of three steps is over 192 binary rewards, 4 per prompt (sd ~0.04 at 0.23): every bound sits 2.5 or more
    # of those from what was measured, and a broken path fails one of them
    assert 0.12 <= first <= 0.4, rewards  # an inverted reward would start near 0.77
    assert last - first >= 0.15 and last >= 0.4, rewards


def test_a_cut_completion_never_passes_the_built_in_evaluation():
    # training scores a completion cut by --max_completion_length 0 (Task.score); the evaluation of the built-in verifier
    # must not count the same completion as a pass, or eval_pass@k and the training reward disagree on one sample
    from common.rl.verifiers import math_reward
    from common.tasks.task import Example, Task

    reward = lambda text, example: math_reward(text, example.answer)  # noqa: E731
    task = Task([], [], reward, reward, "rows")
    example = Example(0, "How many?", "13")
    texts = ["13\n\\boxed{13}\nand then some more text that ran into the limit", "\\boxed{13}"]
    assert task.score(texts, [example] * 2, [[1], [1]], [True, False], 1).total == [0.0, 1.0]
    assert task.eval_success(texts, [example] * 2, [[1], [1]], [True, False]) == [False, True]
