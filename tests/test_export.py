"""The trained model a run leaves in <output_dir>/model/: it loads with transformers (LoRA: with peft's
AutoPeftModelForCausalLM), generates with its chat template and stops where training's generation stopped, carries a
model card, is named by the closing lines with its upload command, and is one of the run's files for the output
folder's checks."""

import json
import os
import re
import shutil
import signal
from types import SimpleNamespace

import pytest
import torch
from conftest import SHORT_RUN_FLAGS, run_main
from safetensors.torch import load_file

TINY = [
    "--max_steps",
    "2",
    "--prompts_per_step",
    "4",
    "--num_generations",
    "2",
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
    "--max_completion_length",
    "16",
    "--num_threads",
    "1",
    "--save_steps",
    "0",
]
TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
PROMPTS = ["14 9 3 t2\n", "5 7 2 t24\n"]  # Countdown prompts: the base answers "a op b = c" lines


@pytest.fixture
def chat_base(tiny_base, tmp_path):
    """The embedded base with a chat template (the bare prompt, as Countdown trains on): one to carry over."""
    from transformers import AutoTokenizer

    path = tmp_path / "chat-base"
    shutil.copytree(tiny_base, path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def _equals_id(path) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)("=", add_special_tokens=False).input_ids[-1]


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_finished_run_leaves_a_model_that_serves_as_trained(chat_base, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.run.clear_run import clear_run
    from common.run.run_folder import describe

    equals = _equals_id(chat_base)
    out = tmp_path / "run"
    run_main(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            str(chat_base),
            "--output_dir",
            str(out),
            *TINY,
            "--stop_token_ids",
            str(equals),
        ]
    )
    stdout = capsys.readouterr().out
    export = out / "model"
    model = AutoModelForCausalLM.from_pretrained(export)
    tokenizer = AutoTokenizer.from_pretrained(export)
    # the trained weights, as training holds them (fp32 master weights): the last checkpoint's
    assert model.dtype == torch.float32
    saved, trained = (
        load_file(str(export / "model.safetensors")),
        load_file(str(out / "checkpoint-2" / "model.safetensors")),
    )
    assert saved.keys() == trained.keys() and all(torch.equal(saved[k], trained[k]) for k in saved)
    # the chat template came along, and the generation config ends where training's generation ended
    assert tokenizer.chat_template == TEMPLATE
    assert model.generation_config.eos_token_id == [tokenizer.eos_token_id, equals]
    for prompt in PROMPTS:
        inputs = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        ids = model.generate(**inputs, max_new_tokens=24, do_sample=False)[
            0, inputs["input_ids"].shape[1] :
        ].tolist()
        assert ids[-1] == equals and ids.count(equals) == 1 and len(ids) < 24, tokenizer.decode(ids)
    # the card: method, paper, base, data, flags, the command, start and end pass@1 / pass@2 from metrics.jsonl
    card = (export / "README.md").read_text()
    rows = _rows(out)
    for needle in (
        "Replay-Augmented RLOO (RA-RLOO)",
        "`ra_rloo.py`",
        "Paper: Hao Xu",
        "`chat-base`",
        "embedded Countdown task",
        "- steps: 2 (of --max_steps 2)",
        "rlvr-sampling",
        f"| `--stop_token_ids` | `{equals}` |",
        "python ra_rloo.py --model_name_or_path chat-base",
        f"| held-out pass@1 | {rows[0]['eval_pass@1']:.3f} | {rows[-1]['eval_pass@1']:.3f} |",
        f"| held-out pass@2 | {rows[0]['eval_pass@2']:.3f} | {rows[-1]['eval_pass@2']:.3f} |",
    ):
        assert needle in card, needle
    assert "--output_dir" not in card and "library_name: transformers" in card
    assert str(tmp_path) not in card and "base_model" not in card  # a local base: no Hub id
    # the closing lines name it and the one command that uploads it; the plot command stays last
    assert f"  model:   {export}: a Hugging Face model" in stdout
    assert f"  upload:  hf upload <your-username>/run {export}" in stdout
    assert (
        stdout.rstrip("\n").splitlines()[-1].startswith("  curves:  python -m common.run.plot_run")
    )
    # it is the run's file: a fresh run refuses the folder (naming it), overwrite would not remove a model the run
    # starts from, and clearing the run removes it with the rest (a user's file stays)
    assert describe(out).endswith("checkpoint-2, model/")
    with pytest.raises(
        SystemExit, match=r"holds a run \(metrics\.jsonl to step 2, checkpoint-2, model/\)"
    ):
        run_main(
            ["ra_rloo.py", "--model_name_or_path", str(chat_base), "--output_dir", str(out), *TINY]
        )
    with pytest.raises(
        SystemExit,
        match=r"--overwrite_output_dir would remove --model_name_or_path .*model \(model "
        r"is a file of the run in",
    ):
        run_main(
            [
                "ra_rloo.py",
                "--model_name_or_path",
                str(export),
                "--output_dir",
                str(out),
                *TINY,
                "--overwrite_output_dir",
            ]
        )
    assert (export / "model.safetensors").exists()
    (out / "notes.txt").write_text("the user's own file")
    assert "model" in clear_run(out) and sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_lora_run_stopped_by_sigterm_leaves_its_adapter_and_the_merged_model(
    chat_base, tmp_path, monkeypatch
):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    import ra_rloo
    from common.run.process import GracefulStop

    metrics, steps = ra_rloo.ra_rloo_metrics, []

    def sigterm_at_step_2(*args):  # as a scheduler stops a job, during step 2
        steps.append(len(steps) + 1)
        if steps[-1] == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics(*args)

    monkeypatch.setattr(ra_rloo, "ra_rloo_metrics", sigterm_at_step_2)
    out = tmp_path / "lora"
    run_main(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            str(chat_base),
            "--output_dir",
            str(out),
            *TINY,
            "--max_steps",
            "5",
            "--lora_r",
            "4",
            "--lora_merged_export",
            "--save_dtype",
            "bfloat16",
            "--learning_rate",
            "1e-2",
        ]
    )
    assert GracefulStop.exit_status() == 128 + signal.SIGTERM and [
        r["step"] for r in _rows(out)
    ] == [0, 1, 2]
    assert (out / "checkpoint-2" / "trainer_state.pt").exists()
    export, merged = out / "model", out / "model-merged"
    adapter = AutoPeftModelForCausalLM.from_pretrained(export)
    assert adapter.peft_config["default"].r == 4
    assert {
        value.dtype for value in load_file(str(export / "adapter_model.safetensors")).values()
    } == {torch.bfloat16}
    assert "lm_head.weight" not in load_file(
        str(merged / "model.safetensors")
    )  # tied to the embedding: once
    plain = AutoModelForCausalLM.from_pretrained(merged)
    assert plain.dtype == torch.bfloat16  # config.json names the dtype the weights are stored in
    assert plain.generation_config.eos_token_id == [2]
    card = (export / "README.md").read_text()
    assert "library_name: peft" in card and "- steps: 2 (of --max_steps 5)" in card
    assert "AutoPeftModelForCausalLM.from_pretrained(path)" in card
    assert "library_name: transformers" in (merged / "README.md").read_text()
    assert "- weights: bfloat16" in card


