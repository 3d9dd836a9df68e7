"""Prefix Sampling: routing, prefix selection, replayed rollouts, prefix masking, the adaptive controller,
and the script end to end (mechanism on/off, exact resume of queue and controller)."""

import json
import os
import random
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from conftest import run_main, run_script

from common.demo import countdown
from common.demo.countdown import Problem
from common.demo.countdown_env import Episode, solver_episode
from common.demo.tiny_model import build_char_tokenizer
from common.generation.hf import Generations, SamplingConfig
from common.run.flags import parse_args
from ps_grpo import (
    Args,
    Attributed,
    BatchTask,
    PrefixController,
    assemble_batch,
    attributed,
    batch_order,
    kept_advantages,
    prefix_steps,
    prefix_tasks,
    ps_loss,
    rollout_text,
    route,
    split_lines,
)

TOK = build_char_tokenizer()


def ENC(s):
    return TOK(s, add_special_tokens=False).input_ids


NL = ENC("\n")[0]


# ---------------- routing and prefix selection ----------------
def test_route_five_paths():
    got = [route(k, 8, 0.3, 0.7) for k in range(9)]
    assert got == [
        "all_fail",
        "too_hard",
        "too_hard",
        "normal",
        "normal",
        "normal",
        "too_easy",
        "too_easy",
        "all_pass",
    ]
    assert (
        route(3, 10, 0.3, 0.7) == "normal" and route(7, 10, 0.3, 0.7) == "normal"
    )  # [low, high] is closed


def test_prefix_steps_paper_examples_caps_and_clamps():
    assert (
        prefix_steps(20, "remaining", 0.25, 1000) == 15
    )  # "a 20-step trajectory replays 15 steps"
    assert (
        prefix_steps(20, "prefix", 0.25, 1000) == 5
    )  # "replays the first 5 steps of a failing trajectory"
    assert (
        prefix_steps(20, "remaining", 0.25, 3) == 17 and prefix_steps(20, "prefix", 0.25, 2) == 2
    )  # caps
    assert prefix_steps(3, "remaining", 0.7, 1000) == 1  # remaining int(2.1) = 2
    # K = T (nothing left to generate) and K = 0 (the fresh task again) are clamped into [1, T - 1]
    assert (
        prefix_steps(2, "remaining", 0.25, 1000) == 1 and prefix_steps(2, "prefix", 0.25, 1000) == 1
    )
    assert (
        prefix_steps(4, "prefix", 1.0, 1000) == 3 and prefix_steps(4, "remaining", 1.0, 1000) == 1
    )
    assert prefix_steps(1, "prefix", 0.5, 1000) is None  # a 1-step trajectory has no proper prefix
    with pytest.raises(ValueError):
        prefix_steps(5, "middle", 0.5, 9)


# ---------------- adaptive prefix control ----------------
CTRL = {
    "alpha": 0.05,
    "lo": 0.47,
    "hi": 0.53,
    "step": 0.05,
    "cooldown": 5,
    "rmin": 0.05,
    "rmax": 0.95,
}


def _drive(ratio0, curve, steps=300, noise=0.03, reset=True, seed=0):
    """Feed the controller pass rates from a synthetic pass-rate-vs-ratio curve (+ uniform noise)."""
    rng = random.Random(seed)
    c, ratios, emas = PrefixController(ratio0, wait=CTRL["cooldown"]), [ratio0], [None]
    for _ in range(steps):
        c.update(curve(c.ratio) + rng.uniform(-noise, noise), **CTRL, reset=reset)
        ratios.append(c.ratio)
        emas.append(c.ema(CTRL["alpha"]))
    return c, ratios, emas


def curve(r):
    return 0.9 - 0.8 * r  # more remaining steps / more failing prefix -> harder; 0.5 at r = 0.5


@pytest.mark.parametrize("ratio0", [0.25, 0.8])
def test_controller_settles_in_the_deadzone_without_oscillating(ratio0):
    _, ratios, emas = _drive(ratio0, curve)
    assert ratios[-1] == pytest.approx(0.5) and 0.47 <= curve(ratios[-1]) <= 0.53
    assert 0.47 <= emas[-1] <= 0.53
    moves = [b - a for a, b in pairwise(ratios) if b != a]
    assert len(moves) == round(
        abs(0.5 - ratio0) / 0.05
    )  # straight there: one-way steps, no overshoot
    assert all(m > 0 for m in moves) if ratio0 < 0.5 else all(m < 0 for m in moves)
    assert set(ratios[150:]) == {ratios[-1]}  # and it stays
    changes = [i for i in range(1, len(ratios)) if ratios[i] != ratios[i - 1]]
    assert all(b - a >= 6 for a, b in pairwise(changes))  # cooldown: 5 observations between moves


def test_a_never_restarted_ema_lags_and_overshoots():
    _, ratios, _ = _drive(0.25, curve, noise=0.0, reset=False)
    assert max(ratios) >= 0.6  # pushed past 0.5 while the EMA still reported the old, easier ratios
    assert any(b < a for a, b in pairwise(ratios))  # and had to come back: oscillation


