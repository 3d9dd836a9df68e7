"""Your environment (`ps_grpo.py --environment`): the text protocol's edge cases and TRL's
environment_factory convention with a scripted generator, prefix replay (restore and re-execution,
a nondeterministic environment dropped), faults in one line, and one short run end to end."""

import json
import random

import pytest
from conftest import run_main

from common.demo.tiny_model import build_char_tokenizer
from common.envs.protocol import Environment, load_class
from common.envs.rollout import EnvRunner, Prefix, Renderer
from common.generation.hf import Generations, SamplingConfig

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id


def ENC(text):
    return TOK(text, add_special_tokens=False).input_ids


NL = ENC("\n")[0]


class Walk:
    """Deterministic: walk from 0 to `goal` (seed % 3 + 2) one step a turn; `+` moves, `-` ends."""

    def reset(self, seed):
        self.pos, self.goal = 0, seed % 3 + 2
        return f"at 0 goal {self.goal}\n"

    def step(self, action):
        if action != "+":
            return "stop\n", 0.0, True
        self.pos += 1
        done = self.pos == self.goal
        return f"at {self.pos}\n", float(done), done


class SnapshotWalk(Walk):
    restored = 0

    def snapshot(self):
        return {"pos": self.pos, "goal": self.goal}

    def restore(self, state):
        SnapshotWalk.restored += 1
        self.pos, self.goal = state["pos"], state["goal"]


class NoisyWalk(Walk):
    def step(self, action):
        observation, reward, done = super().step(action)
        return f"{random.randint(0, 9)}{observation}", reward, done


class Broken(Walk):
    def step(self, action):
        if self.goal > 2:
            raise KeyError(f"no square {self.goal}")  # the line the fault names
        return super().step(action)


class WrongShape(Walk):
    def step(self, action):
        return "at 1\n", 1.0  # no `done`


class Scripted:
    """Answers every context with the next of `turns` (token ids), each ended by `ends`."""

    end_ids = [EOS]

    def __init__(self, turns, finish="stop"):
        self.turns, self.finish, self.calls = turns, finish, []

    def generate(self, prompts, n, cfg):
        self.calls.append(len(prompts))
        outs = [list(self.turns(p)) for p in prompts for _ in range(n)]
        reason = ["length" if len(o) >= cfg.max_new_tokens else self.finish for o in outs]
        return Generations(prompts, outs, [[-0.5] * len(o) for o in outs], reason, n)


CFG = SamplingConfig(max_new_tokens=4, stop_token_ids=[NL])


def runner(cls, max_turns=6, chat=False, tokenizer=TOK, lines=None):
    lines = [] if lines is None else lines
    return EnvRunner(Environment(cls), Renderer(tokenizer, chat), max_turns, lines.append)


def test_text_protocol_turns_masks_rewards_and_the_turn_cap():
    lines = []
    play = runner(Walk, max_turns=3, lines=lines).play
    gen = Scripted(lambda p: ENC("+\n"))
    out = play(gen, [{"seed": 0}, {"seed": 1}, {"seed": 2}], [Prefix()] * 3, 2, CFG)
    assert out.kept == [0, 1, 2] and out.errors == 0 and not lines
    # goals 2, 3, 4: the third is cut by --max_turns 3 (reward of its last step, 0)
    assert [e.reward for e in out.episodes] == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    assert [len(e.steps) for e in out.episodes] == [2, 2, 3, 3, 3, 3]
    assert gen.calls == [6, 6, 4]  # one call per turn over the live episodes
    episode = out.episodes[0]
    assert episode.prompt == ENC("at 0 goal 2\n")
    assert episode.ids == ENC("+\nat 1\n+\nat 2\n")
    # policy tokens mask 1 with their log-probs, observations mask 0
    assert episode.mask == [1, 1] + [0] * 5 + [1, 1] + [0] * 5
    assert episode.old_logp[:2] == [-0.5, -0.5] and episode.old_logp[2:7] == [0.0] * 5


