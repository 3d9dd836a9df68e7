"""LoRA (--lora_r): only the adapters train, the reference is the base (adapters off, no copy), merged weights
fold the adapters in exactly, checkpoints hold the adapter (and merged weights on request) and resume exactly."""

import copy
import json
import sys

import pytest
import torch
from safetensors.torch import load_file

import ada_est
import ada_seq
import pros_ppo
import ps_grpo
import ra_rloo
from common.demo import countdown
from common.model.lora import AdaptersOff, add_lora, merged_state_dict
from common.model.policy import load_policy
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
]


def test_only_adapters_train_and_the_reference_is_the_base(random_model_dir):
    model, _ = load_policy(random_model_dir)
    base = copy.deepcopy(model)
    policy = add_lora(model, 4, 8, "all-linear")
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    x = torch.randint(0, 40, (2, 9))
    for _ in range(2):  # two steps: lora_B leaves zero, then lora_A moves too
        policy(input_ids=x).logits.logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    changed = {name for name, p in policy.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all("lora_" in name for name in changed)
    assert any("lora_A" in name for name in changed) and any("lora_B" in name for name in changed)
    reference = AdaptersOff(policy)
    assert sum(p.numel() for p in reference.parameters()) == 0  # no second copy
    assert torch.equal(reference(input_ids=x).logits, base(input_ids=x).logits)
    assert not torch.allclose(policy(input_ids=x).logits, base(input_ids=x).logits)
    merged = merged_state_dict(policy)
    expected = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(merged) == set(expected) == set(base.state_dict())
    assert all(torch.allclose(merged[k], expected[k], atol=1e-6) for k in merged)


def test_bad_lora_flags_exit_with_a_message(random_model_dir, monkeypatch):
    model, _ = load_policy(random_model_dir)
    with pytest.raises(SystemExit, match="--lora_r -1"):
        add_lora(model, -1, 8, "all-linear")
    with pytest.raises(SystemExit, match="--lora_target_modules"):
        add_lora(model, 4, 8, "no_such_proj")
    monkeypatch.setitem(sys.modules, "peft", None)  # peft not installed
    with pytest.raises(SystemExit, match="pip install peft"):
        add_lora(model, 4, 8, "all-linear")


@pytest.mark.parametrize(
    "module,extra",
    [
        (ra_rloo, []),
        (
            ada_seq,
            [
                "--max_rounds",
                "1",
                "--round_repeat",
                "4",
                "--num_generations",
                "4",
                "--beta",
                "0.05",
            ],
        ),
        (ada_est, []),
        (ps_grpo, ["--mode", "text", "--num_generations", "4"]),
        (pros_ppo, ["--num_generations", "4", "--beta", "0.05"]),
    ],
)
def test_scripts_train_adapters_only_and_export_merged_weights(
    module, extra, tiny_base, tmp_path, monkeypatch
):
    for name in ("binary", "tinyzero"):  # a reward that varies: every script has a gradient
        monkeypatch.setitem(countdown.REWARDS, name, lambda text, problem: float(len(text) % 2))
    module.main(
        parse_args(
            module.Args,
            [
                "--model_name_or_path",
                tiny_base,
                "--output_dir",
                str(tmp_path),
                "--max_steps",
                "2",
                "--eval_steps",
                "0",
                "--lora_r",
                "4",
                "--lora_merged_export",
                "--learning_rate",
                "1e-2",
                *SMALL,
                *extra,
            ],
        )
    )
    ckpt = tmp_path / "checkpoint-2"
    assert (ckpt / "adapter_model.safetensors").exists() and (ckpt / "adapter_config.json").exists()
    start, merged = (
        load_file(f"{tiny_base}/model.safetensors"),
        load_file(str(ckpt / "merged" / "model.safetensors")),
    )
    assert set(merged) == set(start)
    changed = {k for k in start if not torch.equal(merged[k], start[k])}
    # the adapted linear layers moved; embeddings and norms (not adapted, frozen) are bit-identical
    assert changed and all(k.endswith("proj.weight") for k in changed), sorted(changed)[:5]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows[1:])


def test_lora_resume_is_exact(tiny_base, tmp_path, monkeypatch):
    monkeypatch.setitem(countdown.REWARDS, "tinyzero", lambda text, problem: float(len(text) % 2))
    base = [
        "--model_name_or_path",
        tiny_base,
        "--lora_r",
        "4",
        "--learning_rate",
        "1e-2",
        "--save_steps",
        "1",
        "--eval_steps",
        "1",
        *SMALL,
    ]
    ra_rloo.main(
        parse_args(
            ra_rloo.Args, [*base, "--output_dir", str(tmp_path / "full"), "--max_steps", "3"]
        )
    )
    ra_rloo.main(
        parse_args(
            ra_rloo.Args, [*base, "--output_dir", str(tmp_path / "part"), "--max_steps", "1"]
        )
    )
    ra_rloo.main(
        parse_args(
            ra_rloo.Args,
            [
                *base,
                "--output_dir",
                str(tmp_path / "part"),
                "--max_steps",
                "3",
                "--resume_from_checkpoint",
                "auto",
            ],
        )
    )

    def rows(name):
        return [
            {k: v for k, v in json.loads(line).items() if not k.startswith(("time_", "time/"))}
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]

    assert rows("full") == rows("part") and len(rows("full")) == 4
    with pytest.raises(
        SystemExit, match="saved with LoRA adapters, resumed without"
    ):  # needs --lora_r again
        ra_rloo.main(
            parse_args(
                ra_rloo.Args,
                [
                    *base[:2],
                    *base[4:],
                    "--output_dir",
                    str(tmp_path / "part"),
                    "--max_steps",
                    "4",
                    "--resume_from_checkpoint",
                    "auto",
                ],
            )
        )
