"""bf16 compute over fp32 master weights: a real-model learning rate (1e-6) still moves the weights, checkpoints
hold the fp32 masters and resume exactly, and bf16 log-probs stay close to fp32 ones."""

import json

import pytest
import torch
from conftest import run_main
from safetensors.torch import load_file

import ada_est
import ada_seq
import pros_ppo
import ps_grpo
import ra_rloo
from common.demo import countdown
from common.model.policy import autocast, load_policy
from common.rl.logprobs import token_logprobs
from common.rl.masking import pad_sequences
from common.run.flags import parse_args

# k3 KL of two forwards that differ only in batch layout (pros_ppo.py scores the reference in other micro-batches
# than it trains): per-token log-probs within ~1e-4 under bf16 compute, so k3 ~ d^2 / 2 <= 5e-9 (4.7e-10 seen, fsdp);
# a bf16 copy of the whole model as reference gave 1.5e-5, and one update at lr 1e-6 moves it ~3e-6
KL_AT_START = 1e-8
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
]


def test_bf16_logprobs_are_close_to_fp32(random_model_dir):
    model, tok = load_policy(random_model_dir)
    assert all(
        p.dtype == torch.float32 for p in model.parameters()
    )  # trainable weights load as fp32 masters
    batch = pad_sequences(
        [tok("12 3 4", add_special_tokens=False).input_ids, [5, 6]],
        [[7, 8, 9], [10, 11]],
        tok.pad_token_id,
    )
    exact, _ = token_logprobs(model, batch)
    with autocast(torch.device("cpu"), "bfloat16"):
        half, _ = token_logprobs(model, batch)
    assert half.dtype == torch.float32  # log-softmax in fp32 over bf16 logits
    mask = batch.loss_mask.bool()
    diff = (half - exact)[mask].abs()
    assert 0 < diff.max() < 0.05 and diff.mean() < 0.02  # bf16 really ran, and stays close
    with autocast(torch.device("cpu"), "float32"):  # fp32: autocast is off
        assert torch.equal(token_logprobs(model, batch)[0], exact)


@pytest.mark.parametrize(
    "module,extra",
    [
        (ra_rloo, []),
        (ada_seq, ["--max_rounds", "1", "--round_repeat", "4", "--num_generations", "4"]),
        (ada_est, []),
        (ps_grpo, ["--mode", "text", "--num_generations", "4"]),
        (pros_ppo, ["--num_generations", "4"]),
    ],
)
def test_bf16_at_lr_1e6_moves_most_weights_and_saves_fp32_masters(
    module, extra, tiny_base, tmp_path, monkeypatch
):
    # a reward that varies, so every script has a gradient (the tiny test base solves almost nothing)
    for name in ("binary", "tinyzero"):
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
                "--dtype",
                "bfloat16",
                "--learning_rate",
                "1e-6",
                "--warmup_steps",
                "1",
                *SMALL,
                *extra,
            ],
        )
    )
    start = load_file(f"{tiny_base}/model.safetensors")
    end = load_file(str(tmp_path / "checkpoint-2" / "model.safetensors"))
    assert all(
        t.dtype == torch.float32 for t in end.values()
    )  # the checkpoint keeps the fp32 master weights
    changed = sum(int((end[k] != start[k]).sum()) for k in start)
    total = sum(t.numel() for t in start.values())
    assert changed / total > 0.5, f"{module.__name__}: only {changed}/{total} weights changed"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows[1:])


def test_bf16_resume_is_exact(tiny_base, tmp_path, monkeypatch):
    monkeypatch.setitem(countdown.REWARDS, "tinyzero", lambda text, problem: float(len(text) % 2))
    # evaluations at every step, so the stopped run's final evaluation is one the full run makes too
    base = [
        "--model_name_or_path",
        tiny_base,
        "--dtype",
        "bfloat16",
        "--save_steps",
        "1",
        *SMALL,
        "--eval_steps",
        "1",
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
    full, part = (
        load_file(str(tmp_path / name / "checkpoint-3" / "model.safetensors"))
        for name in ("full", "part")
    )
    assert all(torch.equal(full[k], part[k]) for k in full)


KL_FLAGS = {
    "ra_rloo.py": ["--beta", "0.05", "--paper_eval_samples", "0", "--seed_buffer", "false"],
    "ada_seq.py": [
        "--beta",
        "0.05",
        "--max_rounds",
        "1",
        "--round_repeat",
        "4",
        "--num_generations",
        "4",
    ],
    "ada_est.py": ["--beta", "0.05"],
    "pros_ppo.py": ["--beta", "0.05", "--num_generations", "4", "--num_mini_batches", "1"],
}  # 1: KL before the step


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
@pytest.mark.parametrize("script", sorted(KL_FLAGS))
def test_bf16_kl_to_the_reference_is_zero_before_the_first_update(
    script, fsdp, tiny_base, tmp_path
):
    # the reference computes as the policy does at step 0 (same precision path, same autocast): step 1's KL, taken
    # before its optimizer step, is that of two identical forwards (a bf16 copy of the whole model gave ~1e-5)
    run_main(
        [
            script,
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            "1",
            "--dtype",
            "bfloat16",
            "--eval_train_prompts",
            "0",
            *SMALL,
            *KL_FLAGS[script],
            *(["--fsdp"] * fsdp),
        ]
    )
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[1])
    assert row["step"] == 1 and abs(row["kl"]) <= KL_AT_START, (script, row["kl"])
