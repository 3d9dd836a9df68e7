import time
import warnings
from collections import Counter

import pytest

from common.demo import countdown as cd
from common.demo.countdown import Problem, check, reward_binary, reward_shaped, reward_tinyzero

P = Problem((14, 1, 10), 5)


# --- problem space -----------------------------------------------------------------------------------


def test_problem_counts():
    # Convention: sorted multisets of numbers (repeats allowed) x reachable targets in 1..100.
    assert len(cd.enumerate_problems()) == 16_292  # 3 numbers in 1..20, + - * /
    assert len({p.nums for p in cd.enumerate_problems()}) == 1_540  # C(22, 3) multisets
    # The quoted 1..9 figure of 1,865 is the same convention *without division*; with / it is 2,145.
    assert len(cd.enumerate_problems(hi=9, ops="+-*")) == 1_865
    assert len(cd.enumerate_problems(hi=9)) == 2_145


def test_enumeration_is_canonical_and_deterministic():
    probs = cd.enumerate_problems()
    assert probs == cd.enumerate_problems()
    assert all(list(p.nums) == sorted(p.nums) and 1 <= p.target <= 100 for p in probs)
    assert len(set(probs)) == len(probs)


def test_reachable_targets_hand_worked():
    # (2,3): 5 1 6 -> with 4: 9 1 20 | 5 3 4 | 10 2 24
    # (2,4): 6 2 8 -> with 3: 9 3 18 2 | 5 1 6 | 11 5 24
    # (3,4): 7 1 12 -> with 2: 9 5 14 | 3 1 2 | 14 10 24 6
    expected = {1, 2, 3, 4, 5, 6, 9, 10, 11, 14, 18, 20, 24}
    assert cd.reachable_targets((2, 3, 4)) == expected
    assert cd.reachable_targets((4, 2, 3)) == expected  # order-free
    assert cd.reachable_targets((2, 3, 4), max_target=10) == {t for t in expected if t <= 10}
    # Intermediates may exceed max_target: 20*20=400, 400/4=100.
    assert 100 in cd.reachable_targets((20, 20, 4))
    assert cd.reachable_targets((1, 1, 1)) == {1, 2, 3}  # 1-1=0 is not a positive intermediate


def test_splits_deterministic_disjoint_and_fast():
    cd._splits.cache_clear()
    t0 = time.perf_counter()
    train, ev = cd.make_splits(seed=0)
    assert time.perf_counter() - t0 < 2.0
    assert (train, ev) == cd.make_splits(seed=0)
    assert len(ev) == 256
    # Disjoint on the number multiset: eval triples never appear in train, with any target.
    key = lambda p: tuple(sorted(p.nums))  # noqa: E731
    eval_sets = {key(p) for p in ev}
    assert len(eval_sets) == 256  # one problem per held-out multiset
    assert not eval_sets & {key(p) for p in train}
    # Train is everything else: all 16,292 problems minus those of the 256 held-out multisets.
    all_probs = cd.enumerate_problems()
    assert len(train) == sum(p.nums not in eval_sets for p in all_probs)
    assert {(key(p), p.target) for p in train} | {(key(p), p.target) for p in ev} <= {
        (p.nums, p.target) for p in all_probs
    }
    # Display order is shuffled (not always sorted), and a different seed gives a different split.
    assert any(list(p.nums) != sorted(p.nums) for p in train[:50])
    assert cd.make_splits(seed=1)[1] != ev


def test_splits_small_space():
    # 1..9 has only 165 multisets: at most half are held out, extra eval problems come round-robin.
    train, ev = cd.make_splits(seed=0, n_eval=256, hi=9)
    held = {tuple(sorted(p.nums)) for p in ev}
    assert len(held) == 82 and len(ev) == 256
    assert not held & {tuple(sorted(p.nums)) for p in train}


# --- formats and solutions ---------------------------------------------------------------------------


def test_text_formats():
    assert cd.prompt_text(P) == "14 1 10 t5\n"
    assert cd.solution_text(["14-10=4", "4+1=5"]) == "14-10=4\n4+1=5\n"


def test_solutions_hand_worked():
    assert cd.solutions(P) == [["10-1=9", "14-9=5"], ["14+1=15", "15-10=5"], ["14-10=4", "4+1=5"]]
    assert cd.solutions(Problem((2, 3, 4), 7)) == []


def test_every_solution_verifies():
    probs = cd.enumerate_problems()[::97] + cd.make_splits()[1][:40]
    for p in probs:
        sols = cd.solutions(p)
        assert sols, p  # every enumerated problem is solvable
        for s in sols:
            assert check(cd.solution_text(s), p).correct, (p, s)
            assert len(s) == len(p.nums) - 1


# --- checker and reward tiers ------------------------------------------------------------------------