def test_default_controller_is_the_papers_single_ema():
    assert (
        parse_args(Args, []).ema_reset is False
        and parse_args(Args, ["--ema_reset", "true"]).ema_reset is True
    )
    c = PrefixController(0.25)
    assert c.update(0.9, **CTRL) == pytest.approx(0.05)  # a move...
    assert c.observations == 1 and c.ema(CTRL["alpha"]) == pytest.approx(
        0.9
    )  # ...keeps the EMA (the paper)
    c = PrefixController(0.25)
    c.update(0.9, **CTRL, reset=True)
    assert c.observations == 0 and c.ema(CTRL["alpha"]) is None  # our variant restarts it


def test_controller_ignores_steps_without_prefix_tasks_and_clamps():
    c = PrefixController(0.25)
    assert c.update(None, **CTRL) == 0 and c.observations == 0 and c.ema(0.05) is None
    c = PrefixController(0.93)
    assert c.update(1.0, **CTRL) == pytest.approx(0.02) and c.ratio == 0.95  # clamped to ratio_max
    for _ in range(20):
        c.update(1.0, **CTRL)
    assert c.ratio == 0.95


def test_controller_is_fed_only_prefix_tasks_built_with_its_current_ratio():
    """main()'s order: prefix tasks are built at step t with the ratio *before* the update at the end of step t and
    run at step t + 1, so the batch right after a move measures the old ratio: it must not enter the new EMA."""
    # no cooldown: any EMA outside the deadzone moves; the restarting variant, so an empty EMA shows nothing stale
    # entered it
    c, cfg = PrefixController(0.25), {**CTRL, "cooldown": 0, "reset": True}

    def step(
        queue, k
    ):  # run the queued prefix tasks (k of 8 pass), route a fresh one, then the controller update
        tasks = queue + [BatchTask(1)]
        # as in main(): tagged with the ratio that built it
        built = [
            BatchTask(1, "hard", [None] * prefix_steps(20, "remaining", c.ratio, 1000), 20, c.ratio)
        ]
        got = attributed(tasks, [k, 4], "hard", c.ratio)
        c.update(got.pass_rate(8), **cfg)
        return built, got

    queue, _ = step([], 4)  # no prefix task yet
    queue, got = step(queue, 8)  # tasks built at 0.25 all pass: harder
    assert got == Attributed(1, 8, 0) and c.ratio == pytest.approx(0.30) and c.observations == 0
    assert (
        queue[0].ratio == 0.25 and len(queue[0].steps) == 15
    )  # built in this step, before the move
    queue, got = step(queue, 8)  # they replay 15 steps (ratio 0.25), not the 14 of 0.30
    assert got == Attributed(0, 0, 1)  # discarded as stale
    # no second move on 0.25's evidence
    assert c.ratio == pytest.approx(0.30) and c.observations == 0 and c.ema(0.05) is None
    queue, got = step(queue, 4)  # built at 0.30: the new EMA's first value
    assert got.tasks == 1 and c.ema(0.05) == pytest.approx(0.5) and c.ratio == pytest.approx(0.30)


def test_rollouts_the_environment_failed_count_in_no_pass_rate():
    """An episode whose environment raised (`env_error`, reward NaN) is out of k and N alike: in
    the controller's input, the prefix pass rates, the routing and the partially solved count."""
    from common.rl.advantages import grpo_advantages, zero_variance
    from common.rl.episode import Episode
    from ps_grpo import (
        controller_input,
        env_failed,
        make_controllers,
        ps_grpo_metrics,
        ps_grpo_sums,
    )

    n, nan = 4, float("nan")
    args = parse_args(Args, [])
    controllers = make_controllers(args, None)
    ratio = controllers["easy"].ratio
    tasks = [BatchTask(0, "easy", [([1], [2])], 2, ratio), BatchTask(1)]
    episodes = [Episode(group) for group in (0, 0, 0, 0, 1, 1, 1, 1)]
    episodes[0].env_error = episodes[4].env_error = True
    # the prefix task: 1 of the 3 played passes; the fresh task: all 3 played pass
    rewards = torch.tensor([[nan, 1.0, 0.0, 0.0], [nan, 1.0, 1.0, 1.0]])
    success = torch.tensor([[False, True, False, False], [False, True, True, True]])
    counted = [n - failed for failed in env_failed(episodes, n)]
    assert counted == [3, 3]
    routes = [route(k, m, args.low, args.high) for k, m in zip(success.sum(-1).tolist(), counted)]
    assert routes == ["normal", "all_pass"] and route(0, 0, args.low, args.high) == "none"
    keep = ~zero_variance(rewards)
    advantages = grpo_advantages(rewards, scale=False)
    assert keep.tolist() == [True, False]
    assert advantages[0].tolist() == pytest.approx([0.0, 2 / 3, -1 / 3, -1 / 3])
    sums = ps_grpo_sums(
        tasks, episodes, rewards, success, [False] * 8, routes, keep, advantages[keep], controllers
    )
    totals = {name: float(value) for name, value in sums.items()} | {"tok": 0.0}
    control = controller_input(totals)
    assert control["easy"].pass_rate(n) == pytest.approx(1 / 3)
    metrics = ps_grpo_metrics(totals, n, control, controllers, args.ema_alpha, 0, 0)
    assert metrics["ps_prefix_pass_rate_easy"] == pytest.approx(1 / 3)
    assert metrics["ps_ctrl_pass_rate_easy"] == pytest.approx(1 / 3)
    # the fresh task passed every played episode: not partially solved
    assert metrics["ps_solve_partial"] == 1


