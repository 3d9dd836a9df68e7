"""Reinforce-Ada-Seq: exit rules, multi-round sampling, downsampling, global-statistics advantages,
Appendix D's Bernoulli cost simulation, and the script end to end (GRPO-n mode, exact resume)."""

import json
import math
import random

import pytest
import torch
from conftest import run_main, run_script

from ada_seq import (
    Args,
    downsample,
    exit_reached,
    global_advantages,
    multi_round_sampling,
    pool_advantages,
    seq_metrics,
)
from common.rl.advantages import grpo_advantages
from common.run.flags import parse_args

THR = 0.7


# ---------------------------------------------------------------- exit rules and phase 1


def test_exit_rules():
    assert exit_reached([1, 1, 0], "positive", 2, 2, THR)
    assert not exit_reached([1, 0, 0, 0], "positive", 2, 2, THR)
    assert not exit_reached([1, 1, 1, 1], "balanced", 2, 2, THR)  # all positive: no negatives yet
    assert not exit_reached([0.7] * 8, "balanced", 1, 1, THR)  # 0.7 is not > 0.7: all negative
    assert exit_reached([1, 0, 0.5, 1], "balanced", 2, 2, THR)  # shaped 0.5 counts as negative


def _scripted(outcomes):
    """sample_round stand-in: prompt i's r-th draw is outcomes[i][r % len]; records every call."""
    calls, drawn = [], {}

    def sample_round(active, m):
        calls.append(list(active))
        out = []
        for i in active:
            k = drawn.get(i, 0)
            out.append([outcomes[i][(k + j) % len(outcomes[i])] for j in range(m)])
            drawn[i] = k + m
        return out

    return sample_round, calls


def test_multi_round_sampling_retires_prompts_and_caps_rounds():
    # prompt 0 always passes, 1 always fails, 2 is mixed, 3 passes one time in 8 (first success in round 2)
    outcomes = [[1.0], [0.0], [1.0, 0.0], [0.0] * 7 + [1.0]]
    sr, calls = _scripted(outcomes)
    done = lambda rs: exit_reached(rs, "balanced", 1, 1, THR)  # noqa: E731
    pools, exits = multi_round_sampling(4, sr, done, max_rounds=3, m=4)
    assert exits == [None, None, 1, 2]
    assert calls == [[0, 1, 2, 3], [0, 1, 3], [0, 1]]  # only active prompts are sampled again
    assert [len(p) for p in pools] == [12, 12, 4, 8]
    sr, calls = _scripted(outcomes)
    pools, exits = multi_round_sampling(
        4, sr, lambda rs: exit_reached(rs, "positive", 1, 0, THR), 3, 4
    )
    assert exits == [1, None, 1, 2] and calls == [[0, 1, 2, 3], [1, 3], [1]]
    # one round of n: nothing adaptive (GRPO-n)
    sr, calls = _scripted(outcomes)
    pools, exits = multi_round_sampling(4, sr, done, 1, 4)
    assert calls == [[0, 1, 2, 3]] and [len(p) for p in pools] == [4] * 4


# ---------------------------------------------------------------- phase 2: downsampling


@pytest.mark.parametrize(
    "pool,n,expect_pos",
    [
        ([0.0] * 8, 4, 0),  # all negative (unfinished prompt): n negatives
        ([1.0] * 8, 4, 4),  # all positive: n positives
        ([1.0] + [0.0] * 7, 4, 1),  # positives short: negatives top up
        ([1.0] * 7 + [0.0], 4, 3),  # negatives short: positives top up
        ([1.0] * 3 + [0.0] * 13, 4, 2),  # both plentiful: n//2 positives
        ([1.0] * 3 + [0.0] * 13, 5, 2),  # odd n: n//2 positives, the rest negatives
        ([0.1, 1.0, 0.5, 0.0], 4, 1),  # pool of exactly n: everything kept
    ],
)
def test_downsample_counts(pool, n, expect_pos):
    keep = downsample(pool, n, THR, random.Random(0))
    assert len(keep) == n == len(set(keep)) and keep == sorted(keep)
    assert sum(pool[j] > THR for j in keep) == expect_pos


