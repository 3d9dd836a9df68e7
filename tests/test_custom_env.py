"""Your environment (`ps_grpo.py --environment`): the text protocol's edge cases and TRL's
environment_factory convention with a scripted generator, prefix replay (restore and re-execution,
a nondeterministic environment dropped), faults in one line, and one short run end to end."""

import copy
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
        assert [e.env_error for e in out.episodes] == [False, True, True]
    # two messages from one place: said once
    assert len(lines) == 1, lines
    assert "Broken.step raised KeyError: 'no square 3'" in lines[0]
    assert f"{__file__}:{Broken.step.__code__.co_firstlineno + 2}" in lines[0]
    assert "Traceback" not in capsys.readouterr().err

    # every episode of a training batch raising stops the run with one sentence quoting that
    # batch's fault (not an earlier batch's), without the per-episode notes of the fault line
    class Fragile(Broken):
        def reset(self, seed):
            if seed == 5:
                raise ValueError("no board 5")
            return super().reset(seed)

    play = runner(Fragile, lines=lines).play
    play(gen, [{"seed": 0}, {"seed": 1}], [Prefix()] * 2, 1, CFG)  # a step fault, then:
    with pytest.raises(SystemExit) as stop:
        play(gen, [{"seed": 5}], [Prefix()], 2, CFG)
    place = f"{__file__}:{Fragile.reset.__code__.co_firstlineno + 2}"
    assert str(stop.value) == (
        "environment Fragile failed in all 2 episodes of a training batch, so the run stops; the "
        f"batch's first fault: Fragile.reset raised ValueError: no board 5 (at {place})"
    )


class HeldOutFails(Walk):
    """Its held-out tasks (seeds 100 and up) cannot start."""

    def reset(self, seed):
        if seed >= 100:
            raise KeyError(f"no level {seed}")
        return super().reset(seed)


def test_a_held_out_evaluation_whose_every_episode_failed_is_nan_said_once_and_the_run_goes_on(
    capsys,
):
    from types import SimpleNamespace

    from common.envs.tasks import EnvTask
    from common.run.flags import parse_args
    from ps_grpo import AgentEnv, Args, evaluate_episodes, turn_config

    args = parse_args(Args, ["--environment", f"{__file__}:HeldOutFails", "--eval_samples", "2"])
    opened = (Environment(HeldOutFails), [EnvTask({"seed": 0})], [EnvTask({"seed": 100})])
    env = AgentEnv(args, TOK, print, opened)
    gen, one = Scripted(lambda p: ENC("+\n")), SimpleNamespace(process_index=0, num_processes=1)
    cfg = turn_config(TOK, args, 0.0)
    # a training batch's fault first: the evaluation's line quotes its own
    env.runner.play(gen, [{"seed": 0}], [Prefix()], 1, CFG)
    out = evaluate_episodes(env, gen, env.held_out, args, one, cfg)
    assert out and all(value != value for value in out.values())  # NaN, not a pass rate of 0
    err = capsys.readouterr().err
    assert (
        "the held-out evaluation (eval_*): environment HeldOutFails failed in all 2 episodes, so "
        "it is recorded as NaN this time and the run goes on; its first fault: "
        "HeldOutFails.reset raised KeyError: 'no level 100'"
    ) in err
    # the tasks that do start are evaluated as before
    assert evaluate_episodes(env, gen, env.train, args, one, cfg)["eval_pass@1"] == 1.0