def rewards(text, p=P):
    return reward_binary(text, p), reward_tinyzero(text, p), reward_shaped(text, p)


def test_correct_answers():
    for text in ["14-10=4\n4+1=5\n", "14-10=4\n4+1=5", "14-10=4\n\n1+4=5\n\n", "10-1=9\n14-9=5"]:
        assert check(text, P) == cd.Verdict(True, True, True, 5, True)
        assert rewards(text) == (1.0, 1.0, 1.0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "\n\n\n",
        "14-10=4\n4+1=5 ",
        " 14-10=4\n4+1=5",
        "14 - 10 = 4\n4 + 1 = 5",
        "14-10=4\r\n4+1=5",
        "14-10=4\nanswer: 5",
        "5",
        "14-10-4=0",
        "(14-10)+1=5",
        "4+1=5=5",
        "14-10=-4",
        "14x10=140",
    ],
)
def test_not_well_formed(text):
    v = check(text, P)
    assert not v.well_formed and v.value is None and not v.correct
    assert rewards(text) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "text,arith,nums",
    [
        ("14-10=4\n4+1=6", False, True),  # wrong result
        (
            "1-10=0\n14+0=14",
            False,
            True,
        ),  # 1-10 is not 0 (nor positive); stated values are bookkept
        ("10-10=0\n14+1=15", False, False),  # zero result; 10 reused
        ("14/10=1\n1*1=1", False, True),  # inexact division (14/10 is not 1)
        ("10/0=0\n14+1=15", False, False),  # division by zero
        ("14-10=4\n4+4=8", True, False),  # result 4 reused, 1 unused
        ("14-10=4\n14+1=15", True, False),  # original 14 reused
        ("14-10=4", True, False),  # 1 unused
        ("14-10=4\n4+1=5\n5*1=5", True, False),  # extra step reuses 1
        ("14-11=3\n3+2=5", True, False),  # numbers not in the problem
    ],
)
def test_wrong_numbers_or_arithmetic(text, arith, nums):
    v = check(text, P)
    assert v.well_formed and v.arithmetic_ok is arith and v.numbers_ok is nums and not v.correct
    assert rewards(text) == (0.0, 0.1, 0.05)


def test_zero_result_rejected_even_if_it_hits_target():
    # 5-5=0 is true arithmetic but not a positive integer, so "adding 0" cannot be used to finish.
    p = Problem((5, 5, 3), 3)
    v = check("5-5=0\n3+0=3", p)
    assert v.well_formed and v.numbers_ok and not v.arithmetic_ok and v.value == 3 and not v.correct
    assert rewards("5-5=0\n3+0=3", p) == (0.0, 0.1, 0.05)


def test_valid_but_wrong_target_proximity():
    # 14+10=24, 24-1=23: valid, value 23 vs target 5 -> prox = max(0, 1 - 18/5) = 0 -> 0.1.
    assert check("14+10=24\n24-1=23", P) == cd.Verdict(True, True, True, 23, False)
    assert rewards("14+10=24\n24-1=23") == (0.0, 0.1, pytest.approx(0.1))
    # Target 20 from (14, 1, 10): 14+10=24, 24-1=23 -> prox = 1 - 3/20 = 0.85 -> 0.1 + 0.34 = 0.44.
    p20 = Problem((14, 1, 10), 20)
    assert rewards("14+10=24\n24-1=23", p20) == (0.0, 0.1, pytest.approx(0.44))
    # 14-10=4, 4*1=4 -> prox = 1 - 16/20 = 0.2 -> 0.1 + 0.08 = 0.18.
    assert rewards("14-10=4\n4*1=4", p20) == (0.0, 0.1, pytest.approx(0.18))


def test_step_may_reuse_value_equal_to_an_original():
    # (2, 2, 4): 2+2=4 makes a second 4 available; 4*4 uses the result and the original.
    p = Problem((2, 2, 4), 16)
    assert check("2+2=4\n4*4=16", p).correct
    assert not check("2+2=4\n4*4=16\n4+4=8", p).numbers_ok  # a third 4 does not exist


# --- hostile input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "1" * 10_000,
        "14-10=4\n" * 2_000,
        "9**9**9",
        "9**9**9=1",
        "99999999*99999999=1",
        "9999*9999=99980001",
        "١٤-١٠=٤\n٤+١=٥",
        "１４-１０=４\n４+１=５",
        "14-10=٤\n٤+1=5",
        "",
        "\n" * 5,
        "\n" * 300,
        "14-10=4\n4+1=5\x00",
        "14-10=4\u20284+1=5",
        "(" * 10_000,
    ],
)
def test_hostile_strings_fast_and_zero(text):
    for f in cd.REWARDS.values():
        t0 = time.perf_counter()
        r = f(text, P)
        assert time.perf_counter() - t0 < 0.05
        assert r == 0.0, (f, text[:40])