# ---------------- rollouts with a scripted policy ----------------
class ScriptedGenerator:
    """Plays the first solver step for the state in its context's last line; records every call."""

    end_ids = [
        TOK.eos_token_id
    ]  # what ends an episode's turn as its last (HFGenerator's: EOS, end-of-turn ids)

    def __init__(self):
        self.calls = []

    def generate(self, prompts, n, cfg):
        self.calls.append((len(prompts), n, list(cfg.stop_token_ids)))
        outs = []
        for p in prompts:
            *nums, t = TOK.decode(p).strip("\n").split("\n")[-1].split()
            step = countdown.solutions(Problem(tuple(map(int, nums)), int(t[1:])))[0][0]
            outs += [ENC(step + "\n")] * n
        return Generations(
            [list(p) for p in prompts],
            outs,
            [[-0.1] * len(o) for o in outs],
            ["stop"] * len(outs),
            n,
        )


def test_multiturn_rollouts_batch_turns_and_replay_prefixes():
    probs = [Problem((14, 1, 10), 5), Problem((3, 4, 5, 6), 9)]
    prompts = [ENC(countdown.prompt_text(p)) for p in probs]
    stored = solver_episode(
        probs[1], countdown.solutions(probs[1])[-1], ENC, max_turns=4
    )  # another route
    prefixes = [[], stored.steps[:2]]  # task 1 replays 2 of its 3 steps
    gen = ScriptedGenerator()
    cfg = SamplingConfig(max_new_tokens=16, stop_token_ids=[NL])
    from functools import partial

    from common.demo.countdown_env import CountdownGame
    from common.envs.protocol import Environment
    from common.envs.rollout import EnvRunner, Prefix, Renderer

    env = Environment(partial(CountdownGame, 4, "end"))
    rows = [{"nums": list(p.nums), "target": p.target} for p in probs]
    out = EnvRunner(env, Renderer(TOK, False), 4).play(
        gen, rows, [Prefix(steps) for steps in prefixes], 3, cfg
    )
    eps, clipped = out.episodes, out.truncated
    assert [e.prompt for e in eps] == [prompts[0]] * 3 + [prompts[1]] * 3
    assert clipped == [False] * 6  # every action ended at its newline
    # one generate call per turn over all live episodes: turn 1 has all 6, turn 2 only task 0's 3
    assert [c[:2] for c in gen.calls] == [(6, 1), (3, 1)] and gen.calls[0][2] == [NL]
    assert all(e.reward == 1.0 for e in eps) and [e.group for e in eps] == [0, 0, 0, 1, 1, 1]
    e = eps[3]
    cut = sum(len(a) + len(o) for a, o in stored.steps[:2])
    assert (
        e.ids[:cut] == stored.ids[:cut] and e.mask[:cut] == [0] * cut
    )  # restored conversation, no gradient
    assert e.replayed_steps == 2 and e.replayed_tokens == sum(len(a) for a, _ in stored.steps[:2])
    assert e.generated_tokens == len(e.steps[2][0]) and e.env.status == "solved"
    assert e.old_logp[cut : cut + len(e.steps[2][0])] == [-0.1] * len(e.steps[2][0])
    assert eps[0].replayed_tokens == 0 and len(eps[0].steps) == 2
    assert (
        eps[0].generated_tokens == sum(len(a) for a, _ in eps[0].steps) < len(eps[0].ids)
    )  # observations: mask 0


def test_text_mode_steps_are_lines_and_prefix_lines_are_replayed():
    class Gen:
        def generate(self, prompts, n, cfg):
            self.ctx = prompts
            out = [ENC("b\nc\nd")] * (len(prompts) * n)
            return Generations(prompts, out, [[-1.0] * 5] * len(out), ["length"] * len(out), n)

    assert split_lines(ENC("ab\nc\n\nd"), lambda t: t == NL) == [
        ENC("ab\n"),
        ENC("c\n"),
        ENC("\n"),
        ENC("d"),
    ]
    g = Gen()
    prefix = [(ENC("x\n"), []), (ENC("y\n"), [])]
    eps, clipped = rollout_text(
        g,
        TOK,
        [ENC("Q:"), ENC("R:")],
        [[], prefix],
        2,
        SamplingConfig(max_new_tokens=8),
        lambda t: t == NL,
    )
    assert (
        clipped == [True] * 4
    )  # finish reason "length" (and the prefix task's continuation: cut by the budget)
    assert g.ctx == [ENC("Q:"), ENC("R:x\ny\n")]  # the prefix is context, not generated
    assert [TOK.decode(e.ids)[:4] for e in eps] == ["b\nc\n"] * 2 + [
        "x\ny\n"
    ] * 2  # scored: prefix + continuation
    assert (
        TOK.decode(eps[2].ids) == "x\ny\nb\nc\n"
    )  # continuation cut to the remaining budget 8 - 4
    assert (
        eps[2].mask == [0] * 4 + [1] * 4 and eps[2].replayed_tokens == 4 and len(eps[2].steps) == 4
    )
    assert len(eps[0].steps) == 3 and eps[0].mask == [1] * 5

    class GenEos(
        Gen
    ):  # an answer of two lines then the stop token: two steps, the stop token ends the second
        def generate(self, prompts, n, cfg):
            out = [ENC("b\nc\n") + [TOK.eos_token_id]] * (len(prompts) * n)
            return Generations(prompts, out, [[-1.0] * 5] * len(out), ["stop"] * len(out), n)

    eps, clipped = rollout_text(
        GenEos(), TOK, [ENC("Q:")], [[]], 1, SamplingConfig(max_new_tokens=8), lambda t: t == NL
    )
    assert clipped == [False]  # stopped within the budget
    assert [a for a, _ in eps[0].steps] == [ENC("b\n"), ENC("c\n") + [TOK.eos_token_id]]
    _, clipped = rollout_text(
        GenEos(), TOK, [ENC("Q:")], [prefix], 1, SamplingConfig(max_new_tokens=8), lambda t: t == NL
    )
    assert clipped == [True]  # stopped, but 5 tokens do not fit the 8 - 4 left after the prefix