def test_too_few_rows_for_a_held_out_task_say_there_is_no_evaluation_and_skip_it(tmp_path):
    import warnings
    from types import SimpleNamespace

    from common.run.flags import parse_args
    from ps_grpo import AgentEnv, Args

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"seed": i}) + "\n" for i in range(4)))
    flags = ["--environment", MERGE, "--dataset_name", str(rows), "--eval_train_prompts", "0"]
    opened = _opened(flags)
    assert opened[2] == [] and opened[3][1] == (
        f"4 training tasks from {rows}, reset(**row) on each row; no held-out evaluation: a "
        f"one-split source holds out at most a fifth of its rows, and the 4 rows of {rows} give "
        "none (give it 5 rows or more, or held-out rows with --eval_dataset)"
    )
    env = AgentEnv(parse_args(Args, flags), TOK, print, opened[:3])
    one = SimpleNamespace(process_index=0, num_processes=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Mean of empty slice"
        assert env.evaluate(Scripted(lambda p: ENC("+\n")), one) == {}


def test_a_samples_row_of_a_failed_episode_names_its_task():
    import torch

    from common.tasks.scoring import Scored
    from ps_grpo import Args, BatchTask, sample_rows

    out = runner(HeldOutFails).play(
        Scripted(lambda p: ENC("+\n")), [{"seed": 0}, {"seed": 100}], [Prefix()] * 2, 1, CFG
    )
    tasks = [BatchTask(0), BatchTask(100)]
    scored = Scored([1.0, 0.0], {}, 0.0, [True, False])
    rows = sample_rows(
        tasks, out.episodes, torch.zeros(2), [True, True], out.truncated, scored, 1, TOK, Args()
    )
    assert rows[1]["env_error"] is True and rows[1]["prompt"] == "" and rows[1]["prompt_id"] == 100
    assert "env_error" not in rows[0]


class Hoard:
    """Keeps the row's list as its own and appends to it, as a user's class may."""

    def reset(self, seed, items):
        self.items = items
        self.items.append(seed)
        return f"have {len(self.items)}\n"

    def step(self, action):
        self.items.append(0)
        return f"have {len(self.items)}\n", 0.0, len(self.items) > 3


def test_each_episode_gets_its_own_copy_of_the_rows_values():
    row = {"seed": 7, "items": [1, [2]]}
    play = runner(Hoard).play
    out = play(Scripted(lambda p: ENC("+\n")), [row], [Prefix()], 3, CFG)
    # every episode starts from the row as the dataset gave it; the row (what later steps, the
    # evaluation and the reward functions' columns read) is unchanged
    assert [e.prompt for e in out.episodes] == [ENC("have 3\n")] * 3
    assert row == {"seed": 7, "items": [1, [2]]}
    again = play(Scripted(lambda p: ENC("+\n")), [row], [Prefix()], 1, CFG)
    assert again.episodes[0].prompt == ENC("have 3\n") and row["items"] == [1, [2]]


class Trail(Walk):
    """Its state is a list it keeps appending to; snapshot() returns that live list (no copy) and
    restore(state) keeps the object it is given: the two mistakes a copy on each side absorbs."""

    restored: list = []

    def reset(self, seed):
        self.trail = []
        return super().reset(seed)

    def step(self, action):
        self.trail.append(action)
        observation, reward, done = super().step(action)
        return f"{len(self.trail)} {observation}", reward, done

    def snapshot(self):
        return {"trail": self.trail, "pos": self.pos, "goal": self.goal}

    def restore(self, state):
        Trail.restored.append(len(state["trail"]))
        self.trail, self.pos, self.goal = state["trail"], state["pos"], state["goal"]


class LiveDict(Walk):
    """snapshot() returns the instance's own __dict__, which every later step changes."""

    def snapshot(self):
        return self.__dict__

    def restore(self, state):
        self.__dict__.update(state)


def test_a_snapshot_is_the_state_after_its_turn_and_each_restore_gets_a_copy():
    gen = Scripted(lambda p: ENC("+\n"))
    for cls in (Trail, LiveDict):
        play = runner(cls).play
        fresh = play(gen, [{"seed": 2}], [Prefix()], 1, CFG).episodes[0]
        # goal 4: a snapshot after each of the first three turns (none after the last), each the
        # state of its own turn although the environment went on changing what it returned
        assert [state["pos"] for state in fresh.snapshots] == [1, 2, 3]
        k = 2
        stored = fresh.snapshots[k - 1]
        kept = copy.deepcopy(stored)
        Trail.restored.clear()
        out = play(gen, [{"seed": 2}], [Prefix(fresh.steps[:k], fresh.prompt, stored)], 3, CFG)
        assert out.kept == [0] and out.errors == 0
        # every episode starts from turn K's state: the same conversation as the fresh one
        assert all(episode.ids == fresh.ids for episode in out.episodes)
        if cls is Trail:
            assert Trail.restored == [k, k, k]
        # no episode changed the stored snapshot (restore got a copy)
        assert stored == kept


def test_a_snapshot_that_cannot_be_copied_is_the_environments_fault_in_one_line():
    import threading

    class Locked(Walk):
        def snapshot(self):
            return {"pos": self.pos, "lock": threading.Lock()}

        def restore(self, state):
            self.pos = state["pos"]

    gen = Scripted(lambda p: ENC("+\n"))
    with pytest.raises(SystemExit, match=r"Locked\.snapshot: copy\.deepcopy cannot copy the state"):
        runner(Locked).play(gen, [{"seed": 2}], [Prefix()], 2, CFG)


class Drifting(Walk):
    """Walk whose first observation gets `banner` and whose episode ends at `end_at` (class
    switches a test turns between the stored trajectory and its replay)."""

    banner, end_at = "", None

    def reset(self, seed):
        return Drifting.banner + super().reset(seed)

    def step(self, action):
        observation, reward, done = super().step(action)
        return observation, reward, done or self.pos == Drifting.end_at


@pytest.fixture
def drifting():
    yield Drifting
    Drifting.banner, Drifting.end_at = "", None


@pytest.mark.parametrize("change", ["first observation", "done inside the prefix"])
def test_a_replay_that_diverges_drops_its_task_and_counts_in_the_mismatch(drifting, change):
    from types import SimpleNamespace

    from common.envs.tasks import EnvTask
    from ps_grpo import AgentEnv, BatchTask, env_rollouts

    gen = Scripted(lambda p: ENC("+\n"))
    env = SimpleNamespace(
        train=[EnvTask({"seed": 1}), EnvTask({"seed": 2})], runner=runner(Drifting)
    )
    fresh = env.runner.play(gen, [{"seed": 2}], [Prefix()], 1, CFG).episodes[0]
    assert len(fresh.steps) == 4
    prefix_task = BatchTask(1, "easy", fresh.steps[:2], 4, 0.5, fresh.prompt)
    tasks = [prefix_task, BatchTask(0)]
    # the stored trajectory replays as it was
    episodes, _, kept = env_rollouts(env, gen, tasks, 2, CFG)
    assert kept == tasks and len(episodes) == 4 and env.counts["replay_mismatch"] == 0
    if change == "first observation":
        # the same steps' observations, another first observation
        drifting.banner = "!"
    else:
        # the same observations, but the environment ends the episode at turn 1 of the prefix
        drifting.end_at = 1
    episodes, _, kept = env_rollouts(env, gen, tasks, 2, CFG)
    # the diverged prefix task is dropped: only the fresh task's episodes come back, counted
    assert kept == [tasks[1]] and [e.group for e in episodes] == [0, 0]
    replay_counts = {
        key: env.counts[key] for key in ("env_errors", "replay_tasks", "replay_mismatch")
    }
    assert replay_counts == {"env_errors": 0, "replay_tasks": 1, "replay_mismatch": 1}
    totals = {"env_errors": 0, "replay_tasks": 2, "replay_mismatch": 1, "actions": 6}
    totals["actions_cut"] = 0
    owner = SimpleNamespace(name="Drifting", env=SimpleNamespace(text=True))
    metrics = AgentEnv.metrics(owner, totals)
    assert metrics["ps_replay_mismatch_frac"] == 0.5


def test_a_prefix_task_carries_the_snapshot_of_its_turn_k_and_never_a_failed_episode():
    from types import SimpleNamespace

    from ps_grpo import BatchTask, make_prefix_task

    gen = Scripted(lambda p: ENC("+\n"))
    play = runner(Trail).play
    fresh = play(gen, [{"seed": 2}], [Prefix()], 1, CFG).episodes[0]
    caps = SimpleNamespace(prefix_cap=8, remaining_cap=8)
    for category, ratio, k in (("easy", 0.5, 2), ("easy", 0.25, 1), ("hard", 0.25, 3)):
        task = make_prefix_task(BatchTask(0), category, [fresh], [category == "hard"], ratio, caps)
        assert len(task.steps) == k and task.snapshot["pos"] == k
        # restored from it, the replay goes on as the stored trajectory did
        replay = play(gen, [{"seed": 2}], [Prefix(task.steps, task.prompt, task.snapshot)], 1, CFG)
        assert replay.mismatched == 0 and replay.episodes[0].ids == fresh.ids
    # an episode the environment failed is no failure to replay
    fresh.env_error = True
    assert make_prefix_task(BatchTask(0), "easy", [fresh], [False], 0.5, caps) is None


def test_a_wrong_return_type_stops_with_one_line_naming_the_class():
    gen = Scripted(lambda p: ENC("+\n"))
    with pytest.raises(SystemExit, match=r"WrongShape\.step returned \('at 1\\n', 1\.0\)"):
        runner(WrongShape).play(gen, [{"seed": 0}], [Prefix()], 1, CFG)

    class NoText(Walk):
        def reset(self, seed):
            return 7

    with pytest.raises(SystemExit, match=r"NoText\.reset returned 7 \(int\); expected a str"):
        runner(NoText).play(gen, [{"seed": 0}], [Prefix()], 1, CFG)

    class NoPrompt(Walk):  # None is a first observation in TRL's convention only
        def reset(self, seed):
            return None

    with pytest.raises(
        SystemExit, match=r"NoPrompt\.reset returned None \(NoneType\); expected a str$"
    ):
        runner(NoPrompt).play(gen, [{"seed": 0}], [Prefix()], 1, CFG)
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


# ---------------- TRL's convention: what TRL's trainer does that a class relies on ----------------
def trl_play(cls, turns, n=1, tok=None, row=None, max_new_tokens=80, prefix=None):
    """`cls` played by a scripted model writing `turns[k]` (text, then EOS) as its k-th turn."""
    tok = tok or chat_tokenizer()

    def turn(prompt):
        made = tok.decode(prompt).count("A:") - 1
        return tok(turns[made], add_special_tokens=False).input_ids + [tok.eos_token_id]

    gen = Scripted(turn)
    gen.end_ids = [tok.eos_token_id]
    runner = EnvRunner(Environment(cls), Renderer(tok, True), 6, print)
    row = row or {"prompt": [{"role": "user", "content": "Go:"}], "goal": 3}
    cfg = SamplingConfig(max_new_tokens=max_new_tokens)
    return runner.play(gen, [row], [prefix or Prefix()], n, cfg), tok


def call(name, **arguments):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def test_a_chat_template_that_drops_tools_or_tool_calls_is_refused_in_one_line():
    tok = chat_tokenizer()
    tok.name_or_path = "tiny/chat-model"
    no_tools = TEMPLATE.replace("{%- if tools %}", "{%- if false %}")
    no_calls = TEMPLATE.replace("<tool_call>{{ c.function | tojson }}</tool_call>", "")
    for template, reason in ((no_tools, "ignores `tools`"), (no_calls, "tool calls")):
        tok.chat_template = template
        with pytest.raises(SystemExit, match=f"Counter: .*tiny/chat-model: .*{reason}") as stop:
            EnvRunner(Environment(Counter), Renderer(tok, True), 4)
        assert "\n" not in str(stop.value)
    # a template that drops only the arguments says so
    tok.chat_template = TEMPLATE.replace("c.function | tojson", "c.function.name")
    with pytest.raises(SystemExit) as stop:
        EnvRunner(Environment(Counter), Renderer(tok, True), 4)
    assert str(stop.value).endswith(
        "its chat template drops the tool call's argument names and the tool call's argument values"
    )
    # the text protocol needs no tools
    EnvRunner(Environment(Walk), Renderer(tok, True), 4)


def test_a_tokenizer_that_cannot_encode_a_tool_call_is_refused_naming_the_characters():
    # the embedded char-level tokenizer, given a template that renders tools: it has no { } " _
    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    tok.name_or_path = "char-tokenizer"
    with pytest.raises(SystemExit) as stop:
        EnvRunner(Environment(Counter), Renderer(tok, True), 4)
    line = str(stop.value)
    assert "\n" not in line and line.startswith("environment Counter: ")
    assert 'char-tokenizer: it cannot encode " _ { }' in line
    # a tokenizer that has every character passes
    EnvRunner(Environment(Counter), Renderer(chat_tokenizer(), True), 4)


def test_a_trl_class_is_refused_at_start_up_when_the_tokenizer_cannot_take_tools():
    from common.run.flags import parse_args
    from ps_grpo import AgentEnv, Args

    # ps_grpo.py builds its AgentEnv before the generator and the first step
    flags = ["--environment", f"{__file__}:Counter"]
    chat = chat_tokenizer()
    chat.name_or_path = "tiny/chat-model"
    for tok, more in ((chat, ["--use_chat_template", "no"]), (TOK, [])):
        with pytest.raises(SystemExit, match="^environment Counter: TRL's environment_factory"):
            AgentEnv(parse_args(Args, flags + more), tok, print)
    # which of the two it is: the flag turned the template off, or there is none
    with pytest.raises(SystemExit, match="tiny/chat-model: --use_chat_template no turns its chat"):
        AgentEnv(parse_args(Args, flags + ["--use_chat_template", "no"]), chat, print)
    with pytest.raises(SystemExit, match=r": it has no chat template$"):
        AgentEnv(parse_args(Args, flags), TOK, print)


def test_a_tool_without_a_usable_docstring_is_refused_in_one_line_naming_the_method():
    class NoDoc(Counter):
        def move(self, steps: int) -> str:
            return "moved"

    class NoArgs(Counter):
        def move(self, steps: int) -> str:
            """Move."""

    for cls in (NoDoc, NoArgs):
        with pytest.raises(SystemExit, match=rf"^environment {cls.__name__}: tool method "):
            Environment(cls)
    with pytest.raises(SystemExit, match=r"NoDoc\.move has no usable schema: .*no docstring"):
        Environment(NoDoc)
    # the way out names the method itself
    with pytest.raises(SystemExit, match=r"a method that is not a tool: name it _move\)$"):
        Environment(NoDoc)


def test_async_tools_and_an_async_get_reward_are_awaited():
    class AsyncCounter(Counter):
        async def add(self, n: int) -> str:
            """Add to the count.

            Args:
                n: how much to add
            """
            return Counter.add(self, n)

        async def get_reward(self) -> float:
            return Counter.get_reward(self)

    out, tok = trl_play(AsyncCounter, [call("add", n=2), call("add", n=-1), call("add", n=1), "ok"])
    text = tok.decode(out.episodes[0].ids)
    assert (
        "R:total 2</s>" in text and "R:{'error': 'only up'}</s>" in text and "coroutine" not in text
    )
    assert out.episodes[0].reward == 1.0 and out.errors == 0


def test_tool_calls_counted_as_trl_counts_them_and_logged_as_its_metrics():
    from common.run.flags import parse_args
    from ps_grpo import AgentEnv, Args

    # per episode: 2 calls answered, 1 raising, 1 unknown tool
    turns = [call("add", n=2), call("add", n=-1) + call("nope"), call("add", n=1), "ok"]
    out, tok = trl_play(Counter, turns, n=2, max_new_tokens=200)
    assert (out.tool_calls, out.tool_failures, out.actions, out.actions_cut) == (8, 4, 8, 0)
    args = parse_args(Args, ["--environment", f"{__file__}:Counter"])
    env = AgentEnv(args, tok, print)
    totals = {"env_errors": 0, "replay_tasks": 0, "replay_mismatch": 0, "rollouts": 2}
    totals |= {"actions": 8, "actions_cut": 0, "tool_calls": 8, "tool_failures": 4}
    row = env.metrics(totals)
    assert row["tools/call_frequency"] == 4.0 and row["tools/failure_frequency"] == 0.5
    assert env.metrics(totals | {"tool_calls": 0})["tools/failure_frequency"] == 0.0


def test_the_action_cap_fits_a_tool_call_by_default_and_a_step_of_cut_actions_is_said(capsys):
    from common.run.flags import parse_args
    from common.run.logs import BarLine
    from ps_grpo import ACTION_TOKENS, AgentEnv, Args

    tok = chat_tokenizer()
    args = parse_args(Args, ["--environment", f"{__file__}:Counter"])
    env = AgentEnv(args, tok, print)
    hermes = tok(call("add", n=12), add_special_tokens=False).input_ids  # a character a token
    assert env.sampling.max_new_tokens == ACTION_TOKENS["tools"] > len(hermes) + 1
    text = AgentEnv(parse_args(Args, ["--environment", f"{__file__}:Walk"]), TOK, print)
    assert text.sampling.max_new_tokens == ACTION_TOKENS["text"] == 16
    fixed = parse_args(Args, ["--environment", f"{__file__}:Counter", "--max_action_tokens", "9"])
    assert AgentEnv(fixed, tok, print).sampling.max_new_tokens == 9
    # every action of a step cut: one line on stderr, after the progress bar's open line
    totals = {"env_errors": 0, "replay_tasks": 0, "replay_mismatch": 0, "rollouts": 4}
    totals |= {"actions": 4, "actions_cut": 4, "tool_calls": 0, "tool_failures": 0}
    bar = BarLine.install()
    try:
        bar.write("\rps_grpo: 1/3")
        env.metrics(totals)
        env.metrics(totals)  # once a run
        env.metrics(totals | {"actions_cut": 3})
    finally:
        BarLine.uninstall()
    err = capsys.readouterr().err
    assert err.startswith("\rps_grpo: 1/3\nwarning: every action of this step hit ")
    assert err.count("warning") == 1 and "--max_action_tokens 256" in err and err.endswith("\n")


REWARD_FILE = """
SEEN = []


def seen(prompts, completions, environments, **kwargs):
    SEEN.append((prompts, completions, environments))
    return [environment.total / 3 for environment in environments]
"""


def test_reward_funcs_get_the_environments_and_trl_conversational_completions(tmp_path):
    from common.envs.tasks import conversation_rewards
    from common.tasks.rewards import RewardFuncs

    class SnapCounter(Counter):
        def snapshot(self):
            return self.total

        def restore(self, state):
            self.total = state

    (tmp_path / "r.py").write_text(REWARD_FILE)
    funcs = RewardFuncs(f"{tmp_path / 'r.py'}:seen")
    turns = [call("add", n=2), call("add", n=-1), "<tool_call>{bad</tool_call>no"]
    out, tok = trl_play(SnapCounter, turns)
    episode, row = out.episodes[0], {"goal": 3}
    totals, values = conversation_rewards(funcs, tok, out.episodes, [row], 1)
    prompts, completions, environments = funcs.funcs[0].__globals__["SEEN"][-1]
    assert environments == [episode.env] and totals == [2 / 3]
    assert prompts == [[{"role": "user", "content": "Go: count to 3"}]]

    def asked(n):
        fn = {"name": "add", "arguments": {"n": n}}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": fn}],
        }

    assert completions == [
        [
            asked(2),
            {"role": "tool", "name": "add", "content": "total 2"},
            asked(-1),
            {"role": "tool", "name": "add", "content": "{'error': 'only up'}"},
            {"role": "assistant", "content": "<tool_call>{bad</tool_call>no"},
        ]
    ]
    # a prefix task restored from a snapshot starts from the stored conversation's messages
    prefix = Prefix(episode.steps[:1], episode.prompt, episode.snapshots[0], episode.chat[:2])
    again, _ = trl_play(SnapCounter, turns, prefix=prefix)
    assert again.episodes[0].chat == episode.chat and again.episodes[0].ids == episode.ids


