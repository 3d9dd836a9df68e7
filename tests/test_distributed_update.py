"""One update on 1 and on 2 CPU processes (gloo) from the same rollouts: the same gradient, for each script; a rank
with no rows (fewer prompts than processes), or whose rows all drop, idles through the step (DDP and
--fsdp); a stalled rank stops the run with one line."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_script

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
COMMON = [
    "--prompt_pool",
    "24",
    "--eval_prompts",
    "2",
    "--eval_samples",
    "1",
    "--eval_steps",
    "0",
    "--eval_train_prompts",
    "0",
    "--num_threads",
    "1",
    "--max_completion_length",
    "24",
    "--learning_rate",
    "1e-6",
    "--warmup_steps",
    "0",
    "--save_steps",
    "0",
    "--max_grad_norm",
    "1e9",
]  # no clipping: it would hide a gradient's wrong scale
# Each case: its flags. Two steps where the batch holds two kinds of rows from step 2 on (ps_grpo: prefix tasks
# after fresh ones; pros_ppo: stream and pool queries); an odd --prompts_per_step, so the ranks' shares differ; and
# micro-batches of 4 rows, so the ranks run different numbers of them. ps_grpo runs three steps and
# its prefix queue overflows its one slot: which task stays depends on how the batch is dealt
# (strided; dealt contiguously, step 3's gradient differs by ~46%). Here the ranks' queued tasks
# come back in the same order rank by rank as in dealt order, so test_ps_grpo.py tests that order.
CASES = {
    "ra_rloo": [
        "ra_rloo.py",
        "--prompts_per_step",
        "5",
        "--num_generations",
        "4",
        "--reward",
        "binary",
    ],
    "ps_grpo": [
        "ps_grpo.py",
        "--mode",
        "text",
        "--prompts_per_step",
        "11",
        "--num_generations",
        "4",
        "--max_prefix_frac",
        "0.1",
    ],
    "pros_ppo": [
        "pros_ppo.py",
        "--prompts_per_step",
        "5",
        "--num_generations",
        "4",
        "--num_iterations",
        "1",
        "--num_mini_batches",
        "1",
        "--fresh_frac",
        "0.5",
    ],
    "ada_seq": [
        "ada_seq.py",
        "--prompts_per_step",
        "5",
        "--max_rounds",
        "2",
        "--round_repeat",
        "4",
    ],
    "ada_est": ["ada_est.py", "--prompts_per_step", "5"],
}
STEPS = {"ra_rloo": 1, "ps_grpo": 3, "pros_ppo": 2, "ada_seq": 1, "ada_est": 1}


def _harness_main(plan: str) -> None:
    """This file run as a script (one process, or each rank of `accelerate launch`): each (name, args[, stall]) of
    `plan` is one main() whose rollouts do not depend on the rank or the batch they are sampled in (each prompt's k
    samples are drawn alone, seeded by the prompt's tokens, the optimizer steps so far and how often this process
    sampled it since, so a prompt gives the same rollouts on whichever rank holds it); `random`'s draws that pick
    rollouts (ps_grpo's prefix source, ada_seq's downsampling) take the first ones, not a rank-seeded draw. Every
    optimizer step's gradient is saved, as rank 0 has it (the all-reduce made them equal; --fsdp:
    gathered whole), with the number of whole parameters the FSDP-sharded models (a frozen reference
    too) hold at that moment."""
    import random
    import weakref

    from accelerate.state import AcceleratorState
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from common.generation import hf as generation
    from common.run.flags import parse_args

    generate, seen, grads, whole = generation.HFGenerator.generate, {}, [], []
    perturbed = []  # [True] in a run of the sampler correction: the generator's log-probs moved
    sharded = weakref.WeakSet()  # every FSDP unit that ran a forward

    def per_prompt(self, prompt_ids, n, cfg):
        if stall and int(os.environ.get("RANK", "0")) == stall[0] and len(grads) == stall[1]:
            time.sleep(
                stall[2]
            )  # this rank stalls (once) in the generation after that many optimizer steps
            stall.clear()
        parts = []
        for prompt in prompt_ids:
            key = (
                tuple(prompt),
                n,
                len(grads),
            )  # the optimizer steps so far: the same on every rank
            seen[key] = seen.get(key, 0) + 1
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(
                    hash((key, seen[key])) % 2**31
                )  # a tuple of ints hashes the same in every run
                parts.append(generate(self, [prompt], n, cfg))
        completions = [c for part in parts for c in part.completion_ids]
        logprobs = [lp for part in parts for lp in part.logprobs]
        if perturbed:
            # a sampler that is not the trainer: each token's log-prob moved by scale x (id mod 7 - 3), the scale
            # (0.04 to 0.07) set by the prompt, so that the step's extremes come from one prompt's rows, on one rank
            scales = [
                0.04 + 0.03 * (sum(prompt) * 0.6180339887 % 1)
                for prompt in prompt_ids
                for _ in range(n)
            ]
            logprobs = [
                [lp + scale * (token % 7 - 3) for lp, token in zip(lps, ids)]
                for lps, ids, scale in zip(logprobs, completions, scales)
            ]
        return generation.Generations(
            [p for part in parts for p in part.prompt_ids],
            completions,
            logprobs,
            [f for part in parts for f in part.finish_reasons],
            n,
        )

    def record(optimizer, *_):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        # --fsdp: each rank holds a shard of the gradient; every rank gathers it (a collective)
        full = [p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for p in params]
        grads.append(
            torch.cat(
                [
                    (g if g is not None else torch.zeros(p.shape)).flatten().double()
                    for p, g in zip(params, full)
                ]
            )
        )
        # after the backward: a sharded model's parameters are DTensors, except while gathered whole
        whole.append(
            len(
                {id(p) for unit in sharded for p in unit.parameters() if not isinstance(p, DTensor)}
            )
        )

    generation.HFGenerator.generate = per_prompt
    random.choice, random.sample = (
        (lambda items: items[0]),
        (lambda items, count: list(items)[:count]),
    )
    from torch.nn.modules.module import register_module_forward_hook
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(record)
    register_module_forward_hook(
        lambda unit, *_: sharded.add(unit) if isinstance(unit, FSDPModule) else None
    )
    for i, (name, argv, *stall) in enumerate(json.loads(plan)):
        stall = stall[0] if stall else []  # [rank, optimizer steps before it, seconds]
        if (
            i and "RANK" in os.environ
        ):  # main() destroyed its process group: the next one meets on the next port
            AcceleratorState._reset_state(True)
            os.environ.update(
                MASTER_PORT=str(int(os.environ["MASTER_PORT"]) + 1),
                TORCHELASTIC_USE_AGENT_STORE="0",
            )
        seen.clear()
        perturbed[:] = [True] if "--vllm_importance_sampling_correction" in argv else []
        grads.clear()
        whole.clear()
        sharded.clear()
        module = __import__(Path(argv[0]).stem)
        args = parse_args(module.Args, argv[1:])
        module.main(args)
        if os.environ.get("RANK", "0") == "0":
            torch.save({"grads": grads, "whole": whole}, Path(args.output_dir) / "grads.pt")


def _plan(tiny_base, tmp_path, tag, extra=(), steps=None, per_step=None, names=tuple(CASES)):
    return [
        (
            name,
            [
                *CASES[name],
                "--model_name_or_path",
                tiny_base,
                *COMMON,
                "--max_steps",
                str(steps or STEPS[name]),
                *extra,
                *(["--prompts_per_step", str(per_step)] if per_step else []),
                *(ALONE.get(name, []) if per_step else []),
                "--output_dir",
                str(tmp_path / f"{tag}-{name}"),
            ],
        )
        for name in names
    ]


# --prompts_per_step 1 on 2 processes: rank 1 has no rows (ada_seq through DAPO's filter and trim); 16 samples, so
# that the one prompt's group has a signal in every script (with the first prompt of --seed 0); a KL
# reference in every script that has one, so that it makes zero-weight passes too
ALONE = {
    "ps_grpo": ["--num_generations", "16"],
    "pros_ppo": ["--num_generations", "16", "--beta", "0.05"],
    "ada_seq": [
        "--dynamic_sampling",
        "--max_dynamic_rounds",
        "0",
        "--max_rounds",
        "1",
        "--round_repeat",
        "16",
        "--num_generations",
        "16",
        "--beta",
        "0.05",
    ],
    "ada_est": ["--beta", "0.05"],
}
# the same at --prompts_per_step 2: the second prompt's 16 samples all fail, so rank 1's rows all
# drop (ps_grpo's rejection sampling, ada_seq's DAPO filter and trim) while rank 0 trains
DROP = ("ps_grpo", "ada_seq")


# the launches' plain runs apply the sampler correction to log-probs the harness moves off the trainer's
CORRECTION = [
    "--vllm_importance_sampling_correction",
    "--vllm_importance_sampling_mode",
    "token_mask",
    "--vllm_importance_sampling_clip_min",
    "0.9",
    "--vllm_importance_sampling_clip_max",
    "1.1",
]
CORRECTION_KEYS = (
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
    "sampling/importance_sampling_outside_frac",
)


def _rows(tmp_path, tag, name):
    """The run's training rows (step 0 is the evaluation)."""
    lines = (tmp_path / f"{tag}-{name}" / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["step"] > 0]