# ---------------- prefix masking: exactly zero gradient on replayed tokens ----------------
def test_prefix_tokens_get_exactly_zero_gradient(random_model_dir):
    from transformers import AutoModelForCausalLM

    from common.rl.logprobs import token_logprobs
    from common.rl.masking import pad_sequences

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    p = Problem((14, 1, 10), 5)
    prompt = ENC(countdown.prompt_text(p))
    full = solver_episode(p, ["14-10=4", "4+1=5"], ENC)
    ep = Episode(0)
    ep.add_turn(*full.steps[0])  # replayed first turn
    ep.add_turn(full.steps[1][0], full.steps[1][1], [-0.3] * len(full.steps[1][0]))
    other = solver_episode(p, ["14+1=15", "15-10=5"], ENC)
    prompts, comps, masks = [prompt, prompt], [ep.ids, other.ids], [ep.mask, other.mask]
    adv = torch.tensor([1.0, -1.0])

    def grads(batch):
        model.zero_grad()
        logp, _ = token_logprobs(model, batch)
        logp.retain_grad()
        old = logp.detach()  # on-policy: ratio 1, nothing clipped
        loss, _ = ps_loss(logp, old, adv, batch.loss_mask, int(batch.loss_mask.sum()), 0.2, 0.28)
        loss.backward()
        return logp.grad, {n: q.grad.clone() for n, q in model.named_parameters()}

    batch = pad_sequences(prompts, comps, TOK.pad_token_id, masks)
    g_tok, g_par = grads(batch)
    lm = batch.loss_mask.bool()
    assert (g_tok[~lm] == 0).all()  # replayed prefix and observations: exactly zero
    assert (g_tok[lm] != 0).all()  # generated tokens: gradient
    r = batch.completion_width
    assert (
        lm[0, r - len(ep.ids) : r - len(ep.ids) + len(full.steps[0][0])].sum() == 0
    )  # the replayed action itself
    # the same update as training on the continuation with the replayed prefix moved into the prompt
    cut = len(full.steps[0][0]) + len(full.steps[0][1])
    batch2 = pad_sequences(
        [prompt + ep.ids[:cut], prompt],
        [ep.ids[cut:], other.ids],
        TOK.pad_token_id,
        [ep.mask[cut:], other.mask],
    )
    _, g_par2 = grads(batch2)
    assert all(torch.allclose(g_par[n], g_par2[n], atol=1e-6) for n in g_par)


# ---------------- the script ----------------
def test_every_flag_is_documented():
    from dataclasses import fields

    from common.run.flag_help import field_docs

    docs = field_docs(Args)
    assert not [f.name for f in fields(Args) if not docs.get(f.name)]
    out = run_script(["ps_grpo.py", "--help"]).stdout
    assert all(f"--{f.name}" in out for f in fields(Args))


def test_default_advantage_is_the_papers_r_minus_mean():
    """The appendix (Perspective 2) argues with A = r - mean, whose group variance p(1-p) peaks at p = 0.5; dividing
    by the std (--scale_rewards) gives every mixed group Var(A) = 1 and removes that signal-strength gap."""
    from common.rl.advantages import grpo_advantages
    from common.run.flags import parse_args

    rewards = torch.tensor([[1.0] + [0.0] * 7, [1.0] * 4 + [0.0] * 4])  # p = 1/8 and 1/2
    args = parse_args(Args, [])
    assert args.scale_rewards is False
    _, adv, _ = kept_advantages(rewards, args.scale_rewards)  # main()'s call
    assert torch.equal(adv, rewards - rewards.mean(-1, keepdim=True))
    p = rewards.mean(-1)
    assert torch.allclose(
        (adv**2).mean(-1), p * (1 - p)
    )  # 7/64 < 16/64: the balanced task weighs more
    scaled = grpo_advantages(rewards, scale=parse_args(Args, ["--scale_rewards"]).scale_rewards)
    assert torch.allclose(
        (scaled**2).mean(-1), torch.ones(2), atol=1e-4
    )  # the option: equal weight


def test_bad_flags_exit_with_a_message():
    from common.run.flags import parse_args

    for argv, msg in [
        (["--num_generations", "1"], "--num_generations 1"),
        (["--low", "0.8", "--high", "0.7"], "--low"),
        (["--dataset_name", "openai/gsm8k", "--mode", "multiturn"], "--mode multiturn"),
        (["--reward", "shaped"], "--reward shaped"),
        (["--prefix_ratio", "1.5"], "--prefix_ratio"),
        (["--env_numbers", "4", "--max_turns", "2"], "--max_turns 2"),
    ]:
        with pytest.raises(SystemExit, match=msg):
            parse_args(Args, argv)


