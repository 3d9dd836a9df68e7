"""Tests for the shared building blocks in common/ (each fails if its logic is wrong)."""

import json
import math
from dataclasses import dataclass
from itertools import combinations
from typing import Literal, Optional

import numpy as np
import pytest
import torch

from common.rl.advantages import grpo_advantages, zero_variance
from common.rl.logprobs import logprobs_from_logits, score_completions, token_logprobs
from common.rl.masking import pad_sequences, unpad_completion
from common.run.flag_help import field_docs
from common.run.flags import build_parser, parse_args
from common.tasks.evaluation import pass_at_k
from ra_rloo import rloo_advantages


# ---------------- masking ----------------
def test_pad_sequences_left_pads_and_masks():
    b = pad_sequences([[5, 6], [7]], [[1, 2, 3], [4]], pad_id=0, completion_masks=[[1, 0, 1], [1]])
    assert b.input_ids.tolist() == [[5, 6, 1, 2, 3], [0, 0, 0, 7, 4]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 1]]
    assert b.completion_width == 3
    assert b.loss_mask.tolist() == [[1, 0, 1], [0, 0, 1]]
    assert unpad_completion(torch.tensor([[1.0, 2, 3], [4, 5, 6]]), [3, 1]) == [[1, 2, 3], [6]]


def test_pad_sequences_rejects_bad_masks():
    with pytest.raises(ValueError, match="completion 0"):
        pad_sequences([[1]], [[2, 3]], 0, completion_masks=[[1]])
    with pytest.raises(ValueError, match="2 prompts but 1"):
        pad_sequences([[1], [2]], [[3]], 0)