def test_an_action_ends_at_eos_or_the_token_cap_and_reaches_step_without_it():
    seen = []

    class Echo(Walk):
        def step(self, action, final=False):
            seen.append((action, final))
            return "ok\n", 0.0, len(seen) >= 2

    gen = Scripted(lambda p: ENC("+") + [EOS] if len(seen) == 0 else ENC("++++"))
    out = runner(Echo).play(gen, [{"seed": 0}], [Prefix()], 1, CFG)
    # the EOS is stripped from the text and reported as `final`; a cut action is not final
    assert seen == [("+", True), ("++++", False)] and out.truncated == [True]


def test_prefix_replay_reexecutes_or_restores_the_same_tokens():
    gen = Scripted(lambda p: ENC("+\n"))
    for cls in (Walk, SnapshotWalk):
        play = runner(cls).play
        fresh = play(gen, [{"seed": 2}], [Prefix()], 1, CFG).episodes[0]
        assert len(fresh.steps) == 4
        k = 2
        snapshot = fresh.snapshots[k - 1] if fresh.snapshots else None
        prefix = Prefix(fresh.steps[:k], fresh.prompt, snapshot)
        before = SnapshotWalk.restored
        out = play(gen, [{"seed": 2}], [prefix], 3, CFG)
        assert out.kept == [0] and out.replayed == 1 and out.mismatched == 0
        for episode in out.episodes:
            # the same conversation token for token; the replayed turns have mask 0
            assert episode.prompt == fresh.prompt and episode.ids == fresh.ids
            cut = sum(len(a) + len(o) for a, o in fresh.steps[:k])
            assert episode.mask[:cut] == [0] * cut and episode.mask[cut:] == fresh.mask[cut:]
            assert episode.reward == 1.0 and episode.replayed_steps == k
        assert SnapshotWalk.restored - before == (3 if cls is SnapshotWalk else 0)


def test_a_nondeterministic_environment_drops_its_prefix_tasks_said_once():
    random.seed(0)
    lines = []
    play = runner(NoisyWalk, lines=lines).play
    gen = Scripted(lambda p: ENC("+\n"))
    fresh = play(gen, [{"seed": 2}], [Prefix()], 1, CFG).episodes[0]
    prefix = Prefix(fresh.steps[:2], fresh.prompt)
    for _ in range(3):
        out = play(gen, [{"seed": 1}, {"seed": 2}], [Prefix(), prefix], 2, CFG)
        # odds of a digit repeated twice in a row, 1 / 100 each replay: drawn under seed 0
        assert out.kept == [0] and out.replayed == 1 and out.mismatched == 1
        assert [e.group for e in out.episodes] == [0, 0]
    assert len(lines) == 1 and "ps_replay_mismatch_frac" in lines[0]


def test_a_step_that_raises_ends_its_episode_with_one_line_naming_the_file(capsys):
    lines = []
    play = runner(Broken, lines=lines).play
    gen = Scripted(lambda p: ENC("+\n"))
    for _ in range(2):
        out = play(gen, [{"seed": 0}, {"seed": 1}, {"seed": 2}], [Prefix()] * 3, 1, CFG)
        assert out.errors == 2 and [e.reward for e in out.episodes] == [1.0, 0.0, 0.0]
    # two messages from one place: said once
    assert len(lines) == 1, lines
    assert "Broken.step raised KeyError: 'no square 3'" in lines[0]
    assert f"{__file__}:{Broken.step.__code__.co_firstlineno + 2}" in lines[0]
    assert "Traceback" not in capsys.readouterr().err
    # every episode raising stops the run with one line
    with pytest.raises(SystemExit, match="failed in every episode.*KeyError"):
        play(gen, [{"seed": 1}], [Prefix()], 2, CFG)


def test_a_wrong_return_type_stops_with_one_line_naming_the_class():
    gen = Scripted(lambda p: ENC("+\n"))
    with pytest.raises(SystemExit, match=r"WrongShape\.step returned \('at 1\\n', 1\.0\)"):
        runner(WrongShape).play(gen, [{"seed": 0}], [Prefix()], 1, CFG)

    class NoText(Walk):
        def reset(self, seed):
            return 7

    with pytest.raises(SystemExit, match=r"NoText\.reset returned 7 \(int\); expected a str"):
        runner(NoText).play(gen, [{"seed": 0}], [Prefix()], 1, CFG)
    with pytest.raises(SystemExit, match="no class Nope"):
        load_class(f"{__file__}:Nope")
    assert load_class("examples/merge_game.py:MergeGame").__name__ == "MergeGame"


