"""`--cache_implementation` (HF generate's KV cache, TRL's GRPOConfig name) reaches `generate` in every script, `auto`
(the default) resolves to `static` on CUDA where transformers supports it and `dynamic` elsewhere, and a chosen cache
is refused next to vLLM, which manages its own cache."""

import importlib

import pytest
from transformers.generation.utils import GenerationMixin

from common.run.flags import parse_args


class FirstGenerate(Exception):
    """Raised by the spy once it has seen generate's keywords: nothing more of the run is needed."""


@pytest.mark.parametrize("script", ["ra_rloo", "ps_grpo", "pros_ppo", "ada_seq", "ada_est"])
def test_cache_implementation_reaches_generate(script, tiny_base, tmp_path, monkeypatch, capsys):
    seen = []

    def spy(self, *args, **kwargs):
        cache = kwargs.get(
            "past_key_values"
        )  # a static cache is built by the generator (in the compute dtype)
        seen.append(
            type(cache).__name__
            if cache is not None
            else kwargs.get("cache_implementation", "<absent>")
        )
        raise FirstGenerate

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    module = importlib.import_module(script)
    argv = [
        "--model_name_or_path",
        tiny_base,
        "--max_steps",
        "1",
        "--eval_prompts",
        "2",
        "--eval_samples",
        "1",
        "--prompts_per_step",
        "2",
        "--num_threads",
        "1",
    ]
    cases = [
        (["--cache_implementation", "static"], "ComputeDtypeStaticCache"),
        (["--cache_implementation", "dynamic"], "dynamic"),
    ]
    if (
        script == "ra_rloo"
    ):  # seeding scores demonstrations before the first generate: not needed here
        argv += ["--seed_buffer", "false"]
        # unset (auto) on CPU: transformers' own default (no keyword at all); the flag is read
        # in one place
        cases.append(([], "<absent>"))
    for case, (flags, expected) in enumerate(cases):
        seen.clear()
        with pytest.raises(FirstGenerate):
            module.main(
                parse_args(
                    module.Args, [*argv, "--output_dir", str(tmp_path / f"{script}-{case}"), *flags]
                )
            )
        assert seen == [expected]
        if not flags:  # the first lines say which cache auto chose
            assert (
                "KV cache: dynamic (--cache_implementation auto on cpu)" in capsys.readouterr().out
            )


def test_auto_cache_resolution():
    """auto: static on CUDA for a model transformers compiles whole-graph, dynamic (generate's own
    default) on CPU and for a model it cannot; a chosen value is kept on either device. The device
    is an argument, so the CUDA branch is checked without a GPU."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from common.generation.hf import resolve_cache_implementation
    from common.generation.static_cache import static_cache_supported

    config = Qwen2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        vocab_size=32,
    )
    model = Qwen2ForCausalLM(config)
    for source in (model, config):
        assert static_cache_supported(source)
        assert resolve_cache_implementation("auto", "cuda", source) == (
            "static",
            "KV cache: static (--cache_implementation auto on cuda)",
        )
        assert resolve_cache_implementation("auto", "cpu", source)[0] is None
    for value in ("dynamic", "static", "offloaded", "offloaded_static", None):
        assert resolve_cache_implementation(value, "cuda", model)[0] == value
        assert resolve_cache_implementation(value, "cpu", model)[0] == value

    class NoFullGraph(Qwen2ForCausalLM):  # as transformers marks a model it cannot compile
        _can_compile_fullgraph = False

    cache, line = resolve_cache_implementation("auto", "cuda", NoFullGraph(config))
    assert cache is None and line.startswith("KV cache: dynamic") and "does not support" in line
    cache, line = resolve_cache_implementation("auto", "cuda", model, fsdp=True)
    assert cache is None and "with --fsdp" in line
    assert resolve_cache_implementation("static", "cuda", model, fsdp=True)[0] == "static"


def test_auto_cache_is_no_clash():
    """The default (auto) passes with --use_vllm and --torch_compile; a chosen cache does not."""
    import ra_rloo

    assert parse_args(ra_rloo.Args, ["--use_vllm"]).cache_implementation == "auto"
    assert parse_args(ra_rloo.Args, ["--torch_compile"]).torch_compile
    with pytest.raises(SystemExit, match="--torch_compile: not with --cache_implementation"):
        parse_args(ra_rloo.Args, ["--torch_compile", "--cache_implementation", "dynamic"])


def test_cache_implementation_with_vllm_is_refused():
    import ra_rloo

    with pytest.raises(
        SystemExit, match="--cache_implementation static: applies to HF generate only"
    ):
        parse_args(ra_rloo.Args, ["--use_vllm", "--cache_implementation", "static"])
    with pytest.raises(SystemExit):
        parse_args(ra_rloo.Args, ["--cache_implementation", "paged"])  # not a choice


@pytest.mark.parametrize("fsdp", [True, False])
def test_the_generators_set_up_gives_fsdp_to_the_cache_resolver(fsdp, monkeypatch):
    """auto keeps the dynamic cache under --fsdp on CUDA: make_generator must pass the flag on. The
    resolver sees a CUDA device here (this machine may have none), so its line shows the choice."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    from common.demo.tiny_model import build_char_tokenizer
    from common.generation import hf
    from common.run import setup

    def on_cuda(requested, device_type, model, fsdp=False):
        return hf.resolve_cache_implementation(requested, "cuda", model, fsdp=fsdp)

    monkeypatch.setattr(setup, "resolve_cache_implementation", on_cuda)
    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        vocab_size=len(tokenizer),
    )
    args = SimpleNamespace(
        use_vllm=False,
        cache_implementation="auto",
        fsdp=fsdp,
        gen_batch_size=4,
        dtype="float32",
        stop_token_ids=None,
    )
    lines = []
    generator = setup.make_generator(
        args, "", LlamaForCausalLM(config), tokenizer, None, None, lines.append
    )
    expected = None if fsdp else "static"
    assert generator.cache_implementation == expected and ("with --fsdp" in lines[0]) == fsdp, lines