# ---------------- log-probs ----------------
@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_chunked_logprobs_match_log_softmax(chunk):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g) * 3
    targets = torch.randint(0, 11, (3, 7), generator=g)
    lp, ent = logprobs_from_logits(logits, targets, temperature=0.7, chunk_size=chunk)
    ref = torch.log_softmax(logits / 0.7, -1)
    assert torch.allclose(lp, ref.gather(-1, targets[..., None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-5)


def test_token_logprobs_padded_equals_unpadded(random_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(random_model_dir).eval()
    prompts, comps = [[4, 5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15, 16]]
    lp = score_completions(model, prompts, comps, 0, batch_size=8, device="cpu")
    for p, c, got in zip(prompts, comps, lp):  # one sequence at a time, no padding at all
        ids = torch.tensor([p + c])
        ref = torch.log_softmax(model(ids).logits[0, :-1], -1)
        want = [ref[len(p) - 1 + j, t].item() for j, t in enumerate(c)]
        assert np.allclose(got, want, atol=1e-5)


def test_token_logprobs_gradient_only_through_unmasked_tokens(random_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    b = pad_sequences([[4, 5]], [[6, 7, 8]], 0, completion_masks=[[0, 1, 0]])
    lp, _ = token_logprobs(model, b)
    lp.retain_grad()
    (lp * b.loss_mask).sum().backward()
    assert lp.grad[0].tolist() == [
        0.0,
        1.0,
        0.0,
    ]  # masked (replayed/observation) tokens get exactly zero


# ---------------- advantages ----------------
def test_rloo_worked_example_from_paper():
    # RA-RLOO Section 3.1: replay (1.0) + three fails (0.1) -> +0.9 for the replay, -0.3 for each fail
    a = rloo_advantages(torch.tensor([[1.0, 0.1, 0.1, 0.1]]))
    assert torch.allclose(a, torch.tensor([[0.9, -0.3, -0.3, -0.3]]), atol=1e-6)


def test_rloo_equals_scaled_centering_and_zero_for_constant_groups():
    r = torch.rand(5, 4)
    assert torch.allclose(rloo_advantages(r), 4 / 3 * (r - r.mean(-1, keepdim=True)), atol=1e-6)
    assert torch.all(rloo_advantages(torch.full((2, 4), 0.1)) == 0)
    with pytest.raises(ValueError):
        rloo_advantages(torch.ones(2, 1))


def test_grpo_and_zero_variance():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    a = grpo_advantages(r)
    assert torch.allclose(
        a[0], torch.tensor([0.75, -0.25, -0.25, -0.25]) / math.sqrt(3 / 16), atol=1e-4
    )
    assert torch.all(a[1] == 0)
    assert torch.allclose(
        grpo_advantages(r, scale=False)[0], torch.tensor([0.75, -0.25, -0.25, -0.25])
    )
    assert zero_variance(r).tolist() == [False, True]


# ---------------- metrics ----------------
def test_pass_at_k_matches_brute_force():
    for n, c, k in [(8, 0, 1), (8, 3, 1), (8, 3, 4), (5, 4, 2), (6, 6, 3), (10, 1, 10)]:
        outcomes = [1] * c + [0] * (n - c)
        brute = np.mean([any(outcomes[i] for i in s) for s in combinations(range(n), k)])
        assert pass_at_k(n, c, k) == pytest.approx(brute)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_metrics_logger_truncates_rows_after_resume_step(tmp_path):
    from accelerate import Accelerator

    from common.run.logs import MetricsLogger

    acc = Accelerator(cpu=True)
    lg = MetricsLogger(str(tmp_path), acc)
    for s in range(5):
        lg.log({"step": s, "x": np.float32(s)})
    MetricsLogger(str(tmp_path), acc, resume_step=2).log({"step": 3, "x": 30.0})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in rows] == [(0, 0), (1, 1), (2, 2), (3, 30)]
    MetricsLogger(str(tmp_path), acc)  # a fresh (non-resumed) run starts a new file
    assert (tmp_path / "metrics.jsonl").read_text() == ""


# ---------------- cli ----------------
@dataclass
class _Base:
    a: int = 1
    """the a"""


@dataclass
class _Args(_Base):
    b: bool = False
    """switch b"""
    mode: Literal["x", "y"] = "x"
    """the mode"""
    name: Optional[str] = None
    """optional name"""
    xs: list = None


def test_cli_reads_docstrings_and_types():
    assert field_docs(_Args) == {
        "a": "the a",
        "b": "switch b",
        "mode": "the mode",
        "name": "optional name",
    }
    a = parse_args(_Args, ["--a", "3", "--b", "--mode", "y", "--name", "n"])
    assert (a.a, a.b, a.mode, a.name) == (3, True, "y", "n")
    assert parse_args(_Args, ["--b", "false"]).b is False
    with pytest.raises(SystemExit):
        parse_args(_Args, ["--mode", "z"])
    assert "switch b" in build_parser(_Args).format_help()


# ---------------- data ----------------
def test_prompt_sampler_epochs_and_exact_resume():
    from common.tasks.loading import PromptSampler

    s = PromptSampler(10, seed=3)
    first = s.next_ids(10)
    assert sorted(first) == list(range(10))
    s.next_ids(4)
    saved = s.state_dict()
    cont = s.next_ids(12)  # crosses an epoch boundary
    s2 = PromptSampler(10, seed=3)
    s2.load_state_dict(saved)
    assert s2.next_ids(12) == cont
    assert PromptSampler(10, seed=4).next_ids(10) != first
    with pytest.raises(SystemExit, match="10 prompts"):
        PromptSampler(11, seed=3).load_state_dict(saved)


def _hf_args(path, **kw):
    from common.run.flags import BaseArgs

    return BaseArgs(dataset_name=str(path), **kw)


def test_hf_task_from_local_jsonl(tmp_path, random_model_dir):
    from transformers import AutoTokenizer

    from common.tasks.loading import hf_task

    rows = [
        {"question": f"What is {i}+{i}?", "answer": f"Double it. #### {2 * i:,}"}
        for i in range(600, 650)
    ]
    p = tmp_path / "gsm.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = AutoTokenizer.from_pretrained(random_model_dir)
    task = hf_task(_hf_args(p, eval_prompts=5), tok)
    assert len(task.eval) == 5 and len(task.train) == 45  # held out of training, not shared
    assert task.train[0].answer == "1200" and task.train[0].prompt.startswith("What is 600+600?")
    assert task.reward_fn("so \\boxed{1200}", task.train[0]) == 1.0
    assert task.reward_fn("so \\boxed{1201}", task.train[0]) == 0.0
    tok.chat_template = "{% for m in messages %}<s>user: {{ m['content'] }}\n{% endfor %}assistant:"
    chat = hf_task(_hf_args(p, eval_prompts=5), tok)
    assert chat.train[0].prompt.startswith("<s>user: What is 600+600?") and chat.train[
        0
    ].prompt.endswith("assistant:")


def test_hf_task_errors_name_the_input(tmp_path, random_model_dir):
    from transformers import AutoTokenizer

    from common.tasks.loading import hf_task

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"q": "x", "answer": "1"}) + "\n")
    with pytest.raises(SystemExit, match="'question' not in"):
        hf_task(_hf_args(p), tok)
    p.write_text(
        json.dumps({"question": "ok", "answer": "1"})
        + "\n"
        + json.dumps({"question": 5, "answer": "1"})
        + "\n"
    )
    with pytest.raises(SystemExit, match="row 1"):
        hf_task(_hf_args(p), tok)
    with pytest.raises(SystemExit, match="file not found"):
        hf_task(_hf_args(tmp_path / "missing.jsonl"), tok)
    with pytest.raises(SystemExit, match="Countdown task only"):
        hf_task(_hf_args(p, reward="shaped"), tok)