@pytest.fixture(scope="session")  # one per worker (its tests share one, conftest.py)
def mt_base(tiny_base, tmp_path_factory) -> str:
    """The multi-turn warm-up ps_grpo.py starts from by default, copied from assets/ (no SFT: the
    build path is test_the_multiturn_warmup_builds_from_its_recipe). The end-to-end tests build
    their outcomes (built_outcomes): they need its multi-step episodes, not its pass rates."""
    from common.demo.countdown_env import MultiTurnRecipe, ensure_multiturn_policy
    from common.demo.tiny_model import SHIPPED

    ps = Args()
    recipe = MultiTurnRecipe(ps.env_numbers, ps.env_max_number, ps.mt_sft_steps)
    saved = {key: os.environ.pop(key, None) for key in ("RLVR_CACHE", "RLVR_NO_SHIPPED")}
    os.environ["RLVR_CACHE"] = str(tmp_path_factory.mktemp("mtcache"))
    try:
        path = ensure_multiturn_policy(tiny_base, recipe, log=lambda *_: None)
    finally:
        os.environ.pop("RLVR_CACHE")
        os.environ.update({key: value for key, value in saved.items() if value is not None})
    assert (SHIPPED / path.name).is_dir(), f"assets/ holds no multi-turn warm-up {path.name}"
    return str(path)


def test_the_multiturn_warmup_builds_from_its_recipe(tiny_base, tmp_path, monkeypatch):
    """ensure_multiturn_policy's build (SFT on solver episodes, saved with its build_info.json) for a
    recipe assets/ does not hold, in a few steps."""
    import dataclasses

    from common.demo.countdown_env import MultiTurnRecipe, ensure_multiturn_policy
    from common.demo.tiny_model import SHIPPED, weights_sha256

    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    recipe = MultiTurnRecipe(3, SMALL, sft_steps=4, lr=3e-3, batch_size=32)
    logs, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # beside the other worker's tests on 2 cores: 20x slower at 2 threads
    try:
        path = ensure_multiturn_policy(tiny_base, recipe, log=logs.append)
    finally:
        torch.set_num_threads(threads)
    assert not (SHIPPED / path.name).exists() and any("SFT steps" in line for line in logs)
    info = json.loads((path / "build_info.json").read_text())
    assert info["recipe"] == dataclasses.asdict(recipe) and info["base"] == tiny_base
    assert info["weights_sha256"] == weights_sha256(path) != weights_sha256(Path(tiny_base))
    assert 0 < info["mt_sft_final_loss"] < 10
    # built once: a second call finds it
    assert ensure_multiturn_policy(tiny_base, recipe, log=logs.append) == path


SMALL = 3
COMMON = [
    "--env_max_number",
    str(SMALL),
    "--env_numbers",
    "3",
    "--prompt_pool",
    "48",
    "--prompts_per_step",
    "8",
    "--eval_prompts",
    "8",
    "--eval_samples",
    "4",
    "--num_threads",
    "1",
]


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def built_outcomes(monkeypatch):
    """The environment's outcomes replaced by a pattern that gives every step what the end-to-end
    tests check, whatever trajectory this CPU's kernels sample: of the fresh tasks, in order, one in
    three too hard (only its longest episode passes), one in three too easy (only its longest fails),
    one in three normal (4 of 8 pass), so each step trains a group and, when the longest episode has
    a proper prefix (2 steps or more; else the task is normal), queues prefix tasks; a prefix task
    passes 6 of 8 (a pass rate above the dead zone: the adaptive controller moves)."""
    from common.tasks.scoring import Scored
    from ps_grpo import AgentEnv

    def score(self, episodes, examples, truncated, step):
        groups: dict[int, list[int]] = {}
        for i, episode in enumerate(episodes):
            groups.setdefault(episode.group, []).append(i)
        success, fresh = [False] * len(episodes), 0
        for members in groups.values():
            if any(episodes[i].replayed_steps for i in members):  # a prefix task
                passing = members[:6]
            else:
                longest = max(members, key=lambda i: len(episodes[i].steps))
                kind = fresh % 3 if len(episodes[longest].steps) >= 2 else 2
                fresh += 1
                passing = [[longest], [i for i in members if i != longest], members[:4]][kind]
            for i in passing:
                success[i] = True
        return Scored([float(ok) for ok in success], {}, 0.0, success)

    monkeypatch.setattr(AgentEnv, "score", score)


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time_", "time/"))} for r in rows]


