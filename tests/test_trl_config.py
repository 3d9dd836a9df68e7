"""A TRL GRPOConfig file through --config (common/run/trl_config.py): it runs a script, a method
the script does not implement is refused in one line, this project's own flag names keep their
meaning beside TRL's keys, every key of TRL's `grpo` command has an entry, and the docs' table is
the code's."""

import json
import re
from dataclasses import asdict

import pytest
from conftest import run_main

from common.run import trl_config
from common.run.flags import parse_args

# written as a TRL user writes one for `trl grpo --config`, keys from TRL's GRPOConfig, TrainingArguments,
# ScriptArguments and ModelConfig documentation; the dataset, the rewards module and the folders filled in below
TRL_USER_CONFIG = """\
model_name_or_path: {model}
dataset_name: {data}
reward_funcs:
  - trl_user_rewards.length_reward
  - trl_user_rewards.digit_reward
reward_weights: [0.5, 1.0]
output_dir: {out}
bf16: true
learning_rate: 1.0e-5
warmup_steps: 1
max_steps: 2
per_device_train_batch_size: 4
gradient_accumulation_steps: 1
num_generations: 2
max_completion_length: 8
temperature: 1.0
top_p: 1.0
beta: 0.0
epsilon: 0.2
loss_type: dr_grpo
scale_rewards: false
mask_truncated_completions: true
gradient_checkpointing: false
use_vllm: false
eval_strategy: "no"
save_strategy: "no"
logging_steps: 1
report_to: none
seed: 42
push_to_hub: false
hub_model_id: me/tiny-grpo
"""

REWARDS = """
def length_reward(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def digit_reward(completions, **kwargs):
    return [float(any(ch.isdigit() for ch in c)) for c in completions]
"""


def _write(tmp_path, text, name="grpo_config.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _prompt_rows(path, n=20):
    rows = [{"prompt": f"{i} {i + 1} t{2 * i + 1}\n", "answer": str(2 * i + 1)} for i in range(n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_trl_grpo_config_runs_the_script(tiny_base, tmp_path, monkeypatch, capsys):
    (tmp_path / "trl_user_rewards.py").write_text(REWARDS)
    # TRL's CLI imports a dotted reward path from the working folder
    monkeypatch.syspath_prepend(str(tmp_path))
    data, out = _prompt_rows(tmp_path / "train.jsonl"), tmp_path / "Tiny-GRPO"
    config = _write(tmp_path, TRL_USER_CONFIG.format(model=tiny_base, data=data, out=out))
    # the run kept tiny by flags of this project's own (the command line wins over the file)
    tiny = "--eval_prompts 4 --eval_samples 1 --eval_train_prompts 0 --paper_eval_samples 0 --num_threads 1"
    run_main(["ra_rloo.py", "--config", config, *tiny.split()])
    lines = capsys.readouterr().out.splitlines()
    saved = json.loads((out / "args.json").read_text())
    batch = [saved[flag] for flag in ("dtype", "prompts_per_step", "micro_batch_size")]
    assert batch == ["bfloat16", 2, 4]
    assert saved["reward_funcs"] == "trl_user_rewards:length_reward,trl_user_rewards:digit_reward"
    assert (saved["reward_weights"], saved["eval_steps"], saved["save_steps"]) == ("0.5,1", 0, 0)
    assert (saved["seed"], saved["warmup_steps"], saved["max_completion_length"]) == (42, 1, 8)
    # the file's method keys as written (ra_rloo.py's defaults are beta 0.05, num_generations 4)
    assert (saved["beta"], saved["num_generations"]) == (0.0, 2)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "loss" in row] == [1, 2]
    # the first lines: what became of TRL's keys, and how the prompts reach the model
    assert lines[0].startswith(
        f"--config {config}: TRL keys read as flags: reward_funcs -> --reward_funcs "
    )
    assert "bf16 -> --dtype bfloat16" in lines[0]
    assert (
        "per_device_train_batch_size, gradient_accumulation_steps -> --prompts_per_step 2 --micro_batch_size 4"
        in lines[0]
    )
    assert "eval_strategy -> --eval_steps 0; save_strategy -> --save_steps 0" in lines[0]
    assert lines[1] == (
        f"--config {config}: TRL keys as ra_rloo.py does already: top_p 1, epsilon 0.2, "
        "loss_type dr_grpo, scale_rewards false"
    )
    assert (
        lines[2]
        == f"--config {config}: TRL keys ignored (no effect here): logging_steps, push_to_hub, hub_model_id"
    )
    assert (
        "prompts: column 'prompt' (found by name; --prompt_column to choose), 20 rows as text: text is used as it "
        "is (the tokenizer has no chat template); added: nothing"
    ) in lines


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "loss_type: grpo\n",
            "key 'loss_type': grpo is refused: ra_rloo.py implements loss_type dr_grpo",
        ),
        (
            "scale_rewards: batch\n",
            "key 'scale_rewards': batch is refused: ra_rloo.py implements scale_rewards none",
        ),
        (
            "num_iterations: 2\n",
            "key 'num_iterations': 2 is refused: ra_rloo.py has no --num_iterations (accepted: `1`)",
        ),
        (
            "top_p: 0.9\n",
            "key 'top_p': 0.9 is refused: training samples the model's full distribution",
        ),
        (
            "vllm_mode: server\n",
            "key 'vllm_mode': server is refused: vLLM runs in the training process",
        ),
        ("fp16: true\n", "key 'fp16': float16 is not a compute dtype here"),
        (
            "per_device_train_batch_size: 3\n",
            "key 'per_device_train_batch_size': 3 x 1 x 1 process(es) = 3 completions "
            "a step, not a multiple of num_generations 4",
        ),
        ("max_steps: -1\nnum_train_epochs: 3\n", "key 'max_steps': -1 trains by num_train_epochs"),
        (
            "per_device_train_batch_size: 8\nprompts_per_step: 3\n",
            "keys 'per_device_train_batch_size' and "
            "'prompts_per_step' set --prompts_per_step to 2 and 3",
        ),
        (
            "use_liger_loss: true\n",
            "key 'use_liger_loss' is not a flag of this script nor a TRL GRPOConfig key",
        ),
    ],
)
def test_a_method_the_script_does_not_implement_is_refused_in_one_line(tmp_path, text, message):
    from ra_rloo import Args

    with pytest.raises(SystemExit) as stop:
        parse_args(Args, ["--config", _write(tmp_path, text)])
    assert message in str(stop.value) and "\n" not in str(stop.value)


