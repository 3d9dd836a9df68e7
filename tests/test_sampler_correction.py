"""The sampler correction (TRL's vllm_importance_sampling_*; common/rl/sampler_correction.py): each mode's weights
from their definitions, unknown sampler log-probs at weight 1, the flags' defaults, and in every script the weights
multiplying the policy-gradient term (a step whose every ratio is masked trains nothing but the KL)."""

import json
import math

import pytest
import torch
from conftest import run_main
from safetensors.torch import load_file

from common.rl.sampler_correction import correction_metrics, sampler_is_weights, split_extremes
from common.run.flags import parse_args

SCRIPTS = ("ra_rloo.py", "ps_grpo.py", "pros_ppo.py", "ada_seq.py", "ada_est.py")


def _batch():
    """Two rows of 4 tokens: row 0's last token unsampled (mask 0), row 1's second token with no sampler
    log-prob (NaN); log rho = trainer - sampler is written out per token."""
    log_rho = torch.tensor([[0.5, -0.2, 1.5, 9.0], [0.1, 7.0, -2.0, 0.3]])
    sampler = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.7, math.nan, -1.2, -0.9]])
    known = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    return sampler + torch.nan_to_num(log_rho), sampler, known, log_rho


def test_token_modes_follow_their_definitions():
    trainer, sampler, known, log_rho = _batch()
    rho = torch.exp(log_rho)
    weight, sums = sampler_is_weights(trainer, sampler, known, "token_truncate", 0.5, 3.0)
    # clipped to [0.5, 3]; unknown tokens (mask 0, NaN sampler log-prob) at 1
    expected = rho.clamp(0.5, 3.0)
    expected[0, 3] = expected[1, 1] = 1.0
    assert torch.allclose(weight, expected)
    # 6 known tokens; outside [0.5, 3]: exp(1.5) and exp(-2)
    assert float(sums["is_n"]) == 6 and float(sums["is_outside"]) == 2
    weight, _ = sampler_is_weights(trainer, sampler, known, "token_mask", 0.5, 3.0)
    expected = torch.where((rho < 0.5) | (rho > 3.0), 0.0, rho)
    expected[0, 3] = expected[1, 1] = 1.0
    assert torch.allclose(weight, expected)
    # no bounds: the raw ratio
    weight, sums = sampler_is_weights(trainer, sampler, known, "token_mask", None, None)
    assert torch.allclose(
        weight[known.bool() & ~sampler.isnan()], rho[known.bool() & ~sampler.isnan()]
    )
    assert float(sums["is_outside"]) == 0


def test_sequence_modes_use_the_product_of_the_known_tokens_ratios():
    trainer, sampler, known, log_rho = _batch()
    # row 0: exp(0.5 - 0.2 + 1.5) = 6.05; row 1: exp(0.1 - 2.0 + 0.3) = 0.20 (the NaN token left out)
    seq = torch.exp(torch.tensor([1.8, -1.6]))
    weight, sums = sampler_is_weights(trainer, sampler, known, "sequence_truncate", None, 3.0)
    assert torch.allclose(weight, seq.clamp(max=3.0)[:, None].expand(2, 4))
    assert float(sums["is_n"]) == 2 and float(sums["is_outside"]) == 1
    weight, sums = sampler_is_weights(trainer, sampler, known, "sequence_mask", 0.25, 3.0)
    # row 0 above clip_max, row 1 below clip_min: both masked, every token of the row
    assert torch.equal(weight, torch.zeros(2, 4)) and float(sums["is_outside"]) == 2
    # a row with no known token (e.g. a replay) keeps weight 1 and is not counted
    weight, sums = sampler_is_weights(trainer, sampler, torch.zeros(2, 4), "sequence_mask")
    assert torch.equal(weight, torch.ones(2, 4)) and float(sums["is_n"]) == 0


