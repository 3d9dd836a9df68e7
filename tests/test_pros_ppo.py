"""PROS on PPO: cut selection, the query tree, selection, GAE, prefix masking, and the script end to end."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import run_main, run_script

import pros_ppo
from common.run.flags import parse_args
from common.tasks.loading import PromptSampler
from pros_ppo import (
    Args,
    QueryTree,
    child_candidates,
    choose_cut,
    gae_advantages,
    select_nodes,
    value_loss,
)

# ---------------------------------------------------------------- t* (Section 3)


def test_cut_is_the_entropy_argmax_inside_the_window():
    ent = np.array(
        [9.0, 0.1, 0.2, 0.3, 0.9, 0.4, 0.5, 0.6, 0.7, 0.8, 5.0, 8.0]
    )  # T = 12: window [3, 9)
    t = choose_cut(ent, None, inherited=0, length=12)
    assert t == 4  # the global maxima at 0, 10, 11 lie outside [⌊T/4⌋, ⌊3T/4⌋)
    # an inherited prefix raises the lower bound: entries start at position `inherited`
    t = choose_cut(ent[5:], None, inherited=5, length=12)
    assert 5 <= t < 9 and t == 8  # window [5, 9): max of positions 5..8 (entropies 0.4 0.5 0.6 0.7)
    assert choose_cut(ent[9:], None, inherited=9, length=12) is None  # window empty: no child
    assert choose_cut(np.ones(1), None, inherited=0, length=1) is None  # too short: [0, 0)


def test_window_is_the_papers_real_valued_quarter_bounds():
    # the paper's t in [T/4, 3T/4): T = 9 gives {3, 4, 5, 6} (2.25 <= t < 6.75), not {2..5}; a one-hot entropy at
    # t is chosen exactly when t is in the window
    def window(length):
        return {
            t
            for t in range(length)  # noqa: E731
            if choose_cut(np.eye(length)[t], None, 0, length) == t
        }

    assert window(9) == {3, 4, 5, 6} and window(8) == {2, 3, 4, 5} and window(10) == {3, 4, 5, 6, 7}
    assert window(2) == {1} and window(1) == set()  # T = 2: 0.5 <= t < 1.5


def test_with_a_critic_the_top_values_over_the_rollout_meet_the_window_and_entropy_decides():
    ent, val = (
        np.zeros(40),
        -np.arange(40) / 1000,
    )  # T = 40: window [10, 30); distinct low values elsewhere
    ent[[15, 12, 25, 20]] = [9.0, 1.0, 2.0, 3.0]
    val[[35, 12, 25, 20]] = [
        1.0,
        0.9,
        0.8,
        0.7,
    ]  # top ⌈10%·40⌉ = 4 of the rollout: 35 (outside), 12, 25, 20
    assert choose_cut(ent, None, 0, 40) == 15  # entropy alone
    assert (
        choose_cut(ent, val, 0, 40, value_top_frac=0.1) == 20
    )  # the entropy argmax of {12, 20, 25}
    assert choose_cut(ent, val, 0, 40, value_top_frac=0.05) == 12  # top 2: {35, 12}
    # a child (L = 10, T = 30): only positions 10..29 have values, the top ⌈10%·(T - L)⌉ = 2 of them count
    ent, val = (
        np.zeros(21),
        -np.arange(21) / 1000,
    )  # entry j is position 10 + j; the last one is the stop token
    ent[[2, 8]], val[[15, 2, 8, 20]] = (
        [1.0, 5.0],
        [1.0, 0.9, 0.8, 9.0],
    )  # positions 12, 18; 25, 12, 18; stop
    assert (
        choose_cut(ent, val, 10, 30) == 12
    )  # window [10, 23); top 2 = {25, 12}; 18 is third (ignored)


def test_with_a_critic_an_empty_intersection_falls_back_to_the_window_highest_value():
    ent, val = (
        np.zeros(40),
        np.arange(40) / 40,
    )  # values rise to the end: the top 4 (36..39) miss [10, 30)
    ent[[15, 28]] = [9.0, 5.0]
    assert choose_cut(ent, val, 0, 40) == 29  # the window's highest value, whatever the entropy
    val[[17, 23]] = (
        0.8  # a tie for the window's highest value: entropy decides among the tied positions
    )
    ent[23] = 1.0
    assert choose_cut(ent, val, 0, 40) == 23
    # a fresh critic (zero head) ties everywhere: every position is in the top, so entropy alone decides
    assert choose_cut(ent, np.zeros(40), 0, 40) == choose_cut(ent, None, 0, 40) == 15


def test_child_candidates_come_from_correct_rollouts_and_extend_the_prefix():
    stop = {2}
    prefix = (7, 7)
    conts = [
        [5, 5, 5, 5, 5, 5, 2],
        [6, 6, 6, 6, 6, 6, 2],
    ]  # full responses have T = 8 tokens + stop
    # entry j is position 2 + j; window [max(2, ⌊8/4⌋), ⌊3·8/4⌋) = [2, 6)
    ents = [np.array([0, 0, 0, 9.0, 20.0, 0, 0]), np.array([0, 3.0, 0, 0, 0, 0, 0])]
    c = child_candidates(prefix, conts, [False, True], ents, None, stop, 0.1)
    assert c == [(7, 7, 6)]  # only the correct rollout; cut at its entropy argmax (position 3)
    c = child_candidates(prefix, conts, [True, True], ents, None, stop, 0.1)
    assert c == [
        (7, 7, 5, 5, 5),
        (7, 7, 6),
    ]  # position 6 (entropy 20) is outside the window; best first
    flat = [
        np.zeros(7)
    ]  # all ties: t* = 2 = the inherited length, which would reproduce the node itself
    assert child_candidates(prefix, conts[:1], [True], flat, None, stop, 0.1) == []


def test_every_correct_rollout_with_a_new_cut_becomes_a_child_unless_capped():
    stop, prefix = {2}, ()
    conts = [
        [3, 4, 5, 6, 7, 8, 9, 10, 2],
        [4, 4, 4, 4, 4, 4, 4, 4, 2],
        [5, 5, 5, 5, 5, 5, 5, 5, 2],
        [3, 4, 5, 6, 7, 8, 9, 10, 2],
        [6, 6, 6, 6, 6, 6, 6, 6, 2],
    ]  # T = 8: window [2, 6)
    ents = [np.eye(9)[3] * 3, np.eye(9)[4] * 4, np.eye(9)[5] * 5, np.eye(9)[3], np.eye(9)[4] * 9]
    # three correct rollouts with distinct cuts, a fourth duplicating the first's cut, a wrong one
    cands = child_candidates(prefix, conts, [True, True, True, True, False], ents, None, stop, 0.1)
    assert cands == [
        (5, 5, 5, 5, 5),
        (4, 4, 4, 4),
        (3, 4, 5),
    ]  # highest entropy at t* first, distinct

    def tree_with(*children):
        tree = QueryTree()
        tree.add(7, (), 0, 0.0)
        for child in children:
            tree.add(7, child, 0, 0.0)
        return tree

    tree = tree_with()
    assert (
        tree.add_children(7, cands, 1, 0.0) == 3 and len(tree) == 4
    )  # the paper: one per correct rollout
    assert tree.parent.tolist() == [-1, 0, 0, 0] and tree.prefix[1:] == cands
    tree = tree_with()
    assert tree.add_children(7, cands, 1, 0.0, cap=1) == 1 and tree.prefix == [
        (),
        (5, 5, 5, 5, 5),
    ]  # the best
    tree = tree_with(
        (5, 5, 5, 5, 5)
    )  # already in the pool: not new, and not counted against the cap
    assert tree.add_children(7, cands, 1, 0.0, cap=1) == 1 and tree.prefix[-1] == (4, 4, 4, 4)
    assert tree.add_children(7, cands, 2, 0.0) == 1 and len(tree) == 4
    with pytest.raises(SystemExit, match="--max_children_per_group -1: must be >= 0"):
        parse_args(Args, ["--max_children_per_group", "-1"])


# ---------------------------------------------------------------- the tree and selection (Section 4)


def test_tree_children_attach_to_the_root_and_state_round_trips():
    tree = QueryTree()
    r = tree.add(3, (), 1, 0.0)
    c1 = tree.add(3, (1, 2), 1, 0.0)
    c2 = tree.add(3, (1, 2, 3), 2, 0.0)  # a child of a child: still the root's child
    assert tree.parent.tolist() == [-1, r, r] and tree.add(3, (1, 2), 5, 0.0) == c1  # no duplicates
    tree.observe([r, c2, c2], [1.0, 2.0, 0.0], [4.0, 4.0, 4.0], 0.5, 3, "iteration")
    assert tree.n.tolist() == [4.0, 0.0, 8.0] and tree.s.tolist() == [1.0, 0.0, 2.0]
    tree.gibbs(Args(), np.random.default_rng(0))
    t2 = QueryTree(tree.state_dict())
    assert t2.index == tree.index and np.array_equal(t2.psi, tree.psi) and t2.prefix == tree.prefix


def test_eviction_is_bounded_and_drops_the_least_recent_first():
    tree = QueryTree()
    for pid in range(6):
        tree.add(pid, (), pid, 0.0)  # root pid was last observed at step pid
    tree.add(0, (9,), 10, 0.0)  # root 0 has a recent child: it counts as recent
    gone = tree.evict(4)
    assert gone == 3 and len(tree) == 4
    assert sorted(set(tree.pid.tolist())) == [0, 4, 5]  # roots 1, 2, 3 (oldest) went
    assert tree.parent[tree.index[(0, (9,))]] == tree.index[(0, ())]  # parent ids re-mapped
    tree.add(7, (), 11, 0.0)
    assert tree.evict(2) == 3  # roots 4, 5, then the child (children go before their root on ties)
    assert sorted(tree.pid.tolist()) == [0, 7] and (tree.parent < 0).all()
    assert tree.index == {(0, ()): 0, (7, ()): 1}


def test_selection_prefers_pass_rates_near_half_one_node_per_root():
    theta = np.array([0.5, 0.52, 0.9, 0.45, 0.1, 0.6])
    pid = np.array([0, 0, 1, 1, 2, 3])
    sel = select_nodes(theta, pid, 3, set(), "bayes", np.random.default_rng(0))
    assert sel == [0, 3, 5]  # root 0's best, root 1's best (0.45), then 0.6; node 1 shares root 0
    assert select_nodes(theta, pid, 3, {0}, "bayes", np.random.default_rng(0)) == [3, 5, 4]
    rnd = select_nodes(theta, pid, 4, set(), "random", np.random.default_rng(1))
    assert len(rnd) == 4 and len(set(pid[rnd].tolist())) == 4


# ---------------------------------------------------------------- PPO pieces


def test_gae_reduces_to_monte_carlo_and_td_and_ignores_padding():
    v = torch.tensor([[0.0, 0.0, 0.2, 0.5, 0.1]])
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]])  # two pad columns (left), three tokens
    r = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    adv, ret = gae_advantages(r, v, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0, 0, 0.8, 0.5, 0.9])  # R - V_t
    assert ret[0].tolist() == pytest.approx([0, 0, 1.0, 1.0, 1.0])
    adv0, _ = gae_advantages(r, v, mask, gamma=1.0, lam=0.0)
    assert adv0[0].tolist() == pytest.approx(
        [0, 0, 0.5 - 0.2, 0.1 - 0.5, 1.0 - 0.1]
    )  # TD residuals
    advp, _ = gae_advantages(r[:, 2:], v[:, 2:], mask[:, 2:], 1.0, 0.9)
    adv9, _ = gae_advantages(r, v, mask, 1.0, 0.9)
    assert adv9[0, 2:].tolist() == pytest.approx(advp[0].tolist())


def test_value_loss_is_clipped_around_the_old_value():
    v, old, ret = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([1.0])
    assert value_loss(v, old, ret, 0.2).item() == pytest.approx(
        0.5 * 0.8**2
    )  # max(unclipped 0, clipped)


def test_prefix_tokens_get_zero_gradient(random_model_dir):
    """A child's prefix sits in the prompt: the loss has gradient only at positions that predict continuation
    tokens (checked on the full logits, so a prefix wrongly trained as completion would show up)."""
    from transformers import AutoModelForCausalLM

    from common.rl.logprobs import token_logprobs
    from common.rl.losses import clipped_surrogate
    from common.rl.masking import pad_sequences

    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    root, prefix, cont = [5, 6, 7, 8], [9, 10, 11], [12, 13, 2]
    batch = pad_sequences([root + prefix], [cont], 0)
    kept = {}

    class Spy(
        torch.nn.Module
    ):  # full logits with retained grad, then the slice token_logprobs expects
        def forward(self, logits_to_keep, **kw):
            out = model(**kw)
            kept["logits"] = out.logits
            out.logits.retain_grad()
            out.logits = out.logits[:, -logits_to_keep:]
            return out

    logp, _ = token_logprobs(Spy(), batch)
    loss, _ = clipped_surrogate(logp, logp.detach(), torch.ones_like(logp))
    (loss * batch.loss_mask).sum().backward()
    g = kept["logits"].grad[0].abs().sum(-1)  # position t predicts token t+1
    n_ctx = len(root) + len(prefix)
    assert batch.loss_mask.tolist() == [[1.0, 1.0, 1.0]]
    assert torch.all(
        g[: n_ctx - 1] == 0
    )  # positions predicting prompt and prefix tokens: no gradient
    assert torch.all(g[n_ctx - 1 : n_ctx - 1 + len(cont)] > 0)  # continuation tokens: gradient


# ---------------------------------------------------------------- the script


def test_every_flag_is_documented():
    from dataclasses import fields

    from common.run.flag_help import field_docs

    docs = field_docs(Args)
    missing = [f.name for f in fields(Args) if not docs.get(f.name)]
    assert not missing, f"flags without help: {missing}"
    out = run_script(["pros_ppo.py", "--help"]).stdout
    for f in fields(Args):
        assert f"--{f.name}" in out


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _strip(rows):
    return [
        {k: v for k, v in r.items() if not k.startswith(("time_", "time/", "pros_gibbs_s"))}
        for r in rows
    ]


# --success_reward 0: the 30-step test base almost never answers correctly, so every rollout counts as a
# success (a prefix source) here, to make the tree grow children within a few steps
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
    "--reward",
    "tinyzero",
    "--success_reward",
    "0",
    "--pool_capacity",
    "20",
]


def test_pros_ppo_runs_resumes_exactly_and_grows_the_tree(tiny_base, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    base = [
        "pros_ppo.py",
        "--model_name_or_path",
        tiny_base,
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
        *COMMON,
    ]
    run_main([*base, "--output_dir", str(full), "--max_steps", "4"])
    run_main([*base, "--output_dir", str(part), "--max_steps", "2"])
    run_main(
        [*base, "--output_dir", str(part), "--max_steps", "4", "--resume_from_checkpoint", "auto"]
    )
    a, b = _rows(full), _rows(part)
    assert _strip(a) == _strip(b)  # tree, counts, Gibbs RNG, critic and its optimizer were restored
    rows = a[1:]
    keys = {
        "pros_pool_size",
        "pros_frac_children_in_batch",
        "pros_prefix_len_mean",
        "pros_calib_error",
        "pros_gibbs_s",
        "pros_saved_prompt_tokens",
        "ppo_value_loss",
        "ppo_clip_frac",
        "time_step_s",
        "pros_calib_excess",
        "pros_frac_zero_var_picks",
        "pros_frac_zero_var_stream",
        "pros_pick_trials_mean",
        "pros_pick_root_frac",
    }
    assert keys <= set(rows[0]) and "eval_pass@1" in rows[-1]
    assert rows[0]["pros_children_created"] > 0 and rows[0]["pros_frac_children_in_batch"] == 0
    assert any(
        r["pros_frac_children_in_batch"] > 0 for r in rows[1:]
    )  # children are selected and trained
    assert any(r["pros_saved_prompt_tokens"] > 0 for r in rows[1:])
    assert all(r["pros_pool_size"] <= 20 for r in rows)  # bounded pool
    assert rows[-1]["rollouts"] == 4 * 8 * 4
    assert all(
        0 <= r["pros_pick_root_frac"] <= 1 and r["pros_pick_trials_mean"] >= 0
        for r in rows
        if r["pros_pick_root_frac"] is not None
    )
    assert "eval_train_pass@1" in rows[-1]
    state = torch.load(full / "checkpoint-4" / "trainer_state.pt", weights_only=True)["state"][
        "method"
    ]
    assert len(state["tree"]["prefix"]) == rows[-1]["pros_pool_size"] and "critic" in state


def test_vanilla_grpo_has_no_prefix_reuse(tiny_base, tmp_path):
    out = tmp_path / "van"
    run_main(
        [
            "pros_ppo.py",
            "--model_name_or_path",
            tiny_base,
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--eval_steps",
            "2",
            "--pros",
            "off",
            "--adv",
            "grpo",
            *COMMON,
        ]
    )
    rows = _rows(out)[1:]
    assert all(not any(k.startswith("pros_") for k in r) for r in rows)
    assert "ppo_value_loss" not in rows[0] and rows[-1]["rollouts"] == 2 * 8 * 4


def _main_rows(out, extra, monkeypatch, reward=None):
    """pros_ppo.main in process (optionally with a patched training reward); its metrics rows."""
    import pros_ppo
    from common.demo import countdown
    from common.run.flags import parse_args

    if reward is not None:
        monkeypatch.setitem(countdown.REWARDS, "tinyzero", reward)
    pros_ppo.main(parse_args(Args, ["--output_dir", str(out), *COMMON, *extra]))
    return _rows(out)


def test_sample_log_has_root_and_augmented_rows_and_eval_logs_pass_at_powers_of_two(
    tiny_base, tmp_path, monkeypatch
):
    import pros_ppo
    from common.generation.hf import SamplingConfig

    # the generator made to return log-probs: sampler_logp_diff is then measured against score_rollouts' pi_old
    monkeypatch.setattr(
        pros_ppo, "SamplingConfig", lambda **kw: SamplingConfig(**{**kw, "logprobs": True})
    )
    rows = _main_rows(
        tmp_path,
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "3",
            "--eval_steps",
            "3",
            "--log_samples_every",
            "1",
            "--log_samples_per_kind",
            "2",
            "--eval_temperature",
            "0",
        ],
        monkeypatch,
    )
    assert {"eval_pass@1", "eval_pass@2", "eval_pass@4"} <= set(
        rows[0]
    ) and "eval_pass@3" not in rows[0]
    assert (
        rows[0]["eval_pass@1"] == rows[0]["eval_pass@4"]
    )  # --eval_temperature 0: greedy, n identical samples
    assert all(r["sampler_logp_diff"] < 1e-3 for r in rows[1:])  # same weights, same temperature
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    keys = {
        "step",
        "kind",
        "prompt",
        "pros_prefix",
        "completion",
        "reward",
        "advantage",
        "truncated",
        "pros_node",
        "pros_parent",
    }
    assert samples and all(keys <= set(s) for s in samples)
    for step in (1, 2, 3):
        kinds = [s["kind"] for s in samples if s["step"] == step]
        assert (
            0 < kinds.count("root") <= 2
            and kinds.count("augmented") <= 2
            and set(kinds) <= {"root", "augmented"}
        )
        if (
            rows[step]["pros_frac_children_in_batch"] > 0
        ):  # a child in the batch: augmented rows are logged
            assert "augmented" in kinds
    assert any(s["kind"] == "augmented" for s in samples)
    for s in samples:  # a root has no prefix and no parent; an augmented query hangs off its root
        assert (s["kind"] == "augmented") == bool(s["pros_prefix"]) == (s["pros_parent"] >= 0)


def test_truncated_completions_get_reward_zero_and_spawn_no_child(tiny_base, tmp_path, monkeypatch):
    # every rollout would score 1 (a success, --success_reward 0, long enough for a cut), but greedy decoding cut at
    # 4 tokens stops none (the shortest answer, one step, is 6 characters + EOS): reward 0, never a success, no child;
    # --mask_truncated_completions: no policy gradient
    rows = _main_rows(
        tmp_path,
        [
            "--model_name_or_path",
            tiny_base,
            "--max_steps",
            "2",
            "--max_completion_length",
            "4",
            "--temperature",
            "0",
            "--mask_truncated_completions",
            "--eval_steps",
            "0",
        ],
        monkeypatch,
        reward=lambda text, problem: 1.0,
    )[1:]
    assert all(
        r["clipped_ratio"] == 1.0 and r["reward_mean"] == 0.0 and r["pass_rate"] == 0.0
        for r in rows
    )
    assert all(r["pros_children_created"] == 0 and r["pros_pool_children"] == 0 for r in rows)
    assert all(r["loss"] == 0.0 and r["grad_norm"] == 0.0 for r in rows)
    assert all(
        r["sampler_logp_diff"] is None for r in rows
    )  # no sampler log-probs asked for (pi_old is scored)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples and all(
        s["truncated"] and s["reward"] == 0.0 for s in samples
    )  # logged at the final eval step


def test_the_critics_value_loss_counts_only_the_rewarded_rollouts():
    """A rollout with no reward (NaN: no function scored it) has no return to fit: the critic's
    value loss leaves its tokens out, however far its (meaningless) return lies."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from common.rl.logprobs import Forward
    from pros_ppo import critic_step

    class FlatCritic(torch.nn.Module):  # V = 0 on every completion token
        def __init__(self):
            super().__init__()
            self.value = torch.nn.Parameter(torch.zeros(()))

        def forward(self, batch):
            return self.value.expand(batch.input_ids.shape[0], batch.completion_width)

    critic = FlatCritic()
    prompts, completions = [[5, 6], [5, 6]], [[7, 8, 9], [7, 8, 9]]
    old = SimpleNamespace(value=torch.zeros(2, 3))
    returns = torch.tensor([[1.0, 1.0, 1.0], [100.0, 100.0, 100.0]])
    has_reward = torch.tensor([True, False])
    args = SimpleNamespace(
        micro_batch_size=2, max_tokens_per_microbatch=0, cliprange_value=0.2, max_grad_norm=1.0
    )
    forward = Forward(0, torch.device("cpu"), "float32")
    loss = critic_step(
        critic,
        torch.optim.SGD(critic.parameters(), lr=0.0),
        [0, 1],
        old,
        returns,
        has_reward,
        3.0,  # the rewarded rollout's tokens
        prompts,
        completions,
        forward,
        Accelerator(cpu=True),
        args,
    )
    # 0.5 (V - R)^2 = 0.5 on each of the rewarded rollout's 3 tokens, over its 3 tokens
    assert loss.item() == pytest.approx(0.5)