def test_the_card_carries_hub_metadata_the_set_flags_and_no_local_path(tmp_path):
    import ra_rloo
    from common.run.export import model_card
    from common.run.flags import parse_args

    reward = tmp_path / "rewards" / "my_rewards.py"
    argv = ["--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--dataset_name", "openai/gsm8k"]
    argv += ["--reward_funcs", f"{reward}:accuracy,{tmp_path}/fmt.py:fmt"]
    argv += [
        "--output_dir",
        str(tmp_path / "out"),
        "--run_name",
        "gsm8k-ra-rloo",
        "--max_steps",
        "7",
    ]
    args = parse_args(ra_rloo.Args, argv)
    args.reward = "binary"  # as the launch resolves `auto`: not the user's, so not listed
    tokenizer = SimpleNamespace(convert_ids_to_tokens=lambda token: "<eos>", chat_template=None)
    card = model_card(args, "ra_rloo", ra_rloo.__doc__, tokenizer, [2], 2, adapter=False)
    header, _, body = card.removeprefix("---\n").partition("\n---\n")
    assert "base_model: Qwen/Qwen2.5-0.5B-Instruct" in header.splitlines()
    assert "datasets:\n- openai/gsm8k" in header and "library_name: transformers" in header
    assert "tags:\n- rlvr-sampling\n- ra_rloo\n" in header
    assert body.lstrip().startswith("# gsm8k-ra-rloo\n")
    assert str(tmp_path) not in card and "my_rewards.py:accuracy,fmt.py:fmt" in card
    assert "--reward " not in card and "`--max_steps` | `7`" in card
    launch = "accelerate launch --multi_gpu --num_machines 1 --num_processes 2 ra_rloo.py "
    assert launch + "--model_name_or_path Qwen/Qwen2.5-0.5B-Instruct" in card
    # a local base and data file of the training machine: named by their last part, no Hub id
    argv = ["--model_name_or_path", "/nowhere/models/base", "--dataset_name", "/nowhere/d.jsonl"]
    args = parse_args(ra_rloo.Args, [*argv, "--output_dir", str(tmp_path / "out")])
    card = model_card(args, "ra_rloo", ra_rloo.__doc__, tokenizer, [2], 1, adapter=False)
    assert "/nowhere" not in card and "base_model" not in card and "datasets:" not in card
    assert "python ra_rloo.py --model_name_or_path base --dataset_name d.jsonl" in card
    # and the card says so, naming the flags cut
    assert (
        "Local paths in it are cut to their last part (`--model_name_or_path`, `--dataset_name`): "
        "give the paths of those files and folders on your machine to run it." in card
    )
    args = parse_args(ra_rloo.Args, ["--output_dir", str(tmp_path / "out")])
    card = model_card(args, "ra_rloo", ra_rloo.__doc__, tokenizer, [2], 1, adapter=False)
    assert "Local paths" not in card  # nothing cut: it runs as written