def test_downsample_is_a_seeded_random_choice():
    pool = [1.0] * 6 + [0.0] * 10
    picks = {tuple(downsample(pool, 4, THR, random.Random(s))) for s in range(20)}
    assert len(picks) > 1  # not simply the first ones generated
    assert downsample(pool, 4, THR, random.Random(3)) == downsample(pool, 4, THR, random.Random(3))
    with pytest.raises(ValueError):
        downsample([1.0, 0.0], 4, THR, random.Random(0))


# ---------------------------------------------------------------- global-statistics advantages


def test_global_advantages_worked_example():
    pool = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0] * 2  # 16 responses, 2 positive: p_hat = 1/8
    kept = [1.0, 1.0, 0.0, 0.0]  # the balanced downsample
    adv = global_advantages(kept, pool, THR, std_norm=False, weight="none")
    assert adv == pytest.approx(
        [0.875, 0.875, -0.125, -0.125]
    )  # baseline 1/8, not the kept mean 1/2
    assert adv != pytest.approx(grpo_advantages(torch.tensor([kept]), scale=False)[0].tolist())
    assert global_advantages(kept, pool, THR, False, "inv_p") == pytest.approx(
        [7.0, 7.0, -1.0, -1.0]
    )
    assert global_advantages(kept, pool, THR, False, "inv_sqrt_p") == pytest.approx(
        [0.875 * math.sqrt(8), 0.875 * math.sqrt(8), -0.125 * math.sqrt(8), -0.125 * math.sqrt(8)]
    )
    std = math.sqrt(0.125 * 0.875)
    assert global_advantages(kept, pool, THR, True, "none") == pytest.approx(
        [0.875 / std, 0.875 / std, -0.125 / std, -0.125 / std], rel=1e-4
    )
    # all-fail pool: zero advantages, and the 1/p_hat weight stays finite (p_hat floored at 1/N)
    assert global_advantages([0.0] * 4, [0.0] * 32, THR, True, "inv_p") == [0.0] * 4


def test_one_round_of_n_is_grpo():
    rewards = [1.0, 0.0, 0.0, 1.0]
    keep = downsample(rewards, 4, THR, random.Random(0))
    adv = global_advantages([rewards[j] for j in keep], rewards, THR, False, "none")
    assert keep == [0, 1, 2, 3]
    assert adv == pytest.approx(grpo_advantages(torch.tensor([rewards]), scale=False)[0].tolist())
    assert global_advantages(rewards, rewards, THR, True, "none") == pytest.approx(
        grpo_advantages(torch.tensor([rewards]))[0].tolist(), rel=1e-4
    )


def test_default_baseline_is_grpo_eq2_and_dr_grpo_is_the_flag():
    # GRPO-n = one round of n with the default flags: the paper's eq. (2), (r - mean) / std over the group
    a = Args(max_rounds=1, round_repeat=4)
    rewards = [1.0, 0.0, 0.0, 0.0]
    adv = global_advantages(rewards, rewards, THR, a.scale_rewards, a.prompt_weight)
    assert adv == pytest.approx(
        grpo_advantages(torch.tensor([rewards]), scale=True)[0].tolist(), rel=1e-4
    )
    assert adv[0] == pytest.approx(0.75 / math.sqrt(0.1875), rel=1e-4)
    dr = Args(max_rounds=1, round_repeat=4, scale_rewards=False)  # Dr. GRPO-n: r - mean
    assert global_advantages(rewards, rewards, THR, dr.scale_rewards, dr.prompt_weight) == [
        0.75,
        -0.25,
        -0.25,
        -0.25,
    ]


def test_reinforce_ada_default_advantage_has_no_std_and_grpo_n_keeps_eq2():
    # Reinforce-Ada (more than one round) defaults to Alg. 2 line 19: a kept positive of a pool with 1 success in 32
    # gets A = 1 - 1/32 (with the std it would be 5.6)
    pool = [1.0] + [0.0] * 31
    ada = Args()  # SEQ-BALANCE defaults: 4 rounds
    assert ada.max_rounds > 1 and ada.scale_rewards is False
    assert Args(exit_condition="positive").scale_rewards is False
    kept_adv = global_advantages(
        [1.0, 0.0, 0.0, 0.0], pool, THR, ada.scale_rewards, ada.prompt_weight
    )
    assert kept_adv[0] == pytest.approx(1 - 1 / 32) and kept_adv[1] == pytest.approx(-1 / 32)
    # GRPO-n (one round) keeps eq. (2): a group of 4 with one success gives (1 - 0.25) / sqrt(0.25 * 0.75)
    grpo = Args(max_rounds=1, round_repeat=4)
    assert grpo.scale_rewards is True
    group = [1.0, 0.0, 0.0, 0.0]
    assert global_advantages(group, group, THR, grpo.scale_rewards, grpo.prompt_weight)[
        0
    ] == pytest.approx(0.75 / math.sqrt(0.1875), rel=1e-4)
    # one flag overrides both, and the parsed value is what a run writes to args.json
    assert parse_args(Args, ["--scale_rewards", "true"]).scale_rewards is True
    assert (
        parse_args(
            Args, ["--max_rounds", "1", "--round_repeat", "4", "--scale_rewards", "false"]
        ).scale_rewards
        is False
    )
    assert parse_args(Args, ["--max_rounds", "1", "--round_repeat", "4"]).scale_rewards is True
    assert parse_args(Args, []).scale_rewards is False and parse_args(Args, []).warmup_steps == 10


