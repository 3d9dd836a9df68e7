"""--fsdp (FSDP2) under two CPU processes (gloo): sharded states, the same numbers as DDP, exact resume."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import loss_tolerance, run_main, run_script

# two-process launches share accelerate's default rendezvous port: one at a time (pytest-xdist group)
pytestmark = pytest.mark.xdist_group("distributed")
LAUNCH = [
    "-m",
    "accelerate.commands.launch",
    "--multi_gpu",
    "--num_processes",
    "2",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
]
SMALL = [
    "--prompt_pool",
    "48",
    "--prompts_per_step",
    "8",
    "--eval_prompts",
    "8",
    "--eval_samples",
    "4",
    "--micro_batch_size",
    "8",
    "--num_threads",
    "1",
]
COMPARED = ("loss", "grad_norm", "kl", "reward_mean", "eval_pass@1", "ppo_value_loss", "entropy")


def _rows(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _assert_same_run(ddp_rows, fsdp_rows, rel=1e-4):
    assert [r["step"] for r in ddp_rows] == [r["step"] for r in fsdp_rows]
    for ddp, fsdp in zip(ddp_rows, fsdp_rows):
        for key in COMPARED:
            if (
                ddp.get(key) is not None
            ):  # a loss's advantages cancel within each group: conftest.loss_tolerance
                bound = loss_tolerance(ddp) if key == "loss" else 1e-6
                assert fsdp[key] == pytest.approx(ddp[key], rel=rel, abs=bound), (ddp["step"], key)


def _optimizer_numel(path):
    return _optimizer_numel_of(path, "optimizer")


def _optimizer_numel_of(path, key):
    state = torch.load(path, weights_only=True)[key]["state"]
    return sum(entry["exp_avg"].numel() for entry in state.values())


@pytest.mark.parametrize(
    "script", ["pros_ppo.py"]
)  # the policy, the reference and the critic are sharded
def test_fsdp_matches_ddp_shards_states_and_resumes_exactly(script, tiny_base, tmp_path):
    base = [
        *LAUNCH,
        script,
        "--model_name_or_path",
        tiny_base,
        *SMALL,
        "--eval_steps",
        "2",
        "--save_steps",
        "2",
    ]
    run_script([*base, "--max_steps", "3", "--output_dir", str(tmp_path / "ddp")], timeout=900)
    run_script(
        [*base, "--fsdp", "--max_steps", "2", "--output_dir", str(tmp_path / "fsdp")], timeout=900
    )
    ckpt = tmp_path / "fsdp" / "checkpoint-2"
    # each rank holds about half of the AdamW state (and so of the weights it updates)
    full = sum(
        p.numel()
        for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(ckpt).parameters()
    )
    halves = [_optimizer_numel(ckpt / f"shards_rank{rank}.pt") for rank in (0, 1)]
    assert all(0.45 * full <= half <= 0.55 * full for half in halves) and sum(halves) == full, (
        halves,
        full,
    )
    critic = [_optimizer_numel_of(ckpt / f"shards_rank{rank}.pt", "critic_opt") for rank in (0, 1)]
    assert all(
        0.45 <= part / sum(critic) <= 0.55 for part in critic
    )  # the critic's AdamW state is halved too
    # "killed" after step 2: resume under --fsdp, compare with the uninterrupted DDP run
    run_script(
        [
            *base,
            "--fsdp",
            "--max_steps",
            "3",
            "--resume_from_checkpoint",
            "auto",
            "--output_dir",
            str(tmp_path / "fsdp"),
        ],
        timeout=900,
    )
    _assert_same_run(_rows(tmp_path / "ddp"), _rows(tmp_path / "fsdp"))
    # the checkpoint's model dir holds the whole fp32 weights, equal to the DDP run's
    from safetensors.torch import load_file

    ddp_weights = load_file(str(tmp_path / "ddp" / "checkpoint-3" / "model.safetensors"))
    fsdp_weights = load_file(str(tmp_path / "fsdp" / "checkpoint-3" / "model.safetensors"))
    assert ddp_weights.keys() == fsdp_weights.keys()
    for name, value in ddp_weights.items():
        assert fsdp_weights[name].dtype == torch.float32
        torch.testing.assert_close(fsdp_weights[name], value, atol=1e-5, rtol=1e-4)


def _param_groups(model) -> list:
    """A sharded model's FSDP parameter groups: one per unit (each decoder layer, and the root for the rest)."""
    from torch.distributed.fsdp import FSDPModule

    return [
        group
        for unit in model.modules()
        if isinstance(unit, FSDPModule)
        for group in unit._get_fsdp_state()._fsdp_param_groups
    ]


