"""--reward_funcs: TRL-style reward functions and message-format prompts in every script, the one success rule
(--success_reward) in every method, and one line for each bad input."""

import json
import math
import shutil
import statistics
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT, run_main

SCRIPTS = ["ra_rloo.py", "pros_ppo.py", "ps_grpo.py", "ada_seq.py", "ada_est.py"]
TINY = [
    "--max_steps",
    "2",
    "--eval_steps",
    "0",
    "--eval_prompts",
    "2",
    "--eval_samples",
    "2",
    "--eval_train_prompts",
    "0",
    "--prompts_per_step",
    "4",
    "--num_threads",
    "1",
    "--max_completion_length",
    "32",
    "--log_samples_every",
    "1",
    "--log_samples_per_kind",
    "64",
    "--prompt_column",
    "prompt",
]
FLAGS = {
    "ra_rloo.py": ["--num_generations", "4", "--paper_eval_samples", "0", "--seed_buffer", "false"],
    "pros_ppo.py": [],
    "ps_grpo.py": ["--mode", "text"],
    "ada_seq.py": ["--max_rounds", "2", "--round_repeat", "4", "--exit_condition", "positive"],
    "ada_est.py": ["--prompt_pool", "4"],
}

FUNCS = """
def fixed(completions, **kwargs):  # TRL's documented form
    return [0.3] * len(completions)


def none_or_zero(prompts, completions, completion_ids, numbers, target, **kwargs):
    assert len(prompts) == len(completions) == len(completion_ids) == len(numbers) == len(target)
    return [None if len(ids) % 2 else 0.0 for ids in completion_ids]


def chat_length(prompts, completions, completion_ids, **kwargs):
    # message prompts: the prompt as the dataset holds it, the completion as one assistant message
    assert all(p[0]["role"] == "user" and c[0]["role"] == "assistant" for p, c in zip(prompts, completions))
    return [None if len(ids) % 3 == 0 else len(c[0]["content"]) / 10 for c, ids in zip(completions, completion_ids)]


def raises(completions, calls=[0], **kwargs):
    calls[0] += len(completions) > 1  # batches: one a training step (evaluation has its own functions here)
    if calls[0] >= 2:
        raise ZeroDivisionError("division by zero")
    return [0.0] * len(completions)


async def overlong(completion_ids, trainer_state, log_metric, log_extra, **kwargs):
    # TRL's DAPO overlong shaping, awaited as an LLM judge would be: -1 for a completion that reaches 10 tokens;
    # no opinion (None, and no other function: no reward at all) on about a quarter of them
    from trl.rewards import get_soft_overlong_punishment

    assert trainer_state.max_steps == 2 and trainer_state.global_step in (0, 1, 2)
    values = get_soft_overlong_punishment(max_completion_len=10, soft_punish_cache=8)(completion_ids=completion_ids)
    log_metric("cut_share", sum(value == -1.0 for value in values) / len(values))
    log_extra("n_ids", [len(ids) for ids in completion_ids])
    unscored = [sum(i * j for j, i in enumerate(ids)) % 4 == 1 for ids in completion_ids]
    return [None if none else value for none, value in zip(unscored, values)]
"""