def test_the_model_calls_only_tools_with_a_name_and_json_arguments_never_reset_or_get_reward():
    env, tok = Environment(Counter), chat_tokenizer()
    instance = env.new()
    env.reset(instance, {"goal": 3})
    instance.total = 2
    calls = [
        {"type": "function", "function": {"name": "reset", "arguments": {"goal": 1}}},
        {"type": "function", "function": {"name": "get_reward", "arguments": {}}},
        {"type": "function", "function": {"name": "add", "arguments": '{"n": 1}'}},
    ]
    messages, failures = env.tool_calls(instance, calls)
    assert [m["content"] for m in messages] == [
        "{'error': 'Tool reset not found.'}",
        "{'error': 'Tool get_reward not found.'}",
        "total 3",  # JSON-text arguments decoded
    ]
    assert failures == 2 and instance.total == 3
    assert [s["function"]["name"] for s in env.schemas] == ["add"]
    # a Hermes block whose `name` is not a string is no call
    renderer = Renderer(tok, True)
    for block in ('{"arguments": {"n": 1}}', '{"name": 7, "arguments": {"n": 1}}'):
        ids = tok(f"<tool_call>{block}</tool_call>", add_special_tokens=False).input_ids
        assert "tool_calls" not in renderer.assistant(ids, [], env.schemas)
    ids = tok(call("add", n=1), add_special_tokens=False).input_ids
    assert renderer.assistant(ids, [], env.schemas)["tool_calls"][0]["function"]["name"] == "add"