def _gathered_units(groups: list) -> int:
    """How many of `groups` hold whole weights (or have their all-gather under way)."""
    return sum(group.is_unsharded or group._all_gather_result is not None for group in groups)


def _spy_on_unshard(set_attribute, watched: dict, peak: dict) -> None:
    """Wrap FSDP's per-unit unshard (every gather goes through it, also a forward's on an already gathered unit):
    after each call, `peak[name]` = the most units of the watched model `name` gathered at once so far."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    unshard = FSDPParamGroup.unshard

    def spy(self, *args, **kwargs):
        out = unshard(self, *args, **kwargs)
        for name, groups in watched.items():
            peak[name] = max(peak.get(name, 0), _gathered_units(groups))
        return out

    set_attribute(FSDPParamGroup, "unshard", spy)


class Tee:
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def _scoring_spy_main(runs: str) -> None:
    """This file under `accelerate launch` (fsdp_launch): each (script, mode, flags) of `runs` is one main() of that
    script, its stdout also written per rank; pros_ppo.py's scoring is watched, "gathered" scoring under
    `gathered(...)` as the script once did. Per run and rank, a JSON report: per model (and over "all" of them) its FSDP units, the most gathered at once while scoring and those
    still gathered after it, the largest |score - score with whole weights| (same batch), the scoring calls and the
    dummy passes made while scoring."""
    import contextlib
    import importlib
    import io

    from accelerate.state import AcceleratorState

    import pros_ppo
    from common.distributed import fsdp
    from common.distributed.ranks import gathered
    from common.run.flags import parse_args

    score_rollouts, dummy_pass = pros_ppo.score_rollouts, fsdp.dummy_pass
    watched, report = {}, {"peak": {}}
    _spy_on_unshard(setattr, watched, report["peak"])

    def spy_dummy_pass(*args, **kwargs):
        report["dummy_passes"] += bool(watched)
        return dummy_pass(*args, **kwargs)

    def spy_score(policy, critic, ref_model, *args, **kwargs):
        models = {"policy": policy, "critic": critic, "ref": ref_model}
        watched.update(
            {name: _param_groups(model) for name, model in models.items() if model is not None}
        )
        report["units"] = {name: len(groups) for name, groups in watched.items()}
        watched["all"] = [group for groups in list(watched.values()) for group in groups]
        try:
            with (
                gathered(policy, critic, ref_model)
                if report["mode"] == "gathered"
                else contextlib.nullcontext()
            ):
                scores = score_rollouts(policy, critic, ref_model, *args, **kwargs)
            for name, groups in watched.items():
                report["after"][name] = max(report["after"].get(name, 0), _gathered_units(groups))
        finally:
            watched.clear()
        if report["mode"] == "sharded":
            with gathered(policy, critic, ref_model):
                whole = score_rollouts(policy, critic, ref_model, *args, **kwargs)
            for key, value in vars(scores).items():
                if value is not None:
                    gap = float((value - getattr(whole, key)).abs().max())
                    report["diff"][key] = max(report["diff"].get(key, 0.0), gap)
        report["calls"] += 1
        return scores

    fsdp.dummy_pass, pros_ppo.score_rollouts = spy_dummy_pass, spy_score
    for i, (script, mode, flags) in enumerate(json.loads(runs)):
        if i:  # main() destroyed its process group: the next one meets afresh, at its own store on the next port
            AcceleratorState._reset_state(True)
            os.environ.update(
                MASTER_PORT=str(int(os.environ["MASTER_PORT"]) + 1),
                TORCHELASTIC_USE_AGENT_STORE="0",
            )
        report["peak"].clear()
        report.update(mode=mode, after={}, diff={}, calls=0, dummy_passes=0)
        module = importlib.import_module(script)
        args = parse_args(module.Args, flags)
        out = io.StringIO()
        with contextlib.redirect_stdout(
            Tee(out, sys.stdout)
        ):  # shown as it comes: a hang shows where
            module.main(args)
        rank = os.environ["RANK"]
        Path(args.output_dir, f"stdout_rank{rank}.txt").write_text(out.getvalue())
        Path(args.output_dir, f"scoring_spy_rank{rank}.json").write_text(json.dumps(report))


@pytest.fixture(scope="module")
def fsdp_launch(tiny_base, tmp_path_factory):
    """One two-process launch, four --fsdp runs: pros_ppo.py's three (the next test) and ada_seq.py's (the test after
    it), each in its own folder of the returned one (the launch's start-up paid once)."""
    tmp_path = tmp_path_factory.mktemp("fsdp_launch")
    flags = [
        "--model_name_or_path",
        tiny_base,
        "--prompt_pool",
        "48",
        "--prompts_per_step",
        "5",
        "--eval_prompts",
        "4",
        "--eval_samples",
        "2",
        "--micro_batch_size",
        "8",
        "--num_threads",
        "1",
        "--eval_steps",
        "0",
        "--max_steps",
        "2",
        "--beta",
        "0.05",
        "--fsdp",
    ]
    plan = [
        ("pros_ppo", mode, [*flags, *extra, "--output_dir", str(tmp_path / name)])
        for name, (mode, extra) in PROS_RUNS.items()
    ]
    ada_seq = ["--model_name_or_path", tiny_base, *SMALL, "--eval_steps", "2", "--max_steps", "2"]
    plan.append(
        ("ada_seq", "plain", [*ada_seq, "--fsdp", "--output_dir", str(tmp_path / "ada_seq")])
    )
    run_script([*LAUNCH, "tests/test_fsdp.py", json.dumps(plan)], timeout=900)
    return tmp_path


PROS_RUNS = {
    "ppo": ("sharded", []),
    "gathered": ("gathered", []),
    "grpo": ("sharded", ["--adv", "grpo"]),
}


def test_fsdp_pros_ppo_scores_sharded_as_the_whole_weights_do(fsdp_launch):
    # The no-grad scoring pass (old log-probs, entropies, values, reference log-probs) runs sharded: no model ever has
    # all its units gathered (the root, the running layer and one prefetched are allowed), the models in turn (each
    # root freed after its forward, none left gathered after scoring), the scores equal those of the whole weights,
    # and so do the weights after 2 steps. 5 queries over 2 ranks (12 and 8 rollouts, micro-batches of 8): rank 1
    # joins rank 0's second scoring pass with a dummy one. Three runs of the launch: PPO+PROS, the same with scoring
    # under gathered(...) (the spy must see that), and --adv grpo; all with a reference (--beta).
    tmp_path, runs = fsdp_launch, PROS_RUNS
    spies = {
        name: [
            json.loads((tmp_path / name / f"scoring_spy_rank{rank}.json").read_text())
            for rank in (0, 1)
        ]
        for name in runs
    }
    scored = {"logp", "entropy", "mask", "ref_logp"}
    for name, models, scores in (
        ("ppo", {"policy", "critic", "ref"}, scored | {"value"}),
        ("grpo", {"policy", "ref"}, scored),
    ):
        for spy in spies[name]:
            assert spy["calls"] == 2 and set(spy["units"]) == models, spy
            assert all(spy["peak"][model] <= min(3, spy["units"][model] - 1) for model in models), (
                spy
            )
            assert spy["peak"]["all"] == max(spy["peak"][model] for model in models), (
                spy
            )  # the models in turn
            assert set(spy["diff"]) == scores, spy
            assert set(spy["after"].values()) == {0}, (
                spy
            )  # the roots, kept gathered by FSDP after a forward, released
            assert max(spy["diff"].values()) <= 1e-5, spy
        assert [spy["dummy_passes"] for spy in spies[name]] == [
            0,
            2,
        ]  # one per scoring call, policy then its peers
    for spy in spies["gathered"]:  # whole models gathered: the spy sees it
        assert all(spy["peak"][model] == units for model, units in spy["units"].items()), spy
    from safetensors.torch import load_file

    for name in (
        "model.safetensors",
        "trainer_state.pt",
    ):  # the policy, then the critic (with the trainer state)
        ours, whole = (tmp_path / run / "checkpoint-2" / name for run in ("ppo", "gathered"))
        if name == "trainer_state.pt":
            ours, whole = (
                torch.load(path, weights_only=True)["state"]["method"]["critic"]
                for path in (ours, whole)
            )
        else:
            ours, whole = load_file(str(ours)), load_file(str(whole))
        assert ours.keys() == whole.keys()
        for key, value in whole.items():
            torch.testing.assert_close(ours[key], value, atol=1e-5, rtol=1e-4)


def test_ra_rloo_gathers_the_policy_for_seeding_only_where_it_seeds(
    random_model_dir, tiny_base, tmp_path, monkeypatch
):
    # --fsdp (a world of one: the units are the same): on a real dataset nothing is seeded and no unit of the policy
    # is gathered around the seeding, nor inside it; on the embedded task the demonstrations are scored with the
    # whole policy (and so, under vLLM, its shards are back before the engine generates: tests/test_vllm.py).
    import ra_rloo
    from common.run.flags import parse_args

    watched, peak, seen = {}, {}, []
    _spy_on_unshard(monkeypatch.setattr, watched, peak)
    seed_buffers = ra_rloo.seed_buffers

    def spy(task, model, *args):
        watched["policy"] = _param_groups(model)
        at_entry = _gathered_units(watched["policy"])
        try:
            buffers = seed_buffers(task, model, *args)
        finally:
            seen.append((at_entry, peak.pop("policy", 0), len(watched.pop("policy")), len(buffers)))
        return buffers

    monkeypatch.setattr(ra_rloo, "seed_buffers", spy)
    data = tmp_path / "gsm.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"}) + "\n"
            for i in range(40)
        )
    )
    tiny = [
        "--prompts_per_step",
        "4",
        "--eval_prompts",
        "4",
        "--eval_samples",
        "2",
        "--max_completion_length",
        "8",
        "--num_threads",
        "1",
        "--max_steps",
        "1",
        "--eval_steps",
        "0",
        "--fsdp",
    ]
    ra_rloo.main(
        parse_args(
            ra_rloo.Args,
            [
                "--model_name_or_path",
                random_model_dir,
                "--dataset_name",
                str(data),
                *tiny,
                "--output_dir",
                str(tmp_path / "real"),
            ],
        )
    )
    ra_rloo.main(
        parse_args(
            ra_rloo.Args,
            [
                "--model_name_or_path",
                tiny_base,
                "--prompt_pool",
                "48",
                *tiny,
                "--output_dir",
                str(tmp_path / "embedded"),
            ],
        )
    )
    (real_entry, real_peak, real_units, real_seeded), (entry, _, units, seeded) = seen
    assert (real_entry, real_peak, real_seeded) == (0, 0, 0) and real_units > 1, seen
    assert entry == units and seeded == 48, seen


