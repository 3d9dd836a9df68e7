"""`--torch_compile`: HF generate's decoding step and the packed training forward compiled (common/generation/compile.py) give
the eager run's rows, in fp32 and under bf16 autocast; one graph serves micro-batches of any row count; a compile
failure falls back to eager with one log line; the flags it cannot run with are refused at start-up. Compiling costs
seconds, so few tests compile, on small models."""

import json

import pytest
import torch
from conftest import TOKEN_LOGP_TOL, loss_tolerance, run_script

from common.generation.compile import TorchCompile
from common.generation.hf import HFGenerator, SamplingConfig
from common.rl.logprobs import token_logprobs
from common.rl.masking import pack_sequences
from common.run.flags import parse_args

# one shape for every generate call of the run (32 rows, a 32-position cache): the step compiles once
FLAGS = [
    "--max_steps",
    "3",
    "--eval_steps",
    "0",
    "--eval_prompts",
    "8",
    "--eval_samples",
    "4",
    "--prompts_per_step",
    "8",
    "--max_completion_length",
    "16",
    "--num_threads",
    "1",
    "--learning_rate",
    "1e-4",
    "--warmup_steps",
    "5",
    "--prompt_pool",
    "64",
    "--reward",
    "binary",
    "--paper_eval_samples",
    "4",
    "--eval_train_prompts",
    "8",
    "--beta",
    "0",
]  # no reference model: its no-grad graph would add a compile (test_torch_compile_packed_...)