def test_the_metrics_are_global_sums_and_extremes():
    trainer, sampler, known, log_rho = _batch()
    first = sampler_is_weights(trainer[:1], sampler[:1], known[:1], "token_truncate", None, 3.0)[1]
    second = sampler_is_weights(trainer[1:], sampler[1:], known[1:], "token_truncate", None, 3.0)[1]
    update, extremes = split_extremes([first, second])
    totals = {name: sum(float(d.get(name, 0.0)) for d in update) for name in first}

    class One:
        num_processes = 1

    row = correction_metrics(One(), totals, extremes)
    weights = torch.exp(torch.tensor([0.5, -0.2, 1.5, 0.1, -2.0, 0.3])).clamp(max=3.0)
    assert row["sampling/importance_sampling_ratio/mean"] == pytest.approx(float(weights.mean()))
    assert row["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-2.0))
    assert row["sampling/importance_sampling_ratio/max"] == pytest.approx(3.0)
    assert row["sampling/sampling_logp_difference/max"] == pytest.approx(2.0)
    assert row["sampling/sampling_logp_difference/mean"] == pytest.approx(4.6 / 6)
    assert row["sampling/importance_sampling_outside_frac"] == pytest.approx(1 / 6)


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_flags_take_trls_defaults_and_the_correction_follows_use_vllm(script):
    module = __import__(script[:-3])
    extra = ["--mode", "text"] if script == "ps_grpo.py" else []
    args = parse_args(module.Args, extra)
    assert args.vllm_importance_sampling_correction is False  # HF generate
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_max) == (
        "sequence_mask",
        3.0,
    )
    assert args.vllm_importance_sampling_clip_min is None
    assert (
        parse_args(module.Args, [*extra, "--use_vllm"]).vllm_importance_sampling_correction is True
    )
    asked = parse_args(module.Args, [*extra, "--vllm_importance_sampling_correction"])
    assert asked.vllm_importance_sampling_correction is True


# every group's rewards differ (0, 1, 2, 0, ...): each step has a policy-gradient signal, whatever is sampled
SPREAD = """
def spread(completions, **kwargs):
    return [float(i % 3) for i in range(len(completions))]
"""
TINY = [
    "--max_steps",
    "1",
    "--eval_steps",
    "0",
    "--eval_prompts",
    "2",
    "--eval_samples",
    "1",
    "--eval_train_prompts",
    "0",
    "--prompts_per_step",
    "4",
    "--max_completion_length",
    "12",
    "--num_threads",
    "1",
    "--beta",
    "0",
]
OWN = {
    "ps_grpo.py": ["--mode", "text"],
    # two epochs: the second reads the first's weights
    "ada_seq.py": [
        *("--max_rounds", "1", "--round_repeat", "4", "--entropy_coef", "0"),
        *("--num_iterations", "2"),
    ],
    "ada_est.py": ["--entropy_coef", "0", "--num_iterations", "2"],
    "ra_rloo.py": [],
    "pros_ppo.py": [],
}


# ada_seq with HF generate and one epoch takes pi_old from the update's own pass: the correction still
# needs the generator's log-probs
ADA_SEQ_ONE_EPOCH = [*OWN["ada_seq.py"][:-2], "--num_iterations", "1"]
MASKED_RUNS = [pytest.param(script, OWN[script], id=script) for script in SCRIPTS]
MASKED_RUNS += [pytest.param("ada_seq.py", ADA_SEQ_ONE_EPOCH, id="ada_seq.py-one_epoch")]


