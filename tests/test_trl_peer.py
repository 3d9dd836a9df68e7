"""benchmarks/speed/trl_peer.py without trl (the main venv has none): the prompts and reward it hands TRL, the install
hint when trl is missing, and the results page's arithmetic on hand-made numbers. The TRL runs themselves
(throughput and the definition check) need trl and are run by hand; their output is results/trl_peer.md."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.speed import trl_peer
from common.demo import countdown
from common.demo.countdown import countdown_task

ROOT = Path(__file__).resolve().parents[1]


def test_dataset_holds_the_training_prompts_in_order_and_the_reward_scores_them():
    examples, reward_fn = trl_peer.countdown_examples(8)
    assert [ex.prompt for ex in examples] == [
        ex.prompt for ex in countdown_task("binary", 1).train[:8]
    ]
    ds = trl_peer.build_dataset(examples)
    assert ds["prompt"] == [
        countdown.prompt_text(ex.answer) for ex in examples
    ]  # plain text, no template
    assert ds["problem_id"] == [ex.id for ex in examples]

    reward = trl_peer.CountdownReward(examples, reward_fn)
    p = examples[3].answer
    right = countdown.solution_text(countdown.solutions(p)[0])
    wrong = countdown.solution_text(
        countdown.solutions(p)[0][:1]
    )  # first step only: numbers left unused
    other = countdown.solution_text(
        countdown.solutions(examples[5].answer)[0]
    )  # another problem's answer
    got = reward(
        prompts=[ds["prompt"][3]] * 3,
        completions=[right, wrong, other],
        completion_ids=[[1] * 5, [1] * 3, [1]],
        problem_id=[3, 3, 3],
        trainer_state=None,
    )
    assert got == [1.0, 0.0, 0.0]
    assert reward.tokens_per_call == [
        9
    ]  # the generated tokens of that call (one call = one TRL step)
    assert reward.__name__ == "countdown_binary"


def test_missing_trl_exits_with_the_install_hint():
    # this venv has no trl; where it has, the import is blocked so the test still runs (never skips)
    script = ["benchmarks/speed/trl_peer.py", "--check"]
    if importlib.util.find_spec("trl") is not None:
        script = [
            "-c",
            "import runpy, sys; sys.modules['trl'] = None; sys.argv = ['trl_peer.py', '--check']; "
            "runpy.run_path('benchmarks/speed/trl_peer.py', run_name='__main__')",
        ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, *script], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode != 0
    assert "pip install trl" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_steps_is_rejected():
    with pytest.raises(SystemExit, match="--steps"):
        trl_peer.Args(steps=2).validate()
    with pytest.raises(SystemExit, match="--micro_batch_size"):
        trl_peer.Args(micro_batch_size=48).validate()


def run(times, tokens):
    return {"step_times": times, "tokens": tokens}


def test_throughput_and_ratio_arithmetic():
    # step 1 (warm-up) and the last step (ours evaluates in it) are dropped: steps 2-4 count
    trl = trl_peer.throughput([run([9.0, 2.0, 1.0, 3.0, 50.0], [100, 200, 100, 300, 999])])
    assert trl["steps"] == [2, 4] and trl["timed"] == 3
    assert trl["step_s"] == pytest.approx(2.0) and trl["steps_per_s"] == pytest.approx(0.5)
    assert trl["tokens_per_s"] == pytest.approx(600 / 6.0) and trl[
        "tokens_per_step"
    ] == pytest.approx(200)
    ours = trl_peer.throughput([run([5.0, 1.0, 0.5, 1.5, 60.0], [100, 300, 100, 200, 1])])
    assert ours["steps_per_s"] == pytest.approx(1.0) and ours["tokens_per_s"] == pytest.approx(
        200.0
    )
    r = trl_peer.compare(trl, ours)
    assert r["steps_per_s"] == pytest.approx(2.0) and r["tokens_per_s"] == pytest.approx(2.0)
    # rounds are pooled step by step, each without its first and last step
    both = trl_peer.throughput(
        [
            run([9.0, 2.0, 1.0, 3.0, 50.0], [0, 200, 100, 300, 0]),
            run([7.0, 4.0, 5.0, 9.0], [0, 100, 100, 0]),
        ]
    )
    assert both["timed"] == 5 and both["step_s"] == pytest.approx(3.0)
    assert both["tokens_per_s"] == pytest.approx(800 / 15.0)
    with pytest.raises(ValueError):
        trl_peer.throughput(
            [run([1.0, 2.0], [1, 2])]
        )  # nothing left once step 1 and the last are dropped


def test_results_page_shows_the_measured_figures_and_ratio():
    raw = {
        "trl": [run([9.0, 2.0, 1.0, 3.0, 50.0], [100, 200, 100, 300, 999])] * 2,
        "ours": [
            run([5.0, 1.0, 0.5, 1.5, 60.0], [100, 300, 100, 200, 1]),
            run([5.0, 2.0, 4.0, 2.0, 60.0], [100, 300, 100, 200, 1]),
        ],
    }
    trl, ours = trl_peer.throughput(raw["trl"]), trl_peer.throughput(raw["ours"])
    res = {
        "steps": 5,
        "repeats": 2,
        "num_threads": 2,
        "prompt_pool": 256,
        "prompts_per_step": 32,
        "num_generations": 4,
        "max_completion_length": 32,
        "micro_batch_size": 64,
        "learning_rate": 5e-5,
        "warmup_steps": 5,
        "trl": trl,
        "ours": ours,
        "ratio": trl_peer.compare(trl, ours),
        "versions": {"trl": "9.9.9", "torch": "2.x", "transformers": "5.x"},
        "machine": {"nproc": 2, "cpu": "test cpu", "python": "3.x"},
        "commands": {
            "this": "python benchmarks/speed/trl_peer.py --steps 5",
            "ours": "python ada_seq.py --max_rounds 1",
            "trl_config": "loss_type='dr_grpo'",
        },
    }
    md = trl_peer.render_md(res)
    # pooled: TRL steps 2,1,3,2,1,3 (median 2.0, 1200 tokens / 12 s); ours 1,0.5,1.5,2,4,2 (median 1.75, 1200 / 11 s)
    assert "**Ours / TRL: 1.14x steps/s, 1.09x generated tokens/s**" in md
    assert (
        "| 2.000 | 0.500 | 200 | 100 |" in md
    )  # TRL: median s/step, steps/s, tokens/step, tokens/s
    assert "| 1.750 | 0.571 | 200 | 109 |" in md
    assert (
        "2 rounds" in md and "Steps 2-4 of every run" in md and "6 steps per trainer pooled" in md
    )
    assert "trl 9.9.9" in md and "2 CPUs" in md and "python ada_seq.py --max_rounds 1" in md
    assert "Definition check" not in md and "| round" not in md  # only when given
    res["raw"] = raw
    res["rounds"] = [
        trl_peer.compare(trl_peer.throughput([a]), trl_peer.throughput([b]))
        for a, b in zip(raw["trl"], raw["ours"])
    ]
    md = trl_peer.render_md(res)
    assert "| 1 (TRL) | 2.000 | 1.000 | 2.00x | 2.00x |" in md
    assert "| 2 (ours) | 2.000 | 2.000 | 1.00x | 0.75x |" in md
    # the KV caches: ours' dynamic cache is TRL's default, so its one run gives both ratios
    res["cache"] = {"ours": "dynamic", "trl_default": "dynamic", "trl_same": "dynamic"}
    res["ratio_same_cache"] = res["ratio"]
    md = trl_peer.render_md(res)
    assert "**Ours / TRL at its default: 1.14x steps/s" in md
    assert "**Ours / TRL with the same (dynamic) cache: 1.14x steps/s" in md
    assert "one TRL run serves both ratios" in md
    # TRL with ours' static cache: its own row and ratio (here twice as slow as at its default)
    res["cache"] = {"ours": "static", "trl_default": "dynamic", "trl_same": "static"}
    raw["trl_same"] = [run([9.0, 4.0, 2.0, 6.0, 50.0], [100, 200, 100, 300, 999])] * 2
    res["trl_same_cache"] = trl_peer.throughput(raw["trl_same"])
    res["ratio_same_cache"] = trl_peer.compare(res["trl_same_cache"], ours)
    for r, c in zip(res["rounds"], raw["trl_same"]):
        r["same_cache"] = trl_peer.compare(trl_peer.throughput([c]), ours)
    md = trl_peer.render_md(res)
    assert "| TRL 9.9.9 `GRPOTrainer`, static cache | 4.000 | 0.250 | 200 | 50 |" in md
    assert "**Ours / TRL with the same (static) cache: 2.29x steps/s, 2.18x" in md
    assert "| 1 (TRL) | 2.000 | 1.000 | 2.00x | 2.00x | 4.000 | 2.29x |" in md
    res["cache"]["trl_same_error"] = "ValueError: no"
    res["ratio_same_cache"] = None
    md = trl_peer.render_md(res)
    assert "with the same (static) cache: not measured**: TRL failed with it (ValueError: no)" in md


def test_our_metrics_are_read_per_step(tmp_path):
    rows = [
        {"step": 0, "gen_tokens": 0, "eval_pass@1": 0.1},
        {"step": 1, "gen_tokens": 100, "time_step_s": 3.0},
        {"step": 2, "gen_tokens": 250, "time_step_s": 1.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    times, tokens = trl_peer.read_ours(tmp_path / "metrics.jsonl")
    assert times == [3.0, 1.0] and tokens == [100, 150]  # gen_tokens is cumulative in core_metrics


def test_our_command_is_grpo_n_with_the_shared_budget():
    cmd = trl_peer.ours_command(trl_peer.Args(steps=7), "/tmp/x")
    flags = dict(zip(cmd[2::2], cmd[3::2]))
    assert cmd[1] == "ada_seq.py"
    assert (
        flags["--max_rounds"] == "1"
        and flags["--round_repeat"] == flags["--num_generations"] == "4"
    )
    assert (
        flags["--max_steps"] == "7"
        and flags["--prompts_per_step"] == "32"
        and flags["--prompt_pool"] == "256"
    )
    assert flags["--max_completion_length"] == "32" and flags["--eval_steps"] == "0"
    src = (ROOT / "ada_seq.py").read_text() + (ROOT / "common" / "run" / "flags.py").read_text()
    for flag in flags:  # every flag exists in the script (BaseArgs or its Args)
        assert f"    {flag[2:]}:" in src, flag


def test_device_and_model_path_run_the_check_and_the_throughput_on_cpu(tiny_base, tmp_path):
    """--device / --model_name_or_path (the GPU command's path) on CPU with the tiny model: TRL's own code and ours
    agree on the fixed batch, and one short round of each trainer is timed; needs trl (benchmarks/requirements.txt)."""
    pytest.importorskip("trl", reason="trl is in benchmarks/requirements.txt, which CI installs")
    out, raw = tmp_path / "peer.md", tmp_path / "peer.json"
    args = trl_peer.Args(
        steps=3,
        repeats=1,
        num_threads=1,
        prompts_per_step=4,
        micro_batch_size=16,
        max_completion_length=16,
        device="cpu",
        model_name_or_path=tiny_base,
        out=str(out),
        json=str(raw),
        # on CPU auto is the dynamic cache, TRL's default: static makes TRL run once with each
        cache_implementation="static",
    )
    res = trl_peer.main(args)
    assert res["check"]["agree"], res["check"]
    saved = json.loads(raw.read_text())
    assert (
        saved["device"] == "cpu"
        and saved["ratio"]["steps_per_s"] > 0
        and saved["trl"]["timed"] == 1
    )
    assert saved["cache"] == {"ours": "static", "trl_default": "dynamic", "trl_same": "static"}
    assert saved["trl_same_cache"]["timed"] == 1 and saved["ratio_same_cache"]["steps_per_s"] > 0
    assert saved["rounds"][0]["same_cache"]["steps_per_s"] > 0
    # TRL's GRPOConfig got no cache the first time (its default) and ours the second
    assert saved["raw"]["trl"][0]["cache_implementation"] is None
    assert saved["raw"]["trl_same"][0]["cache_implementation"] == "static"
    assert "--cache_implementation static" in res["commands"]["ours"]
    assert "cache_implementation='static'" in res["commands"]["trl_config"]
    page = out.read_text()
    assert f"`{tiny_base}`" in page
    assert "**Ours / TRL with the same (static) cache: " in page and "at its default: " in page
    assert all("--model_name_or_path" in c and tiny_base in c for c in [res["commands"]["ours"]])


def test_grpo_advantages_are_sqrt_k_over_k_minus_1_times_trls_group_scaled_ones():
    # grpo_advantages divides by the population std; TRL's scale_rewards='group' by its nanstd (Bessel-corrected,
    # + 1e-4): on the definition check's fixed batch (groups (1, 0, 0, 1) and (0, 0, 0, 1), see fixed_batch) ours
    # are sqrt(k / (k - 1)) times TRL's, the factor docs/pros_ppo.md and docs/ps_grpo.md state
    import importlib.util

    import torch
    from trl.trainer.utils import nanstd

    from common.rl.advantages import grpo_advantages

    source = Path(importlib.util.find_spec("trl.trainer.grpo_trainer").origin).read_text()
    assert (
        "std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)" in source
    )  # the 'group' scaling
    assert "advantages = advantages / (std_rewards + 1e-4)" in source
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    k = rewards.shape[1]
    centred = rewards - rewards.mean(-1, keepdim=True)
    std_trl = nanstd(rewards, dim=1)[:, None]
    ratio = grpo_advantages(rewards, eps=0.0) / (centred / std_trl)
    assert torch.allclose(ratio, torch.full_like(ratio, (k / (k - 1)) ** 0.5), rtol=0, atol=1e-6)
    # with each side's epsilon: the ratio results/trl_peer.md records (ours / TRL 1.1549 from the real trainer)
    ours, trl_group = grpo_advantages(rewards), centred / (std_trl + 1e-4)
    assert torch.allclose(ours / trl_group, torch.full_like(ours, 1.1549), rtol=0, atol=1e-4)
    assert (
        "ratio ours/TRL 1.1549"
        in (ROOT / "benchmarks" / "speed" / "results" / "trl_peer.md").read_text()
    )
