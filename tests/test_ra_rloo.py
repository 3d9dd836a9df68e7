"""RA-RLOO: the splice, the importance weight, and the script end to end (resume, 2 processes)."""

import json
import random
from collections import deque

import pytest
import torch
from conftest import run_main, run_script

from ra_rloo import Args, replay_weights, rloo_advantages, rloo_loss, splice_replays


def _setup():
    comps = [[1], [2], [3], [4], [5], [6], [7], [8], [9], [10], [11], [12]]
    rewards = torch.tensor([[0.1, 0.1, 0.1, 0.1], [1.0, 0.1, 0.0, 0.1], [0.0, 0.0, 0.0, 0.0]])
    buffers = {
        10: deque([([99, 98], -3.0, 1.0)]),
        11: deque([([97], -1.0, 1.0)]),
    }  # prompt 12 has an empty buffer
    return comps, rewards, buffers


def test_on_demand_splices_only_groups_without_a_success():
    comps, rewards, buffers = _setup()
    lp_old = splice_replays(
        [10, 11, 12], comps, rewards, rewards >= 1.0, buffers, "on_demand", random.Random(0)
    )
    assert comps[3] == [99, 98] and rewards[0].tolist() == pytest.approx([0.1, 0.1, 0.1, 1.0])
    assert lp_old[0].tolist()[3] == -3.0 and torch.isnan(lp_old[0, :3]).all()
    assert (
        comps[4:8] == [[5], [6], [7], [8]] and torch.isnan(lp_old[1]).all()
    )  # had a fresh success
    assert comps[8:] == [[9], [10], [11], [12]] and torch.isnan(lp_old[2]).all()  # nothing stored
    # the paper's worked example on the spliced group: +0.9 replay, -0.3 each fail
    assert rloo_advantages(rewards[:1]).tolist()[0] == pytest.approx([-0.3, -0.3, -0.3, 0.9])


def test_the_replay_is_a_uniform_draw_from_the_buffer():
    # the paper samples a stored success at random: over 400 splices each of 4 stored successes
    # comes back about 100 times (binomial sd ~9), never always the newest or the oldest
    buffers = {0: deque([([i], -float(i), 1.0) for i in range(4)], maxlen=4)}
    rng, counts = random.Random(0), [0] * 4
    for _ in range(400):
        comps, rewards = [[9]] * 4, torch.zeros(1, 4)
        splice_replays([0], comps, rewards, rewards > 0.5, buffers, "on_demand", rng)
        counts[comps[3][0]] += 1
    assert all(60 < count < 140 for count in counts), counts


def test_always_mode_splices_every_group_with_a_buffer():
    comps, rewards, buffers = _setup()
    lp_old = splice_replays(
        [10, 11, 12], comps, rewards, rewards >= 1.0, buffers, "always", random.Random(0)
    )
    assert comps[7] == [97] and lp_old[1, 3] == -1.0 and rewards[1, 3] == 1.0
    assert torch.isnan(lp_old[2]).all()


def test_replay_weight_is_clipped_ratio():
    w = replay_weights(
        torch.tensor([-1.0, -2.0, 0.0]), torch.tensor([-2.0, -1.0, -10.0]), w_max=5.0
    )
    assert w.tolist() == pytest.approx([2.718281, 0.367879, 5.0], rel=1e-5)


def test_every_flag_is_documented():
    from dataclasses import fields

    from common.run.flag_help import field_docs

    docs = field_docs(Args)
    missing = [f.name for f in fields(Args) if not docs.get(f.name)]
    assert not missing, f"flags without help: {missing}"
    out = run_script(["ra_rloo.py", "--help"]).stdout
    for f in fields(Args):
        assert f"--{f.name}" in out


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


COMMON = [
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
    "--num_threads",
    "1",
]