def test_trl_method_and_batch_keys_become_the_flags_they_name(tmp_path):
    # beta 0 (no KL term) where the script's default is 0.05; 6 x 2 completions in groups of 3
    from ra_rloo import Args

    text = (
        "beta: 0.0\nnum_generations: 3\n"
        "per_device_train_batch_size: 6\ngradient_accumulation_steps: 2\n"
    )
    args = parse_args(Args, ["--config", _write(tmp_path, text)])
    got = (args.beta, args.num_generations, args.prompts_per_step, args.micro_batch_size)
    assert got == (0.0, 3, 4, 6)


def test_transformers_warmup_ratio_goes_to_warmup_ratio(tmp_path):
    # transformers 5 reads a warmup_steps below 1 as a ratio of the run: --warmup_ratio where the script has it
    from ra_rloo import Args

    config = _write(tmp_path, "warmup_steps: 0.1\n")
    if "warmup_ratio" in Args.__dataclass_fields__:
        assert parse_args(Args, ["--config", config]).warmup_ratio == 0.1
    else:
        with pytest.raises(
            SystemExit,
            match="key 'warmup_steps': 0.1 needs --warmup_ratio, which ra_rloo.py has not",
        ):
            parse_args(Args, ["--config", config])


@pytest.mark.parametrize(
    "script, extra",
    [
        ("ra_rloo", []),
        ("ps_grpo", ["--mode", "text"]),
        ("pros_ppo", []),
        ("ada_seq", []),
        ("ada_est", []),
    ],
)
def test_own_flag_names_keep_their_meaning_beside_trl_keys(tmp_path, script, extra, capsys):
    # a run's args.json (this project's names, several of them TRL's too: dtype, lora_r, reward_funcs,
    # save_total_limit...) with TRL-only keys added reads back as it was; the TRL-only keys are named
    import importlib

    args = importlib.import_module(script).Args
    original = parse_args(args, extra)
    config = _write(
        tmp_path,
        json.dumps({**asdict(original), "push_to_hub": True, "logging_steps": 5}),
        "args.json",
    )
    assert asdict(parse_args(args, ["--config", config])) == {**asdict(original), "config": config}
    assert capsys.readouterr().out.splitlines() == [
        f"--config {config}: TRL keys ignored (no effect here): push_to_hub, logging_steps"
    ]


def test_every_key_of_trls_grpo_command_has_an_entry():
    pytest.importorskip("trl")  # benchmarks/requirements.txt installs it
    import dataclasses

    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig
    from trl.scripts.grpo import GRPOScriptArguments

    keys = {
        f.name
        for kind in (GRPOConfig, ModelConfig, GRPOScriptArguments, DatasetMixtureConfig)
        for f in dataclasses.fields(kind)
    }
    assert keys - set(trl_config.TABLE) == set()


def test_the_docs_table_is_the_code_table():
    text = trl_config.DOCS.read_text()
    assert trl_config.docs_block(text) == trl_config.markdown(), (
        "docs/custom_task.md: run `python -m common.run.trl_config --write_docs`"
    )
    documented = set(re.findall(r"`(\w+)`", trl_config.docs_block(text).split("\n\n")[0]))
    assert set(trl_config.TABLE) <= documented