def test_rewards_registry():
    assert set(cd.REWARDS) == {"binary", "tinyzero", "shaped"}
    assert Counter(r("14-10=4\n4+1=5", P) for r in cd.REWARDS.values()) == Counter({1.0: 3})


# --- the embedded level mix ----------------------------------------------------------------------------


def test_level_splits_shares_tags_and_unseen_multisets():
    train, held = cd.make_level_splits()
    assert (train, held) == cd.make_level_splits()  # deterministic
    assert cd.make_level_splits(seed=1)[1] != held
    tags = Counter(tag for tag, _ in train)
    for level in cd.LEVELS:
        mine = [p for tag, p in train if tag == level.tag]
        assert all(len(p.nums) == level.n_numbers and max(p.nums) <= level.hi for p in mine)
        assert abs(tags[level.tag] - level.weight * 4096) <= 1  # each level gets its share
        seen = {tuple(sorted(p.nums)) for p in mine}
        unseen = [p for tag, p in held if tag == level.tag]
        assert unseen and not seen & {
            tuple(sorted(p.nums)) for p in unseen
        }  # held-out multisets never trained
    assert len(held) <= 256 and {tag for tag, _ in held} == {level.tag for level in cd.LEVELS}
    # shuffled together: the first prompts (a --prompt_pool) already hold every level
    assert {tag for tag, _ in train[:64]} == {level.tag for level in cd.LEVELS}


def test_sample_steps_aims_or_ignores_the_target():
    import random

    rng = random.Random(0)
    for tag, p in cd.make_level_splits()[0][:60]:
        assert check(cd.solution_text(cd.sample_steps(p, rng)), p).correct
        careless = check(cd.solution_text(cd.sample_steps(p, rng, aim=False)), p)
        assert (
            careless.well_formed and careless.arithmetic_ok and careless.numbers_ok
        )  # valid, only the value is free
    values = {
        check(
            cd.solution_text(cd.sample_steps(Problem((3, 7, 2, 9, 5), 61), rng, aim=False)),
            Problem((3, 7, 2, 9, 5), 61),
        ).value
        for _ in range(50)
    }
    assert len(values) > 10  # careless chains land on many values, not the target
    with pytest.raises(ValueError, match="no solution"):
        cd.sample_steps(Problem((1, 1), 7), rng)


def test_countdown_task_tags_and_per_level_eval_metrics():
    from common.tasks.evaluation import pass_metrics

    task = cd.countdown_task("binary", 256)
    assert {e.tag for e in task.eval} == {"easy", "mid", "hard"}
    assert all(
        len(e.answer.nums) == {"easy": 2, "mid": 3, "hard": 5}[e.tag] for e in task.train[:200]
    )
    out = pass_metrics([4, 0, 2, 1], 4, ["easy", "hard", "mid", "mid"])
    assert out["eval_pass@1"] == pytest.approx(7 / 16) and out["eval_pass@1_easy"] == 1.0
    assert out["eval_pass@1_hard"] == 0.0 and out["eval_pass@1_mid"] == pytest.approx(3 / 8)
    assert out["eval_pass@4"] == pytest.approx(3 / 4)
    assert set(pass_metrics([1, 2], 2, ["", ""])) == {
        "eval_pass@1",
        "eval_pass@2",
    }  # untagged: no level metrics
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" would be one
        assert pass_metrics([], 4, []) == {}  # no held-out prompt: no figure, not NaN


def test_level_splits_are_kept_on_disk_and_read_back_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    levels = (cd.Level("easy", 2, 10, 0.5), cd.Level("mid", 3, 8, 0.5))
    cd._level_splits.cache_clear()
    computed = cd.make_level_splits(levels, seed=3, n_eval=8, n_train=64)
    [saved] = (tmp_path / "countdown-splits").iterdir()
    cd._level_splits.cache_clear()
    monkeypatch.setattr(
        cd, "_compute_level_splits", lambda *a: pytest.fail("recomputed despite the saved file")
    )
    assert (
        cd.make_level_splits(levels, seed=3, n_eval=8, n_train=64) == computed
    )  # read back, Problems and all
    assert isinstance(computed[0][0][1], cd.Problem)
    # a damaged file is recomputed and replaced; other arguments get a file of their own
    monkeypatch.undo()
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path))
    saved.write_text('[[["easy", [1, 2')
    cd._level_splits.cache_clear()
    assert cd.make_level_splits(levels, seed=3, n_eval=8, n_train=64) == computed
    assert saved.read_text().startswith('[[["') and len(saved.read_text()) > 100
    cd.make_level_splits(levels, seed=4, n_eval=8, n_train=64)
    assert len(list((tmp_path / "countdown-splits").iterdir())) == 2
    cd._level_splits.cache_clear()