def test_replay_removes_zero_variance_groups_and_vanilla_does_not(random_model_dir, tmp_path):
    # an untrained policy fails every problem: each fresh group is all-fail, the case the splice exists for (a trained
    # base also has all-pass groups, which the on-demand rule leaves alone)
    run_main(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            random_model_dir,
            "--output_dir",
            str(tmp_path / "ra"),
            "--max_steps",
            "3",
            "--eval_steps",
            "3",
            *COMMON,
        ]
    )
    run_main(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            random_model_dir,
            "--output_dir",
            str(tmp_path / "van"),
            "--max_steps",
            "3",
            "--eval_steps",
            "3",
            "--replay",
            "none",
            *COMMON,
        ]
    )
    ra, van = _rows(tmp_path / "ra")[1:], _rows(tmp_path / "van")[1:]
    core = {
        "step",
        "rollouts",
        "gen_tokens",
        "reward_mean",
        "pass_rate",
        "frac_zero_var_groups",
        "loss",
        "kl",
        "entropy",
        "lr",
        "time_step_s",
        "time_gen_s",
        "time_train_s",
        "ra_zero_var_frac_post",
        "ra_replay_fired_frac",
        "ra_is_weight_mean",
        "ra_buffer_prompts",
    }
    assert core <= set(ra[0]) and "eval_pass@1" in ra[-1] and "eval_pass@4" in ra[-1]
    assert ra[-1]["rollouts"] == 3 * 8 * 4
    # seeded buffers: every group without a fresh success gets a replay, so no zero-variance group survives
    assert all(r["ra_zero_var_frac_post"] == 0.0 for r in ra)
    assert all(
        r["ra_no_success_frac_post"] == 0.0 for r in ra
    )  # the paper's degenerate groups: none left
    assert any(r["frac_zero_var_groups"] > 0 for r in ra) and all(
        r["ra_replay_fired_frac"] > 0 for r in ra
    )
    assert all(0 < r["ra_is_weight_mean"] <= 5.0 for r in ra) and ra[0]["ra_buffer_prompts"] == 48
    assert all(
        r["ra_replay_fired_frac"] == 0 and r["ra_zero_var_frac_post"] == r["frac_zero_var_groups"]
        for r in van
    )
    assert all(r["ra_buffer_prompts"] == 0 for r in van)
    assert any(
        r["ra_no_success_frac_post"] > 0 for r in van
    )  # without the splice, groups without a success stay


def _main_rows(out, extra, monkeypatch, reward=lambda text, problem: float(len(text) % 2)):
    """ra_rloo.main in process, with a training reward that varies (the tiny test base solves almost nothing)."""
    import ra_rloo
    from common.demo import countdown
    from common.run.flags import parse_args

    monkeypatch.setitem(countdown.REWARDS, "tinyzero", reward)
    ra_rloo.main(
        parse_args(ra_rloo.Args, ["--output_dir", str(out), "--eval_steps", "0", *COMMON, *extra])
    )
    return _rows(out)