def test_fsdp_ada_seq_rounds_differ_per_rank_without_deadlock(fsdp_launch):
    # Ada-Seq's ranks run different numbers of sampling rounds and micro-batches: the case FSDP's lock-step breaks
    # (it deadlocked before generation ran outside lock-step). Equality with DDP is tested above; here: it finishes
    # (its run is the last of fsdp_launch's, after three others in the same processes).
    out = fsdp_launch / "ada_seq"
    # the first lines say how the two processes share the training
    stdout = (out / "stdout_rank0.txt").read_text()
    assert "processes: 2 on cpu, FSDP (--fsdp): weights, gradients and optimizer state" in stdout
    rows = _rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2] and all(r["grad_norm"] >= 0 for r in rows[1:])


def test_one_process_fsdp_runs_and_resume_refuses_a_layout_change(tiny_base, tmp_path):
    base = [
        "ra_rloo.py",
        "--model_name_or_path",
        tiny_base,
        *SMALL,
        "--eval_steps",
        "0",
        "--max_steps",
        "1",
        "--output_dir",
        str(tmp_path / "one"),
    ]
    # a world of one, in this process: FSDP still wraps the model (how gpu_smoke runs it on one GPU)
    run_main([*base, "--fsdp"])
    assert (tmp_path / "one" / "checkpoint-1" / "shards_rank0.pt").exists()
    with pytest.raises(AssertionError, match="saved with --fsdp, resumed without it"):
        run_script(
            [
                *base[:-2],
                "--max_steps",
                "2",
                "--resume_from_checkpoint",
                "auto",
                "--output_dir",
                str(tmp_path / "one"),
            ]
        )


