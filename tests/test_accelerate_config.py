"""`accelerate config` chose FSDP or DeepSpeed: FSDP is mapped onto the scripts' own --fsdp and
accelerate's plugin is kept out of the Accelerator; DeepSpeed stops before anything loads."""

import json
import os
import re
import sys

import pytest
from conftest import ROOT, run_script

from common.run.accelerate_env import (
    accelerate_sharding,
    collapsed_launch,
    resolve_accelerate_sharding,
)
from common.run.launch import resolve_accelerate_precision

SCRIPTS = ("ra_rloo.py", "ps_grpo.py", "pros_ppo.py", "ada_seq.py", "ada_est.py")
# what accelerate 1.x's launcher exports (accelerate/utils/launch.py: prepare_multi_gpu_env for --use_fsdp,
# prepare_deepspeed_cmd_env for --use_deepspeed), here as `accelerate launch --use_fsdp [--fsdp_version 2]` sets it
FSDP_V1 = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "1",
    "FSDP_SHARDING_STRATEGY": "FULL_SHARD",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_OFFLOAD_PARAMS": "false",
    "FSDP_MIN_NUM_PARAMS": "100000000",
    "FSDP_FORWARD_PREFETCH": "false",
    "FSDP_USE_ORIG_PARAMS": "true",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
    "FSDP_SYNC_MODULE_STATES": "true",
    "FSDP_ACTIVATION_CHECKPOINTING": "false",
    "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "false",
    "ACCELERATE_MIXED_PRECISION": "no",
}
FSDP_V2 = {**FSDP_V1, "FSDP_VERSION": "2"}
DEEPSPEED = {
    "ACCELERATE_USE_DEEPSPEED": "true",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
    "ACCELERATE_CONFIG_DS_FIELDS": "",
    "ACCELERATE_MIXED_PRECISION": "no",
}
SMALL = [
    "--prompt_pool",
    "48",
    "--prompts_per_step",
    "8",
    "--eval_prompts",
    "8",
    "--eval_samples",
    "4",
    "--max_completion_length",
    "20",
    "--micro_batch_size",
    "8",
    "--num_threads",
    "1",
    "--eval_steps",
    "0",
    "--max_steps",
    "1",
]


# ---------------- detection and mapping (fake environments) ----------------
@pytest.mark.parametrize("env", [FSDP_V1, FSDP_V2], ids=["fsdp_v1", "fsdp_v2"])
def test_fsdp_any_version_maps_onto_our_fsdp_and_leaves_accelerate_without_it(env):
    environ, logs = dict(env), []
    assert accelerate_sharding(environ) == "fsdp"
    assert resolve_accelerate_sharding(False, environ, logs.append) is True
    assert "ACCELERATE_USE_FSDP" not in environ  # what Accelerator() and transformers read: gone
    assert accelerate_sharding(environ) is None
    assert {
        k: v for k, v in env.items() if k != "ACCELERATE_USE_FSDP"
    } == environ  # nothing else touched
    assert len(logs) == 1 and "ACCELERATE_USE_FSDP" in logs[0] and "--fsdp" in logs[0]
    assert f"FSDP_VERSION={env['FSDP_VERSION']}" in logs[0]


def test_fsdp_logs_on_rank_zero_only_and_reads_truth_values():
    logs = []
    assert (
        resolve_accelerate_sharding(False, {**FSDP_V2, "RANK": "1"}, logs.append) is True
        and logs == []
    )
    for value in (
        "True",
        "1",
        "yes",
    ):  # accelerate's own helpers write "True" (enable_fsdp_ram_efficient_loading)
        assert accelerate_sharding({"ACCELERATE_USE_FSDP": value}) == "fsdp"
    for value in ("false", "0", ""):
        assert (
            accelerate_sharding({"ACCELERATE_USE_FSDP": value, "ACCELERATE_USE_DEEPSPEED": value})
            is None
        )


def test_deepspeed_stops_with_a_message_naming_the_variable_and_fsdp():
    assert accelerate_sharding(DEEPSPEED) == "deepspeed"
    assert accelerate_sharding({**DEEPSPEED, **FSDP_V2}) == "deepspeed"  # never run half of it
    with pytest.raises(SystemExit, match=r"ACCELERATE_USE_DEEPSPEED.*without DeepSpeed.*--fsdp"):
        resolve_accelerate_sharding(False, dict(DEEPSPEED), print)