def inductor_vectorises() -> bool:
    """Whether inductor generates vectorised C++ here. Without a vector ISA (a CPU without AVX2, or
    ATEN_CPU_CAPABILITY=default) torch 2.13's scalar code for the model's reductions names `at::vec` without its header
    and g++ fails: every compiled pass must then fall back to eager, with its line."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return bool(pick_vec_isa())


def rows(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def assert_rows_match(eager: list[dict], compiled: list[dict]) -> None:
    """A compiled run's rows against the eager run's, each quantity to a tolerance from its conditioning."""
    assert [row["step"] for row in compiled] == [row["step"] for row in eager]
    for a, b in zip(eager, compiled):
        # sampled tokens and the verifier's verdicts are discrete: the same seeds give the same completions, so what
        # is counted from them is equal exactly (a near-tie that flipped one sample would show here first)
        for key in (
            "reward_mean",
            "pass_rate",
            "completion_len_mean",
            "frac_zero_var_groups",
            "eval_pass@1",
        ):
            if key in a:
                assert b[key] == a[key], (a["step"], key)
        # per-token means of well-conditioned terms (entropies are positive; kl is 0 at --beta 0)
        for key in ("entropy", "kl"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=0, abs=TOKEN_LOGP_TOL), (a["step"], key)
        if (
            "loss" in a
        ):  # advantages that cancel within each group: an absolute bound (conftest.loss_tolerance)
            assert b["loss"] == pytest.approx(a["loss"], rel=0, abs=loss_tolerance(a)), (
                a["step"],
                "loss",
            )


def test_torch_compile_matches_eager_three_steps(tiny_base, tmp_path):
    for name, extra in (("eager", []), ("compiled", ["--torch_compile"])):
        run_script(
            [
                "ra_rloo.py",
                "--model_name_or_path",
                tiny_base,
                "--output_dir",
                str(tmp_path / name),
                *FLAGS,
                *extra,
            ]
        )
    eager, compiled = rows(tmp_path / "eager"), rows(tmp_path / "compiled")
    assert [row["step"] for row in compiled] == [0, 1, 2, 3]
    assert_rows_match(eager, compiled)
    assert "time_compile_s" not in eager[0]
    # the decoding step compiles in the step-0 evaluation, the training forward (and backward) in step 1, once:
    # every later call reuses them
    assert compiled[0]["time_compile_s"] > 1.0 and compiled[1]["time_compile_s"] > 1.0
    assert all(row["time_compile_s"] == 0 for row in compiled[2:])
    assert all(row["compile_recompiles"] == 0 for row in compiled)
    assert compiled[-1]["compile_eager_passes"] == (0 if inductor_vectorises() else 2)


def tiny_generator_inputs():
    from common.demo.tiny_model import BaseRecipe, build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    recipe = BaseRecipe(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    )
    model = build_tiny_model(recipe, len(tokenizer))
    prompts = [tokenizer(text).input_ids for text in ("3 4 5 =", "12 +", "9", "1 2 3 4 5 6")]
    return model, tokenizer, prompts, SamplingConfig(max_new_tokens=8, temperature=1.0)


def generate(generator, prompts, sampling):
    torch.manual_seed(0)
    return generator.generate(prompts, 2, sampling)  # 8 rows: a bucket as it is, no padding rows


def test_torch_compile_bf16_generation_matches_eager():
    # the static cache under bf16 autocast: fp32 keys (rotary embedding) and bf16 values stored in one dtype
    model, tokenizer, prompts, sampling = tiny_generator_inputs()
    logs = []
    eager = generate(
        HFGenerator(model, tokenizer, batch_size=8, dtype="bfloat16"), prompts, sampling
    )
    compiled_generator = HFGenerator(
        model, tokenizer, batch_size=8, dtype="bfloat16", compiled=TorchCompile(log=logs.append)
    )
    compiled = generate(compiled_generator, prompts, sampling)
    if (
        not inductor_vectorises()
    ):  # no vector ISA: the compile fails, the rows are eager's (inductor_vectorises)
        assert (
            len(logs) == 1
            and "eagerly" in logs[0]
            and compiled.completion_ids == eager.completion_ids
        )
        return
    assert not logs and not compiled_generator.compiled.failed["decoding"]  # it did run compiled
    assert compiled.completion_ids == eager.completion_ids
    assert torch.allclose(
        torch.tensor(sum(compiled.logprobs, [])), torch.tensor(sum(eager.logprobs, [])), atol=1e-5
    )
    assert compiled_generator.compiled.metrics()["time_compile_s"] > 0


def test_torch_compile_failure_falls_back_to_eager_with_one_line():
    model, tokenizer, prompts, sampling = tiny_generator_inputs()

    def failing_backend(graph, example_inputs):
        raise RuntimeError("no compiler on this machine")

    logs = []
    compiled = TorchCompile(backend=failing_backend, log=logs.append)
    generator = HFGenerator(model, tokenizer, batch_size=8, compiled=compiled)
    first, second = generate(generator, prompts, sampling), generate(generator, prompts, sampling)
    eager = generate(HFGenerator(model, tokenizer, batch_size=8), prompts, sampling)
    assert len(logs) == 1 and "no compiler on this machine" in logs[0] and "eagerly" in logs[0]
    # the failed call is redone from the same random state: the rows are the eager ones
    assert first.completion_ids == eager.completion_ids == second.completion_ids
    # the packed forward falls back on its own, with one more line
    batch = packed_batches(tokenizer, prompts)[0]
    compiled_logp = [token_logprobs(model, batch, compiled=compiled)[0] for _ in range(2)]
    assert (
        len(logs) == 2
        and "the compiled training forward failed" in logs[1]
        and "eagerly" in logs[1]
    )
    assert all(torch.equal(logp, token_logprobs(model, batch)[0]) for logp in compiled_logp)


def packed_gradient(model, batch, compiled) -> torch.Tensor:
    """The gradient of a packed batch's summed completion log-probs, flat, through `compiled` (None: eager)."""
    model.zero_grad()
    logp, _ = token_logprobs(model, batch, compiled=compiled)
    (logp * batch.loss_mask).sum().backward()
    return torch.cat([param.grad.flatten() for param in model.parameters()])