def test_an_observation_of_the_wrong_type_stops_and_a_cut_chat_turn_is_closed():
    class NumberObservation(Walk):
        def step(self, action):
            return 5, 1.0, True

    gen = Scripted(lambda p: ENC("+\n"))
    with pytest.raises(SystemExit, match="NumberObservation.step .*the observation is a int"):
        runner(NumberObservation).play(gen, [{"seed": 0}], [Prefix()], 1, CFG)
    tok = chat_tokenizer()
    renderer = Renderer(tok, True, [tok.eos_token_id])
    user = [{"role": "user", "content": "at 1"}]
    ended = renderer.observation(user, ENC("+") + [tok.eos_token_id])
    cut = renderer.observation(user, ENC("++"))
    # a turn cut by the token cap gets the end token the template puts after a turn
    assert tok.decode(ended) == "U:at 1</s>A:" and cut == [tok.eos_token_id] + ended


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


FLAKY = """
class Flaky:
    # a task's episodes start one after another: the first raises in step, the second wins
    last, count = None, 0

    def reset(self, seed):
        Flaky.count = Flaky.count + 1 if seed == Flaky.last else 0
        Flaky.last = seed
        self.place = Flaky.count % 4
        return f"seed {seed}\\n"

    def step(self, action):
        if self.place == 0:
            raise RuntimeError("the board fell over")
        return ("won" if self.place == 1 else "lost") + "\\n", 0.0, True


def won(completions, **kwargs):
    # the last observation, whatever the action was (a cut action gets the environment's 0)
    return [1.0 if text.endswith("won\\n") else 0.0 for text in completions]
"""