@pytest.mark.parametrize("fsdp", [False, True])
def test_no_accelerate_sharding_keeps_the_flag_and_the_environment(fsdp):
    environ, logs = {"ACCELERATE_MIXED_PRECISION": "bf16", "FSDP_VERSION": "2", "RANK": "0"}, []
    assert accelerate_sharding(environ) is None
    assert resolve_accelerate_sharding(fsdp, environ, logs.append) is fsdp
    assert (
        environ == {"ACCELERATE_MIXED_PRECISION": "bf16", "FSDP_VERSION": "2", "RANK": "0"}
        and logs == []
    )


def test_the_accelerator_built_after_it_has_no_fsdp_plugin(monkeypatch):
    # Accelerator() builds FullyShardedDataParallelPlugin() whenever ACCELERATE_USE_FSDP is true (and on CPU that
    # plugin even refuses to exist); after the mapping it builds none
    import accelerate.accelerator as accelerator_module
    from accelerate.state import AcceleratorState, GradientState

    built = []

    class Spy(accelerator_module.FullyShardedDataParallelPlugin):
        def __init__(self, *a, **k):
            built.append(1)
            super().__init__(*a, **k)

    monkeypatch.setattr(accelerator_module, "FullyShardedDataParallelPlugin", Spy)
    for key, value in FSDP_V2.items():
        monkeypatch.setenv(key, value)
    try:
        try:  # the control: without the mapping accelerate takes the plugin from the environment
            accelerator_module.Accelerator(cpu=True)
        except RuntimeError:  # no GPU: the plugin refuses CPU-only machines
            pass
        assert built == [1]
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        assert resolve_accelerate_sharding(False, os.environ, lambda _: None) is True
        accelerator = accelerator_module.Accelerator(cpu=True)
        assert built == [1] and getattr(accelerator.state, "fsdp_plugin", None) is None
        assert accelerator.distributed_type.value != "FSDP"
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


# ---------------- the scripts ----------------
def _run(args, env):
    import subprocess

    full = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **env)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=full
    )


# Runs each argv as `python <argv>` would (as __main__), one after another in one interpreter (the
# imports paid once): prints, per script, SAID [script, its SystemExit message, another exception's type]
SAY_HOW_IT_STOPPED = """
import json, os, runpy, sys
sys.path.insert(0, os.getcwd())
for argv in json.loads(sys.argv[1]):
    sys.argv, said = argv, [argv[0], None, None]
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        said[1] = stop.code if isinstance(stop.code, str) else f"exit status {stop.code}"
    except BaseException as error:
        said[2] = type(error).__name__
    print("SAID", json.dumps(said), flush=True)
"""


def test_deepspeed_launch_stops_every_script_before_loading(tmp_path):
    # a model path that does not exist: a script that went on to load it would fail with another message
    runs = [
        [
            script,
            "--model_name_or_path",
            str(tmp_path / "no-model"),
            "--output_dir",
            str(tmp_path / script),
            *SMALL,
        ]
        for script in SCRIPTS
    ]
    r = _run(["-c", SAY_HOW_IT_STOPPED, json.dumps(runs)], DEEPSPEED)
    said = [json.loads(line[5:]) for line in r.stdout.splitlines() if line.startswith("SAID [")]
    assert [script for script, *_ in said] == list(SCRIPTS), r.stdout[-2000:] + r.stderr[-3000:]
    for script, message, error in said:
        # a clean SystemExit message (what `python <script>` prints without a traceback), not a crash
        assert error is None and message is not None, (script, error, r.stderr[-3000:])
        assert "ACCELERATE_USE_DEEPSPEED" in message and "--fsdp" in message, (script, message)
        # stopped before the output dir (and args.json) was written
        assert not (tmp_path / script).exists(), script


def _assert_mapped(stdout: str, out):
    assert "ACCELERATE_USE_FSDP" in stdout and "mapped onto this script's --fsdp" in stdout, stdout[
        -3000:
    ]
    assert json.loads((out / "args.json").read_text())["fsdp"] is True
    assert (
        out / "checkpoint-1" / "shards_rank0.pt"
    ).exists()  # written only for a model our FSDP2 sharded
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]