def test_trl_names_on_the_command_line_go_through_the_same_table(capsys):
    from ra_rloo import Args

    argv = "--bf16 --per_device_train_batch_size 8 --logging_steps 5 --eval_strategy no --top_p 1"
    args = parse_args(Args, [*argv.split(), "--max_steps", "1"])
    assert (args.dtype, args.micro_batch_size, args.prompts_per_step) == ("bfloat16", 8, 2)
    assert (args.eval_steps, args.max_steps, args.log_samples_every) == (0, 1, None)
    assert args._given["dtype"] == args._given["prompts_per_step"] == "the command line"
    assert capsys.readouterr().out.splitlines() == [
        "the command line: TRL flags became: bf16 -> --dtype bfloat16; per_device_train_batch_size "
        "-> --prompts_per_step 2 --micro_batch_size 8; eval_strategy -> --eval_steps 0",
        "the command line: TRL flags as ra_rloo.py does already: top_p 1",
        "the command line: TRL flags ignored (no effect here): logging_steps",
    ]
    refused = {
        "--loss_type grpo": "--loss_type: grpo is refused: ra_rloo.py implements loss_type dr_grpo "
        "(its Args.trl_equivalents)",
        "--per_device_train_batch_size 8 --prompts_per_step 3": "--per_device_train_batch_size "
        "and --prompts_per_step set --prompts_per_step to 2 and 3: keep one",
        "--learning_rte 1e-6": "--learning_rte: not a flag of ra_rloo.py nor a TRL GRPOConfig "
        "name; the nearest is --learning_rate",
    }
    for typed, message in refused.items():
        with pytest.raises(SystemExit) as stop:
            parse_args(Args, typed.split())
        assert str(stop.value) == message
    assert capsys.readouterr().err == ""  # no usage printed


def test_every_problem_is_reported_at_once_each_on_its_own_key(tmp_path):
    # num_iterations 2 is what ra_rloo.py cannot do; epsilon 0.2 would be accepted beside
    # num_iterations 1, so it is not blamed
    from ra_rloo import Args

    config = _write(tmp_path, "num_iterations: 2\nepsilon: 0.2\ntop_p: 0.9\nnum_generations: 4.5\n")
    with pytest.raises(SystemExit) as stop:
        parse_args(Args, ["--config", config, "--max_steps", "0", "--delta", "2", "--frobnicate"])
    lines = str(stop.value).splitlines()
    starts = [
        f"--config {config}: key 'num_iterations': 2 is refused",
        f"--config {config}: key 'top_p': 0.9 is refused",
        f"--config {config}: key 'num_generations': expected int",
        "--frobnicate: not a flag of ra_rloo.py",
        "--max_steps 0: must be >= 1",
    ]
    assert len(lines) == len(starts), lines
    assert all(line.startswith(start) for line, start in zip(lines, starts)), lines
    assert not [line for line in lines if "epsilon" in line or "delta" in line], lines


def test_a_scripts_own_combinations_are_reported_with_the_other_problems():
    # ps_grpo's validate() finds two combinations it refuses; a range problem stands beside them
    from ps_grpo import Args

    argv = ["--low", "0.9", "--high", "0.1", "--mode", "text", "--env_numbers", "3"]
    with pytest.raises(SystemExit) as stop:
        parse_args(Args, [*argv, "--learning_rate", "-1"])
    lines = str(stop.value).splitlines()
    assert lines == [
        "--learning_rate -1.0: must be >= 0",
        "--low 0.9 --high 0.1: need low <= high",
        "--env_numbers 3: applies to --mode multiturn only",
    ], lines


def test_num_train_epochs_beside_max_steps_is_ignored_on_the_command_line_as_in_a_file(
    tmp_path, capsys
):
    from ra_rloo import Args

    args = parse_args(Args, ["--num_train_epochs", "1", "--max_steps", "2"])
    assert args.max_steps == 2
    assert capsys.readouterr().out.splitlines() == [
        "the command line: TRL flags ignored (no effect here): num_train_epochs"
    ]
    config = _write(tmp_path, "num_train_epochs: 1\n")  # max_steps on the command line
    assert parse_args(Args, ["--config", config, "--max_steps", "2"]).max_steps == 2
    with pytest.raises(SystemExit, match="^--num_train_epochs: this script counts policy updates"):
        parse_args(Args, ["--num_train_epochs", "1"])


