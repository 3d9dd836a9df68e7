"""--gradient_checkpointing: the decoder layers really are recomputed in the backward pass (policy, and the critic
in pros_ppo.py), and the run's numbers do not change."""

import json

import pytest

import ada_seq
import pros_ppo
import ra_rloo
from common.demo import countdown
from common.run.flags import parse_args

SMALL = [
    "--prompts_per_step",
    "4",
    "--prompt_pool",
    "8",
    "--eval_prompts",
    "4",
    "--eval_samples",
    "2",
    "--max_completion_length",
    "16",
    "--num_threads",
    "1",
    "--eval_steps",
    "0",
    "--max_steps",
    "2",
]


@pytest.mark.parametrize(
    "module,extra",
    [
        (ra_rloo, []),
        (ada_seq, ["--max_rounds", "1", "--round_repeat", "4", "--num_generations", "4"]),
        (pros_ppo, ["--num_generations", "4"]),
    ],
)
def test_recomputes_layers_and_changes_no_number(module, extra, tiny_base, tmp_path, monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    for name in ("binary", "tinyzero"):  # a reward that varies: every script has a gradient
        monkeypatch.setitem(countdown.REWARDS, name, lambda text, problem: float(len(text) % 2))
    calls = {"n": 0}
    forward = LlamaDecoderLayer.forward

    def counting(self, *args, **kwargs):
        calls["n"] += 1
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(LlamaDecoderLayer, "forward", counting)
    counts, rows = {}, {}
    for flag in ("false", "true"):
        calls["n"] = 0
        out = tmp_path / flag
        module.main(
            parse_args(
                module.Args,
                [
                    "--model_name_or_path",
                    tiny_base,
                    "--output_dir",
                    str(out),
                    "--gradient_checkpointing",
                    flag,
                    *SMALL,
                    *extra,
                ],
            )
        )
        counts[flag] = calls["n"]
        rows[flag] = [
            {
                k: v
                for k, v in json.loads(line).items()
                if not (k.startswith(("time_", "time/")) or k.endswith("_s"))
            }
            for line in (out / "metrics.jsonl").read_text().splitlines()
        ]
    assert rows["true"] == rows["false"]  # same samples, losses, gradient norms, evaluations
    assert counts["true"] > counts["false"]  # the extra forwards are the recomputation in backward