def test_unfinished_prompts_pass_ratio_fallback():
    # 3 positives in a pool of 32: balanced keeps 2 positives of 4; the pass-ratio fallback keeps
    # max(1, floor(4 * 3/32)) = 1; without positives both keep 4 negatives; mostly positive: floor(4 * 30/32) = 3
    pool = [1.0] * 3 + [0.0] * 29
    for rule, want in (("balanced", 2), ("pass_ratio", 1)):
        keep = downsample(pool, 4, THR, random.Random(0), rule)
        assert len(keep) == 4 and sum(pool[j] > THR for j in keep) == want, rule
    assert downsample([0.0] * 8, 4, THR, random.Random(0), "pass_ratio") == sorted(
        downsample([0.0] * 8, 4, THR, random.Random(0), "balanced")
    )
    mostly = [1.0] * 30 + [0.0] * 2
    assert (
        sum(mostly[j] > THR for j in downsample(mostly, 4, THR, random.Random(0), "pass_ratio"))
        == 3
    )


def test_seq_metrics():
    m = seq_metrics(
        [8, 16, 32, 32], [1, 2, None, 4], [False, False, True, False], n=4, max_rounds=4
    )
    assert m["ada_samples_step"] == 88 and m["ada_samples_per_prompt_mean"] == 22
    assert m["ada_samples_per_prompt_max"] == 32 and m["ada_inference_cost_rel"] == 88 / 16
    assert m["ada_rounds_used"] == 4 and m["ada_frac_unfinished"] == 0.25
    assert [m[f"ada_active_after_round_{r}"] for r in (1, 2, 3, 4)] == [0.75, 0.5, 0.5, 0.25]
    assert m["ada_frac_zero_var_groups_post"] == 0.25
    assert not any(
        k.startswith("ada_samples_per_prompt_easy") for k in m
    )  # untagged prompts: no level metrics
    tagged = seq_metrics(
        [8, 16, 32, 32],
        [1, 2, None, 4],
        [False] * 4,
        n=4,
        max_rounds=4,
        tags=["easy", "hard", "hard", "easy"],
    )
    assert (
        tagged["ada_samples_per_prompt_easy"] == 20 and tagged["ada_samples_per_prompt_hard"] == 24
    )


# ---------------------------------------------------------------- Appendix D: Bernoulli(p) simulator


def _cost(p, rule, k, m, max_rounds, sims, seed):
    """Mean responses generated per prompt by phase 1 when every response is a Bernoulli(p) success."""
    rng = random.Random(seed)
    sample_round = lambda active, mm: [[float(rng.random() < p) for _ in range(mm)] for _ in active]  # noqa: E731
    done = lambda rs: exit_reached(rs, rule, k, k, THR)  # noqa: E731
    pools, _ = multi_round_sampling(sims, sample_round, done, max_rounds, m)
    return sum(map(len, pools)) / sims


def _capped_negbin_mean(p, k, cap):
    """E[min(T, cap)] for T = draws until the k-th success: sum_{t < cap} P(fewer than k successes in t draws)."""
    return sum(
        sum(math.comb(t, j) * p**j * (1 - p) ** (t - j) for j in range(k)) for t in range(cap)
    )


@pytest.mark.parametrize("p,k", [(0.5, 1), (0.2, 1), (0.25, 4), (0.1, 2)])
def test_positive_rule_costs_k_over_p(p, k):
    # one response per round and a budget that never binds: E[N] = K/p (Sec. 3.2)
    assert _cost(p, "positive", k, 1, 2000, 3000, seed=1) == pytest.approx(k / p, rel=0.06)


