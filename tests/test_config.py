"""--config: YAML/JSON flag values under the command line, args.json as a config, errors that name the key."""

import json
from dataclasses import asdict

import pytest

from common.run.flags import build_parser, parse_args
from ra_rloo import Args


def _write(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_config_sets_defaults_and_the_command_line_wins(tmp_path):
    config = _write(
        tmp_path,
        "learning_rate: 1e-6\nnum_generations: 6\nreplay: none\nseed_buffer: no\ndataset_test_split: null\n",
    )
    args = parse_args(Args, ["--config", config, "--num_generations", "5"])
    assert args.learning_rate == 1e-6 and isinstance(
        args.learning_rate, float
    )  # YAML reads 1e-6 as a string
    assert (
        args.num_generations == 5
        and args.replay == "none"
        and args.seed_buffer is False
        and args.dataset_test_split is None
    )
    assert parse_args(Args, []).num_generations == 4  # no config: the dataclass defaults


def test_a_runs_args_json_repeats_the_run(tmp_path):
    original = parse_args(
        Args,
        [
            "--num_generations",
            "3",
            "--w_max",
            "2.5",
            "--output_dir",
            str(tmp_path / "run"),
            "--dataset_config",
            "main",
            "--report_to",
            "none",
            "--max_steps",
            "7",
        ],
    )
    saved = _write(tmp_path, json.dumps(asdict(original), indent=2), "args.json")
    repeated = parse_args(Args, ["--config", saved])
    assert asdict(repeated) == {**asdict(original), "config": saved}


@pytest.mark.parametrize(
    "text, message",
    [
        ("kk: 4\n", "key 'kk' is not a flag"),
        ("num_generations: 4.5\n", "key 'num_generations': expected int, got the YAML float 4.5"),
        ("num_generations: true\n", "key 'num_generations': expected int, got the YAML bool"),
        ("replay: sometimes\n", "key 'replay': 'sometimes' is not one of"),
        ("dataset_name: 5\n", "key 'dataset_name': expected str, got the YAML int 5 (quote it)"),
        ("learning_rate: fast\n", "key 'learning_rate': 'fast' is not a valid float"),
        ("num_generations: null\n", "key 'num_generations': null is not allowed"),
        (
            "prompts_per_step: 0\n",
            "key 'prompts_per_step': 0 must be >= 1",
        ),  # the flag's declared range
        ("temperature: .nan\n", "key 'temperature': nan must be a finite number >= 0; 0 = greedy"),
        ("learning_rate: -1e-6\n", "key 'learning_rate': -1e-06 must be >= 0"),
        (
            "eval_temperature: .inf\n",
            "key 'eval_temperature': inf must be a finite number >= 0; 0 = greedy",
        ),
        ("- k\n", "expected a mapping of flag names to values, got list"),
        ("k: [1\n", "cannot read it"),
    ],
)
def test_bad_configs_name_the_key_and_leave_a_run_dir_alone(tmp_path, text, message):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    config = _write(tmp_path, text)
    with pytest.raises(
        SystemExit, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        parse_args(
            Args, ["--config", config, "--output_dir", str(run), "--resume_from_checkpoint", "auto"]
        )
    assert (run / "metrics.jsonl").read_text() == '{"step": 0}\n' and sorted(
        p.name for p in run.iterdir()
    ) == ["metrics.jsonl"]


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(SystemExit, match="--config .*nope.yaml: cannot read it"):
        parse_args(Args, ["--config", str(tmp_path / "nope.yaml")])


def test_help_documents_the_config_flag():
    text = build_parser(Args).format_help()
    assert "--config" in text and "flags given on the command line" in " ".join(text.split())


def test_an_optional_bool_flag_reads_a_yaml_bool(tmp_path):
    # ada_seq's --scale_rewards is Optional[bool] (unset: the method's own default); its args.json holds true/false
    import ada_seq

    for text, expected in (("scale_rewards: false\n", False), ("scale_rewards: true\n", True)):
        assert (
            parse_args(ada_seq.Args, ["--config", _write(tmp_path, text)]).scale_rewards is expected
        )


def test_only_the_flags_the_user_set_count_as_given(tmp_path):
    # the flags typed (an abbreviation too) and the file's keys; every other flag keeps its default's place
    from common.run.flags import given_flags

    config = _write(tmp_path, "learning_rate: 1e-6\n")
    args = parse_args(Args, ["--config", config, "--num_gen", "5"])
    assert args.num_generations == 5
    assert given_flags(args) == {
        "learning_rate": f"--config {config}",
        "num_generations": "the command line",
    }