def test_a_trl_file_names_the_trl_defaults_that_differ_here_for_the_keys_it_leaves_out(
    tmp_path, capsys
):
    from ra_rloo import Args

    config = _write(tmp_path, "per_device_train_batch_size: 8\nlearning_rate: 1.0e-6\n")
    parse_args(Args, ["--config", config, "--seed", "42"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "leaves out" in line]
    # learning_rate is in the file and seed on the command line: neither is named
    assert lines == [
        f"--config {config}: keys it leaves out keep ra_rloo.py's defaults, not TRL GRPOConfig's: "
        "beta 0.05 (TRL 0), num_generations 4 (TRL 8), max_completion_length 48 (TRL 512), "
        "lr_scheduler_type warmup_constant (TRL linear), warmup_steps 5 (TRL 0), "
        "gradient_checkpointing false (TRL true)"
    ]
    # a run's args.json (no TRL-only key) gets no such line
    parse_args(Args, ["--config", _write(tmp_path, "max_steps: 3\n", "args.json")])
    assert "leaves out" not in capsys.readouterr().out


def test_every_unknown_flag_and_misspelt_trl_name_is_reported_with_its_nearest_name(tmp_path):
    from ra_rloo import Args

    argv = "--per_device_train_batchsize 8 --frobnicate --lerning_rate 3 --num_generatons 2"
    with pytest.raises(SystemExit) as stop:
        parse_args(Args, argv.split())
    assert str(stop.value).splitlines() == [
        "--per_device_train_batchsize: not a flag of ra_rloo.py nor a TRL GRPOConfig name; the "
        "nearest is --per_device_train_batch_size",
        "--frobnicate: not a flag of ra_rloo.py nor a TRL GRPOConfig name (--help lists every "
        "flag)",
        "--lerning_rate: not a flag of ra_rloo.py nor a TRL GRPOConfig name; the nearest is "
        "--learning_rate",
        "--num_generatons: not a flag of ra_rloo.py nor a TRL GRPOConfig name; the nearest is "
        "--num_generations",
    ]
    # a file's keys likewise, TRL's spellings among the candidates
    config = _write(tmp_path, "per_device_train_batchsize: 8\nmax_step: 3\n")
    with pytest.raises(SystemExit) as stop:
        parse_args(Args, ["--config", config])
    lines = str(stop.value).splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("; the nearest TRL key is per_device_train_batch_size"), lines
    assert lines[1].endswith("; the nearest flag is --max_steps"), lines


@pytest.mark.parametrize(
    "text, want",
    [
        # TRL's default (correction true) with vLLM: on, sequence_mask, clip_max 3, no clip_min
        ("use_vllm: true\n", (True, "sequence_mask", 3.0, None)),
        # HF generate: off unless asked
        ("use_vllm: false\n", (False, "sequence_mask", 3.0, None)),
        (
            "use_vllm: true\nvllm_importance_sampling_correction: false\n",
            (False, "sequence_mask", 3.0, None),
        ),
        (
            "use_vllm: true\nvllm_importance_sampling_correction: true\n"
            "vllm_importance_sampling_mode: token_truncate\n"
            "vllm_importance_sampling_clip_max: 2.0\nvllm_importance_sampling_clip_min: 0.5\n",
            (True, "token_truncate", 2.0, 0.5),
        ),
        # TRL ignores the correction without vLLM (its GRPOConfig default is true): off here too
        ("vllm_importance_sampling_correction: true\n", (False, "sequence_mask", 3.0, None)),
        # the deprecated cap is clip_max; null clip_max: no upper bound
        ("use_vllm: true\nvllm_importance_sampling_cap: 1.5\n", (True, "sequence_mask", 1.5, None)),
        (
            "use_vllm: true\nvllm_importance_sampling_clip_max: null\n",
            (True, "sequence_mask", None, None),
        ),
    ],
)
def test_trl_sampler_correction_keys_set_the_flags(tmp_path, text, want):
    from ra_rloo import Args

    args = parse_args(Args, ["--config", _write(tmp_path, text)])
    got = (
        args.vllm_importance_sampling_correction,
        args.vllm_importance_sampling_mode,
        args.vllm_importance_sampling_clip_max,
        args.vllm_importance_sampling_clip_min,
    )
    assert got == want


def test_a_sampler_correction_clip_min_above_clip_max_is_refused(tmp_path):
    from ra_rloo import Args

    text = "vllm_importance_sampling_clip_min: 3.0\nvllm_importance_sampling_clip_max: 2.0\n"
    with pytest.raises(SystemExit, match="--vllm_importance_sampling_clip_min 3.0: must be below"):
        parse_args(Args, ["--config", _write(tmp_path, text)])


def test_a_sampler_correction_clip_min_equal_to_clip_max_is_refused(tmp_path):
    from ra_rloo import Args

    # an empty interval [2, 2): token_mask and sequence_mask would zero every ratio
    text = "vllm_importance_sampling_clip_min: 2.0\nvllm_importance_sampling_clip_max: 2.0\n"
    with pytest.raises(SystemExit, match="--vllm_importance_sampling_clip_min 2.0: must be below"):
        parse_args(Args, ["--config", _write(tmp_path, text)])