def test_episodes_the_environment_failed_are_left_out_of_the_update(tiny_base, tmp_path, capsys):
    (tmp_path / "flaky.py").write_text(FLAKY)
    out = tmp_path / "run"
    n, tasks = 4, 3
    run_main(
        [
            "ps_grpo.py",
            "--environment",
            f"{tmp_path}/flaky.py:Flaky",
            "--reward_funcs",
            f"{tmp_path}/flaky.py:won",
            "--max_steps",
            "2",
            "--prompts_per_step",
            str(tasks),
            "--num_generations",
            str(n),
            "--max_action_tokens",
            "64",
            "--eval_prompts",
            "2",
            "--eval_samples",
            "2",
            "--eval_train_prompts",
            "0",
            "--log_samples_every",
            "1",
            "--log_samples_per_kind",
            str(n * tasks),
            "--num_threads",
            "1",
            "--output_dir",
            str(out),
        ]
    )
    printed = capsys.readouterr()
    # the run went on, with the fault said once and no traceback
    assert "Traceback" not in printed.err + printed.out
    assert (printed.err + printed.out).count("Flaky.step raised RuntimeError") == 1
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in metrics if row.get("step", 0) > 0 and "loss" in row]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(steps) == 2 and len(samples) == 2 * n * tasks
    for row in steps:
        rows = [sample for sample in samples if sample["step"] == row["step"]]
        assert row["env_errors"] == tasks
        passing = 0
        for group in range(tasks):
            failed, *played = rows[group * n : (group + 1) * n]
            # marked, no reward, advantage 0
            assert failed["env_error"] is True and failed["reward"] is None
            assert failed["advantage"] == 0.0
            assert not any("env_error" in sample for sample in played)
            # the baseline is the mean of the 3 episodes played (1, 0, 0): 1/3, not 1/4
            assert [sample["reward"] for sample in played] == [1.0, 0.0, 0.0]
            advantages = [sample["advantage"] for sample in played]
            assert advantages == pytest.approx([2 / 3, -1 / 3, -1 / 3], abs=1e-6)
            # the winner passes unless its action was cut: 1 of 3 (normal), not 1 of 4 (too hard)
            passing += not played[0]["truncated"]
        assert row["ps_route_normal"] == row["ps_solve_partial"] == passing
        assert row["ps_route_all_fail"] == tasks - passing and row["ps_route_too_hard"] == 0
    # (how many winners were cut is the sampled trajectory's; the routing over the episodes played
    # is pinned without sampling by test_ps_grpo's failed-rollout pass-rate test)


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
    with pytest.raises(
        SystemExit, match=r"Bad\.reset raised OSError: no board \(at .*game\.py:8\)$"
    ):
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