@pytest.mark.parametrize("p,k,m,n_max", [(0.02, 1, 1, 32), (0.05, 2, 1, 32), (0.04, 2, 4, 32)])
def test_positive_rule_is_capped_by_the_budget(p, k, m, n_max):
    cost = _cost(p, "positive", k, m, n_max // m, 3000, seed=2)
    assert cost <= n_max and cost < k / p  # the cap binds
    if m == 1:
        assert cost == pytest.approx(_capped_negbin_mean(p, k, n_max), rel=0.03)


def test_balanced_cost_is_u_shaped_in_p():
    # App. D / Fig. 10 setting: N_max = 64, rounds of k_batch = N_max/8 = 8
    ps = [0.03, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.97]
    cost = {p: _cost(p, "balanced", 2, 8, 8, 1500, seed=3) for p in ps}
    low = min(cost, key=cost.get)
    assert 0.2 <= low <= 0.8  # cheapest in the middle ...
    assert cost[0.03] > 2 * cost[0.5] and cost[0.97] > 2 * cost[0.5]  # ... dearest at both ends
    assert all(
        cost[a] >= cost[b] - 0.5 for a, b in zip(ps, ps[1:]) if b <= 0.35
    )  # falls towards the middle
    assert all(
        cost[a] - 0.5 <= cost[b] for a, b in zip(ps, ps[1:]) if a >= 0.65
    )  # and rises after it
    assert cost[0.1] == pytest.approx(cost[0.9], rel=0.1)  # K_pos = K_neg: symmetric in p <-> 1 - p
    # the positive rule has no right arm: its cost only falls as p grows
    pos = [_cost(p, "positive", 2, 8, 8, 1500, seed=4) for p in ps]
    assert pos[-1] == 8 and pos[0] > pos[4] >= pos[-1]


# ---------------------------------------------------------------- flags


def test_args_validation_and_defaults():
    a = Args()
    assert a.quotas() == (2, 2) and Args(num_generations=5).quotas() == (2, 3)
    # SEQ-POS exits after one positive by default (the authors' code); the text's K_pos is a flag
    assert Args(exit_condition="positive").quotas() == (1, 2)
    assert Args(exit_condition="positive", k_pos=16).quotas() == (16, 2)
    with pytest.raises(SystemExit, match="--entropy_coef -1.0: must be >= 0"):
        parse_args(Args, ["--entropy_coef", "-1"])
    with pytest.raises(SystemExit, match="--round_repeat 2: must be >= --num_generations 4"):
        parse_args(Args, ["--round_repeat", "2"])  # M < n
    with pytest.raises(SystemExit, match="--max_rounds 0: must be >= 1"):
        parse_args(Args, ["--max_rounds", "0"])


def test_every_flag_is_documented():
    from dataclasses import fields

    from common.run.flag_help import field_docs

    docs = field_docs(Args)
    assert not [f.name for f in fields(Args) if not docs.get(f.name)]
    out = run_script(["ada_seq.py", "--help"]).stdout
    assert all(f"--{f.name}" in out for f in fields(Args))


# ---------------------------------------------------------------- end to end


COMMON = [
    "--prompts_per_step",
    "8",
    "--eval_prompts",
    "8",
    "--eval_samples",
    "4",
    "--max_completion_length",
    "20",
    "--num_threads",
    "1",
]


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time_", "time/"))} for r in rows]


def test_grpo_n_mode_generates_exactly_n(tiny_base, tmp_path):
    run_main(
        [
            "ada_seq.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            "2",
            "--eval_steps",
            "0",
            "--prompt_pool",
            "48",
            "--max_rounds",
            "1",
            "--round_repeat",
            "4",
            *COMMON,
        ]
    )
    rows = _rows(tmp_path)[1:]
    assert [r["rollouts"] for r in rows] == [32, 64]
    assert all(r["ada_inference_cost_rel"] == 1.0 and r["ada_rounds_used"] == 1 for r in rows)
    assert all(r["ada_frac_zero_var_groups_post"] == r["frac_zero_var_groups"] for r in rows)
    saved = json.loads(
        (tmp_path / "args.json").read_text()
    )  # GRPO-n: eq. (2)'s std, recorded as used
    assert saved["scale_rewards"] is True and saved["warmup_steps"] == 10


def test_exit_condition_stops_sampling(tiny_base, tmp_path):
    # threshold -1: every response is "positive", so SEQ-POS retires every prompt after round 1, while
    # SEQ-BALANCE (in the resume test below) never finds a negative and runs all rounds
    run_main(
        [
            "ada_seq.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            "2",
            "--eval_steps",
            "0",
            "--prompt_pool",
            "48",
            "--exit_condition",
            "positive",
            "--positive_threshold",
            "-1",
            "--round_repeat",
            "8",
            "--max_rounds",
            "3",
            *COMMON,
        ]
    )
    rows = _rows(tmp_path)[1:]
    assert [r["rollouts"] for r in rows] == [64, 128] and all(r["pass_rate"] == 1.0 for r in rows)
    assert all(r["ada_rounds_used"] == 1 and r["ada_active_after_round_1"] == 0.0 for r in rows)
    assert all(r["ada_inference_cost_rel"] == 2.0 and r["ada_frac_unfinished"] == 0.0 for r in rows)
    assert (
        json.loads((tmp_path / "args.json").read_text())["scale_rewards"] is False
    )  # Reinforce-Ada: r - mean(pool)


def test_balanced_run_and_exact_resume(tiny_base, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    base = [
        "ada_seq.py",
        "--model_name_or_path",
        tiny_base,
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--prompt_pool",
        "16",
        "--round_repeat",
        "4",
        "--max_rounds",
        "3",
        *COMMON,
    ]
    run_main([*base, "--output_dir", str(full), "--max_steps", "4"])
    run_main([*base, "--output_dir", str(part), "--max_steps", "2"])  # "killed" after step 2
    run_main(
        [*base, "--output_dir", str(part), "--max_steps", "4", "--resume_from_checkpoint", "auto"]
    )
    a, b = _strip(_rows(full)), _strip(_rows(part))
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert a == b  # same rounds, downsampling draws, losses and eval after the resume
    rows = a[1:]
    keys = {
        "ada_samples_per_prompt_mean",
        "ada_samples_per_prompt_max",
        "ada_rounds_used",
        "ada_frac_unfinished",
        "ada_frac_zero_var_groups_post",
        "ada_inference_cost_rel",
        "ada_active_after_round_1",
        "ada_active_after_round_3",
        "eval_pass@1",
        "frac_zero_var_groups",
        "loss",
        "entropy",
    }
    assert keys <= set(rows[-1])
    assert rows[-1]["rollouts"] == sum(
        r["ada_samples_step"] for r in rows
    )  # every round's samples are counted
    for r in rows:
        assert 1.0 <= r["ada_inference_cost_rel"] <= 3.0 and r["ada_samples_per_prompt_max"] <= 12
        # a prompt whose first n responses disagree keeps both kinds: downsampling never adds zero variance
        assert r["ada_frac_zero_var_groups_post"] <= r["frac_zero_var_groups"]
        assert (
            r["ada_active_after_round_1"]
            >= r["ada_active_after_round_2"]
            >= r["ada_frac_unfinished"]
        )
    assert any(r["ada_rounds_used"] > 1 for r in rows)  # some prompts needed more rounds
    if all(
        r["pass_rate"] == 0 for r in rows
    ):  # the test policy fails everything: nothing ever exits
        assert all(
            r["ada_frac_unfinished"] == 1.0 and r["ada_inference_cost_rel"] == 3.0 for r in rows
        )


# ---------------------------------------------------------------- in process: DAPO, truncation, sample log


def _main(out, extra, monkeypatch, reward=lambda text, problem: float(len(text) % 3 == 0)):
    """ada_seq.main in process; the training reward (`--reward tinyzero`, patched) varies, unlike the test base's."""
    import ada_seq
    from common.demo import countdown
    from common.run.flags import parse_args

    monkeypatch.setitem(countdown.REWARDS, "tinyzero", reward)
    ada_seq.main(
        parse_args(
            ada_seq.Args,
            [
                "--output_dir",
                str(out),
                "--eval_steps",
                "0",
                "--reward",
                "tinyzero",
                "--prompt_pool",
                "48",
                *COMMON,
                *extra,
            ],
        )
    )
    return _rows(out)


def _samples(path):
    return [json.loads(line) for line in (path / "samples.jsonl").read_text().splitlines()]


def test_dynamic_sampling_keeps_only_groups_with_signal(tiny_base, tmp_path, monkeypatch, capsys):
    # [DAPO] GRPO-n4 + dynamic sampling: zero-variance groups are dropped, new prompts refill the batch
    grpo_n4 = [
        "--model_name_or_path",
        tiny_base,
        "--max_rounds",
        "1",
        "--round_repeat",
        "4",
        "--dynamic_sampling",
    ]
    rows = _main(
        tmp_path / "dapo", [*grpo_n4, "--max_steps", "2", "--max_dynamic_rounds", "3"], monkeypatch
    )[1:]
    for r in rows:
        assert {"dapo_rounds", "dapo_kept_groups", "dapo_sampled_groups"} <= set(r)
        assert r["ada_frac_zero_var_groups_post"] == 0.0  # every kept group has signal
        assert r["dapo_kept_groups"] <= 8 and r["dapo_sampled_groups"] == 8 * (1 + r["dapo_rounds"])
        assert r["dapo_rounds"] == 3 or r["dapo_kept_groups"] == 8  # refilled until full or capped
        assert r["ada_inference_cost_rel"] == r["dapo_sampled_groups"] / 8
        assert r["dapo_batch_fill"] == r["dapo_kept_groups"] / 8  # trained / prompts_per_step
    assert rows[-1]["rollouts"] == 4 * sum(
        r["dapo_sampled_groups"] for r in rows
    )  # refills are counted
    assert any(r["dapo_rounds"] > 0 for r in rows) and any(
        r["frac_zero_var_groups"] > 0 for r in rows
    )
    kinds = {s["kind"] for s in _samples(tmp_path / "dapo")}
    assert "fresh" in kinds and kinds <= {"fresh", "dynamic_refill"}
    # no group has signal (reward 0, cut or not): the cap on extra rounds ends the search, nothing is trained on
    flat = _main(
        tmp_path / "flat",
        [*grpo_n4, "--max_steps", "1", "--max_dynamic_rounds", "2"],
        monkeypatch,
        reward=lambda text, problem: 0.0,
    )[1:]
    assert (
        flat[0]["dapo_rounds"] == 2
        and flat[0]["dapo_kept_groups"] == 0
        and flat[0]["dapo_sampled_groups"] == 24
    )
    assert flat[0]["loss"] == 0.0 and flat[0]["grad_norm"] == 0.0
    assert flat[0]["dapo_batch_fill"] == 0.0 and "did not fill the batch" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--dynamic_sampling"):
        Args(dynamic_sampling=True, max_rounds=2).validate()


def test_training_prompt_evaluation_leaves_the_training_steps_unchanged(
    tiny_base, tmp_path, monkeypatch
):
    """eval_train_* samples in a copy of the random state: evaluating every step with and without it gives the same
    training rows (rounds, downsampling draws, losses), so runs made before it stay comparable."""
    seq = [
        "--model_name_or_path",
        tiny_base,
        "--max_steps",
        "3",
        "--eval_steps",
        "1",
        "--max_rounds",
        "2",
    ]
    on = _main(tmp_path / "on", seq, monkeypatch)
    off = _main(tmp_path / "off", [*seq, "--eval_train_prompts", "0"], monkeypatch)

    def training(rows):
        return [
            {k: v for k, v in r.items() if not k.startswith(("time_", "time/", "eval_"))}
            for r in rows
        ]

    assert training(on) == training(off)
    assert all(
        "eval_train_pass@1" in r and "eval_train_pass@4" in r and "eval_train_pass@1" not in o
        for r, o in zip(on, off)
    )
    assert any(k.startswith("eval_train_pass@1_") for k in on[-1])  # per level
    assert (
        json.loads((tmp_path / "on" / "args.json").read_text())["eval_train_prompts"] == 8
    )  # = --eval_prompts
    # [ADA] mechanism: every prompt keeps n = 4 trained responses; a pool-wide baseline need not average 0
    assert all(
        r["ada_trained_responses"] == 8 * 4 and r["ada_adv_mean_trained"] is not None
        for r in on[1:]
    )
    # GRPO-n: group-centred advantages average exactly 0, overall and per level
    grpo = _main(
        tmp_path / "grpo",
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "2",
            "--max_rounds",
            "1",
            "--round_repeat",
            "4",
        ],
        monkeypatch,
    )[1:]
    for r in grpo:
        means = [v for k, v in r.items() if k.startswith("ada_adv_mean_trained")]
        assert r["ada_trained_responses"] == 32 and len(means) >= 2 and max(map(abs, means)) < 1e-6


def test_dynamic_sampling_resumes_exactly(tiny_base, tmp_path, monkeypatch):
    # [DAPO] the refill prompts come from the checkpointed sampler: a resumed run draws the same ones
    base = [
        "--model_name_or_path",
        tiny_base,
        "--max_rounds",
        "1",
        "--round_repeat",
        "4",
        "--dynamic_sampling",
        "--save_steps",
        "1",
        "--eval_steps",
        "1",
        "--eval_prompts",
        "4",
        "--eval_samples",
        "2",
    ]
    full = _main(tmp_path / "full", [*base, "--max_steps", "2"], monkeypatch)
    _main(tmp_path / "part", [*base, "--max_steps", "1"], monkeypatch)
    part = _main(
        tmp_path / "part",
        [*base, "--max_steps", "2", "--resume_from_checkpoint", "auto"],
        monkeypatch,
    )
    assert _strip(full) == _strip(part) and any(r.get("dapo_rounds") for r in full)


def test_truncated_completions_get_reward_zero_and_optionally_no_gradient(
    tiny_base, tmp_path, monkeypatch
):
    # every completion is cut at 2 tokens: reward 0 though the (patched) reward would give 1
    base = [
        "--model_name_or_path",
        tiny_base,
        "--max_steps",
        "1",
        "--max_completion_length",
        "2",
        "--max_rounds",
        "1",
        "--round_repeat",
        "4",
    ]
    one = lambda text, problem: 1.0  # noqa: E731
    masked = _main(tmp_path / "masked", [*base, "--mask_truncated_completions"], monkeypatch, one)[
        1
    ]
    plain = _main(tmp_path / "plain", base, monkeypatch, one)[1]
    for r in (masked, plain):
        assert r["clipped_ratio"] == 1.0 and r["reward_mean"] == 0.0 and r["pass_rate"] == 0.0
    assert masked["loss"] == 0.0 and masked["grad_norm"] == 0.0 and masked["entropy"] == 0.0
    assert (
        plain["grad_norm"] > 0.0
    )  # unmasked: the entropy bonus still pulls on the cut completions


def test_sample_log_pass_at_k_and_sampler_logp_diff(tiny_base, tmp_path, monkeypatch, capsys):
    rows = _main(
        tmp_path,
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "2",
            "--eval_steps",
            "1",
            "--round_repeat",
            "4",
            "--max_rounds",
            "2",
            "--old_logprobs",
            "sampler",
            "--log_samples_per_kind",
            "3",
            "--logp_diff_warn",
            "0",
        ],
        monkeypatch,
    )
    assert all({"eval_pass@1", "eval_pass@2", "eval_pass@4"} <= set(r) for r in rows)
    for r in rows[1:]:  # the HF sampler's log-probs are the trainer's (fp32, same weights)
        assert isinstance(r["sampler_logp_diff"], float) and r["sampler_logp_diff"] < 1e-4
    assert (
        capsys.readouterr().out.count("warning: sampler_logp_diff") == 1
    )  # warned once (threshold 0: any gap)
    samples = _samples(tmp_path)
    assert [s["step"] for s in samples] == [1, 1, 1, 2, 2, 2] and {s["kind"] for s in samples} == {
        "fresh"
    }
    for s in samples:
        assert {
            "prompt",
            "completion",
            "reward",
            "advantage",
            "truncated",
            "ada_pool_size",
            "ada_exit_round",
        } <= set(s)
        assert s["ada_exit_round"] in (None, 1, 2) and s["ada_pool_size"] == 4 * (
            s["ada_exit_round"] or 2
        )


def test_pool_advantages_downsample_by_whether_the_pool_met_the_exit_condition():
    # Alg. 2 l. 18 downsamples a pool that met the exit condition balanced, and only an unfinished
    # one by --unfinished_downsample: the same pool of 6 successes in 8 keeps 2 + 2 when finished,
    # 3 + 1 (its pass ratio) when not
    args = Args(num_generations=4, round_repeat=8, unfinished_downsample="pass_ratio")
    pool = [1.0] * 6 + [0.0] * 2
    _, kept, _ = pool_advantages([0, 1], [pool, pool], [1, None], 4, 0.5, args)
    assert [sum(rewards) for rewards in kept] == [2.0, 3.0], kept