def test_fsdp_refuses_lora(random_model_dir):
    from common.distributed.fsdp import shard
    from common.model.lora import add_lora
    from common.model.policy import load_policy

    policy, _ = load_policy(random_model_dir)
    with pytest.raises(SystemExit, match="--fsdp with --lora_r"):
        shard(add_lora(policy, 4, 8, "all-linear"))


def _reshard_settings(model) -> list[bool]:
    """Each FSDP unit's reshard-after-forward setting, as FSDP holds it (a unit that reshards after its
    forward keeps a post-forward mesh)."""
    return [group.post_forward_mesh_info is not None for group in _param_groups(model)]


def _whole_parameters(model) -> int:
    """The parameters `model` holds whole: FSDP swaps a gathered unit's DTensor shards for plain
    tensors until it reshards."""
    from torch.distributed.tensor import DTensor

    return sum(not isinstance(param, DTensor) for param in model.parameters())


def test_sharded_models_keep_their_reshard_settings_and_a_frozen_one_frees_its_root(
    random_model_dir,
):
    # A world of one in this process: the units, their settings and their gathers are those of any
    # world. A frozen model (the KL reference) run outside the training loop must hold nothing
    # whole after its forward (no backward will free its root: ~2 GB a rank at 7-8B parameters);
    # `whole_weights` must hand every unit back its own setting (a trained model's root stays
    # whole until its backward, a frozen one's and every layer's reshard after each forward).
    import torch.distributed as dist

    from common.distributed.fsdp import shard, whole_weights
    from common.model.policy import load_policy
    from common.model.reference import frozen_reference

    policy, _ = load_policy(random_model_dir)
    reference = frozen_reference(policy, "float32", True)
    created = not dist.is_initialized()
    try:
        shard(policy), shard(reference)
        expected = {
            "policy": [False] + [True] * (len(_param_groups(policy)) - 1),
            "reference": [True] * len(_param_groups(reference)),
        }
        ids = torch.tensor([[1, 2, 3, 4]])
        with torch.no_grad():
            reference(input_ids=ids)
        assert _whole_parameters(reference) == 0 and _gathered_units(_param_groups(reference)) == 0
        models = {"policy": policy, "reference": reference}
        settings = {name: _reshard_settings(model) for name, model in models.items()}
        assert settings == expected, settings  # the root first (FSDP lists it first)
        with whole_weights([policy, reference]):
            assert _gathered_units(_param_groups(policy)) == len(expected["policy"])
            with torch.no_grad():
                policy(input_ids=ids), reference(input_ids=ids)
        assert {name: _reshard_settings(model) for name, model in models.items()} == expected
        assert _whole_parameters(policy) == 0 and _whole_parameters(reference) == 0
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("script", ["ps_grpo", "pros_ppo", "ada_seq", "ada_est", "ra_rloo"])
def test_every_script_destroys_its_process_group_before_returning(script, tiny_base, tmp_path):
    # A gloo group still alive when the interpreter exits can abort a finished run (SIGABRT, "terminate called without
    # an active exception"), so main() destroys it. --fsdp makes a world-of-one group in this very process.
    import importlib

    import torch.distributed as dist

    from common.run.flags import parse_args

    module = importlib.import_module(script)
    module.main(
        parse_args(
            module.Args,
            [
                "--model_name_or_path",
                tiny_base,
                *SMALL,
                "--eval_steps",
                "0",
                "--max_steps",
                "1",
                "--fsdp",
                "--output_dir",
                str(tmp_path / script),
            ],
        )
    )
    assert (tmp_path / script / "checkpoint-1" / "shards_rank0.pt").exists()  # it did run sharded
    assert not dist.is_initialized()
    if script == "ra_rloo":  # its trained model holds the whole weights, gathered from the shards
        from safetensors.torch import load_file

        export, ckpt = (
            load_file(str(tmp_path / script / name / "model.safetensors"))
            for name in ("model", "checkpoint-1")
        )
        assert export.keys() == ckpt.keys() and all(
            torch.equal(export[key], ckpt[key]) for key in ckpt
        )


