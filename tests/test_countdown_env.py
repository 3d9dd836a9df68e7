"""The multi-turn Countdown environment: transitions, episodes, and exact prefix replay."""

import random

import pytest

from common.demo import countdown
from common.demo.countdown import Problem
from common.demo.countdown_env import (
    CountdownEnv,
    Episode,
    make_env_task,
    replay,
    replay_episode,
    solver_episode,
    state_text,
)
from common.demo.tiny_model import build_char_tokenizer

P = Problem((14, 1, 10), 5)
TOK = build_char_tokenizer()


def ENC(s):
    return TOK(s, add_special_tokens=False).input_ids


def DEC(ids):
    return TOK.decode(ids, skip_special_tokens=True)


def test_a_solved_episode_turn_by_turn():
    env = CountdownEnv(P)
    assert env.reset() == "14 1 10 t5\n"
    r = env.step("14-10=4\n")
    assert (r.observation, r.done, r.reward, r.status) == ("1 4 t5\n", False, 0.0, "ok")
    assert env.numbers == [1, 4]  # operands consumed, result appended
    r = env.step("4+1=5")
    assert (r.observation, r.done, r.reward, r.status) == ("solved\n", True, 1.0, "solved")
    assert env.turns == [("14-10=4", "1 4 t5\n"), ("4+1=5", "solved\n")]
    with pytest.raises(RuntimeError):
        env.step("1+1=2")


@pytest.mark.parametrize(
    "action,status",
    [
        ("14-10=5", "invalid"),  # wrong arithmetic
        ("14-3=11", "invalid"),  # 3 is not available
        ("10-10=0", "invalid"),  # only one 10, and results must be positive
        ("14 - 10 = 4", "invalid"),  # not the step format
        ("1" * 40, "invalid"),  # over the length cap
        ("", "stopped"),  # the agent stops
    ],
)
def test_episode_ends_on_bad_or_empty_actions(action, status):
    env = CountdownEnv(P)
    r = env.step(action)
    assert r.done and r.reward == 0.0 and r.status == status and env.numbers == [14, 1, 10]


def test_wrong_final_value_stop_and_retry_modes():
    env = CountdownEnv(P)
    env.step("14+1=15")
    r = env.step("15+10=25")
    assert (r.status, r.reward, r.done) == ("wrong", 0.0, True)
    # EOS after a non-final step: the agent answered before using every number
    r = CountdownEnv(P).step("14-10=4", final=True)
    assert (r.status, r.done, r.reward) == ("stopped", True, 0.0)
    # retry: an invalid action is answered with an error and the unchanged state; the turn budget still ends it
    env = CountdownEnv(P, max_turns=3, invalid="retry")
    r = env.step("14-10=5")
    assert (r.observation, r.done) == ("invalid\n14 1 10 t5\n", False)
    assert not env.step("14-10=4").done
    r = env.step("4*1=4")
    assert r.done and r.status == "wrong"
    env = CountdownEnv(P, max_turns=2, invalid="retry")
    env.step("1+1=2")
    assert env.step("2+2=4").status == "out_of_turns" and env.done


def test_env_reward_equals_the_single_turn_checker():
    """Feeding a text completion line by line to the environment scores it like countdown.check."""
    rng = random.Random(0)
    train, _ = countdown.make_splits()
    for p in train[:300]:
        nums, lines = list(p.nums), []
        while len(nums) > 1:  # a random sequence of valid moves, sometimes corrupted
            a, b = rng.sample(nums, 2)
            x, op, y, c = rng.choice(countdown._combine(a, b))
            if rng.random() < 0.1:
                c += 1
            lines.append(f"{x}{op}{y}={c}")
            nums.remove(x)
            nums.remove(y)
            nums.append(c)
        env = CountdownEnv(p)
        for line in lines:
            if env.done:
                break
            env.step(line + "\n")
        assert env.reward == countdown.reward_binary(countdown.solution_text(lines), p)
        sol = solver_episode(p, rng.choice(countdown.solutions(p)), ENC)
        assert sol.reward == 1.0


def _play(problem, actions):
    """An episode as the trainer builds it: action tokens (generated, mask 1) then observation tokens."""
    ep = Episode(0, env=CountdownEnv(problem))
    for a in actions:
        ids = ENC(a + "\n")
        ep.add_turn(ids, ENC(ep.env.step(a + "\n").observation), [-0.5] * len(ids))
    return ep