def test_unchanged_policy_gives_weight_one_at_the_sampling_temperature(
    tiny_base, tmp_path, monkeypatch
):
    # learning rate 0: the policy never changes, so pi_theta / pi_old = 1 for every replay, at T = 0.6 too:
    # fresh entries (stored from the sampler at logits / T, replayed at step 2) and seeded ones (scored at T)
    base = [
        "--model_name_or_path",
        tiny_base,
        "--temperature",
        "0.6",
        "--learning_rate",
        "0",
        "--replay",
        "always",
        "--paper_eval_samples",
        "0",
    ]
    fresh = _main_rows(
        tmp_path / "fresh",
        [*base, "--max_steps", "2", "--seed_buffer", "false", "--prompt_pool", "8"],
        monkeypatch,
    )[1:]
    assert fresh[0]["ra_is_weight_mean"] is None and fresh[1]["ra_replay_fired_frac"] > 0
    assert fresh[1]["ra_is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    seeded = _main_rows(tmp_path / "seeded", [*base, "--max_steps", "1"], monkeypatch)[1:]
    assert seeded[0]["ra_replay_fired_frac"] == 1.0 and seeded[0][
        "ra_is_weight_mean"
    ] == pytest.approx(1.0, abs=1e-3)


def test_paper_reward_and_paper_evaluation_by_default(tiny_base, tmp_path, monkeypatch):
    seen = []

    def reward(text, problem):  # records that training is scored by the tinyzero reward
        seen.append(text)
        return 0.1

    rows = _main_rows(
        tmp_path, ["--model_name_or_path", tiny_base, "--max_steps", "1"], monkeypatch, reward
    )
    cut = round(
        rows[1]["clipped_ratio"] * 8 * 4
    )  # truncated completions score 0 without asking the verifier
    assert len(seen) == 8 * 4 - cut and rows[1]["reward_mean"] == pytest.approx(
        0.1 * len(seen) / (8 * 4)
    )
    assert (
        json.loads((tmp_path / "args.json").read_text())["reward"] == "tinyzero"
    )  # what `auto` resolved to
    assert {"eval_pass@1", "eval_pass@4", "eval_paper_pass@1", "eval_paper_pass@4"} <= set(rows[0])
    assert 0.0 <= rows[0]["eval_paper_pass@1"] <= rows[0]["eval_paper_pass@4"] <= 1.0


def test_top_k_reaches_generate_and_truncated_logprobs_are_refused(random_model_dir):
    from common.generation.hf import HFGenerator, SamplingConfig
    from common.model.policy import load_policy

    torch.manual_seed(0)
    model, tok = load_policy(random_model_dir, "float32")
    gen = HFGenerator(model, tok)
    prompt = tok("12 34", add_special_tokens=False).input_ids
    top1 = gen.generate(
        [prompt], 4, SamplingConfig(max_new_tokens=6, temperature=0.6, top_k=1, logprobs=False)
    )
    assert (
        len({tuple(c) for c in top1.completion_ids}) == 1
    )  # top-k 1 is greedy: every sample is the same
    free = gen.generate(
        [prompt], 8, SamplingConfig(max_new_tokens=6, temperature=1.0, logprobs=False)
    )
    assert (
        len({tuple(c) for c in free.completion_ids}) > 1
    )  # an untrained model samples diverse completions
    with pytest.raises(ValueError, match="top_p"):
        gen.generate([prompt], 2, SamplingConfig(max_new_tokens=4, temperature=0.6, top_k=20))


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time_", "time/"))} for r in rows]


# killed (SIGKILL) at step 3 while writing its metrics row, after that step's samples were written: checkpoints at 2, 4
KILLED_MID_ROW = """
import json, os, runpy, signal, sys
from common.run import logs as metrics
log = metrics.MetricsLogger.log
def killed_mid_row(self, row):
    if row["step"] == 3:
        line = json.dumps(row) + "\\n"
        with open(self.path, "a") as f:
            f.write(line[:len(line) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    log(self, row)
metrics.MetricsLogger.log = killed_mid_row
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_resume_after_sigkill_and_cut_lines_reproduces_an_uninterrupted_run(tiny_base, tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    full, part = tmp_path / "full", tmp_path / "part"
    base = [
        "ra_rloo.py",
        "--model_name_or_path",
        tiny_base,
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--log_samples_every",
        "1",
        "--prompt_pool",
        "6",
        "--buffer_capacity",
        "2",
        *COMMON[2:],
    ]
    run_main([*base, "--output_dir", str(full), "--max_steps", "4"])
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_MID_ROW,
            *base,
            "--output_dir",
            str(part),
            "--max_steps",
            "4",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert [p.name for p in part.glob("checkpoint-*")] == ["checkpoint-2"]
    saved = torch.load(part / "checkpoint-2" / "trainer_state.pt", weights_only=True)["state"][
        "method"
    ]["buffers"]
    # the buffers as they are: prompt id -> FIFO of (int32 tensor, float, float), some full (a
    # FIFO that evicts)
    entries = [entry for buffer in saved.values() for entry in buffer]
    assert entries and all(response.dtype == torch.int32 for response, _, _ in entries)
    assert max(map(len, saved.values())) == 2
    assert not (part / "metrics.jsonl").read_text().endswith("\n")  # step 3's row, cut in half
    samples = (
        part / "samples.jsonl"
    ).read_bytes()  # its last row (step 3) cut too, as a full disk would
    (part / "samples.jsonl").write_bytes(samples[: len(samples) - 40])
    r = run_script(
        [*base, "--output_dir", str(part), "--max_steps", "4", "--resume_from_checkpoint", "auto"]
    )
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert r.stdout.count(f"{name}: dropped its last line") == 1, r.stdout[-3000:]
    a, b = _strip(_rows(full)), _strip(_rows(part))
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert (
        a == b
    )  # same rewards, losses, KL, IS weights and eval: buffers and replay RNG were restored
    assert all(
        r["ra_replay_fired_frac"] > 0 for r in b[3:]
    )  # replays after the resume drew from restored buffers
    assert (part / "samples.jsonl").read_text() == (full / "samples.jsonl").read_text()


def test_buffers_store_int32_and_save_and_load_a_million_tokens_fast_and_exactly(tmp_path):
    # the buffers go into the checkpoint as they are (a dict of FIFOs of (int32 tensor, float,
    # float)); common/run/checkpoint.py's `plain` and `safe_load` carry them
    import time

    from common.run.checkpoint import plain
    from common.run.resume import safe_load
    from ra_rloo import restore_buffers

    generator = torch.Generator().manual_seed(0)
    # 125 prompts x 16 successes x 500 tokens: 1M tokens, a full buffer everywhere
    tokens = torch.randint(0, 152_000, (1_000_000,), dtype=torch.int32, generator=generator)
    buffers = {
        prompt_id: deque(
            (
                (
                    tokens[(prompt_id * 16 + i) * 500 :][:500].clone(),
                    float(-torch.rand(1, generator=generator, dtype=torch.float64) * 50),
                    float(i % 3),
                )
                for i in range(16)
            ),
            maxlen=16,
        )
        for prompt_id in range(125)
    }
    started = time.perf_counter()
    torch.save(plain({"state": {"method": {"buffers": buffers}}}), tmp_path / "trainer_state.pt")
    save_s = time.perf_counter() - started
    started = time.perf_counter()
    saved = safe_load(tmp_path / "trainer_state.pt")["state"]["method"]["buffers"]
    loaded = restore_buffers(saved, 16)
    load_s = time.perf_counter() - started
    # measured 0.11-0.13 s / 0.26-0.44 s (a tensor object per entry) on a busy 2-core box; lists of
    # ints pickled took 0.47 s / 0.69 s
    assert save_s < 1.0 and load_s < 1.5, (save_s, load_s)

    def same(a: dict, b: dict) -> bool:
        # the same entries, in FIFO order, int32 (4 bytes a token), with the same capacity
        return list(a) == list(b) and all(
            a[key].maxlen == b[key].maxlen
            and len(a[key]) == len(b[key])
            and all(
                x.dtype == torch.int32 and torch.equal(x, y) and lp_x == lp_y and r_x == r_y
                for (x, lp_x, r_x), (y, lp_y, r_y) in zip(a[key], b[key])
            )
            for key in b
        )

    assert same(loaded, buffers)
    # a checkpoint of the older layout (every response back to back, with their lengths) resumes
    # with the same buffers
    entries = [(key, *entry) for key, buffer in buffers.items() for entry in buffer]
    older = {
        "prompt_ids": torch.tensor([entry[0] for entry in entries]),
        "logp_old": torch.tensor([entry[2] for entry in entries], dtype=torch.float64),
        "rewards": torch.tensor([entry[3] for entry in entries], dtype=torch.float64),
        "lengths": torch.tensor([len(entry[1]) for entry in entries]),
        "tokens": torch.cat([entry[1] for entry in entries]),
    }
    assert same(restore_buffers(older, 16), buffers)


def test_a_damaged_row_before_the_last_stops_the_resume_with_its_line_number(tmp_path):
    from common.run.resume_checks import read_rows

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(SystemExit, match=r"metrics.jsonl line 3: not a row this project writes"):
        read_rows(path)
    path.write_text('{"step": 0}\n\n{"step": 1}\n{"step": 2, "lo')
    said = []
    assert read_rows(path, said.append) == ['{"step": 0}', '{"step": 1}'] and len(said) == 1
    assert "line 4" in said[0]


@pytest.mark.xdist_group(
    "distributed"
)  # accelerate's default rendezvous port, as in tests/test_fsdp.py
def test_two_processes_on_cpu(tiny_base, tmp_path):
    out = tmp_path / "ddp"
    cmd = [
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "ra_rloo.py",
        "--model_name_or_path",
        tiny_base,
        "--output_dir",
        str(out),
        "--eval_steps",
        "2",
        *COMMON,
    ]
    run_script([*cmd, "--max_steps", "2"], timeout=900)
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2]  # one writer, no duplicated rows
    assert rows[-1]["rollouts"] == 2 * 8 * 4  # both ranks' rollouts are counted
    assert (out / "model" / "model.safetensors").exists() and not (
        out / ".tmp-model"
    ).exists()  # written once
    state = torch.load(out / "checkpoint-2" / "trainer_state.pt", weights_only=True)
    assert (
        state["world_size"] == 2
        and sum(1 for entries in state["state"]["method"]["buffers"].values() if entries) == 48
    )
    # only rank 1's RNG file refused: rank 0 stops too (no hang) before its loggers touch metrics.jsonl
    (out / "metrics.jsonl").open("a").write(
        json.dumps({"step": 3, "junk": 1}) + "\n"
    )  # a resume would drop it
    metrics = (out / "metrics.jsonl").read_bytes()
    torch.save({"python": "not an RNG state"}, out / "checkpoint-2" / "rng_rank1.pt")
    with pytest.raises(
        AssertionError, match="checkpoint-2/rng_rank1.pt: not a checkpoint written by this project"
    ):
        run_script([*cmd, "--max_steps", "3", "--resume_from_checkpoint", "auto"], timeout=300)
    assert (out / "metrics.jsonl").read_bytes() == metrics


def test_sigint_saves_a_checkpoint_and_resume_continues(tiny_base, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import ROOT

    out = tmp_path / "sig"
    cmd = [
        sys.executable,
        "ra_rloo.py",
        "--model_name_or_path",
        tiny_base,
        "--output_dir",
        str(out),
        "--max_steps",
        "200",
        "--eval_steps",
        "0",
        "--save_steps",
        "0",
        *COMMON,
    ]
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    deadline = time.time() + 300
    while time.time() < deadline and len(_rows_if(out)) < 2:  # step 0 eval + one training step
        time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    log, _ = p.communicate(timeout=300)
    assert p.returncode == 128 + signal.SIGINT, log[
        -2000:
    ]  # stopped, resumable: not a finished run
    steps = [r["step"] for r in _rows(out)]
    last = steps[-1]
    assert 1 <= last < 200 and (out / f"checkpoint-{last}" / "trainer_state.pt").exists()
    assert "--resume_from_checkpoint auto" in log
    run_main(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            "--max_steps",
            str(last + 1),
            "--eval_steps",
            "0",
            "--resume_from_checkpoint",
            "auto",
            *COMMON,
        ]
    )
    assert [r["step"] for r in _rows(out)] == steps + [last + 1]


def _rows_if(path):
    return _rows(path) if (path / "metrics.jsonl").exists() else []


def test_real_dataset_path_with_a_local_jsonl(random_model_dir, tmp_path):
    data = tmp_path / "gsm.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"}) + "\n"
            for i in range(40)
        )
    )
    out = tmp_path / "real"
    run_script(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            random_model_dir,
            "--dataset_name",
            str(data),
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--eval_steps",
            "2",
            "--prompts_per_step",
            "4",
            "--eval_prompts",
            "4",
            "--eval_samples",
            "2",
            "--max_completion_length",
            "8",
            "--num_threads",
            "1",
        ]
    )
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[-1]["rollouts"] == 2 * 4 * 4
    assert rows[-1]["ra_buffer_prompts"] == 0  # real datasets: lazy buffers, nothing to seed from


def test_samples_log_truncation_and_sampler_agreement(tiny_base, tmp_path, monkeypatch):
    # one eval step: samples.jsonl holds at most 2 rows per kind (fresh / replayed, the replayed with its IS weight),
    # pass@k for every power of two up to --eval_samples, and the HF sampler agrees with the trainer (fp32)
    rows = _main_rows(
        tmp_path / "a",
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "1",
            "--replay",
            "always",
            "--log_samples_per_kind",
            "2",
            "--paper_eval_samples",
            "0",
        ],
        monkeypatch,
    )
    samples = [
        json.loads(line) for line in (tmp_path / "a" / "samples.jsonl").read_text().splitlines()
    ]
    assert sorted(s["kind"] for s in samples) == ["fresh", "fresh", "replayed", "replayed"]
    assert all(
        {"step", "prompt", "completion", "reward", "advantage", "truncated"} <= set(s)
        for s in samples
    )
    assert all(
        s["reward"] == 1.0 and 0 < s["is_weight"] <= 5.0 for s in samples if s["kind"] == "replayed"
    )
    assert {"eval_pass@1", "eval_pass@2", "eval_pass@4"} <= set(
        rows[-1]
    ) and "eval_pass@3" not in rows[-1]
    assert rows[1]["sampler_logp_diff"] < 1e-4
    # every completion cut at 2 tokens: no success (reward 0, though the test reward would pay 1 for odd lengths),
    # and with --mask_truncated_completions no gradient from them (vanilla RLOO: no replay either)
    cut = [
        "--model_name_or_path",
        tiny_base,
        "--max_steps",
        "1",
        "--max_completion_length",
        "2",
        "--replay",
        "none",
        "--paper_eval_samples",
        "0",
        "--log_samples_every",
        "0",
    ]
    rows = _main_rows(
        tmp_path / "b", [*cut, "--mask_truncated_completions"], monkeypatch, lambda t, p: 1.0
    )
    assert (
        rows[1]["clipped_ratio"] == 1.0
        and rows[1]["reward_mean"] == 0.0
        and rows[1]["grad_norm"] == 0.0
    )
    assert not (tmp_path / "b" / "samples.jsonl").exists()


def test_kl_weighs_beta_against_the_policy_gradient_at_any_completion_cap():
    # one normaliser for both sums: the KL sum divided by the actual token count instead would weigh against the PG
    # by a factor that moves with --max_completion_length (~3x at 48 tokens, 18-token answers)
    for max_new_tokens in (16, 48, 512):
        pg_sum, kl_sum = (
            torch.tensor(2.0, requires_grad=True),
            torch.tensor(0.5, requires_grad=True),
        )
        rloo_loss(pg_sum, kl_sum, 0.05, 8 * max_new_tokens).backward()
        assert kl_sum.grad / pg_sum.grad == pytest.approx(0.05)
        assert pg_sum.grad == pytest.approx(1 / (8 * max_new_tokens))
    assert rloo_loss(torch.tensor(2.0), 0.0, 0.05, 4.0).item() == pytest.approx(
        0.5
    )  # beta 0 / no reference