class _Payload:
    """Unpickling this runs a shell command that creates `marker`: what a tampered checkpoint file could do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_resume_refuses_a_pickle_payload_in_every_file_it_reads_and_runs_none(tiny_base, tmp_path):
    # a world-of-one --fsdp run writes all three kinds of file a resume unpickles: trainer state, RNG, optimizer shard
    import pickle
    import sys

    import torch.distributed as dist
    from conftest import ROOT

    import ra_rloo
    from common.run.flags import parse_args

    out, marker = tmp_path / "run", tmp_path / "payload-ran"
    base = [
        "ra_rloo.py",
        "--model_name_or_path",
        tiny_base,
        *SMALL,
        "--eval_steps",
        "0",
        "--fsdp",
        "--output_dir",
        str(out),
    ]
    run_main([*base, "--max_steps", "1"])  # in this process: main() ends its world-of-one group
    pickle.loads(pickle.dumps(_Payload(tmp_path / "control")))
    assert (tmp_path / "control").exists()  # the payload is live: unpickled unrestricted, it runs
    for name in (
        "metrics.jsonl",
        "samples.jsonl",
    ):  # rows past the checkpoint: a resume that got going drops them
        with (out / name).open("a") as f:
            f.write(json.dumps({"step": 2, "junk": 1}) + "\n")
    ckpt = out / "checkpoint-1"

    def files():  # .run.lock aside: the failed in-process resumes' hold, which their process gives back at exit
        return {
            p.relative_to(out): p.read_bytes()
            for p in out.rglob("*")
            if p.is_file() and p.name != ".run.lock"
        }

    before = files()
    plants = {
        "trainer_state.pt": lambda path: path.write_bytes(pickle.dumps({"step": _Payload(marker)})),
        "rng_rank0.pt": lambda path: torch.save({"python": _Payload(marker)}, path),
        "shards_rank0.pt": lambda path: torch.save({"optimizer": _Payload(marker)}, path),
    }
    message = r"^checkpoint-1/{}: not a checkpoint written by this project \(unsafe or unreadable content\)"
    for name, plant in plants.items():
        plant(ckpt / name)
        if (
            name == "trainer_state.pt"
        ):  # as a user runs it: a non-zero exit, one line on stderr, no traceback
            r = subprocess.run(
                [sys.executable, *base, "--max_steps", "2", "--resume_from_checkpoint", "auto"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=300,
                env=dict(os.environ, OMP_NUM_THREADS="1"),
            )
            assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
            assert re.match(message.format(re.escape(name)), r.stderr.strip().splitlines()[-1]), (
                r.stderr[-3000:]
            )
        else:  # in process (faster); the failed resume leaves its world-of-one process group behind
            try:
                with pytest.raises(SystemExit, match=message.format(re.escape(name))):
                    ra_rloo.main(
                        parse_args(
                            ra_rloo.Args,
                            [*base[1:], "--max_steps", "2", "--resume_from_checkpoint", "auto"],
                        )
                    )
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()
        assert not marker.exists(), name
        (ckpt / name).write_bytes(before[ckpt.relative_to(out) / name])
        assert files() == before, (
            name
        )  # metrics.jsonl, samples.jsonl and the checkpoint as they were, nothing new


if __name__ == "__main__":  # the payload of fsdp_launch
    _scoring_spy_main(sys.argv[1])