def test_countdown_task_and_prompt_pool():
    from common.demo.countdown import countdown_task
    from common.run.flags import BaseArgs

    args = BaseArgs(prompt_pool=64, eval_prompts=32)
    task = countdown_task("binary", args.eval_prompts, args.prompt_pool)
    assert len(task.train) == 64 and len(task.eval) == 32
    assert [e.id for e in task.train] == list(range(64))
    held = {e.prompt for e in task.eval}
    assert not held & {e.prompt for e in task.train}
    ex = task.train[0]
    from common.demo import countdown

    sol = countdown.solution_text(countdown.solutions(ex.answer)[0])
    assert task.reward_fn(sol, ex) == 1.0 and task.eval_reward_fn("1+1=2\n", ex) == 0.0


# ---------------- policy / tokenizer ----------------
def test_char_tokenizer_round_trips_after_reload(random_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    s = "14 1 10 t5\n14-10=4\n4+1=5\n =5 | 5 7 target 19"
    ids = tok(s, add_special_tokens=False).input_ids
    assert len(ids) == len(s)  # one token per character: spaces and newlines survive
    assert tok.decode(ids) == s
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == s


def test_load_policy_sets_pad_and_rejects_bad_path(random_model_dir, tmp_path):
    from common.model.policy import load_policy

    model, tok = load_policy(random_model_dir)
    assert tok.pad_token_id is not None and model.config.vocab_size == len(tok)
    with pytest.raises(SystemExit, match="--model_name_or_path"):
        load_policy(str(tmp_path / "nope"))


# ---------------- generation ----------------
def test_hf_generator_format_and_logprobs(random_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.generation.hf import HFGenerator, SamplingConfig

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    torch.manual_seed(0)
    nl = tok("\n", add_special_tokens=False).input_ids[0]
    prompts = [
        tok("1 2 3 t6\n", add_special_tokens=False).input_ids,
        tok("4 t4\n", add_special_tokens=False).input_ids,
    ]
    g = HFGenerator(model, tok, batch_size=3).generate(
        prompts, 4, SamplingConfig(max_new_tokens=12, stop_token_ids=[nl])
    )
    assert len(g.completion_ids) == 8 and g.n == 4 and g.prompt_index(5) == 1
    stops = {tok.eos_token_id, nl}
    for c, lp, why in zip(g.completion_ids, g.logprobs, g.finish_reasons):
        assert len(c) == len(lp) and all(x <= 0 for x in lp)
        inner = [t for t in c[:-1] if t in stops]
        assert not inner  # generation stops at the first stop token
        assert (why == "stop") == (c[-1] in stops) and (why == "stop" or len(c) == 12)
    flat = [p for p in prompts for _ in range(4)]
    again = score_completions(model, flat, g.completion_ids, tok.pad_token_id, 8, "cpu")
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(again, g.logprobs))


# ---------------- checkpoint ----------------
def test_checkpoint_round_trip_and_auto_resume(tmp_path, random_model_dir):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.run import checkpoint as ck
    from common.run import resume

    acc = Accelerator(cpu=True)
    tok = AutoTokenizer.from_pretrained(random_model_dir)
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    model(torch.tensor([[4, 5, 6]])).logits.sum().backward()
    opt.step()
    sched.step()
    (tmp_path / ".tmp-checkpoint-9").mkdir()  # an interrupted save is never picked
    for step in (1, 2, 3):
        ck.save_checkpoint(
            str(tmp_path),
            step,
            acc,
            model,
            tok,
            opt,
            sched,
            {"buf": {7: [[1, 2]]}, "s": step},
            keep=2,
        )
    assert [p.name for p in ck.list_checkpoints(str(tmp_path))] == ["checkpoint-2", "checkpoint-3"]
    latest = ck.resolve_resume("auto", str(tmp_path))
    assert latest.name == "checkpoint-3"
    want = {k: v.clone() for k, v in model.state_dict().items()}
    r_before = torch.rand(3)
    m2 = AutoModelForCausalLM.from_pretrained(random_model_dir)
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
    s2 = torch.optim.lr_scheduler.LambdaLR(o2, lambda s: 0.5)
    torch.manual_seed(123)
    step, state = resume.load_checkpoint(latest, acc, m2, o2, s2)
    assert step == 3 and state == {"buf": {7: [[1, 2]]}, "s": 3}
    assert all(torch.equal(want[k], v) for k, v in m2.state_dict().items())
    assert torch.equal(
        o2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"]
    )
    assert torch.equal(torch.rand(3), r_before)  # RNG restored to its state at save time
    assert AutoModelForCausalLM.from_pretrained(latest) is not None  # plain HF dir
    assert ck.resolve_resume("auto", str(tmp_path / "empty")) is None
    with pytest.raises(SystemExit, match="not a checkpoint"):
        ck.resolve_resume(str(tmp_path), str(tmp_path))


def test_checkpoint_files_are_plain_data_and_a_bad_file_stops_the_resume_with_one_line(
    tmp_path, random_model_dir
):
    import random
    import re

    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.run import checkpoint as ck
    from common.run import resume

    acc = Accelerator(cpu=True)
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    import collections
    import dataclasses

    @dataclasses.dataclass
    class Task:
        prompt_id: int
        steps: list

    state = {
        "tree": np.arange(3.0),
        "p": np.float64(0.25),
        "pair": (1, 2),
        "buf": {7: [[1, 2]]},
        # a FIFO and a dataclass, as the scripts keep them: saved as a list and a dict of fields
        "fifo": collections.deque([(torch.tensor([3, 4], dtype=torch.int32), -0.5)], maxlen=2),
        "queue": [Task(5, [(1, 2)])],
    }  # what scripts keep
    path = ck.save_checkpoint(
        str(tmp_path),
        1,
        acc,
        model,
        AutoTokenizer.from_pretrained(random_model_dir),
        opt,
        sched,
        state,
        keep=1,
    )
    for name in ("trainer_state.pt", "rng_rank0.pt"):  # nothing for the restricted loader to refuse
        assert torch.serialization.get_unsafe_globals_in_checkpoint(path / name) == []
    _, loaded = resume.load_checkpoint(path, acc, model, opt, sched)
    assert (
        torch.equal(loaded["tree"], torch.arange(3.0, dtype=torch.float64))
        and type(loaded["p"]) is float
    )
    assert loaded["pair"] == (1, 2) and loaded["buf"] == {7: [[1, 2]]}
    [(response, logp)] = loaded["fifo"]
    assert response.dtype == torch.int32 and response.tolist() == [3, 4] and logp == -0.5
    assert loaded["queue"] == [{"prompt_id": 5, "steps": [(1, 2)]}]
    with pytest.raises(TypeError, match="holds a set"):  # refused when saving, not at resume
        ck.plain({"seen": {1, 2}})

    def refused(name, content, match):
        good = (path / name).read_bytes()
        (path / name).write_bytes(content)
        with pytest.raises(SystemExit, match=match) as info:
            resume.load_checkpoint(path, acc, model, opt, sched)
        (path / name).write_bytes(good)
        assert "\n" not in str(info.value)  # one line

    bad = r"not a checkpoint written by this project \(unsafe or unreadable content\)"
    for name in (
        "trainer_state.pt",
        "rng_rank0.pt",
        "model.safetensors",
    ):  # cut short, as by a failed copy
        refused(name, (path / name).read_bytes()[:200], f"^checkpoint-1/{name}: {bad}: ")
    foreign = tmp_path / "foreign.pt"
    torch.save(torch.zeros(2), foreign)
    refused(
        "trainer_state.pt",
        foreign.read_bytes(),
        r"trainer_state.pt: not a checkpoint .* \(expected the keys step",
    )
    # written before the RNG file held plain data: numpy arrays, refused with the way to go on
    torch.save(
        {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        },
        foreign,
    )
    refused(
        "rng_rank0.pt",
        foreign.read_bytes(),
        "^checkpoint-1/rng_rank0.pt: an older checkpoint format .* restart "
        f"from its weights with --model_name_or_path {re.escape(str(path))}$",
    )


# ---------------- distributed helpers ----------------
def test_micro_batches_sum_to_the_full_batch_gradient(random_model_dir):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from common.distributed.ranks import micro_batches, my_slice
    from common.rl.logprobs import token_logprobs

    acc = Accelerator(cpu=True)
    prompts = [[4, 5], [6], [7, 8, 9], [10]]
    comps = [[11, 12], [13, 14, 15], [16], [17, 18]]
    adv = torch.tensor([1.0, -0.5, 0.3, 2.0])

    def grads(size):
        model = AutoModelForCausalLM.from_pretrained(random_model_dir)
        seen = []
        for rows in micro_batches(len(prompts), size, acc, model):
            batch = pad_sequences([prompts[r] for r in rows], [comps[r] for r in rows], 0)
            logp, _ = token_logprobs(model, batch)
            acc.backward(-(adv[rows] * (logp * batch.loss_mask).sum(-1)).sum() / 4)
            seen += rows
        assert seen == [0, 1, 2, 3]
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    assert torch.allclose(grads(4), grads(1), atol=1e-6)
    # no rows on one process: nothing to iterate, but zero gradients exist, as on a rank of several processes, which
    # makes a zero-weight pass (tests/test_distributed_update.py): the optimizer steps alike
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    assert list(micro_batches(0, 4, acc, model)) == []
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    ranks = [type("A", (), {"num_processes": 3, "process_index": r}) for r in range(3)]
    shares = [
        my_slice(list(range(10)), rank) for rank in ranks
    ]  # strided: each rank gets every third item
    assert shares == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


# ---------------- losses ----------------
def test_kl_k3_is_zero_at_equality_and_positive_otherwise():
    from common.rl.losses import kl_k3

    lp = torch.log(torch.tensor([0.2, 0.5, 0.9]))
    assert torch.allclose(kl_k3(lp, lp), torch.zeros(3))
    assert torch.all(kl_k3(lp, lp - 0.3) > 0)
    # expectation under pi of k3 equals KL(pi||ref) for a categorical
    p, q = torch.tensor([0.1, 0.6, 0.3]), torch.tensor([0.3, 0.3, 0.4])
    assert torch.isclose((p * kl_k3(p.log(), q.log())).sum(), (p * (p / q).log()).sum(), atol=1e-6)


def test_clipped_surrogate_clips_asymmetrically():
    from common.rl.losses import clipped_surrogate

    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 1.1]))
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0])
    loss, clipped = clipped_surrogate(logp, old, adv, eps_low=0.2, eps_high=0.28)
    assert torch.allclose(loss, torch.tensor([-1.28, 1.5, 0.8, -1.1]), atol=1e-6)
    assert clipped.tolist() == [1.0, 0.0, 1.0, 0.0]
    logp.requires_grad_(True)
    per_token, _ = clipped_surrogate(logp, old, adv)
    per_token.sum().backward()
    assert logp.grad[0] == 0 and logp.grad[2] == 0 and logp.grad[1] != 0  # no gradient once clipped