def test_accelerate_launch_use_fsdp_runs_ra_rloo_with_our_fsdp(tiny_base, tmp_path):
    # the real launcher (`accelerate config` with FSDP is the same as these flags): one process, FSDP2 asked for
    launch = [
        "-m",
        "accelerate.commands.launch",
        "--use_fsdp",
        "--fsdp_version",
        "2",
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--main_process_port",
        "0",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    out = tmp_path / "ra"
    r = run_script(
        [*launch, "ra_rloo.py", "--model_name_or_path", tiny_base, "--output_dir", str(out), *SMALL]
    )
    _assert_mapped(r.stdout, out)


def test_fsdp_v1_environment_runs_ada_seq_with_our_fsdp(tiny_base, tmp_path):
    # a plain single process with what accelerate exports for FSDP v1 (the default of `accelerate config`)
    out = tmp_path / "ada_seq"
    r = run_script(
        ["ada_seq.py", "--model_name_or_path", tiny_base, "--output_dir", str(out), *SMALL],
        env_extra=FSDP_V1,
    )
    _assert_mapped(r.stdout, out)
    assert r.stdout.count("ACCELERATE_USE_FSDP") == 1


def test_accelerate_mixed_precision_maps_bf16_onto_dtype_and_stops_on_fp16():
    # left in the environment, accelerator.prepare would autocast the DDP-wrapped policy's forward only (not the
    # reference, the critic's copy or vLLM): bf16 becomes our --dtype bfloat16, the variable is consumed
    environ, logs = {"ACCELERATE_MIXED_PRECISION": "bf16", "RANK": "0"}, []
    assert resolve_accelerate_precision("float32", environ, logs.append) == "bfloat16"
    assert "ACCELERATE_MIXED_PRECISION" not in environ and "--dtype bfloat16" in logs[0]
    environ, logs = {"ACCELERATE_MIXED_PRECISION": "no"}, []
    assert (
        resolve_accelerate_precision("float32", environ, logs.append) == "float32" and not environ
    )
    assert logs == ["compute dtype float32 (--dtype's default)"]  # the source, every run
    assert (
        resolve_accelerate_precision("bfloat16", {}, logs.append, "the command line") == "bfloat16"
    )
    assert logs[-1] == "compute dtype bfloat16 (--dtype, set on the command line)"
    for mode in ("fp16", "fp8"):
        with pytest.raises(
            SystemExit, match=f"ACCELERATE_MIXED_PRECISION={mode}.*--dtype bfloat16"
        ):
            resolve_accelerate_precision(
                "float32", {"ACCELERATE_MIXED_PRECISION": mode}, logs.append
            )


# ---------------- a flag the user set wins; accelerate's gradient accumulation never divides the loss ----------------
def _start(argv: list[str], capsys):
    """start_run on `argv` (ra_rloo.py's flags): (args, the lines it printed); no model loads."""
    from common.run.flags import parse_args
    from common.run.folder_lock import release_all
    from common.run.setup import start_run
    from ra_rloo import Args

    args = parse_args(Args, [*argv, "--num_threads", "1"])
    try:
        start_run(args, "ra_rloo")
    finally:
        release_all()
    return args, capsys.readouterr().out.splitlines()


def test_a_dtype_from_config_wins_over_accelerate_mixed_precision_and_the_first_line_says_so(
    tmp_path, monkeypatch, capsys
):
    config = tmp_path / "run.yaml"
    config.write_text("dtype: float32\n")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    args, lines = _start(["--config", str(config), "--output_dir", str(tmp_path / "a")], capsys)
    assert args.dtype == "float32" and "ACCELERATE_MIXED_PRECISION" not in os.environ
    assert lines[0] == (
        f"compute dtype float32 (--dtype, set on --config {config}; accelerate's "
        "ACCELERATE_MIXED_PRECISION=bf16 is not applied)"
    )
    # not given: accelerate's setting applies, and the line names it
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    args, lines = _start(["--output_dir", str(tmp_path / "b")], capsys)
    assert args.dtype == "bfloat16" and lines[0].startswith(
        "compute dtype bfloat16 (accelerate's ACCELERATE_MIXED"
    )
    # the launch: its processes and how they share the training
    assert re.fullmatch(r"processes: 1 on (cpu|cuda) \(neither DDP nor FSDP\)", lines[-1])
    from common.run.setup import launch_line

    assert launch_line(2, False, "cuda").startswith("processes: 2 on cuda, DDP: ")
    assert launch_line(2, True, "cpu").startswith("processes: 2 on cpu, FSDP (--fsdp): ")


def test_an_explicit_fsdp_flag_wins_over_accelerate_use_fsdp():
    environ, logs = dict(FSDP_V2), []
    assert resolve_accelerate_sharding(False, environ, logs.append, "the command line") is False
    assert "ACCELERATE_USE_FSDP" not in environ  # still kept out of the Accelerator
    assert logs == [
        "--fsdp False (set on the command line) wins over accelerate's ACCELERATE_USE_FSDP; accelerate's "
        "FSDP_* options are ignored"
    ]


def test_command_line_fsdp_and_dtype_win_over_accelerates_environment_through_start_run(
    tmp_path, monkeypatch, capsys
):
    # `accelerate launch --use_fsdp --mixed_precision bf16` with a command line that says otherwise
    monkeypatch.delenv("RANK", raising=False)
    for name, value in {**FSDP_V2, "ACCELERATE_MIXED_PRECISION": "bf16"}.items():
        monkeypatch.setenv(name, value)
    argv = ["--fsdp", "false", "--dtype", "float32", "--output_dir", str(tmp_path / "a")]
    args, lines = _start(argv, capsys)
    assert (args.fsdp, args.dtype) == (False, "float32")
    assert "ACCELERATE_USE_FSDP" not in os.environ  # kept out of the Accelerator either way
    assert lines[:2] == [
        "--fsdp False (set on the command line) wins over accelerate's ACCELERATE_USE_FSDP; "
        "accelerate's FSDP_* options are ignored",
        "compute dtype float32 (--dtype, set on the command line; accelerate's "
        "ACCELERATE_MIXED_PRECISION=bf16 is not applied)",
    ]
    # the same environment, neither flag given: accelerate's settings apply
    for name in ("ACCELERATE_USE_FSDP", "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.setenv(name, {**FSDP_V2, "ACCELERATE_MIXED_PRECISION": "bf16"}[name])
    args, lines = _start(["--output_dir", str(tmp_path / "b")], capsys)
    assert (args.fsdp, args.dtype) == (True, "bfloat16")
    assert lines[0].startswith("ACCELERATE_USE_FSDP is set (FSDP_VERSION=2")


def test_accelerate_gradient_accumulation_is_refused_in_one_line_before_anything_loads(
    tmp_path, monkeypatch, capsys
):
    # accelerator.backward would divide every loss by it: the same step at a quarter of the gradient, silently
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    with pytest.raises(SystemExit) as stopped:
        _start(["--output_dir", str(tmp_path / "out")], capsys)
    assert str(stopped.value).startswith(
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=4 (from the environment"
    )
    assert "\n" not in str(stopped.value) and "unset it" in str(stopped.value)
    assert not (tmp_path / "out").exists()  # refused before the folder was claimed
    from common.run.accelerate_env import refuse_accelerate_accumulation

    refuse_accelerate_accumulation(
        {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "1"}
    )  # 1 changes nothing


PROBE = """import sys
sys.path.insert(0, {root!r})
from common.run.accelerate_env import collapsed_launch
print("LINE", collapsed_launch())
"""


def test_a_launch_of_two_processes_that_started_one_names_the_flag_that_fixes_it(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE.format(root=str(ROOT)))
    launch = ["-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1"]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
    # without --multi_gpu on a machine with no GPU: one process, which says so and names the flag
    lines = [
        line for line in run_script([*launch, str(probe)]).stdout.splitlines() if "LINE" in line
    ]
    assert len(lines) == 1 and lines[0].startswith(
        "LINE accelerate launch started 1 process, not the --num_processes asked for: add "
        "--multi_gpu (`accelerate launch --multi_gpu --num_processes 2"
    ), lines
    # with it, each of the two processes has WORLD_SIZE (as under torchrun): nothing to say
    launched = {"ACCELERATE_DYNAMO_BACKEND": "NO", "MASTER_PORT": "29500", "WORLD_SIZE": "2"}
    assert collapsed_launch(launched) is None


def test_start_run_says_when_a_launch_of_several_processes_started_one(
    tmp_path, monkeypatch, capsys
):
    # what accelerate's simple launcher exports for `--num_processes 2` without --multi_gpu
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "ACCELERATE_DYNAMO_BACKEND": "NO",
    }.items():
        monkeypatch.setenv(name, value)
    _, lines = _start(["--output_dir", str(tmp_path / "a")], capsys)
    assert [line for line in lines if "add --multi_gpu" in line], lines
    monkeypatch.delenv("MASTER_PORT")  # a launch of one process asked for
    _, lines = _start(["--output_dir", str(tmp_path / "b")], capsys)
    assert not [line for line in lines if "multi_gpu" in line], lines