def _load(tmp_path, tag, name):
    return torch.load(tmp_path / f"{tag}-{name}" / "grads.pt")


def test_one_update_has_the_same_gradient_on_one_and_two_processes(tiny_base, tmp_path):
    # One launch per process count, every script in each: two steps where the ranks' shares differ (ps_grpo with
    # prefix tasks, pros_ppo with stream and pool queries), then one step of a single prompt (rank 1 trains nothing,
    # so the update must be rank 0's rows alone, as on one process) under DDP and --fsdp, and with
    # --fsdp one step where rank 1's rows all drop. Without the global token counts, whitening
    # statistics and strided batch, the gradients differ by 1-50%; without every rank joining every
    # collective, the launch fails (gloo: a collective mismatch) or hangs until the timeout below.
    mb = ["--micro_batch_size", "4"]
    fsdp = [*mb, "--fsdp"]
    one = [
        *_plan(tiny_base, tmp_path, "one", [*mb, *CORRECTION]),
        *_plan(tiny_base, tmp_path, "alone1", mb, 1, 1),
        *_plan(tiny_base, tmp_path, "drop1", mb, 1, 2, DROP),
    ]
    layout = _plan(tiny_base, tmp_path, "layout", ["--micro_batch_size", "64", *CORRECTION])
    two = [
        *_plan(tiny_base, tmp_path, "two", [*mb, *CORRECTION]),
        *_plan(tiny_base, tmp_path, "alone2", mb, 1, 1),
        *_plan(tiny_base, tmp_path, "fsdp-alone2", fsdp, 1, 1),
        *_plan(tiny_base, tmp_path, "fsdp-drop2", fsdp, 1, 2, DROP),
    ]
    # last in the launch: rank 1 sleeps 10 s in step 2's generation, past a 5 s --collective_timeout
    stalled = tmp_path / "stalled"
    stall = (
        "ra_rloo",
        [
            *CASES["ra_rloo"],
            "--model_name_or_path",
            tiny_base,
            *COMMON,
            *mb,
            "--max_steps",
            "3",
            "--save_steps",
            "1",
            "--collective_timeout",
            "5",
            "--output_dir",
            str(stalled),
        ],
        [1, 1, 10],
    )
    me = str(Path(__file__).relative_to(Path(__file__).parents[1]))
    run_script([me, json.dumps(one + layout)], timeout=600)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    launch = subprocess.run(
        [sys.executable, *LAUNCH, me, json.dumps([*two, stall])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    output = launch.stdout + launch.stderr
    assert launch.returncode != 0, output[-3000:]
    # every rank stops with one line naming the step and the phase, and no traceback of ours
    stops = re.findall(
        r"rank (\d): step (\S+), phase (.*?): a collective waited longer than --collective_timeout 5 s",
        output,
    )
    assert sorted((rank, step) for rank, step, _ in stops) == [("0", "2"), ("1", "2")], output[
        -5000:
    ]
    assert all("ra_rloo.py:" in phase for _, _, phase in stops), stops
    assert not re.search(r'File ".*(ra_rloo|common/[\w/]+)\.py"', output), output[-5000:]
    from common.run.checkpoint import list_checkpoints

    assert [path.name for path in list_checkpoints(str(stalled))] == [
        "checkpoint-1"
    ]  # whole: its files are all there
    assert all(
        (stalled / "checkpoint-1" / name).is_file()
        for name in ("model.safetensors", "trainer_state.pt")
    )
    for name in CASES:
        grads = {tag: _load(tmp_path, tag, name)["grads"] for tag in ("one", "layout", "two")}
        assert len(grads["one"]) == len(grads["layout"]) == len(grads["two"]) >= STEPS[name], name
        for step, (ref, other, dist) in enumerate(zip(grads["one"], grads["layout"], grads["two"])):
            # the float noise of this very gradient: one process, another micro-batch layout (other padding widths
            # and summation order), x10, and at least 1e-6 of its norm
            noise = float((other - ref).norm()) / float(ref.norm())
            assert noise < 1e-3, (name, step, noise)
            bound = (10 * noise + 1e-6) * float(ref.norm())
            assert float((dist - ref).norm()) <= bound, (
                name,
                step,
                float((dist - ref).norm()),
                bound,
            )
        # rank 0's rows alone: one process's update on them (a zero norm: the group had no signal)
        pairs = [("alone1", "alone2"), ("alone1", "fsdp-alone2")]
        pairs += [("drop1", "fsdp-drop2")] * (name in DROP)
        for one_tag, two_tag in pairs:
            ones, twos = _load(tmp_path, one_tag, name)["grads"], _load(tmp_path, two_tag, name)
            assert len(ones) == len(twos["grads"]) >= 1, (name, two_tag)
            for ref, dist in zip(ones, twos["grads"]):
                assert float(ref.norm()) > 0, (name, one_tag, "no signal: choose another prompt")
                bound = (10 * noise + 1e-6) * float(ref.norm())
                assert float((dist - ref).norm()) <= bound, (name, two_tag)
            # no sharded model (the frozen reference included) keeps a whole parameter between steps
            assert set(twos["whole"]) == {0}, (name, two_tag, twos["whole"])
        # the sampler correction's statistics: sums and extremes over all ranks' tokens, the same on 1 and 2
        # processes (a per-rank mean, min or max would differ: the ranks hold different rows)
        one_rows, two_rows = (_rows(tmp_path, tag, name) for tag in ("one", "two"))
        assert len(one_rows) == len(two_rows) >= STEPS[name], name
        for one_row, two_row in zip(one_rows, two_rows):
            assert 0 < one_row["sampling/importance_sampling_outside_frac"] < 1, (name, one_row)
            for key in CORRECTION_KEYS:
                assert two_row[key] == pytest.approx(one_row[key], rel=1e-5, abs=1e-6), (name, key)
    for name, key in (("ps_grpo", "ps_trained_groups"), ("ada_seq", "dapo_kept_groups")):
        rows = (tmp_path / f"drop1-{name}" / "metrics.jsonl").read_text().splitlines()
        # one of the two groups trained: rank 0's (rank 1's dropped)
        assert json.loads(rows[-1])[key] == 1, (name, "choose prompts where one group drops")


if __name__ == "__main__":
    _harness_main(sys.argv[1])
