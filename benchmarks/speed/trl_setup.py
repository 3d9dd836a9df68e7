"""What TRL's side of benchmarks/speed/trl_peer.py is built from: the base policy (the cached embedded tiny
model), the Countdown prompts as a dataset, the binary verifier as a TRL reward function, and GRPOConfig set
to our batch and optimiser settings."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if (
    TYPE_CHECKING
):  # the command's flags; imported for the annotation only (trl_peer.py imports this module)
    from benchmarks.speed.trl_peer import Args


TRL_MISSING = "trl is not installed for {python}: pip install trl (e.g. in a separate venv) to run this peer benchmark"


def require_trl() -> None:
    """Exit with an install hint before any heavy import when trl is absent."""
    if importlib.util.find_spec("trl") is None:
        raise SystemExit(TRL_MISSING.format(python=sys.executable))


def base_dir(model_name_or_path: str = "embedded") -> Path:
    """The base policy's folder: `embedded` is the cached embedded base, never built here (a missing cache would
    otherwise start a ~3 minute SFT inside a timed benchmark); else a local Hugging Face model dir."""
    from common.demo.tiny_model import BaseRecipe, cache_root

    path = Path(model_name_or_path)
    if model_name_or_path == "embedded":
        path = cache_root() / f"countdown-base-{BaseRecipe().key()}"
        if not (path / "build_info.json").exists():
            raise SystemExit(
                f"no embedded base policy at {path}: build it first with "
                "python -c 'from common.demo.tiny_model import ensure_embedded_base; ensure_embedded_base()'"
            )
    elif not (path / "config.json").exists():
        raise SystemExit(
            f"--model_name_or_path {model_name_or_path}: not a local Hugging Face model dir"
        )
    return path


def load_base(model_name_or_path: str = "embedded"):
    """(model, tokenizer, dir) of the base policy (`base_dir`), loaded the way our scripts load it.

    `load_policy` is what every script uses; the round trip guards against a tokenizer
    reloaded as a class that drops characters (spaces, newlines), which would silently change every prompt.
    """
    from common.demo import countdown
    from common.model.policy import load_policy

    path = base_dir(model_name_or_path)
    model, tokenizer = load_policy(str(path))
    problem = countdown.make_splits()[0][0]
    probe = countdown.prompt_text(problem) + countdown.solution_text(
        countdown.solutions(problem)[0]
    )
    if tokenizer.decode(tokenizer(probe).input_ids, skip_special_tokens=True) != probe:
        raise SystemExit(
            f"{path}: the tokenizer ({type(tokenizer).__name__}) does not round-trip Countdown text"
        )
    return model, tokenizer, path


def countdown_examples(prompt_pool: int):
    """The training prompts our scripts see with `--prompt_pool N` (common/demo/countdown.py countdown_task)."""
    from common.demo.countdown import countdown_task

    task = countdown_task("binary", eval_prompts=1)
    return task.train[:prompt_pool] if prompt_pool > 0 else task.train, task.reward_fn


def build_dataset(examples):
    """TRL's dataset: a `prompt` column of plain strings (no chat template: the char tokenizer has none) and
    the example id, which TRL passes on to the reward function as a keyword."""
    import datasets

    return datasets.Dataset.from_dict(
        {"prompt": [ex.prompt for ex in examples], "problem_id": [ex.id for ex in examples]}
    )


class CountdownReward:
    """TRL reward function wrapping the repo's training reward, called as ada_seq calls `task.reward_fn`.

    It also records the completion tokens of each call: TRL scores one generation batch (one optimizer step
    here) per call, so these are the generated tokens per step, counted like our `gen_tokens` (stop token in).
    """

    __name__ = "countdown_binary"  # TRL names the reward's metrics after it

    def __init__(self, examples, reward_fn):
        self.by_id = {ex.id: ex for ex in examples}
        self.reward_fn = reward_fn
        self.tokens_per_call: list[int] = []

    def __call__(self, prompts, completions, completion_ids, problem_id, **_) -> list[float]:
        self.tokens_per_call.append(sum(len(ids) for ids in completion_ids))
        return [
            float(self.reward_fn(text, self.by_id[i])) for text, i in zip(completions, problem_id)
        ]


def grpo_config(
    args: Args, output_dir: str, batch: int, micro: int, cache_implementation: str | None = None
):
    """TRL's GRPOConfig for our GRPO-n setting: one generation batch of `batch` completions per optimizer step,
    trained in micro-batches of `micro` (gradient accumulation), no reference model, on `--device` in `--dtype`;
    `cache_implementation`: HF generate's KV cache (None: TRL's default, transformers' dynamic cache)."""
    from trl import GRPOConfig

    accum = batch // micro
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=args.device == "cpu",
        bf16=args.dtype == "bfloat16",
        fp16=False,
        seed=args.seed,
        gradient_checkpointing=False,  # TRL defaults it on; we never recompute activations
        max_steps=args.steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum,  # = accumulation: one generate per optimizer step, on-policy (no old-logp pass)
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        learning_rate=args.learning_rate,
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=args.warmup_steps,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,  # ada_seq's eps_low / eps_high (inactive on-policy)
        loss_type="dr_grpo",
        scale_rewards="none",  # = ours, see the definition check
        use_vllm=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_pin_memory=False,
        torch_compile=args.trl_torch_compile,
        cache_implementation=cache_implementation,
    )