# ---------------- TRL's environment_factory convention ----------------
TEMPLATE = (
    "{%- if tools %}T:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' %}U:{{ m.content }}</s>"
    "{%- elif m.role == 'assistant' %}A:{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}</s>"
    "{%- elif m.role == 'tool' %}R:{{ m.content }}</s>{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt %}A:{% endif -%}"
)


def chat_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *chars])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = TEMPLATE
    return tokenizer


class Counter:
    """TRL's convention: reset, tools, get_reward."""

    def reset(self, **row):
        self.total = 0
        return f" count to {row['goal']}"

    def add(self, n: int) -> str:
        """Add to the count.

        Args:
            n: how much to add
        """
        if n < 0:
            raise ValueError("only up")
        self.total += n
        return f"total {self.total}"

    def get_reward(self) -> float:
        return 1.0 if self.total == 3 else 0.0


def test_a_trl_environment_factory_class_calls_its_tools_through_the_chat_template():
    tok = chat_tokenizer()
    calls = [
        '<tool_call>{"name": "add", "arguments": {"n": 2}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"n": -1}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"n": 1}}</tool_call>',
        "done",
    ]

    def turn(prompt):
        made = tok.decode(prompt).count("<tool_call>")
        return tok(calls[made], add_special_tokens=False).input_ids + [tok.eos_token_id]

    gen = Scripted(turn)
    gen.end_ids = [tok.eos_token_id]
    env = Environment(Counter)
    assert not env.text and env.tool_names == ["add"] and env.has_reward
    play = EnvRunner(env, Renderer(tok, True), 6, print).play
    row = {"prompt": [{"role": "user", "content": "Go:"}], "goal": 3}
    out = play(gen, [row], [Prefix()], 2, SamplingConfig(max_new_tokens=80))
    episode = out.episodes[0]
    # the tools in the prompt, the reset text appended to the last user message
    assert tok.decode(episode.prompt) == "T:add;U:Go: count to 3</s>A:"
    text = tok.decode(episode.ids)
    # a tool that raises answers {"error": ...} as TRL's does; the episode goes on
    assert "R:total 2</s>A:" in text and "R:{'error': 'only up'}</s>A:" in text
    assert "R:total 3</s>A:done</s>" in text and text.endswith("done</s>")
    assert len(episode.steps) == 4 and episode.reward == 1.0 and out.errors == 0
    # the tool results have mask 0, every generated token mask 1
    first_action = len(episode.steps[0][0])
    assert episode.mask[:first_action] == [1] * first_action
    assert episode.mask[first_action : first_action + len(episode.steps[0][1])] == [0] * len(
        episode.steps[0][1]
    )
    # a prefix replayed by executing its tool calls again gives the same tokens
    prefix = Prefix(episode.steps[:2], episode.prompt)
    again = play(gen, [row], [prefix], 1, SamplingConfig(max_new_tokens=80))
    assert again.kept == [0] and again.episodes[0].ids == episode.ids


def test_text_protocol_observations_go_through_the_chat_template_as_user_messages():
    tok = chat_tokenizer()
    gen = Scripted(lambda p: tok("+", add_special_tokens=False).input_ids + [tok.eos_token_id])
    out = runner(Walk, tokenizer=tok, chat=True).play(
        gen, [{"seed": 0}], [Prefix()], 1, SamplingConfig(max_new_tokens=4)
    )
    episode = out.episodes[0]
    assert tok.decode(episode.prompt) == "U:at 0 goal 2\n</s>A:"
    assert tok.decode(episode.ids) == "+</s>U:at 1\n</s>A:+</s>U:at 2\n</s>A:"
    # the end-of-turn token was generated (mask 1); the template's user turn is context
    action, observation = episode.steps[0]
    assert episode.mask[: len(action) + len(observation)] == [1, 1] + [0] * len(observation)
    assert episode.reward == 1.0