@pytest.mark.parametrize("script", sorted(SHORT_RUN_FLAGS))
def test_every_script_exports_its_model(short_run, script):
    """Each script's short run leaves `model/`: the weights (as its last checkpoint holds them),
    the tokenizer, a generation config that ends where the run's generation ended, and the card
    naming the script and its run."""
    out, stdout = short_run(script)
    export = out / "model"
    assert export.is_dir(), f"{script} left no {export}"
    files = {path.name for path in export.iterdir()}
    wanted = {"config.json", "model.safetensors", "generation_config.json", "README.md"}
    assert wanted | {"tokenizer.json", "tokenizer_config.json"} <= files, files
    # the ids the run printed before its first step: "... token ids 2 '</s>' (...), ..."
    line = next(line for line in stdout.splitlines() if "generation stops at token ids" in line)
    end_ids = [int(token) for token in re.findall(r"(\d+) '", line)]
    generation = json.loads((export / "generation_config.json").read_text())
    assert end_ids and generation["eos_token_id"] == end_ids, (generation, line)
    card = (export / "README.md").read_text()
    rows = _rows(out)
    steps = rows[-1]["step"]
    for needle in (f"`{script}`", f"- steps: {steps} (of --max_steps {steps})", "rlvr-sampling"):
        assert needle in card, needle
    # the trained fp32 weights, bit for bit (the shared export code loads them with transformers in
    # the test above; here only what each script hands it)
    saved = load_file(str(export / "model.safetensors"))
    trained = load_file(str(out / f"checkpoint-{steps}" / "model.safetensors"))
    assert saved.keys() == trained.keys()
    assert all(saved[k].dtype == torch.float32 and torch.equal(saved[k], trained[k]) for k in saved)


def test_a_home_relative_path_is_cut_like_an_absolute_one():
    """`~/...` names a file of the training machine's home as much as `/...` does."""
    from common.run.export import shareable

    assert shareable("~/data/d.jsonl") == "d.jsonl"
    assert shareable("~/rewards/mine.py:accuracy,/abs/fmt.py:fmt") == "mine.py:accuracy,fmt.py:fmt"
    assert shareable("openai/gsm8k") == "openai/gsm8k"  # a Hub id stays