def test_choose_batch_takes_the_ceiling_of_fresh_frac_from_the_stream():
    # Sec. 3's ⌈fresh_frac·P⌉ stream prompts: an odd batch of 5 at fresh_frac 0.5 has 3 from the
    # stream and 2 from the pool (the tree's other roots), whatever is drawn
    args = pros_ppo.Args(adv="grpo", pros="random", prompts_per_step=5, fresh_frac=0.5)
    tree = pros_ppo.QueryTree()
    for prompt_id in range(8):
        tree.add(prompt_id, (), 0, args.prior_mu)
    for seed in range(3):
        sampler = PromptSampler(8, seed)
        queries = pros_ppo.choose_batch(tree, sampler, args, 1, np.random.default_rng(seed), 8)
        assert [q.from_pool for q in queries] == [False] * 3 + [True] * 2, queries
        assert len({q.prompt_id for q in queries}) == 5


def test_the_policy_divisor_and_loss_count_the_policy_tokens_only():
    # a row out of the policy's mask (truncated under --mask_truncated_completions, or unscored):
    # the policy's token mean neither trains nor counts it; the critic's divisor still counts it
    mask = torch.ones(3, 4)
    policy_mask = mask.clone()
    policy_mask[1] = 0.0
    one = SimpleNamespace(num_processes=1, process_index=0)
    policy_tokens, all_tokens = pros_ppo.minibatch_divisors([0, 1, 2], policy_mask, mask, one)
    assert (policy_tokens, all_tokens) == (8.0, 12.0)
    logp = torch.zeros(3, 4, requires_grad=True)
    advantages = torch.ones(3, 4)  # nonzero on the row the policy mask drops
    loss, _ = pros_ppo.policy_loss(
        logp, logp.detach(), advantages, policy_mask, policy_tokens, 0.2, 0.28
    )
    loss.backward()
    assert torch.all(logp.grad[1] == 0) and torch.allclose(logp.grad[0], torch.full((4,), -1 / 8))