def test_replay_restores_state_and_tokens_exactly():
    rng = random.Random(1)
    train, _ = countdown.make_splits(n_numbers=4, hi=10)
    for p in train[:20]:
        actions = rng.choice(countdown.solutions(p))
        full = _play(p, actions)
        assert full.env.reward == 1.0 and len(full.steps) == 3
        for k in range(len(actions)):  # every proper prefix, K = 0 .. T - 1
            rep = replay_episode(p, full.steps[:k], 7, DEC, ENC)
            ref = replay(p, actions[:k])  # the same, at the text level
            cut = sum(len(a) + len(o) for a, o in full.steps[:k])
            assert rep.ids == full.ids[:cut]  # the same conversation, token for token
            assert rep.env.state == ref.state and rep.env.numbers == ref.numbers
            assert rep.env.turns == full.env.turns[:k] and not rep.env.done
            assert (
                rep.mask == [0] * cut and rep.generated_tokens == 0
            )  # replayed: no gradient, no generation
            assert rep.replayed_tokens == sum(len(a) for a, _ in full.steps[:k]) and rep.group == 7
            # continuing the replayed episode with the stored actions reaches the same end
            for a in actions[k:]:
                ids = ENC(a + "\n")
                rep.add_turn(ids, ENC(rep.env.step(a).observation), [0.0] * len(ids))
            assert rep.ids == full.ids and rep.env.state == full.env.state
            assert rep.mask[cut:] == full.mask[cut:]


def test_replay_checks_the_stored_observations():
    full = _play(P, ["14-10=4", "4+1=5"])
    tampered = [(full.steps[0][0], ENC("1 4 t6\n"))]
    with pytest.raises(RuntimeError, match="diverged"):
        replay_episode(P, tampered, 0, DEC, ENC)
    with pytest.raises(ValueError, match="unfinished"):
        replay_episode(
            P, full.steps, 0, DEC, ENC
        )  # replaying a whole trajectory leaves nothing to do


def test_episode_masks_and_token_counts():
    ep = Episode(3)
    ep.add_turn([1, 2], [9])  # replayed
    ep.add_turn([3, 4, 5], [8, 8], [-1.0, -2.0, -3.0])  # generated
    assert ep.ids == [1, 2, 9, 3, 4, 5, 8, 8]
    assert ep.mask == [0, 0, 0, 1, 1, 1, 0, 0]
    assert ep.old_logp == [0, 0, 0, -1.0, -2.0, -3.0, 0, 0]
    assert (ep.generated_tokens, ep.replayed_tokens, ep.replayed_steps) == (3, 2, 1)
    ep = solver_episode(P, ["14-10=4", "4+1=5"], ENC)
    assert DEC(ep.ids) == "14-10=4\n1 4 t5\n4+1=5\nsolved\n"
    assert [t for t, m in zip(DEC(ep.ids), ep.mask) if m] == list(
        "14-10=4\n4+1=5\n"
    )  # loss on actions only


def test_state_text_and_task_match_the_single_turn_task():
    assert state_text([1, 4], 5) == "1 4 t5\n"
    from common.demo.countdown import countdown_task

    train, evals = make_env_task(eval_prompts=16)
    ref = countdown_task("binary", 16)
    assert [(e.id, e.prompt, e.answer) for e in evals] == [
        (e.id, e.prompt, e.answer) for e in ref.eval
    ]
    assert [(e.id, e.prompt) for e in train[:50]] == [(e.id, e.prompt) for e in ref.train[:50]]
    assert len(make_env_task(prompt_pool=48)[0]) == 48


def test_the_text_protocol_class_passes_final_on_to_the_game():
    """CountdownGame, what ps_grpo plays through the text protocol: an action that ended with EOS
    (`final`) ends the episode there, as CountdownEnv's own step does."""
    from common.demo.countdown_env import CountdownGame
    from common.envs.protocol import Environment

    env = Environment(CountdownGame)
    assert env.step_takes_final
    row = {"nums": list(P.nums), "target": P.target}
    for final, expected in ((True, ("stopped\n", 0.0, True)), (False, ("1 4 t5\n", 0.0, False))):
        game = env.new()
        env.reset(game, row)
        assert env.step(game, "14-10=4", final) == expected
    # retry mode: an invalid action still ends the episode when the agent said it was done
    game = CountdownGame(invalid="retry")
    game.reset(**row)
    assert game.step("14-10=5", final=True) == ("invalid\n", 0.0, True)