@pytest.mark.parametrize("script, own", MASKED_RUNS)
def test_a_step_whose_every_ratio_is_masked_has_no_policy_gradient(
    script, own, tiny_base, tmp_path
):
    # HF generate scores its samples with the trainer's weights: every token's ratio is within ~1e-5 of 1, so
    # token_mask with clip_max 0.5 masks every token: the policy-gradient term, and with beta 0 the whole
    # gradient, is zero. Without the weights in the loss the step trains on the rewards' spread.
    (tmp_path / "spread.py").write_text(SPREAD)
    out = tmp_path / "run"
    run_main(
        [
            script,
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            *TINY,
            *own,
            "--reward_funcs",
            f"{tmp_path / 'spread.py'}:spread",
            "--vllm_importance_sampling_correction",
            "--vllm_importance_sampling_mode",
            "token_mask",
            "--vllm_importance_sampling_clip_max",
            "0.5",
        ]
    )
    row = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert row["frac_zero_var_groups"] < 1, row  # there was a signal to train on
    assert row["sampling/importance_sampling_outside_frac"] == 1.0, row
    assert row["sampling/importance_sampling_ratio/max"] == 0.0, row
    # the trainer and HF generate's cached decode agree: the ratio is a check here, not a correction
    assert row["sampling/sampling_logp_difference/max"] < 1e-3, row
    # the gap is the sampler's, against the trainer's first pass (not against pi_old)
    assert row["sampler_logp_diff"] == pytest.approx(
        row["sampling/sampling_logp_difference/mean"], rel=1e-6
    )
    assert row["loss"] == 0.0 and row["grad_norm"] == 0.0, row


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_lists_the_four_flags_with_trls_defaults(script, capsys):
    module = __import__(script[:-3])
    with pytest.raises(SystemExit) as stop:
        parse_args(module.Args, ["--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--vllm_importance_sampling_correction [BOOL] reweight each sampled token" in text
    assert "(default: on with --use_vllm, as TRL, off with HF generate)" in " ".join(text.split())
    assert "(`truncate`) (default: sequence_mask)" in text
    assert "file: none) [> 0] (default: 3.0)" in text
    assert "below --vllm_importance_sampling_clip_max [>= 0] (default: none)" in text


@pytest.mark.parametrize("script", ["ra_rloo.py", "pros_ppo.py", "ada_seq.py", "ada_est.py"])
def test_the_ratio_metrics_count_only_the_trained_tokens(script, tiny_base, tmp_path):
    # every completion cut at one token and dropped by --mask_truncated_completions: no token is
    # trained, so no ratio is counted (as ps_grpo and TRL leave masked tokens out)
    out = tmp_path / "run"
    run_main(
        [
            script,
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            *TINY,
            *OWN[script],
            "--max_completion_length",
            "1",
            "--mask_truncated_completions",
            "true",
            "--vllm_importance_sampling_correction",
        ]
    )
    row = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert row["clipped_ratio"] == 1.0, row  # the condition: every completion was cut
    assert row["sampling/importance_sampling_ratio/mean"] is None, row
    assert row["sampling/importance_sampling_outside_frac"] is None, row


def test_the_weights_carry_no_gradient():
    # rho is a fixed reweighting of each token's term: the gradient of (weight x log pi) is weight x grad log pi,
    # with no term from differentiating the weight itself (which would double a truncated token's pull)
    trainer, sampler, known, _ = _batch()
    trainer = trainer.clone().requires_grad_(True)
    for mode in ("token_truncate", "sequence_truncate"):
        weight, _ = sampler_is_weights(trainer, sampler, known, mode, None, None)
        assert not weight.requires_grad, mode
        (weight * trainer).sum().backward()
        assert torch.allclose(trainer.grad, weight), mode
        trainer.grad = None


def test_the_sequence_modes_metrics_count_sequences_and_the_gap_counts_tokens():
    # sequence_truncate at clip_max 3: row 0's ratio exp(1.8) clipped to 3, row 1's exp(-1.6) kept; the ratio
    # mean and outside share are over the 2 sequences, the log-prob gap over the 6 known tokens
    trainer, sampler, known, _ = _batch()
    _, sums = sampler_is_weights(trainer, sampler, known, "sequence_truncate", None, 3.0)
    update, extremes = split_extremes([sums])
    totals = {name: sum(float(d.get(name, 0.0)) for d in update) for name in sums}

    class One:
        num_processes = 1

    row = correction_metrics(One(), totals, extremes)
    assert row["sampling/importance_sampling_ratio/mean"] == pytest.approx(
        (3.0 + math.exp(-1.6)) / 2
    )
    assert row["sampling/importance_sampling_outside_frac"] == pytest.approx(1 / 2)
    assert row["sampling/sampling_logp_difference/mean"] == pytest.approx(4.6 / 6)
    assert row["sampling/importance_sampling_ratio/min"] == pytest.approx(math.exp(-1.6))


def _flat(weights: dict) -> torch.Tensor:
    return torch.cat([weights[name].flatten().double() for name in sorted(weights)])


@pytest.mark.parametrize("script", ["ada_seq.py", "ada_est.py"])
def test_pi_old_is_each_micro_batchs_first_epoch_pass(script, tiny_base, tmp_path):
    # two epochs at a large learning rate over several micro-batches (2 rows each): the second
    # epoch's ratios against pi_old leave the clip range. HF generate scores its samples with the
    # trainer's weights (rho within ~1e-5 of 1), so the correction, kept right, moves the trained
    # weights by ~1e-5 of the update (measured 2e-5 to 5e-5); pi_old recomputed in the second
    # epoch (ratio 1, nothing clipped) or a micro-batch reading another's cached pass moves them
    # by ~0.4 to 0.6 of it
    (tmp_path / "spread.py").write_text(SPREAD)
    trained = {}
    for correction in ("false", "true"):
        out = tmp_path / correction
        run_main(
            [
                script,
                "--model_name_or_path",
                tiny_base,
                "--output_dir",
                str(out),
                *TINY,
                *OWN[script],
                *("--learning_rate", "1e-2", "--micro_batch_size", "2"),
                "--reward_funcs",
                f"{tmp_path / 'spread.py'}:spread",
                "--vllm_importance_sampling_correction",
                correction,
            ]
        )
        trained[correction] = _flat(load_file(out / "model" / "model.safetensors"))
    update = (trained["false"] - _flat(load_file(f"{tiny_base}/model.safetensors"))).norm()
    assert update > 0  # the condition: the step trained
    gap = float((trained["true"] - trained["false"]).norm() / update)
    assert gap < 3e-3, gap
