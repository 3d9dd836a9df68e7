"""`--cache_implementation` (HF generate's KV cache, TRL's GRPOConfig name) reaches `generate` in every script, and is
refused next to vLLM, which manages its own cache."""

import importlib

import pytest
from transformers.generation.utils import GenerationMixin

from common.run.flags import parse_args


class FirstGenerate(Exception):
    """Raised by the spy once it has seen generate's keywords: nothing more of the run is needed."""


@pytest.mark.parametrize("script", ["ra_rloo", "ps_grpo", "pros_ppo", "ada_seq", "ada_est"])
def test_cache_implementation_reaches_generate(script, tiny_base, tmp_path, monkeypatch):
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
        # unset: transformers' own default (no keyword at all); the flag is read in one place
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


def test_cache_implementation_with_vllm_is_refused():
    import ra_rloo

    with pytest.raises(
        SystemExit, match="--cache_implementation static: applies to HF generate only"
    ):
        parse_args(ra_rloo.Args, ["--use_vllm", "--cache_implementation", "static"])
    with pytest.raises(SystemExit):
        parse_args(ra_rloo.Args, ["--cache_implementation", "paged"])  # not a choice
