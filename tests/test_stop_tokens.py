"""Generation stops at the tokenizer's EOS, at every id of the model's generation_config `eos_token_id` (a chat
model's end-of-turn token) and at --stop_token_ids; the run's first lines name them all."""

import json
import shutil

import pytest
from conftest import SHORT_RUN_FLAGS, run_main
from transformers import GenerationConfig

from common.generation.hf import HFGenerator, SamplingConfig, end_token_ids
from common.model.policy import load_policy

PROMPTS = [
    "14 9 3 t2\n",
    "5 7 2 t24\n",
    "8 3 6 t30\n",
    "9 4 1 t5\n",
]  # Countdown prompts: two-line answers + EOS
GREEDY = SamplingConfig(max_new_tokens=24, temperature=0.0, logprobs=False)


def test_an_end_of_turn_id_of_the_generation_config_ends_generation(tiny_base, tmp_path):
    # the embedded base answers in two lines then EOS; a generation_config that lists the newline beside EOS (as a
    # chat model lists its end-of-turn token) must end every answer after its first line, finish reason "stop"
    model, tok = load_policy(tiny_base)
    prompts = [tok(text, add_special_tokens=False).input_ids for text in PROMPTS]
    newline = tok("\n", add_special_tokens=False).input_ids[-1]
    free = HFGenerator(model, tok).generate(prompts, 1, GREEDY)
    assert all(
        ids.count(newline) >= 2 for ids in free.completion_ids
    )  # past the first line without the list
    chat = tmp_path / "chat"
    shutil.copytree(tiny_base, chat)
    GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=[tok.eos_token_id, newline],
        pad_token_id=tok.pad_token_id,
    ).save_pretrained(chat)
    model, tok = load_policy(str(chat))
    lines = []
    generator = HFGenerator(model, tok)
    assert (
        generator.end_ids
        == end_token_ids(tok, model, (), lines.append)
        == [tok.eos_token_id, newline]
    )
    assert lines == [
        f"generation stops at token ids {tok.eos_token_id} '</s>' (the tokenizer's EOS), {newline} "
        "'\\n' (the model's generation_config)"
    ]
    cut = generator.generate(prompts, 1, GREEDY)
    for ids, reason, whole in zip(cut.completion_ids, cut.finish_reasons, free.completion_ids):
        assert reason == "stop" and ids == whole[: whole.index(newline) + 1]
    with pytest.raises(
        SystemExit, match=rf"^--stop_token_ids {len(tok) + 5}: not a token id of this model"
    ):
        end_token_ids(tok, model, [len(tok) + 5])


def test_stop_token_ids_flag_ends_generation_and_is_named_first(tiny_base, tmp_path, capsys):
    _, tok = load_policy(tiny_base)
    equals = tok("=", add_special_tokens=False).input_ids[-1]
    run_main(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            "1",
            "--prompts_per_step",
            "4",
            "--prompt_pool",
            "8",
            "--eval_prompts",
            "4",
            "--eval_samples",
            "2",
            "--eval_train_prompts",
            "0",
            "--paper_eval_samples",
            "0",
            "--num_threads",
            "1",
            "--eval_steps",
            "0",
            "--log_samples_every",
            "1",
            "--stop_token_ids",
            str(equals),
        ]
    )
    out = capsys.readouterr().out
    assert (
        f"generation stops at token ids {tok.eos_token_id} '</s>' (the tokenizer's EOS), {equals} '=' "
        "(--stop_token_ids)" in out.split("step 0 (starting policy)")[0]
    )
    fresh = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    fresh = [row for row in fresh if row["kind"] == "fresh"]
    assert fresh and all(
        row["completion"].endswith("=") and row["completion"].count("=") == 1 for row in fresh
    )
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])
    assert row["clipped_ratio"] == 0.0  # every sample ended at the stop token: finish reason "stop"


@pytest.mark.parametrize("script", sorted(SHORT_RUN_FLAGS))
def test_every_script_names_its_stop_tokens_before_the_first_step(short_run, script):
    _, stdout = short_run(script)
    head = stdout.split("step 0 (starting policy)")[0]
    assert "generation stops at token ids 2 '</s>' (the tokenizer's EOS)\n" in head