@pytest.mark.kernel_paths
def test_prefix_sampling_on_and_off(mt_base, built_outcomes, tmp_path):
    run_main(
        [
            "ps_grpo.py",
            "--model_name_or_path",
            mt_base,
            "--output_dir",
            str(tmp_path / "ps"),
            "--max_steps",
            "3",
            "--eval_steps",
            "3",
            *COMMON,
        ]
    )
    run_main(
        [
            "ps_grpo.py",
            "--model_name_or_path",
            mt_base,
            "--output_dir",
            str(tmp_path / "base"),
            "--max_steps",
            "3",
            "--eval_steps",
            "3",
            "--prefix_sampling",
            "false",
            *COMMON,
        ]
    )
    ps, base = _rows(tmp_path / "ps"), _rows(tmp_path / "base")
    assert "eval_pass@1" in ps[0] and "eval_pass@4" in ps[-1] and ps[0]["step"] == 0
    keys = {
        "ps_solve_partial",
        "ps_prefix_tasks",
        "ps_prefix_pass_rate_hard",
        "ps_prefix_pass_rate_easy",
        "ps_ratio_hard",
        "ps_ratio_easy",
        "ps_ema_hard",
        "ps_ema_easy",
        "ps_replayed_tokens",
        "ps_generated_tokens",
        "ps_fresh_pass_rate",
        "pass_rate",
        "frac_zero_var_groups",
        "loss",
        "entropy",
        "ps_ctrl_pass_rate_hard",
        "ps_ctrl_stale_easy",
        "ps_signal_strength",
    }
    assert keys <= set(ps[1]) and keys <= set(base[1])
    ps, base = ps[1:], base[1:]
    # skewed fresh tasks were sent to Prefix & Mask and came back as prefix tasks in the next batch
    assert any(r["ps_queued"] > 0 for r in ps[:-1])
    for prev, r in pairwise(ps):
        assert r["ps_prefix_tasks"] == min(prev["ps_queued"], 4)  # capped at max_prefix_frac * 8
    for r in ps:  # replayed tokens exactly when prefix tasks ran; fresh + prefix tasks = 8 per step
        assert (r["ps_replayed_tokens"] > 0) == (r["ps_prefix_tasks"] > 0)
        assert (r["ps_prefix_pass_rate"] is None) == (r["ps_prefix_tasks"] == 0)
        assert (
            sum(
                r[f"ps_route_{c}"]
                for c in ("all_fail", "all_pass", "normal", "too_hard", "too_easy")
            )
            == 8 - r["ps_prefix_tasks"]
        )
    for r in ps:  # fixed ratios: every prefix task is attributed to the ratio that built it
        assert all(
            r[f"ps_ctrl_stale_{c}"] == 0
            and r[f"ps_ctrl_pass_rate_{c}"] == r[f"ps_prefix_pass_rate_{c}"]
            for c in ("hard", "easy")
        )
    # the advantages trained on are r - mean: a trained group's mean A^2 is p(1-p) in [7/64, 1/4] (1 with / std)
    assert all(7 / 64 - 1e-6 <= r["ps_signal_strength"] <= 0.25 + 1e-6 for r in base + ps)
    assert ps[-1]["rollouts"] == base[-1]["rollouts"] == 3 * 8 * 8
    assert all(r["ps_prefix_tasks"] == r["ps_queued"] == r["ps_replayed_tokens"] == 0 for r in base)


@pytest.mark.kernel_paths
def test_resume_restores_queue_and_controller(mt_base, built_outcomes, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    base = [
        "ps_grpo.py",
        "--model_name_or_path",
        mt_base,
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        "--adaptive",
        "--cooldown",
        "0",
        *COMMON,
    ]
    run_main([*base, "--output_dir", str(full), "--max_steps", "4"])
    run_main([*base, "--output_dir", str(part), "--max_steps", "2"])  # "killed" after step 2
    state = torch.load(part / "checkpoint-2" / "trainer_state.pt", weights_only=True)["state"][
        "method"
    ]
    assert set(state) == {"queue", "ctrl"} and set(state["ctrl"]) == {"hard", "easy"}
    run_main(
        [*base, "--output_dir", str(part), "--max_steps", "4", "--resume_from_checkpoint", "auto"]
    )
    a, b = _strip(_rows(full)), _strip(_rows(part))
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4] and a == b
    assert (
        state["queue"] and b[3]["ps_prefix_tasks"] > 0
    )  # step 3 ran the prefix tasks queued before the "kill"
    moved = [r for r in b[1:] if (r["ps_ratio_hard"], r["ps_ratio_easy"]) != (0.25, 0.25)]
    assert moved  # the controller acted, and its ratios/EMAs continued identically after the resume
    assert all(
        "ratio" in task for task in state["queue"]
    )  # each queued prefix task records the ratio that built it
    for c in (
        "hard",
        "easy",
    ):  # the batch after a move measures the old ratio: stale, not fed (so no move either)
        ratios = [0.25] + [r[f"ps_ratio_{c}"] for r in b[1:]]
        for s, r in enumerate(b[2:], 2):
            if ratios[s - 1] != ratios[s - 2]:
                assert r[f"ps_ctrl_pass_rate_{c}"] is None and ratios[s] == ratios[s - 1]
            else:
                assert r[f"ps_ctrl_stale_{c}"] == 0


def test_text_mode_runs(mt_base, tmp_path):
    """The single-turn path (used for real datasets), here on the Countdown text form."""
    run_main(
        [
            "ps_grpo.py",
            "--model_name_or_path",
            mt_base,
            "--mode",
            "text",
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            "1",
            "--max_completion_length",
            "16",
            *COMMON[4:],
        ]
    )  # (--env_max_number/--env_numbers: multiturn only)
    rows = _rows(tmp_path)
    assert (
        [r["step"] for r in rows] == [0, 1]
        and "eval_pass@1" in rows[1]
        and rows[1]["rollouts"] == 8 * 8
    )
    assert rows[1]["ps_generated_tokens"] > 0 and rows[1]["ps_replayed_tokens"] == 0