# ---------------- end to end, on the embedded model ----------------
def test_ps_grpo_on_a_user_environment_end_to_end(tiny_base, tmp_path):
    out = tmp_path / "run"
    run_main(
        [
            "ps_grpo.py",
            "--environment",
            "examples/merge_game.py:MergeGame",
            "--max_steps",
            "3",
            "--prompts_per_step",
            "8",
            "--num_generations",
            "4",
            "--eval_prompts",
            "4",
            "--eval_samples",
            "2",
            "--eval_train_prompts",
            "0",
            "--num_threads",
            "1",
            "--output_dir",
            str(out),
        ]
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if row.get("step", 0) > 0 and "loss" in row]
    assert len(steps) == 3
    assert all(row["ps_replay_mismatch_frac"] == 0.0 and row["env_errors"] == 0 for row in steps)
    assert all("rewards/MergeGame/mean" in row for row in steps)


def test_flags_and_a_sweep_task_file_that_names_an_environment(tmp_path):
    from benchmarks.sweep.configs import task_configs
    from benchmarks.sweep.run import Args as SweepArgs
    from benchmarks.sweep.task import check_task, load_task, runner_types
    from common.run.flags import parse_args
    from ps_grpo import Args

    with pytest.raises(SystemExit, match="--environment g.py:G: not with --mode text"):
        parse_args(Args, ["--environment", "g.py:G", "--mode", "text"])
    assert parse_args(Args, ["--environment", "g.py:G"]).multiturn
    (tmp_path / "game.py").write_text(
        "class Game:\n    def reset(self, seed):\n        return 'hi'\n"
        "    def step(self, action):\n        return '', 1.0, True\n"
        "class Bad(Game):\n    def reset(self, seed):\n        raise OSError('no board')\n"
    )
    lines = []
    (tmp_path / "t.yaml").write_text("max_steps: 2\nenvironment: game.py:Game\n")
    task = load_task(str(tmp_path / "t.yaml"), runner_types(SweepArgs))
    assert task.script_flags[-2:] == ["--environment", str(tmp_path / "game.py") + ":Game"]
    check_task(task, "embedded", lines.append)
    assert lines == [f"  checked: environment {task.environment} builds and resets"]
    # Prefix Sampling's multi-turn configs only, as they are
    assert set(task_configs(True)) == {"ps_off", "ps_fixed", "ps_adaptive", "ps_adaptive_reset"}
    assert all("multiturn" in c.flags for c in task_configs(True).values())
    (tmp_path / "b.yaml").write_text("max_steps: 2\nenvironment: game.py:Bad\n")
    bad = load_task(str(tmp_path / "b.yaml"), runner_types(SweepArgs))
    with pytest.raises(SystemExit, match=r"Bad\.reset raised OSError: no board \(at .*game\.py:8"):
        check_task(bad, "embedded", lines.append)


# ---------------- start-up: the class, its convention, its tasks' split, before the model --------
MERGE = "examples/merge_game.py:MergeGame"


def _opened(flags: list[str]):
    """(environment, train, held out, the lines said) of `open_environment` for ps_grpo's flags."""
    from common.envs.startup import open_environment
    from common.run.flags import parse_args
    from ps_grpo import Args

    lines = []
    env, train, held_out = open_environment(parse_args(Args, flags), lines.append)
    return env, train, held_out, lines


def test_a_one_file_dataset_holds_out_its_last_rows_never_trained_on_and_says_so(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"seed": i}) + "\n" for i in range(40)))
    flags = ["--environment", MERGE, "--dataset_name", str(rows), "--eval_prompts", "4"]
    _, train, held_out, lines = _opened(flags)
    # the text path's rule: the last min(--eval_prompts, rows / 5) rows, out of training
    assert [task.row["seed"] for task in train] == list(range(36))
    assert [task.row["seed"] for task in held_out] == [36, 37, 38, 39]
    assert lines[0].startswith("environment MergeGame (") and "the text protocol" in lines[0]
    assert lines[1] == (
        f"36 training tasks from {rows}, reset(**row) on each row; 4 held-out tasks from the last "
        f"4 rows of {rows} (at most --eval_prompts, at most a fifth of the rows)"
    )
    # --prompt_pool takes the first training rows; --eval_dataset gives the held-out rows
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"seed": 100 + i}) + "\n" for i in range(3)))
    flags += ["--prompt_pool", "8", "--eval_dataset", str(held)]
    _, train, held_out, lines = _opened(flags)
    assert [task.row["seed"] for task in train] == list(range(8))
    assert [task.row["seed"] for task in held_out] == [100, 101, 102]
    assert lines[1].endswith(f"; 3 held-out tasks from {held}")


