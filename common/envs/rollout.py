"""Multi-turn rollouts in an `Environment` (common/envs/protocol.py), and [PS] prefix replay.

A turn: the policy generates an action (it ends at an end token, at a newline in raw-text mode --
one action per line -- or at the sampling config's max_new_tokens), the environment answers with an
observation. Observations enter the context as the tokenizer expects them: as a user message (text
protocol) or tool messages (TRL's convention) through the chat template when it has one, as raw
text otherwise; their tokens have loss mask 0, the policy's tokens mask 1. One generate call per
turn covers every live episode of the batch.

Prefix replay: a prefix task starts from step K of a stored trajectory on a fresh instance, by
`restore(snapshot)` when the environment offers it, else by `reset` with the same row and the first
K stored actions executed again; each re-executed observation (and the first one) is compared with
the stored tokens. A difference drops the task (`Rollouts.kept` leaves it out) and is said once.
A snapshot is copied when it is taken and again for each restore (`state_copy`).

An episode whose environment raised (an `EnvFault`) ends there, marked `Episode.env_error`: the
trainer leaves it out of the update and of Prefix Sampling's counts.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field

from common.envs.protocol import EnvFault, Environment
from common.rl.episode import Episode

# Hermes-style tool calls (Qwen's templates): what transformers' response schemas parse
TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class Prefix:
    """[PS] What a prefix task replays: K stored (action ids, observation ids) turns, the stored
    prompt (the first observation's tokens; empty: not checked) and the environment's snapshot after
    turn K (None: re-execute the actions), with the stored conversation's chat messages (TRL's
    convention: `Episode.chat`, what a restored episode starts from)."""

    steps: list = field(default_factory=list)
    prompt: list = field(default_factory=list)
    snapshot: object = None
    chat: list = field(default_factory=list)


@dataclass
class Rollouts:
    """A batch's episodes (n per kept task, `group` indexing `kept`), which tasks were kept (a
    prefix task whose replay diverged is not), and the counts behind env_errors and
    ps_replay_mismatch_frac."""

    episodes: list[Episode]
    truncated: list[bool]
    kept: list[int]
    errors: int = 0
    replayed: int = 0  # prefix tasks replayed
    mismatched: int = 0  # of those, dropped: a replayed observation differed
    actions: int = 0  # turns the policy generated
    actions_cut: int = 0  # of those, cut by the token cap (max_new_tokens)
    tool_calls: int = 0  # TRL's convention: the tool calls of the generated turns
    tool_failures: int = 0  # of those, answered with an error
    faults: list = field(default_factory=list)  # this batch's faults (`EnvFault.short`), in order


@dataclass
class Act:
    """One action applied: the observation's tokens, the reward and done (text protocol), and in
    TRL's convention the turn as chat messages (the assistant's, then its tool results) and how
    many of its tool calls failed."""

    observation: list[int]
    reward: float = 0.0
    done: bool = False
    messages: list = field(default_factory=list)
    failures: int = 0


def state_copy(env: Environment, state, what: str = "snapshot"):
    """A deep copy of a snapshot (`copy.deepcopy`, which uses the state's own `__deepcopy__` when
    its class defines one): taken when `snapshot()` returns, the stored state stays the state after
    its turn even when the environment goes on changing the object it returned; taken again for
    each `restore`, no episode changes the stored one. A state that cannot be copied is the
    environment's fault (`EnvFault`)."""
    try:
        return copy.deepcopy(state)
    except Exception as error:  # noqa: BLE001 - the user's state: one line, the episode ends
        line = (
            f"environment {env.name}.{what}: copy.deepcopy cannot copy the state snapshot() "
            f"returned ({type(error).__name__}: {error}); return plain data, or define "
            "__deepcopy__ on the state's class (docs/custom_env.md)"
        )
        raise EnvFault(line, (what, "deepcopy", type(error).__name__)) from error