# ---------------- evaluation, truncation, sampler agreement, sample log ----------------
def test_episode_eval_gives_pass_at_every_power_of_two_at_the_eval_temperature():
    from types import SimpleNamespace

    from common.envs.tasks import EnvTask
    from common.run.flags import parse_args
    from ps_grpo import AgentEnv, evaluate_episodes, turn_config

    class Gen(ScriptedGenerator):
        def generate(self, prompts, n, cfg):
            self.temperatures = getattr(self, "temperatures", []) + [cfg.temperature]
            return super().generate(prompts, n, cfg)

    args = parse_args(Args, ["--eval_samples", "8", "--env_numbers", "3", "--max_turns", "3"])
    probs = [Problem((14, 1, 10), 5), Problem((3, 4, 5), 7)]
    tasks = [EnvTask({"nums": list(p.nums), "target": p.target}) for p in probs]
    gen, acc = Gen(), SimpleNamespace(process_index=0, num_processes=1)
    env = AgentEnv(args, TOK, print)
    out = evaluate_episodes(env, gen, tasks, args, acc, turn_config(TOK, args, 0.0))
    assert out == {f"eval_pass@{k}": 1.0 for k in (1, 2, 4, 8)} and set(gen.temperatures) == {0.0}


def _text_main(out, extra, monkeypatch, reward):
    """ps_grpo.main in process, single-turn text mode, with a stand-in training reward."""
    import ps_grpo
    from common.run.flags import parse_args

    monkeypatch.setitem(countdown.REWARDS, "binary", reward)
    ps_grpo.main(
        parse_args(
            Args,
            [
                "--mode",
                "text",
                "--output_dir",
                str(out),
                "--prompt_pool",
                "16",
                "--num_generations",
                "4",
                "--prompts_per_step",
                "4",
                "--eval_prompts",
                "4",
                "--num_threads",
                "1",
                *extra,
            ],
        )
    )
    return _rows(out)


def test_text_mode_sample_log_pass_at_k_and_sampler_agreement(tiny_base, tmp_path, monkeypatch):
    from common.tasks import evaluation

    temps = []
    real = evaluation.evaluate
    monkeypatch.setattr(
        evaluation, "evaluate", lambda *a, **k: temps.append(a[5].temperature) or real(*a, **k)
    )
    rows = _text_main(
        tmp_path,
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "2",
            "--eval_steps",
            "0",
            "--eval_samples",
            "8",
            "--eval_temperature",
            "0",
            "--max_completion_length",
            "48",
            "--log_samples_every",
            "1",
            "--log_samples_per_kind",
            "2",
            "--prompts_per_step",
            "8",
        ],
        monkeypatch,
        lambda text, problem: float(len(text) % 2),
    )
    assert temps == [0.0] * 4  # step 0 and the last step, held-out and training prompts, greedy
    assert {f"eval_pass@{k}" for k in (1, 2, 4, 8)} <= set(rows[0]) and "eval_pass@8" in rows[-1]
    # the HF generator in fp32 samples from exactly the policy the trainer scores
    assert all(
        r["sampler_logp_diff"] is not None and r["sampler_logp_diff"] < 1e-4 for r in rows[1:]
    )
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    keys = {
        "step",
        "kind",
        "prompt",
        "completion",
        "reward",
        "advantage",
        "trained",
        "truncated",
        "ps_prefix_steps",
    }
    assert (
        samples and all(keys <= set(s) for s in samples) and {s["step"] for s in samples} == {1, 2}
    )
    for step in (1, 2):
        kinds = [s["kind"] for s in samples if s["step"] == step]
        assert all(kinds.count(kind) <= 2 for kind in kinds) and "fresh" in kinds
    assert all(s["advantage"] == 0.0 for s in samples if not s["trained"])
    assert all(
        s["ps_prefix_steps"] == 0 and "ps_ratio" not in s for s in samples if s["kind"] == "fresh"
    )
    prefix = [
        s for s in samples if s["kind"] != "fresh"
    ]  # step 2 runs a prefix task queued by step 1
    assert prefix and all(
        s["kind"] in ("prefix_hard", "prefix_easy")
        and s["ps_prefix_steps"] >= 1
        and s["ps_ratio"] == 0.25
        for s in prefix
    )