def test_a_backward_that_fails_to_compile_falls_back_to_eager_with_one_line():
    """AOTAutograd compiles a dynamic-shape backward at the forward and, when that fails, would retry at `.backward()`
    (in the method file, outside any fallback) and crash there: the failure must surface in the forward's fallback."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def failing_backward(graph, example_inputs):
        raise RuntimeError("no backward compiler here")

    backend = aot_autograd(
        fw_compiler=lambda graph, example_inputs: make_boxed_func(graph.forward),
        bw_compiler=failing_backward,
    )
    model, tokenizer, prompts, _ = tiny_generator_inputs()
    logs = []
    compiled = TorchCompile(backend=backend, log=logs.append)
    for batch in packed_batches(tokenizer, prompts):
        grads = [packed_gradient(model, batch, run) for run in (compiled, None)]
        assert torch.equal(
            grads[0], grads[1]
        )  # the eager forward and backward: exactly eager's gradients
    assert len(logs) == 1 and "no backward compiler here" in logs[0] and "eagerly" in logs[0]
    assert compiled.failed == {"decoding": False, "forward": True}


def test_ranks_agree_on_a_pass_that_failed_on_one_of_them():
    """A compile failure on one rank switches that pass to eager on every rank, with one line naming the rank."""
    logs = []
    on_rank0 = TorchCompile(log=logs.append)
    rank1_failed = torch.tensor(
        [[0.0, 1.0]]
    )  # rank 1 (passes in sorted order: decoding, forward): forward failed

    def gather(mine):  # what Accelerator.gather gives two ranks: their rows stacked in rank order
        return torch.cat([mine, rank1_failed])

    on_rank0.agree(gather)
    assert on_rank0.failed == {"decoding": False, "forward": True}
    assert len(logs) == 1 and "forward" in logs[0] and "rank(s) [1]" in logs[0]
    on_rank0.agree(gather)  # agreed already: no second line
    assert len(logs) == 1


def packed_batches(tokenizer, prompts):
    """Two packed micro-batches of 3 and 2 rows (a row count of 1 would be a shape of its own)."""
    completions = [tokenizer(text).input_ids for text in ("5+4=9", "12", "9*1=9 ok", "6-5")]
    return [
        pack_sequences(prompts[rows], completions[rows], tokenizer.pad_token_id, 16)
        for rows in (slice(0, 4), slice(0, 3))
    ]


def test_torch_compile_packed_forward_matches_eager_one_graph():
    from common.generation.compile import compiled_graphs

    model, tokenizer, prompts, _ = tiny_generator_inputs()
    logs = []
    compiled, graphs = TorchCompile(log=logs.append), compiled_graphs()
    batches = packed_batches(tokenizer, prompts)
    assert [batch.input_ids.shape[0] for batch in batches] == [3, 2]
    for batch in batches:  # log-probs and gradients, micro-batch by micro-batch
        grads = [packed_gradient(model, batch, run) for run in (None, compiled)]
        assert torch.allclose(grads[0], grads[1], atol=1e-6)
    if (
        not inductor_vectorises()
    ):  # no vector ISA: one line, then eager (whose gradients were just compared)
        assert len(logs) == 1 and "the compiled training forward failed" in logs[0]
        return
    assert not logs and compiled_graphs() - graphs == 1  # one graph served both row counts
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16),
    ):  # a bf16 scoring pass: a graph of its own
        compiled_bf16, eager_bf16 = (
            token_logprobs(model, batches[0], compiled=run)[0] for run in (compiled, None)
        )
    assert torch.allclose(compiled_bf16, eager_bf16, atol=0.05)
    assert compiled_graphs() - graphs == 2 and compiled.metrics()["compile_recompiles"] == 0


def test_torch_compile_pads_chunks_to_few_shapes():
    assert [TorchCompile.bucket(rows, 256) for rows in (1, 2, 3, 100, 128, 129, 256)] == [
        1,
        2,
        4,
        128,
        128,
        256,
        256,
    ]
    assert TorchCompile.bucket(70, 100) == 100  # never past the generation batch size
    # cache lengths: multiples of 16 up to 255 positions, then of an eighth of the length's power of two
    assert [TorchCompile.cache_length(width, 32) for width in (9, 14, 16, 17, 100)] == [
        48,
        48,
        48,
        64,
        144,
    ]
    assert [TorchCompile.cache_length(width, 1024) for width in (60, 200, 300)] == [
        1152,
        1280,
        1408,
    ]
    lengths = [TorchCompile.cache_length(width, 1024) for width in range(1, 1025)]
    assert len(set(lengths)) == 8 and all(
        length >= width + 1024 for width, length in enumerate(lengths, 1)
    )


@pytest.mark.parametrize(
    "flags, clash",
    [
        (["--use_vllm"], "--use_vllm"),
        (["--fsdp"], "--fsdp"),
        (["--cache_implementation", "static"], "--cache_implementation"),
    ],
)
def test_torch_compile_refuses_what_it_cannot_run_with(flags, clash):
    import ra_rloo

    with pytest.raises(SystemExit, match=f"--torch_compile: not with {clash} "):
        parse_args(ra_rloo.Args, ["--torch_compile", *flags])
    parse_args(
        ra_rloo.Args,
        ["--torch_compile", "--lora_r", "4", "--gradient_checkpointing", "--dtype", "bfloat16"],
    )


def test_compile_speed_block_renders_every_part(tmp_path):
    from dataclasses import fields

    from benchmarks.speed.compile_speed import Args, docs_block
    from common.run.flag_help import field_docs

    assert not [
        f.name for f in fields(Args) if not field_docs(Args).get(f.name)
    ]  # every flag has its help

    assert "has not been measured" in docs_block(tmp_path / "none.json")
    job = {
        "step_s": 0.6,
        "gen_s": 0.3,
        "gen_tokens_per_s": 4000.0,
        "compile_s": 30.0,
        "recompiles": 1,
        "fallback": False,
    }
    rounds = {
        "ours_eager_vs_trl_eager": [1.1, 1.2],
        "ours_compiled_vs_trl_eager": [1.4, 1.5],
        "ours_compiled_vs_trl_compiled": [1.3, 1.25],
    }
    res = {
        "args": {"num_threads": 2, "rounds": 2, "steps": 40, "peer_rounds": 2, "peer_steps": 20},
        "machine": {"cpu": "a CPU"},
        "job": {
            "ra_rloo": {
                "eager": job,
                "compiled": {**job, "step_s": 0.5, "gen_tokens_per_s": 6000.0},
                "speedup": 1.2,
                "gen_speedup": 1.5,
                "break_even_steps": 100.0,
                "default_max_steps": 300,
                "rest_speedup": 1.1,
            },
            "pros_ppo": {
                "eager": job,
                "compiled": {**job, "step_s": 0.55, "fallback": True},
                "speedup": 1.09,
                "gen_speedup": 1.0,
                "break_even_steps": 600.0,
                "default_max_steps": 200,
                "rest_speedup": 1.04,
            },
            "ada_seq": {
                "eager": job,
                "compiled": {**job, "step_s": 0.7},
                "speedup": 0.86,
                "gen_speedup": 0.9,
                "break_even_steps": None,
                "default_max_steps": 300,
                "rest_speedup": 1.2,
            },
        },
        "floor": {
            "eager": {"floor_s": 0.5, "script_ratio": 0.9},
            "compiled": {"floor_s": 0.4, "script_ratio": 0.95},
            "floor_speedup": 1.25,
        },
        "peer": {
            "versions": {"trl": "1.16.0"},
            "rounds": rounds,
            "ratios": {
                "ours_eager_vs_trl_eager": 1.15,
                "ours_compiled_vs_trl_eager": 1.45,
                "ours_compiled_vs_trl_compiled": 1.27,
            },
        },
    }
    path = tmp_path / "compile.json"
    path.write_text(json.dumps(res))
    text = " ".join(docs_block(path).split())
    for figure in (
        "`ra_rloo.py`: 0.600 s/step eager, 0.500 s/step",
        "(1.20x)",
        "4,000 vs 6,000 tokens/s",
        "paid back after 100 steps: it pays within the default 300-step run",
        "`pros_ppo.py`: 0.600 s/step eager, 0.550 s/step",
        "paid back after 600 steps: it does not pay "
        "within the default 200-step run (a pass fell back to eager)",
        "`ada_seq.py`: 0.600 s/step eager, 0.700 s/step",
        "it does not pay back: no saving per step",
        "0.500 s eager, 0.400 s compiled (1.25x)",
        "default job (2 threads, a CPU), 2 round(s) of 40 steps",
        "vs TRL eager 1.45x (rounds 1.40/1.50)",
        "`torch_compile=True` 1.27x (rounds 1.30/1.25)",
    ):
        assert figure in text, figure
    assert all(len(line) <= 120 for line in docs_block(path).splitlines())


# each script's default mode, small: its shapes (the multi-turn episode's growing prompts, Ada-Seq's rounds, PROS's
# augmented queries) are what the decoding step's buckets and dynamic dimensions must cover
DEFAULT_MODES = {
    "ra_rloo": ["ra_rloo.py", "--prompt_pool", "64"],
    "ada_seq": ["ada_seq.py"],
    "ada_est": ["ada_est.py"],
    "ps_grpo-multiturn": ["ps_grpo.py"],
    "ps_grpo-text": ["ps_grpo.py", "--mode", "text"],
    "pros_ppo": ["pros_ppo.py"],
}
SMALL = [
    "--max_steps",
    "3",
    "--eval_steps",
    "3",
    "--eval_prompts",
    "8",
    "--eval_samples",
    "2",
    "--num_threads",
    "1",
    "--prompts_per_step",
    "8",
]


@pytest.mark.parametrize("mode", list(DEFAULT_MODES))
def test_every_default_mode_compiles_into_few_graphs_and_gives_the_eager_rows(
    mode, tmp_path, monkeypatch
):
    """What recompiles is dynamo's guards, whatever the backend: the `eager` backend traces and guards exactly as
    inductor does without its minutes of code generation (the numbers of inductor's code: the tests above)."""
    import torch._dynamo
    from conftest import run_main

    monkeypatch.setattr(TorchCompile.__init__, "__defaults__", ("eager", print))
    torch._dynamo.reset()  # graphs of earlier runs in this process would count against the same code objects' limit
    script = DEFAULT_MODES[mode]
    run_main([*script, "--output_dir", str(tmp_path / "compiled"), *SMALL, "--torch_compile"])
    run_main([*script, "--output_dir", str(tmp_path / "eager"), *SMALL])
    compiled = rows(tmp_path / "compiled")
    assert [row["step"] for row in compiled] == [0, 1, 2, 3]
    # the compiled path's own shapes (static cache, padded buckets, dynamic dimensions) give the eager run's rows
    # (inductor's numerics against eager: test_torch_compile_matches_eager_three_steps)
    assert_rows_match(rows(tmp_path / "eager"), compiled)
    # each compiled pass compiles a static graph first and, at its first new shape, one with that dimension dynamic,
    # which serves every later size (a static decoding step compiled once per (rows, cache length): 7 in the
    # multi-turn mode's 3 steps, past dynamo's limit soon after, where the pass falls back: the next test)
    assert compiled[-1]["compile_recompiles"] <= 2 < torch._dynamo.config.recompile_limit, compiled[
        -1
    ]
    assert compiled[-1]["compile_eager_passes"] == 0


def test_dynamos_recompile_limit_falls_back_to_eager_with_one_line(tmp_path, monkeypatch, capsys):
    """Past dynamo's recompile limit a frame would run eagerly silently: the pass falls back with our line and the
    metric counts it. A limit of 1 is reached by the multi-turn mode's second decoding shape."""
    import torch._dynamo
    from conftest import run_main

    monkeypatch.setattr(TorchCompile.__init__, "__defaults__", ("eager", print))
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    torch._dynamo.reset()
    run_main(["ps_grpo.py", "--output_dir", str(tmp_path / "run"), *SMALL, "--torch_compile"])
    out = capsys.readouterr().out
    assert (
        out.count("--torch_compile: the compiled decoding step failed") == 1
        and "eagerly from here on" in out
    )
    assert "recompile_limit" in out
    last = rows(tmp_path / "run")[-1]
    assert last["step"] == 3 and last["compile_eager_passes"] >= 1