def test_reset_is_checked_against_the_first_held_out_task_too(tmp_path):
    """Held-out rows from another file can have other columns than the training rows: reset's
    signature is checked against them before the model loads, not at the first evaluation."""
    (tmp_path / "game.py").write_text(
        "class Board:\n    def reset(self, board):\n        return board\n"
        "    def step(self, action):\n        return '', 1.0, True\n"
    )
    spec = f"{tmp_path / 'game.py'}:Board"
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps({"board": "x"}) + "\n" for _ in range(10)))
    held.write_text("".join(json.dumps({"grid": "y"}) + "\n" for _ in range(3)))
    flags = ["--environment", spec, "--dataset_name", str(train), "--eval_dataset", str(held)]
    with pytest.raises(SystemExit) as stop:
        _opened(flags)
    assert str(stop.value).startswith(
        f"--environment {spec}: Board.reset(board) cannot take the first held-out task's keywords "
        "(grid): "
    )


def test_the_start_up_line_names_trl_s_convention_and_its_tools(tmp_path):
    (tmp_path / "counter.py").write_text(
        "class Counter:\n    def reset(self, **row):\n        return None\n"
        "    def add(self, n: int) -> str:\n"
        '        """Adds n.\n\n        Args:\n            n: how much\n        """\n'
        "        return str(n)\n"
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