def test_checkpoint_loads_sharded_weights(tmp_path, random_model_dir):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.run import checkpoint as ck
    from common.run import resume

    acc = Accelerator(cpu=True)
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    path = ck.save_checkpoint(
        str(tmp_path),
        1,
        acc,
        model,
        AutoTokenizer.from_pretrained(random_model_dir),
        opt,
        sched,
        {},
        keep=1,
    )
    (path / "model.safetensors").unlink()
    model.save_pretrained(path, max_shard_size="300KB")  # how big models are saved
    assert (path / "model.safetensors.index.json").exists()
    m2 = AutoModelForCausalLM.from_pretrained(random_model_dir)
    resume.load_checkpoint(path, acc, m2, torch.optim.AdamW(m2.parameters()), sched)
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), m2.state_dict().values())
    )


def test_report_to_without_the_package_is_a_clear_error(monkeypatch, tmp_path):
    import importlib.util

    from common.run.logs import check_tracker

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda n, *a: None if n.startswith(("tensorboard", "wandb")) else real(n, *a),
    )
    with pytest.raises(SystemExit, match="--report_to wandb: install it first"):
        check_tracker("wandb")
    check_tracker("none")  # nothing to check


# ---------------- embedded base ----------------
def test_embedded_base_build_records_its_quality(built_base):
    from pathlib import Path

    info = json.loads((Path(built_base) / "build_info.json").read_text())
    for k in (
        "train_all",
        "train_easy",
        "train_mid",
        "train_hard",
        "heldout_all",
        "heldout_hard",
        "recipe",
        "params",
    ):
        assert k in info
    for level in (
        "easy",
        "mid",
        "hard",
    ):  # the regime RL starts in, per level (16 prompts of each split here)
        part, whole = info[f"train_{level}"], info["train_all"]
        assert 0 < part["prompts"] < whole["prompts"] == 16
        assert {
            "pass@1",
            "greedy_pass@1",
            "pass@8",
            "zero_var_groups_of_4",
            "pass_rate_below_0.1",
        } <= set(part)
    assert 0.0 <= info["heldout_all"]["pass@1"] <= 1.0 and info["recipe"]["sft_steps"] == 2
    assert info["recipe"]["careless"] == [0.0, 0.85, 0.5]
    assert 900_000 < info["params"] < 1_100_000  # hidden 128, 4 layers: ~1M parameters