class Renderer:
    """How text enters the context: through the chat template (`chat`) or as raw text."""

    def __init__(self, tokenizer, chat: bool, end_ids=()):
        self.tokenizer, self.chat, self.end_ids = tokenizer, chat, set(end_ids)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids

    def action_text(self, ids: list[int]) -> str:
        """The action as the environment gets it: its text without special tokens (raw text: less
        the newline that ended it)."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text if self.chat else text.removesuffix("\n")

    def prompt(self, messages: list[dict], tools=None) -> list[int]:
        """The context before the first turn (raw text: the last message's text, with the
        tokenizer's special tokens, as a text prompt)."""
        if not self.chat:
            return self.tokenizer(messages[-1]["content"], add_special_tokens=True).input_ids
        return list(
            self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
        )

    def observation(self, messages: list[dict], action_ids: list[int]) -> list[int]:
        """The tokens after an action: the observation's message(s) and the next turn's opening (a
        turn that did not end with an end token is closed first)."""
        if not self.chat:
            return self.encode("".join(message["content"] for message in messages))
        close = [] if action_ids and action_ids[-1] in self.end_ids else [self.eos]
        return close + self._suffix(messages)

    @property
    def eos(self) -> int:
        return self.tokenizer.eos_token_id

    def _suffix(self, messages: list[dict]) -> list[int]:
        # the messages' tokens as the template renders them after an assistant turn: the rendering
        # of a short conversation with them, less the same conversation without them (cut after its
        # last end token, where a generated turn stops), as TRL renders tool results
        assistant = {"role": "assistant", "content": ""}
        if messages[0]["role"] == "tool":
            call = {"name": messages[0].get("name", "tool"), "arguments": {}}
            assistant["tool_calls"] = [{"type": "function", "function": call}]
        head = [{"role": "user", "content": "x"}, assistant]
        render = self.tokenizer.apply_chat_template
        before = list(render(head, tokenize=True, return_dict=False))
        after = list(
            render(head + messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
        ends = [i for i, token in enumerate(before) if token == self.eos]
        if ends:
            before = before[: ends[-1] + 1]
        if after[: len(before)] != before:
            raise SystemExit(
                "the chat template renders an assistant turn differently when a message follows "
                "it: cannot put observations into the context"
            )
        return after[len(before) :]

    def assistant(self, ids: list[int], prefix: list[int], tools) -> dict:
        """A generated turn as TRL's assistant message: its text and tool calls, parsed as
        transformers parses them (the tokenizer's response schema) when it has one, else
        Hermes-style `<tool_call>{json}</tool_call>` blocks; a malformed call is no call (the
        turn is plain text)."""
        tokenizer = self.tokenizer
        text = tokenizer.decode(ids, skip_special_tokens=True)
        schema = getattr(tokenizer, "response_template", None) or getattr(
            tokenizer, "response_schema", None
        )
        if schema is not None:
            try:
                message = tokenizer.parse_response(ids, prefix=prefix, tools=tools)
            except Exception:  # noqa: BLE001 - TRL's fallback: the turn as plain text
                message = None
            if not isinstance(message, dict):
                return {"role": "assistant", "content": text}
            content = message.get("content")
            if isinstance(content, str) and tokenizer.eos_token:
                content = content.removesuffix(tokenizer.eos_token)
            calls = [call for call in message.get("tool_calls") or [] if isinstance(call, dict)]
            parsed = {key: value for key, value in message.items() if key != "tool_calls"}
            parsed.update(role="assistant", content=content or "")
            return parsed | ({"tool_calls": calls} if calls else {})
        calls = []
        for block in TOOL_CALL_RE.findall(tokenizer.decode(ids, skip_special_tokens=False)):
            try:
                call = json.loads(block)
            except ValueError:
                continue
            if isinstance(call, dict) and isinstance(call.get("name"), str):
                calls.append({"type": "function", "function": call})
        if not calls:
            return {"role": "assistant", "content": text}
        return {
            "role": "assistant",
            "content": TOOL_CALL_RE.sub("", text).strip(),
            "tool_calls": calls,
        }

    def tool_template_problem(self) -> str | None:
        """Why the chat template cannot carry TRL's convention, None when it can: TRL's test (a
        user -> assistant with tool calls -> tool conversation renders the call's name, its argument
        and the tool's result), the tools' schema reaching the prompt, and the tokenizer encoding
        the characters of both (encoded then decoded, none of them is lost)."""
        render = self.tokenizer.apply_chat_template
        name, key, value, result = (
            f"probe_{part}_7c1e" for part in ("tool", "key", "value", "out")
        )
        call = {"type": "function", "function": {"name": name, "arguments": {key: value}}}
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": name, "content": result},
        ]
        try:
            try:
                text = render(messages, tokenize=False)
            except TypeError:  # templates that take the arguments as JSON text only (TRL retries)
                call["function"]["arguments"] = json.dumps({key: value})
                text = render(messages, tokenize=False)
        except Exception as error:  # noqa: BLE001 - the template's own error, in one line
            return f"it fails on a tool call and its result ({type(error).__name__}: {error})"
        dropped = [part for part in (name, key, value, result) if part not in text]
        if dropped:
            return f"its chat template drops {dropped_parts(dropped, name, key, value, result)}"
        conversation = text
        schema = {
            "type": "function",
            "function": {
                "name": name,
                "description": "probe",
                "parameters": {"type": "object", "properties": {}},
            },
        }
        try:
            text = render([{"role": "user", "content": "hi"}], tools=[schema], tokenize=False)
        except Exception as error:  # noqa: BLE001
            return f"its chat template fails on `tools` ({type(error).__name__}: {error})"
        if name not in text:
            return "its chat template ignores `tools` (the model would never see the tools' schema)"
        # the rendered text as the model reads it: encoded, then decoded
        needed = set(json.dumps(call) + json.dumps(schema))
        lost = sorted(
            set(
                lost_characters(self.tokenizer, conversation)
                + lost_characters(self.tokenizer, text)
            )
            & needed
        )
        if lost:
            return (
                f"it cannot encode {' '.join(lost)} (characters of a tool call or the tools' "
                "schema, which the prompt would then read as unknown tokens, so no call could "
                "parse)"
            )
        return None


def dropped_parts(dropped: list[str], name: str, key: str, value: str, result: str) -> str:
    """What a chat template leaves out of the probe conversation, in words."""
    if dropped == [result]:
        return "the tool's result"
    if {name, key, value} <= set(dropped):
        return "the assistant's tool calls"
    words = {
        name: "the tool call's name",
        key: "the tool call's argument names",
        value: "the tool call's argument values",
        result: "the tool's result",
    }
    return " and ".join(words[part] for part in dropped)


def lost_characters(tokenizer, text: str) -> list[str]:
    """The characters of `text` that its encoding and decoding lose (a tokenizer without them
    encodes them as its unknown token)."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    return sorted(set(text) - set(decoded))


class EnvRunner:
    """Plays an `Environment` with a generator: fresh episodes from `reset(**row)`, prefix tasks
    from a replayed step K; a fault ends its episode, marked `env_error` (said once per distinct
    line)."""

    def __init__(self, env: Environment, renderer: Renderer, max_turns: int, log=print):
        if not env.text:
            # TRL refuses such a tokenizer too: the model would never see the tools or its calls
            tokenizer = getattr(renderer.tokenizer, "name_or_path", "") or "the tokenizer"
            if renderer.chat:
                problem = renderer.tool_template_problem()
            elif getattr(renderer.tokenizer, "chat_template", None):
                problem = "--use_chat_template no turns its chat template off"
            else:
                problem = "it has no chat template"
            if problem:
                raise SystemExit(
                    f"environment {env.name}: TRL's environment_factory convention needs a chat "
                    f"template that renders tools, tool calls and their results, and a tokenizer "
                    f"that encodes them; {tokenizer}: {problem}"
                )
        self.env, self.renderer, self.max_turns, self.log = env, renderer, max_turns, log
        self.said: set = set()
        self.faults: list[str] = []  # the faults of the batch being played

    def say(self, line: str, key=None) -> None:
        """`line` once per run: the same fault (`key`) or the same line again is not said again."""
        key = key or (line,)
        if key not in self.said:
            self.said.add(key)
            self.log(line)

    def fault(self, fault: EnvFault) -> None:
        """A fault of this batch: said once per run, kept for the batch's stop line."""
        self.say(str(fault), fault.key)
        self.faults.append(fault.short)

    # ---------------- one episode's start ----------------
    def _start(self, row: dict, prefix: Prefix, group: int, errors: list):
        """A fresh instance at the prefix's step K: (episode, instance, live), or None when the
        replay diverged from the stored trajectory."""
        env, renderer = self.env, self.renderer
        episode = Episode(group)
        instance = None
        try:
            instance = env.new()
            if prefix.snapshot is not None and prefix.prompt and env.restores:
                # [PS] restore(snapshot): the stored state; the conversation is the stored one
                env.restore(instance, state_copy(env, prefix.snapshot, "restore"))
                episode.prompt = list(prefix.prompt)
                episode.chat = copy.deepcopy(prefix.chat)
                for action_ids, obs_ids in prefix.steps:
                    episode.add_turn(action_ids, obs_ids)
                return episode, instance, True
            first = env.reset(instance, row)
            messages = self._first_messages(row, first)
            episode.prompt = renderer.prompt(messages, env.schemas)
            if prefix.prompt and episode.prompt != list(prefix.prompt):
                return None
            episode.chat = [] if env.text else [messages]
            for action_ids, stored in prefix.steps:
                # [PS] re-execute a stored action; its observation must be the stored one
                act = self._act(instance, action_ids, episode.prompt + episode.ids)
                # a stored prefix never ends its episode: a replay that does diverged too
                if act.observation != list(stored) or act.done:
                    return None
                episode.add_turn(action_ids, act.observation)
                if not env.text:
                    episode.chat.append(act.messages)
        except EnvFault as fault:
            self.fault(fault)
            errors.append(episode)
            return episode, instance, False
        return episode, instance, True

    def _first_messages(self, row: dict, first: str | None) -> list[dict]:
        """The conversation before the first turn: the first observation as a user message (TRL's
        convention: appended to the row's prompt messages, when it has them)."""
        prompt = row.get("prompt") if not self.env.text else None
        if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
            last = prompt[-1]
            return prompt[:-1] + [{**last, "content": last.get("content", "") + (first or "")}]
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt + (first or "")}]
        return [{"role": "user", "content": first or ""}]

    def _act(self, instance, action_ids: list[int], context: list[int]) -> Act:
        """One action applied; TRL's convention: the turn's tool calls run, a turn without one ends
        the episode."""
        env, renderer = self.env, self.renderer
        if env.text:
            final = not renderer.chat and bool(action_ids) and action_ids[-1] in renderer.end_ids
            text, reward, done = env.step(instance, renderer.action_text(action_ids), final)
            observation = renderer.observation([{"role": "user", "content": text}], action_ids)
            return Act(observation, reward, done)
        message = renderer.assistant(action_ids, context, env.schemas)
        calls = message.get("tool_calls") or []
        if not calls:
            return Act([], done=True, messages=[message])
        results, failures = env.tool_calls(instance, calls)
        observation = renderer.observation(results, action_ids)
        return Act(observation, messages=[message, *results], failures=failures)

    # ---------------- a batch ----------------
    def play(
        self, generator, rows: list[dict], prefixes: list[Prefix], n: int, cfg, evaluation=False
    ) -> Rollouts:
        """n episodes per task, turn by turn; one generate call per turn for every live episode.
        Returns the kept tasks' episodes (a prefix task whose replay diverged is dropped). A
        training batch whose every episode failed stops the run, quoting the batch's first fault;
        an `evaluation`'s is returned (its caller says so)."""
        env = self.env
        self.faults = []
        self.renderer.end_ids = set(generator.end_ids)
        episodes, instances, live, errors, kept, mismatched = [], [], [], [], [], 0
        for task, (row, prefix) in enumerate(zip(rows, prefixes)):
            starts = [self._start(row, prefix, len(kept), errors) for _ in range(n)]
            if any(start is None for start in starts):
                mismatched += 1
                self.say(
                    f"prefix replay: environment {env.name} gave another observation than the "
                    "stored trajectory (it is not deterministic): such prefix tasks are dropped, "
                    "counted in ps_replay_mismatch_frac; define snapshot() / restore(state), or "
                    "make reset and step deterministic (docs/custom_env.md)"
                )
                continue
            kept.append(task)
            for episode, instance, alive in starts:
                episodes.append(episode)
                instances.append(instance)
                live.append(alive)
        rewards = [0.0] * len(episodes)
        clipped = [False] * len(episodes)
        # the generated turns: Rollouts' counts
        counts = dict(actions=0, actions_cut=0, tool_calls=0, tool_failures=0)
        failed = set(map(id, errors))
        for i, episode in enumerate(episodes):
            live[i] = live[i] and len(episode.steps) < self.max_turns
        while active := [i for i, alive in enumerate(live) if alive]:
            contexts = [episodes[i].prompt + episodes[i].ids for i in active]
            gens = generator.generate(contexts, 1, cfg)
            turns = zip(active, contexts, gens.completion_ids, gens.logprobs, gens.finish_reasons)
            for i, context, ids, logprobs, reason in turns:
                clipped[i] = clipped[i] or reason == "length"
                counts["actions"] += 1
                counts["actions_cut"] += reason == "length"
                try:
                    act = self._act(instances[i], ids, context)
                    if env.restores and not act.done:
                        # copied now: the state after this turn, not the object as it ends up
                        state = state_copy(env, env.snapshot(instances[i]))
                        episodes[i].snapshots.append(state)
                except EnvFault as fault:
                    self.fault(fault)
                    failed.add(id(episodes[i]))
                    act = Act([], done=True)
                rewards[i], done = act.reward, act.done
                # the action: mask 1; the observation: mask 0
                episodes[i].add_turn(ids, act.observation, logprobs)
                if not env.text:
                    episodes[i].chat.append(act.messages)
                    counts["tool_calls"] += sum(m["role"] == "tool" for m in act.messages)
                    counts["tool_failures"] += act.failures
                live[i] = not done and len(episodes[i].steps) < self.max_turns
        for i, (episode, instance) in enumerate(zip(episodes, instances)):
            reward = 0.0 if id(episode) in failed else rewards[i]
            if not env.text and id(episode) not in failed:
                try:  # TRL's convention: the environment's own reward, when it has one
                    reward = env.reward(instance) or 0.0
                except EnvFault as fault:
                    self.fault(fault)
                    failed.add(id(episode))
                    reward = 0.0
            episode.reward = reward
            episode.env = instance
            episode.env_error = id(episode) in failed
        if episodes and len(failed) == len(episodes) and not evaluation:
            raise SystemExit(
                f"environment {env.name} failed in all {len(episodes)} episodes of a training "
                f"batch, so the run stops; the batch's first fault: {self.faults[0]}"
            )
        replayed = sum(1 for p in prefixes if p.steps)
        return Rollouts(
            episodes, clipped, kept, len(failed), replayed, mismatched, **counts, faults=self.faults
        )