def test_truncated_completions_get_reward_zero(tiny_base, tmp_path, monkeypatch):
    rows = _text_main(
        tmp_path,
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "1",
            "--eval_samples",
            "1",
            "--max_completion_length",
            "2",
            "--mask_truncated_completions",
        ],
        monkeypatch,
        lambda text, problem: 1.0,
    )  # every completion would pass, but each one is cut
    assert (
        rows[1]["clipped_ratio"] == 1.0
        and rows[1]["reward_mean"] == 0.0
        and rows[1]["pass_rate"] == 0.0
    )
    assert (
        rows[1]["ps_trained_groups"] == 0 and rows[1]["sampler_logp_diff"] is None
    )  # all-fail: rejected

    # some cut, some not: the cut ones (reward 0) stay in their group's baseline but get loss mask 0
    import ps_grpo

    seen, trained_tokens = {}, []
    rollout, loss = ps_grpo.rollout_text, ps_grpo.ps_loss
    monkeypatch.setattr(ps_grpo, "rollout_text", lambda *a: seen.setdefault("out", rollout(*a)))
    monkeypatch.setattr(
        ps_grpo,
        "ps_loss",
        lambda logp, old, adv, mask, n_tok, *a: (
            trained_tokens.append((int(mask.sum()), n_tok)) or loss(logp, old, adv, mask, n_tok, *a)
        ),
    )
    # 16 tokens: the base's two-line mid answers (~7 characters a line + EOS) straddle it
    rows = _text_main(
        tmp_path / "mixed",
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "1",
            "--eval_samples",
            "1",
            "--max_completion_length",
            "16",
            "--mask_truncated_completions",
        ],
        monkeypatch,
        lambda text, problem: 1.0,
    )
    episodes, clipped = seen["out"]
    assert 0 < rows[1]["clipped_ratio"] < 1 and rows[1]["reward_mean"] == pytest.approx(
        1 - rows[1]["clipped_ratio"]
    )
    groups = [range(g * 4, g * 4 + 4) for g in range(4)]
    want = sum(
        episodes[i].generated_tokens
        for g in groups
        if 0 < sum(clipped[i] for i in g) < 4
        for i in g
        if not clipped[i]
    )
    assert want > 0 and sum(m for m, _ in trained_tokens) == trained_tokens[0][1] == want


def test_queued_tasks_come_back_in_the_order_they_were_dealt_on_every_rank():
    # The ranks' prefix tasks, gathered rank by rank, go back in the whole batch's order (the order
    # one process builds them in): the overflow cut (--max_prefix_frac) then keeps the same tasks on
    # any number of ranks. Every rank's groups as my_slice deals them, each skewed one building a
    # task; the earliest skewed group sits on rank 1 in several cases.
    from types import SimpleNamespace

    from common.distributed.ranks import my_indices

    for world in (1, 2, 3):
        for num in (5, 11):
            for skewed in ({1, 2, 3}, {1, 4, num - 1}, set(range(num)), {0}, set()):
                built = []  # gather_list's result: rank 0's list, then rank 1's, ...
                for rank in range(world):
                    mine = my_indices(num, SimpleNamespace(process_index=rank, num_processes=world))
                    built += [
                        (rank, group, BatchTask(place))
                        for group, place in enumerate(mine)
                        if place in skewed
                    ]
                queue = [task.prompt_id for task in batch_order(built, world)]
                assert queue == sorted(skewed), (world, num, skewed, queue)


def test_the_batch_caps_prefix_tasks_drops_the_rest_and_fills_with_fresh_tasks():
    queue = [BatchTask(i, "hard", steps=[None]) for i in range(5)]
    fresh = iter(range(100, 200))

    def next_ids(count):
        return [next(fresh) for _ in range(count)]

    batch, dropped = assemble_batch(queue, next_ids, 8, 0.5)
    assert [task.prompt_id for task in batch] == [0, 1, 2, 3, 100, 101, 102, 103]
    assert [task.category for task in batch[4:]] == [None] * 4 and dropped == 1
    batch, dropped = assemble_batch(queue[:2], next_ids, 8, 0.5)
    assert [task.prompt_id for task in batch] == [0, 1, 104, 105, 106, 107, 108, 109]
    assert dropped == 0


def test_rejection_drops_the_groups_with_one_reward():
    rewards = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    keep, advantages, trained_ids = kept_advantages(rewards, False)
    assert keep.tolist() == [True, False, False, True]
    assert trained_ids == [0, 1, 2, 9, 10, 11]
    assert torch.allclose(advantages[0], torch.tensor([2 / 3, -1 / 3, -1 / 3]))


def test_skewed_fresh_tasks_become_prefix_tasks_of_their_category():
    from common.rl.episode import Episode as Rollout

    n, steps = 8, 4
    passes = [1, 7, 4, 1]  # too hard, too easy, normal, and a prefix task (not routed again)
    tasks = [BatchTask(0), BatchTask(1), BatchTask(2), BatchTask(3, "hard", steps=[None])]
    success = torch.tensor([[i < k for i in range(n)] for k in passes])
    episodes = []
    for group in range(len(tasks)):
        for i in range(n):
            rollout = Rollout(group)
            for d in range(steps):
                rollout.add_turn([100 * group + 10 * i + d], [], [0.0])
            episodes.append(rollout)
    routes = [route(k, n, 0.3, 0.7) for k in passes]
    controllers = {"hard": PrefixController(0.25), "easy": PrefixController(0.25)}
    args = Args()
    built = prefix_tasks(tasks, routes, episodes, success, controllers, args)
    assert [(group, task.category) for group, task in built] == [(0, "hard"), (1, "easy")]
    hard, easy = built[0][1], built[1][1]
    # too hard: the one success's first T - int(T x 0.25) steps; too easy: one failure's first step
    assert [action for action, _ in hard.steps] == [[0], [1], [2]]
    assert len(easy.steps) == 1 and easy.steps[0][0][0] // 10 == 17
    assert (
        prefix_tasks(tasks, routes, episodes, success, controllers, Args(prefix_sampling=False))
        == []
    )