# ---------------- vLLM weight push and sleep mode (engine faked: sleep mode exists only on GPU) ----------------
def test_vllm_push_maps_a_sleeping_engines_weights_and_leaves_them_awake(random_model_dir):
    from transformers import AutoModelForCausalLM

    from common.generation.vllm_backend import VLLMGenerator

    calls = []

    class FakeLLM:
        def sleep(self, level):
            calls.append(("sleep", level))

        def wake_up(self, tags):
            calls.append(("wake_up", tuple(tags)))

        def collective_rpc(self, method, kwargs):
            calls.append((method, len(list(kwargs["weights_iterator"]))))

        def reset_prefix_cache(self):
            calls.append(("reset_prefix_cache",))
            return self.reset_ok

    FakeLLM.reset_ok = True

    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    gen = VLLMGenerator.__new__(
        VLLMGenerator
    )  # no engine start: only the push / sleep bookkeeping is tested
    gen.llm, gen.sleep_enabled, gen._asleep = (
        FakeLLM(),
        True,
        {"weights", "kv_cache"},
    )  # asleep, as after sleep()
    gen.sync_weights(model)
    n_tensors = len(model.state_dict())  # lm_head.weight included (tied embeddings)
    # only the weights are mapped for the push (TRL and verl do the same): the KV cache's memory stays free; no
    # sleep after it, since a level-2 sleep would discard the weights just pushed
    assert calls == [
        ("wake_up", ("weights",)),
        ("reload_weights", n_tensors),
        ("reset_prefix_cache",),
    ]
    assert gen._asleep == {"kv_cache"}
    calls.clear()
    gen._asleep = set()  # an awake engine (CPU, or sleep disabled) is pushed to and stays awake
    gen.sleep_enabled = False
    gen.sync_weights(model)
    assert [c[0] for c in calls] == [
        "reload_weights",
        "reset_prefix_cache",
    ] and gen._asleep == set()
    FakeLLM.reset_ok = (
        False  # vLLM could not drop KV blocks computed with the old weights: never go on silently
    )
    with pytest.raises(RuntimeError, match="prefix cache"):
        gen.sync_weights(model)


def test_graceful_stop_flags_the_first_signal_and_gives_the_handlers_back():
    import os
    import signal

    from common.run.process import GracefulStop

    before = signal.getsignal(signal.SIGINT)
    stop = GracefulStop(log=lambda *_: None)
    os.kill(os.getpid(), signal.SIGINT)  # the first one only asks for a stop
    assert stop.requested
    with pytest.raises(KeyboardInterrupt):  # the second one aborts
        os.kill(os.getpid(), signal.SIGINT)
    stop.close()
    assert signal.getsignal(signal.SIGINT) is before


def test_vllm_takes_the_gpu_accelerate_picked_not_the_launchers_local_rank():
    # one visible GPU per process (e.g. SLURM): accelerate's device is cuda:0 while LOCAL_RANK is 1; vLLM's external
    # launcher reads LOCAL_RANK as the GPU index, so it must be the accelerator's device index
    from types import SimpleNamespace

    from common.generation.vllm_backend import _process_layout

    acc = SimpleNamespace(
        process_index=5, local_process_index=1, num_processes=8, device=torch.device("cuda", 0)
    )
    assert _process_layout(acc) == (5, 0, 8, True)
    acc.device = torch.device("cpu")
    assert _process_layout(acc) == (5, 1, 8, True)