@pytest.fixture(scope="module")
def chat_base(tiny_base, tmp_path_factory):
    """The embedded base with a chat template that renders a user message as the plain Countdown prompt (so the
    model answers as it does on the embedded task), and the training rows as .jsonl, text and message prompts."""
    from common.demo.countdown import countdown_task

    root = tmp_path_factory.mktemp("chat_base")
    shutil.copytree(tiny_base, root / "model")
    config = json.loads((root / "model" / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (root / "model" / "tokenizer_config.json").write_text(json.dumps(config))
    rows = [example.columns for example in countdown_task("binary", 0).train[:40]]
    (root / "text.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    chat = [{**row, "prompt": [{"role": "user", "content": row["prompt"]}]} for row in rows]
    (root / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in chat))
    (root / "funcs.py").write_text(FUNCS)
    return root


@pytest.fixture(scope="module")
def reward_model(chat_base):
    """A tiny random sequence-classification model (one label) with the chat base's tokenizer and chat template."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    path = chat_base / "rm"
    config = AutoConfig.from_pretrained(chat_base / "model", num_labels=1)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 32, 64, 1
    config.num_attention_heads = config.num_key_value_heads = 2
    AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(chat_base / "model").save_pretrained(path)
    return path


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run(script, root, out, data, funcs, weights, *extra):
    run_main(
        [
            script,
            "--model_name_or_path",
            str(root / "model"),
            "--dataset_name",
            str(root / data),
            "--output_dir",
            str(out),
            "--reward_funcs",
            ",".join(f if "/" in f else f"{root / 'funcs.py'}:{f}" for f in funcs),
            "--reward_weights",
            weights,
            *TINY,
            *FLAGS[script],
            *extra,
        ]
    )
    return _rows(out / "metrics.jsonl"), _rows(out / "samples.jsonl") if (
        out / "samples.jsonl"
    ).exists() else []


def _check_totals(rows, samples, names, weights):
    for name in names:
        assert all(
            f"rewards/{name}/mean" in row and f"rewards/{name}/std" in row for row in rows[1:]
        ), name
    checked = 0
    for sample in samples:
        if f"reward/{names[0]}" not in sample or sample["kind"] == "replayed":
            continue
        values = [sample[f"reward/{name}"] for name in names]
        total = sum(w * v for w, v in zip(weights, values) if v is not None)
        assert sample["reward"] == pytest.approx(total, abs=1e-6), (
            sample
        )  # a cut completion keeps its total (TRL)
        checked += 1
    return checked


@pytest.mark.parametrize("script", SCRIPTS)
def test_two_reward_funcs_route_by_success_reward(chat_base, tmp_path, script):
    # every total is 10 x 0.3 + (None or 0) = 3, cut or not (TRL's rule): a success at --success_reward 2.5, a failure
    # at the default 1 (and positive by Ada's default > 0.7); each method must route every rollout as a success
    rows, samples = _run(
        script,
        chat_base,
        tmp_path / "text",
        "text.jsonl",
        ["fixed", "none_or_zero"],
        "10,1",
        "--success_reward",
        "2.5",
        "--max_completion_length",
        "14",
    )
    last = rows[-1]
    assert any(
        s["truncated"] for s in samples
    )  # some completions were cut: they keep their total, succeed too
    assert last["reward_mean"] == pytest.approx(3.0) and last["reward_none_frac"] == 0.0
    assert last["pass_rate"] == pytest.approx(1.0) and last["rewards/fixed/mean"] == pytest.approx(
        0.3
    )
    assert last["rewards/none_or_zero/mean"] == 0.0 and last["time_reward_s"] >= 0.0
    assert any(s["reward/none_or_zero"] is None for s in samples)
    assert _check_totals(rows, samples, ["fixed", "none_or_zero"], [10.0, 1.0]) > 0
    if script == "ps_grpo.py":  # [PS] every task of the step passes all N: 100% routing
        assert last["ps_route_all_pass"] == 4 and last["ps_route_normal"] == 0
    elif (
        script == "ra_rloo.py"
    ):  # [RA-RLOO] every prompt's successes enter its buffer; no group needs a replay
        assert last["ra_buffer_prompts"] == 8 and last["ra_replay_fired_frac"] == 0.0
    elif script == "ada_seq.py":  # [ADA] positive exit: every prompt leaves after its first round
        assert last["ada_active_after_round_1"] == 0.0
    elif (
        script == "ada_est.py"
    ):  # [EST] Beta counts: the step-1 trials were successes, so p_hat rose above its prior
        assert rows[1]["est_p_hat_mean"] == pytest.approx(1 / 17) and last["est_p_hat_mean"] > 0.3
    elif script == "pros_ppo.py":  # [PROS] correct rollouts spawn children
        assert last["pros_children_created"] > 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_message_prompts_and_weighted_totals(chat_base, reward_model, tmp_path, script):
    # ra_rloo.py and ps_grpo.py also weigh in a reward model (its own tokenizer and chat template, prompt + completion)
    model = [str(reward_model)] if script in ("ra_rloo.py", "ps_grpo.py") else []
    rows, samples = _run(
        script,
        chat_base,
        tmp_path / "chat",
        "chat.jsonl",
        ["fixed", "chat_length", *model],
        "1,0.5" + ",2" * len(model),
    )
    assert all(math.isfinite(row["reward_mean"]) for row in rows[1:])
    names, weights = ["fixed", "chat_length", *["rm"] * len(model)], [1.0, 0.5, *[2.0] * len(model)]
    assert _check_totals(rows, samples, names, weights) > 0
    if model:  # a number for every completion, and not one number for all
        assert len({s["reward/rm"] for s in samples if s["kind"] != "replayed"}) > 1
    if script in (
        "ps_grpo.py",
        "pros_ppo.py",
        "ada_est.py",
    ):  # samples.jsonl holds every rollout of the step
        values = [s["reward/chat_length"] for s in samples if s["step"] == 2]
        assert None in values  # not applicable: left out of the total and of the mean
        given = [v for v in values if v is not None]
        assert rows[-1]["rewards/chat_length/mean"] == pytest.approx(sum(given) / len(given))
        assert rows[-1]["rewards/chat_length/std"] == pytest.approx(statistics.stdev(given))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_cut_completion_keeps_its_negative_reward_and_unscored_ones_train_as_in_trl(
    chat_base, tmp_path, script, capsys
):
    # rewards in [-1, 0] from an async function; --max_completion_length 10 cuts most answers (-1: DAPO's overlong
    # punishment), a quarter get no reward; a success is a total >= -0.5: never a cut one here
    rows, samples = _run(
        script,
        chat_base,
        tmp_path / "run",
        "text.jsonl",
        ["overlong"],
        "1",
        "--max_completion_length",
        "10",
        "--success_reward",
        "-0.5",
    )
    assert (
        capsys.readouterr().out.count("warning: every reward function returned None for") == 1
    )  # once a run
    fresh = [s for s in samples if s["kind"] != "replayed"]
    cut = [s for s in fresh if s["truncated"] and s["reward/overlong"] is not None]
    assert len(cut) > len(fresh) / 2 and all(s["reward"] == -1.0 for s in cut)  # not 0: TRL's rule
    unscored = [s for s in fresh if s["reward/overlong"] is None]
    assert unscored and all(s["reward"] is None for s in unscored)
    assert all(s["advantage"] == 0.0 for s in unscored if "advantage" in s)  # no gradient
    assert all(s["n_ids"] is not None for s in fresh)  # log_extra's column
    for row in rows[1:]:
        assert math.isfinite(row["reward_mean"]) and -1.0 <= row["reward_mean"] <= 0.0
        assert (
            0 < row["reward_none_frac"] < 1 and 0 <= row["reward_fn/cut_share"] <= 1
        )  # log_metric
    if script in (
        "ps_grpo.py",
        "pros_ppo.py",
        "ada_est.py",
    ):  # samples.jsonl holds every rollout of the step
        step = [s for s in fresh if s["step"] == 2]
        assert rows[-1]["pass_rate"] == pytest.approx(
            sum(s["reward"] is not None and s["reward"] >= -0.5 for s in step) / len(step)
        )
        rated = [s["reward"] for s in step if s["reward"] is not None]
        assert rows[-1]["reward_mean"] == pytest.approx(sum(rated) / len(rated))


def test_bad_reward_functions_get_one_line(tmp_path, monkeypatch, capsys):
    from common.tasks.rewards import TRACEBACK_ENV, RewardFuncs, call_reward_funcs

    (tmp_path / "f.py").write_text(FUNCS + "\nimport_error = None\n")
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    f = str(tmp_path / "f.py")
    cases = [
        (
            f"{tmp_path / 'broken.py'}:g",
            r"cannot import .*broken.py \(ModuleNotFoundError: No module named",
        ),
        ("no_such_package.mod:g", r"cannot import no_such_package.mod \(ModuleNotFoundError"),
        (f"{f}:missing", r"f.py has no function missing$"),
        (f"{f}:chat_lenght", r"f.py has no function chat_lenght; the nearest is chat_length$"),
        ("./no_such_model_dir", "no_such_model_dir: directory not found"),
        (f"{tmp_path / 'nope.py'}:g", "file .*nope.py not found"),
    ]
    for spec, message in cases:
        with pytest.raises(SystemExit, match=message):
            RewardFuncs(spec)
    with pytest.raises(SystemExit, match="--reward_weights '1,2': expected 1 finite numbers"):
        RewardFuncs(f"{f}:fixed", "1,2")
    from common.run.flags import parse_args
    from ps_grpo import Args

    with pytest.raises(SystemExit, match="--reward_funcs: multi-turn keeps its binary reward"):
        parse_args(
            Args, ["--reward_funcs", f"{f}:fixed"]
        )  # the embedded task's default mode: multi-turn

    def score(body, n=4, step=3):
        (tmp_path / "g.py").write_text(f"def g(completions, **kwargs):\n    {body}\n")
        sys.modules.pop("g", None)
        funcs = RewardFuncs(f"{tmp_path / 'g.py'}:g")
        return call_reward_funcs(
            funcs,
            ["a", "bb", "ccc", "dddd"][:n],
            [{"prompt": "p", "x": 1}] * n,
            [[1]] * n,
            "prompt",
            step,
        )

    total = score("return [None, 1, 2.5, True]")[0]
    assert math.isnan(total[0]) and total[1:] == [
        1.0,
        2.5,
        1.0,
    ]  # no function scored completion 0: NaN, as TRL
    assert (
        score("return [kwargs['trainer_state'].global_step] * 4")[0] == [2.0] * 4
    )  # TRL's: updates done
    # the columns TRL passes: neither `prompt` nor `completion`, whatever the prompt column is
    (tmp_path / "k.py").write_text("def k(prompts, completions, **kwargs):\n    return [0]\n")
    keys = RewardFuncs(f"{tmp_path / 'k.py'}:k")
    seen = []
    keys.funcs = [lambda prompts, **kwargs: seen.append((prompts, sorted(kwargs))) or [0]]
    row = {"question": "q", "prompt": "p", "completion": "gold", "x": 1}
    call_reward_funcs(keys, ["a"], [row], [[1]], "question", 1)
    assert seen[0][0] == ["q"] and "x" in seen[0][1]
    assert not {"prompt", "completion", "question"} & set(seen[0][1])
    bad = [
        ("return [1, 2]", "g at step 3: returned 2 values for 4 completions"),
        ("return [0, 0, float('inf'), 0]", "g at step 3: value 2 is inf, not finite"),
        ("return [0, 0, 0, 'yes']", "g at step 3: value 3 is 'yes', not a number or None"),
        ("return 1.0", "g at step 3: returned float, not a list of 4 numbers"),
        (
            "return [1 / (len(c) - 3) for c in completions]",
            "g raised at step 3 on completion 2: ZeroDivisionError",
        ),
    ]
    for body, message in bad:
        with pytest.raises(SystemExit, match=message):
            score(body)

    # a raise inside a helper of the user's file: the line names that file and line; the
    # documented switch prints the whole traceback
    (tmp_path / "h.py").write_text(
        "def helper(text):\n    return {}[text]\n\n\ndef h(completions, **kwargs):\n"
        "    return [helper(c) for c in completions]\n"
    )
    with pytest.raises(SystemExit) as stop:
        call_reward_funcs(RewardFuncs(f"{tmp_path / 'h.py'}:h"), ["a"], [{}], [[1]], "prompt", 1)
    assert f"h.py:2; {TRACEBACK_ENV}=1 prints the traceback)" in str(stop.value)
    assert str(stop.value).startswith(
        "reward function h raised at step 1 on completion 0: KeyError"
    )
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(SystemExit) as stop:
        call_reward_funcs(RewardFuncs(f"{tmp_path / 'h.py'}:h"), ["a"], [{}], [[1]], "prompt", 1)
    assert str(stop.value).endswith("(in " + str(tmp_path / "h.py") + ":2)")
    err = capsys.readouterr().err
    assert "Traceback" in err and "line 6, in h" in err and "line 2, in helper" in err


def test_a_raising_function_stops_the_run_and_the_checkpoint_before_resumes(
    chat_base, tmp_path, capsys
):
    out = tmp_path / "run"
    with pytest.raises(
        SystemExit,
        match="reward function raises raised at step 2 on completion 0: ZeroDivisionError",
    ) as stopped:
        _run(
            "ra_rloo.py",
            chat_base,
            out,
            "text.jsonl",
            ["raises"],
            "1",
            "--save_steps",
            "1",
            "--eval_reward_funcs",
            f"{chat_base / 'funcs.py'}:fixed",
        )
    assert [row["step"] for row in _rows(out / "metrics.jsonl")] == [0, 1]
    # the interpreter writes the message to sys.stderr as it exits: on a line of its own, not glued
    # to the progress bar's (a log file keeps the bar's carriage returns)
    sys.stderr.write(f"{stopped.value}\n")
    err = capsys.readouterr().err
    assert "ra_rloo: " in err and f"\n{stopped.value}\n" in err, err[-300:]
    # the fixed function is another flag value: the resume says so and records it (a function fixed in place is not)
    rows, _ = _run(
        "ra_rloo.py",
        chat_base,
        out,
        "text.jsonl",
        ["fixed"],
        "1",
        "--resume_from_checkpoint",
        "auto",
        "--eval_reward_funcs",
        f"{chat_base / 'funcs.py'}:fixed",
        "--accept_changed_flags",
    )
    assert [row["step"] for row in rows] == [0, 1, 2] and rows[-1][
        "rewards/fixed/mean"
    ] == pytest.approx(0.3)
    assert "resumed from" in capsys.readouterr().out


def test_split_line_truncation_warning_and_a_separate_evaluation_file(chat_base, tmp_path, capsys):
    # every completion cut at 3 tokens: the warning names the flag, once; the held-out prompts come from the file
    rows = [json.loads(line) for line in (chat_base / "text.jsonl").read_text().splitlines()]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:3]))
    _run(
        "ra_rloo.py",
        chat_base,
        tmp_path / "run",
        "text.jsonl",
        ["fixed"],
        "1",
        "--max_completion_length",
        "3",
        "--eval_dataset",
        str(tmp_path / "eval.jsonl"),
    )
    out = capsys.readouterr().out
    split = f"40 training prompts from {chat_base / 'text.jsonl'}; 2 held-out prompts from {tmp_path / 'eval.jsonl'}"
    assert split + "\n" in out
    assert out.count("completions hit --max_completion_length 3") == 1


def test_a_damaged_jsonl_line_is_named(tmp_path):
    from common.run.flags import BaseArgs
    from common.tasks.loading import hf_task

    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"question": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\n{"question": "c", "ans\n'
    )
    with pytest.raises(SystemExit, match=r"d.jsonl line 3: not valid JSON"):
        hf_task(BaseArgs(dataset_name=str(path)), None)
    path.write_text('{"question": "a", "answer": "1"}\n[1, 2]\n')
    with pytest.raises(SystemExit, match=r"d.jsonl line 2: a row must be a JSON object, got list"):
        hf_task(BaseArgs(dataset_name=str(path)), None)


def test_the_worked_example(random_model_dir, tmp_path):
    # examples/: the message-format .jsonl loads (through a chat template) and its two functions score it
    from transformers import AutoTokenizer

    from common.run.flags import BaseArgs
    from common.tasks.loading import hf_task
    from common.tasks.rewards import RewardFuncs, call_reward_funcs

    tok = AutoTokenizer.from_pretrained(random_model_dir)
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    funcs = "examples/gsm8k_rewards.py:format_reward,examples/gsm8k_rewards.py:correctness_reward"
    args = BaseArgs(
        dataset_name=str(ROOT / "examples" / "gsm8k_chat.jsonl"),
        prompt_column="prompt",
        eval_prompts=2,
        reward_funcs=funcs,
    )
    task = hf_task(args, tok)
    assert task.train[0].prompt.startswith("system: Solve") and task.train[0].prompt.endswith(
        "assistant:"
    )
    examples = [task.train[0], task.train[0], task.eval[-1]]  # the last row has no gold answer
    texts = ["12 * 5 = 60\nAnswer: 60", "Answer: 61", "Answer: 12"]
    with_root = RewardFuncs(",".join(f"{ROOT / spec}" for spec in funcs.split(",")), "0.2,1")
    total, values = call_reward_funcs(
        with_root, texts, [e.columns for e in examples], [[1]] * 3, "prompt", 1
    )
    assert values == {"format_reward": [1.0, 1.0, 1.0], "correctness_reward": [1.0, 0.0, None]}
    assert total == pytest.approx([1.2, 0.2, 0.2])
    # --system_prompt goes before text prompts; message prompts without a chat template: one line
    text = tmp_path / "text.jsonl"
    text.write_text(
        "".join(
            json.dumps({"question": f"What is {i}?", "answer": str(i)}) + "\n" for i in range(10)
        )
    )
    task = hf_task(BaseArgs(dataset_name=str(text), system_prompt="Be brief.", eval_prompts=2), tok)
    assert task.train[0].prompt.startswith(
        "system: Be brief.\nuser: What is 0? Please reason step by step"
    )
    tok.chat_template = None
    with pytest.raises(SystemExit, match="row 0: a message-format prompt needs a chat template"):
        hf_task(args, tok)


PARITY = """
import asyncio

import numpy as np
import torch


def length(completions, label, **kwargs):  # negative; a cut completion is long: its most negative value
    text = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [None if lab == "skip" else -abs(8 - len(t)) / 4 for t, lab in zip(text, label)]


def sometimes(completion_ids, label, **kwargs):  # None for some items, every kind of number for the others
    kinds = [None, float("nan"), torch.tensor(0.5), np.float32(0.25), 2, True]
    return [kinds[i % len(kinds)] if lab != "skip" else None for i, lab in enumerate(label)]


def schedule(completions, trainer_state, log_metric, log_extra, **kwargs):  # a warm-up read from trainer_state
    log_metric("progress", trainer_state.global_step / trainer_state.max_steps)
    log_extra("seen", [1] * len(completions))
    return [None if i in (2, 3) else min(1.0, trainer_state.global_step / trainer_state.max_steps)
            for i in range(len(completions))]


async def judge(prompts, completions, label, **kwargs):  # an async verifier: None wherever `label` says skip
    await asyncio.sleep(0)
    return [None if lab == "skip" else float(len(str(p)) % 3) for p, lab in zip(prompts, label)]
"""


def test_totals_match_trl_calculate_rewards(tmp_path):
    # the same batches through TRL 1.16's own GRPOTrainer._calculate_rewards (on a stand-in for the trainer) and
    # through Task.score: the same totals (NaN where no function scored), cut completions included
    from types import SimpleNamespace

    import torch
    from accelerate import PartialState
    from transformers import TrainerState
    from trl.trainer.grpo_trainer import GRPOTrainer
    from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon

    from common.tasks.rewards import RewardFuncs
    from common.tasks.task import Example, Task

    (tmp_path / "parity.py").write_text(PARITY)
    specs = ",".join(
        f"{tmp_path / 'parity.py'}:{name}" for name in ("length", "sometimes", "schedule", "judge")
    )
    weights = [1.0, -2.0, 0.5, 3.0]
    funcs = RewardFuncs(specs, ",".join(map(str, weights)))
    funcs.state.max_steps = 8
    task = Task([], [], None, None, "parity", reward_funcs=funcs, success_reward=0.0)
    PartialState()  # one process: TRL's gather returns the batch
    thread, loop, ready = start_event_loop_in_daemon(name="parity")
    ready.wait()
    trl_state = TrainerState(max_steps=8)
    stand_in = SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        reward_funcs=funcs.funcs,
        reward_processing_classes=[None] * 4,
        reward_func_names=funcs.names,
        state=trl_state,
        args=SimpleNamespace(report_to=[]),
        _log_completion_extra=lambda *a: None,
        _log_metric=lambda *a: None,
        environments=None,
        async_loop=loop,
        chat_template_kwargs={},
    )
    texts = [
        "12+3=15",
        "a much longer answer cut at the limit",
        "x",
        "",
        "8 chars!",
        "cut again, and long",
    ]
    labels = ["ok", "ok", "skip", "ok", "ok", "ok"]  # item 2: every function says None
    messages = [[{"role": "user", "content": f"q{i}"}] for i in range(6)]
    try:
        for prompts, step in ((["p"] * 6, 3), (messages, 5)):
            rows = [{"prompt": p, "label": lab} for p, lab in zip(prompts, labels)]
            ids = [list(range(len(t))) for t in texts]
            cut = [len(t) > 15 for t in texts]  # cut completions: TRL scores them as any other
            ours = task.score(
                texts,
                [Example(i, "", None, columns=row) for i, row in enumerate(rows)],
                ids,
                cut,
                step,
            ).total
            completions = [
                [{"role": "assistant", "content": t}] if isinstance(p, list) else t
                for p, t in zip(prompts, texts)
            ]
            trl_state.global_step = step - 1
            per_func = GRPOTrainer._calculate_rewards(stand_in, rows, prompts, completions, ids)
            theirs = (per_func * torch.tensor(weights)).nansum(dim=1)
            theirs[torch.isnan(per_func).all(dim=1)] = torch.nan
            assert (
                [math.isnan(v) for v in ours]
                == torch.isnan(theirs).tolist()
                == [False, False, True] + [False] * 3
            )
            scale = max(abs(v) for v in ours if not math.isnan(v))
            for mine, trl_value in zip(ours, theirs.tolist()):
                if not math.isnan(
                    mine
                ):  # float32 there, float64 here: a few ulps of float32 at this scale
                    assert mine == pytest.approx(
                        trl_value, abs=4 * scale * torch.finfo(torch.float32).eps
                    )
        # and one completion that no function scores: NaN in both
        rows = [{"prompt": "p", "label": "skip"}]
        solo = RewardFuncs(
            ",".join(f"{tmp_path / 'parity.py'}:{n}" for n in ("sometimes", "judge"))
        )
        stand_in.reward_funcs, stand_in.reward_func_names = solo.funcs, solo.names
        stand_in.reward_processing_classes = [None] * 2
        assert math.isnan(
            Task([], [], None, None, "p", reward_funcs=solo)
            .score(["t"], [Example(0, "", None, columns=rows[0])], [[1]], [False], 1)
            .total[0]
        )
        assert torch.isnan(
            GRPOTrainer._calculate_rewards(stand_in, rows, ["p"], ["t"], [[1]])
        ).all()
    finally:
        shutdown_event_loop_in_daemon(thread, loop)


def test_reward_model_names_and_trainer_state(reward_model, tmp_path):
    # a reward model scores prompt + completion (messages: through its own chat template) in eval mode; functions
    # are named as TRL names them; trainer_state is a real TrainerState, the evaluation's at the last step's count
    import torch
    from transformers import TrainerState

    from common.run.flags import BaseArgs
    from common.tasks.rewards import RewardFuncs
    from common.tasks.task import Example, Task

    (tmp_path / "named.py").write_text(
        "import functools\n\n\ndef base(completions, scale, trainer_state, **kwargs):\n"
        "    return [scale * trainer_state.global_step] * len(completions)\n\n\n"
        "part = functools.partial(base, scale=2.0)\n\n\nclass Judge:\n"
        "    def __call__(self, completions, trainer_state, **kwargs):\n"
        "        assert isinstance(trainer_state.epoch, float) and trainer_state.max_steps == 10\n"
        "        return [0.0] * len(completions)\n\n\njudge = Judge()\n"
    )
    funcs = RewardFuncs(
        f"{tmp_path / 'named.py'}:part,{tmp_path / 'named.py'}:judge,{reward_model}"
    )
    assert funcs.names == ["base", "Judge", "rm"]
    assert isinstance(funcs.state, TrainerState)
    model = funcs.funcs[2]
    assert not model.model.training and model.model.dtype == torch.float32
    funcs.fill_state(BaseArgs(max_steps=10, prompts_per_step=4), 40, print)
    task = Task([], [], None, None, "t", reward_funcs=funcs, eval_reward_funcs=funcs)
    messages = [{"role": "user", "content": "3 4 t7"}]
    example = Example(0, "", None, columns={"prompt": messages})
    total = task.score(["3+4=7"], [example], [[1]], [False], 4).total[0]
    text = model.tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": "3+4=7"}], tokenize=False
    )
    with torch.no_grad():
        alone = model.model(
            **model.tokenizer([text], return_tensors="pt", add_special_tokens=False)
        ).logits[0, 0]
    assert total == pytest.approx(
        2.0 * 3 + float(alone), abs=1e-5
    )  # global_step: the 3 updates before step 4
    # the evaluation after step 4: the 4 updates done
    assert task.eval_success(["3+4=7"], [example], [[1]], [False]) == [
        2.0 * 4 + float(alone) >= 1.0
    ]
    assert funcs.state.global_step == 4 and funcs.state.epoch == pytest.approx(4 / 10)


class _Answers:
    """A stand-in generator: every sample answers `text`; the odd samples are cut by the token limit."""

    def __init__(self, tokenizer, text):
        self.ids = tokenizer(text, add_special_tokens=False).input_ids
        self.end_ids = [
            tokenizer.eos_token_id
        ]  # what ends a turn, as the generators' (EOS, end-of-turn ids)

    def generate(self, prompts, n, sampling):
        from common.generation.hf import Generations

        count = len(prompts) * n
        return Generations(
            prompts,
            [list(self.ids) for _ in range(count)],
            [[] for _ in range(count)],
            ["length" if i % 2 else "stop" for i in range(count)],
            n,
        )


def test_a_cut_correct_answer_never_passes_the_evaluation(tiny_base, tmp_path):
    # the evaluation every script runs (common/run/logs.py `evaluate` with `Task.eval_success`; ps_grpo.py's episodes):
    # of two correct answers, the one cut by the limit fails, as it does in training; pass@k counts the same
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    import ps_grpo
    from common.demo.countdown import Problem, countdown_task
    from common.generation.hf import SamplingConfig
    from common.rl.verifiers import math_reward
    from common.tasks.evaluation import evaluate
    from common.tasks.rewards import RewardFuncs
    from common.tasks.task import Example, Task

    tok = AutoTokenizer.from_pretrained(tiny_base)
    one = SimpleNamespace(process_index=0, num_processes=1)
    encode = lambda text: tok(text).input_ids  # noqa: E731
    problem = Problem((3, 4), 7)
    countdown = countdown_task("binary", 4)
    example = Example(0, "3 4 t7\n", problem)
    maths = Task([], [Example(0, "1+1?", "2")], None, lambda t, e: math_reward(t, e.answer), "math")
    (tmp_path / "f.py").write_text(
        "def right(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    funcs = Task(
        [], [], None, None, "funcs", eval_reward_funcs=RewardFuncs(f"{tmp_path / 'f.py'}:right")
    )
    sampling = SamplingConfig(max_new_tokens=8)
    cases = [(countdown, example, "3+4=7\n"), (maths, maths.eval[0], "\\boxed{2}")]
    for (
        task,
        item,
        text,
    ) in cases:  # (the char tokenizer has no backslash: the text itself for the decoded ids)
        fixed = SimpleNamespace(batch_decode=lambda ids, **kwargs: [text] * len(ids))
        out = evaluate(
            _Answers(tok, "1"), fixed, [item], encode, task.eval_success, sampling, 2, one
        )
        assert out["eval_pass@1"] == 0.5 and out["eval_pass@2"] == 1.0, (
            task.name
        )  # the cut one fails
    # --eval_reward_funcs: the training rule (a cut completion keeps its functions' total) in both places
    assert funcs.eval_success(["a", "b"], [example] * 2, [[1], [1]], [False, True]) == [True, True]
    assert Task([], [], None, None, "t", reward_funcs=funcs.eval_reward_funcs).score(
        ["a", "b"], [example] * 2, [[1], [1]], [False, True], 1
    ).success == [True, True]
    # ps_grpo.py's multi-turn episodes: the one whose solving action was cut does not pass
    from common.envs.tasks import EnvTask

    args = ps_grpo.Args(eval_samples=2)
    out = ps_grpo.evaluate_episodes(
        ps_grpo.AgentEnv(args, tok, print),
        _Answers(tok, "3+4=7"),
        [EnvTask({"nums": list(problem.nums), "target": problem.target})],
        args,
        one,
        ps_grpo.turn_config(tok, args, 1.0),
    )
    assert out["eval_pass@1"] == 0.5


def test_each_method_reads_rewards_of_any_sign_and_leaves_unscored_ones_out():
    # the methods' reward-reading helpers on a [-1, 0] reward with a completion no function scored (NaN)
    import random
    from collections import deque

    import torch

    from ada_est import est_advantages
    from ada_seq import downsample, global_advantages
    from common.rl.advantages import grpo_advantages, zero_variance
    from ra_rloo import rloo_advantages, splice_replays

    nan = float("nan")
    # RLOO: the NaN is out of the others' baselines; alone in its group a scored completion gets 0
    adv = rloo_advantages(torch.tensor([[-1.0, nan, 0.0, -0.5], [nan, nan, -1.0, nan]]))
    assert (
        adv[0].tolist() == pytest.approx([-0.75, 0.0, 0.75, 0.0]) and adv[1].tolist() == [0.0] * 4
    )
    # GRPO: mean and std over the scored ones
    adv = grpo_advantages(torch.tensor([[-1.0, nan, 0.0]]))
    assert adv.tolist()[0] == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)
    assert zero_variance(torch.tensor([[-1.0, nan, -1.0], [0.0, nan, -1.0]])).tolist() == [
        True,
        False,
    ]
    # RA-RLOO: a spliced success carries the reward it was stored with (here -0.2 under a reward in [-1, 0])
    rewards, comps = torch.tensor([[-1.0, -1.0]]), [[1], [2]]
    buffers = {7: deque([([5, 6], -2.0, -0.2)])}
    splice_replays(
        [7],
        comps,
        rewards,
        torch.tensor([[False, False]]),
        buffers,
        "on_demand",
        random.Random(0),
    )
    assert comps[1] == [5, 6] and rewards.tolist() == [[-1.0, pytest.approx(-0.2)]]
    # Ada-Seq: the pool's statistics leave the NaN out, it is kept only to fill up, with advantage 0
    pool = [-1.0, nan, 0.0, -0.25]
    assert global_advantages([-1.0, nan], pool, -0.5, False, "inv_sqrt_p") == pytest.approx(
        [(-1.0 + 1.25 / 3) / math.sqrt(2 / 3), 0.0]
    )
    assert downsample(pool, 3, -0.5, random.Random(0)) == [0, 2, 3]
    # Ada-Est: the hybrid weight reads the pass rate (rewards > threshold), finite for negative rewards
    adv, alpha = est_advantages([-1.0, -0.9, nan, -0.1], "hybrid", 0.01, threshold=-0.5)
    assert alpha == pytest.approx(1 / math.sqrt(1 / 3 + 0.01)) and adv[2] == 0.0
    assert est_advantages([-1.0, -1.0], "hybrid", 0.01, threshold=-0.5)[1] == pytest.approx(10.0)


def test_reward_metrics_carry_trl_names_and_the_sample_std():
    from common.tasks.scoring import Scored

    values = {"a": [1.0, None, 0.0, 0.5], "b": [None, 2.0, None, None], "c": [None] * 4}
    out = Scored([1.0, 2.0, 0.0, 0.5], values, 0.1).metrics(SimpleNamespace(num_processes=1))
    assert out["rewards/a/mean"] == pytest.approx(0.5)
    assert out["rewards/a/std"] == pytest.approx(statistics.stdev([1.0, 0.0, 0.5]))  # Bessel's
    # one value has no sample std; no value, no mean (TRL logs NaN for both)
    assert out["rewards/b/mean"] == 2.0 and out["rewards/b/std"] is None
    assert out["rewards/c/mean"] is None and out["rewards/c/std"] is None
    assert not [key for key in out if key.startswith("reward/")]