def test_seed_tasks_hold_out_the_seeds_after_the_pool_and_say_so():
    from common.envs.tasks import SEED_POOL

    for pool, n_eval in ((0, 4), (8, 16), (SEED_POOL, 1)):
        flags = ["--environment", MERGE, "--prompt_pool", str(pool), "--eval_prompts", str(n_eval)]
        _, train, held_out, lines = _opened(flags)
        seeds = [task.row["seed"] for task in train]
        held = [task.row["seed"] for task in held_out]
        size = pool or SEED_POOL
        assert seeds == list(range(size)) and held == list(range(size, size + n_eval))
        assert not set(seeds) & set(held)
        assert lines[1].startswith(f"{size} training tasks from reset(seed=i), seeds 0-{size - 1}")
        assert f"; {n_eval} held-out tasks from the seeds after them, {size}-" in lines[1]


def test_the_class_and_reset_are_checked_before_the_model_loads_in_one_line(tmp_path):
    # a misspelt class: the nearest names of the file, and the model (a folder that does not
    # exist) never reached
    flags = ["--model_name_or_path", str(tmp_path / "no-model"), "--num_threads", "1"]
    with pytest.raises(SystemExit) as stop:
        run_main(["ps_grpo.py", "--environment", MERGE[:-1], *flags, "--output_dir", str(tmp_path)])
    assert str(stop.value) == (
        f"--environment {MERGE[:-1]}: examples/merge_game.py has no class MergeGam; the nearest "
        "are MergeGame, NoisyMergeGame"
    )
    with pytest.raises(SystemExit, match=r"file nope\.py not found$"):
        run_main(
            ["ps_grpo.py", "--environment", "nope.py:Game", *flags, "--output_dir", str(tmp_path)]
        )
    # reset's keywords against a seed and a dataset row
    (tmp_path / "game.py").write_text(
        "class Board:\n    def reset(self, board):\n        return board\n"
        "    def step(self, action):\n        return '', 1.0, True\n"
    )
    spec = f"{tmp_path / 'game.py'}:Board"
    with pytest.raises(SystemExit) as stop:
        run_main(["ps_grpo.py", "--environment", spec, *flags, "--output_dir", str(tmp_path)])
    assert str(stop.value) == (
        f"--environment {spec}: Board.reset(board) cannot take the first training task's keywords "
        "(seed): missing a required argument: 'board'"
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"board": "x", "size": 3}) + "\n" for _ in range(10)))
    with pytest.raises(SystemExit, match=r"Board\.reset\(board\) cannot take .*\(board, size\)"):
        _opened(["--environment", spec, "--dataset_name", str(rows)])


def test_the_start_up_line_names_trl_s_convention_and_its_tools(tmp_path):
    (tmp_path / "counter.py").write_text(
        "class Counter:\n    def reset(self, **row):\n        return None\n"
        "    def add(self, n: int) -> str:\n        return str(n)\n"
    )
    spec = f"{tmp_path / 'counter.py'}:Counter"
    _, _, _, lines = _opened(["--environment", spec])
    assert lines[0] == (
        f"environment Counter ({tmp_path / 'counter.py'}): TRL's environment_factory convention "
        "(no step); tools, through the chat template: add; reward: none of its own (no "
        "get_reward(): 0)"
    )


def test_a_line_the_run_prints_starts_on_its_own_line_after_the_progress_bar(capsys):
    from types import SimpleNamespace

    from common.run.logs import BarLine
    from common.run.setup import main_process_log

    bar = BarLine.install()
    try:
        bar.write("\rps_grpo:  50%|#####     | 1/2")  # the bar leaves its line open
        main_process_log(SimpleNamespace(is_main_process=True))("stopped at step 1")
    finally:
        BarLine.uninstall()
        BarLine.open = False
    captured = capsys.readouterr()
    assert (
        captured.err == "\rps_grpo:  50%|#####     | 1/2\n"
        and captured.out == "stopped at step 1\n"
    )


def test_the_reward_funcs_help_says_they_work_with_an_environment():
    from common.run.flag_help import field_docs
    from ps_grpo import Args

    help_text = " ".join(field_docs(Args)["reward_funcs"].split())
    assert "not the multi-turn mode" not in help_text and "with --environment" in help_text
