"""A TRL `GRPOConfig` file read as this script's flags: the YAML or JSON a `trl grpo --config` user
writes (GRPOConfig's and TrainingArguments' keys, with the CLI's ScriptArguments and ModelConfig
ones), given to `--config`, or TRL's names typed as flags on the command line (both read by
common/run/flag_sources.py): the same table, the same lines.

Every key TRL knows has one entry in `TABLE`:
- `Flag`: the key sets this script's flag (most names coincide; a converter where TRL's value
  differs in form or meaning). A script without that flag accepts only the values in `unless`,
  what it does anyway, and refuses the others.
- `Refused`: a loss, sampler, optimizer or set-up this script does not implement: one line naming
  the key, unless its value is in `unless` (TRL's "off" value, or what the script's method is).
- `Ignored`: no effect on what is trained (hub, logging, dataloader niceties).
The run's first lines say which keys became which flags and which were ignored. Keys the file
leaves out keep this script's defaults, not TRL's (a line names those that differ:
`left_out_defaults`).
docs/custom_task.md holds the table as
`python -m common.run.trl_config` prints it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


class Refusal(Exception):
    """Raised by a converter: why the key's value cannot run here (one line)."""


@dataclass
class Context:
    """What a converter reads: the whole file, this script's flags with their defaults, the
    script's name, its `Args.trl_equivalents` (the TRL values its method is) and the key read."""

    config: dict
    flags: dict
    script: str
    declared: dict = field(default_factory=dict)
    key: str = ""
    given: set = field(default_factory=set)  # this script's flags the user set elsewhere

    def value(self, flag: str):
        """The flag's value as the file sets it, else the script's default (None: no such flag)."""
        return self.config.get(flag, self.flags.get(flag))

    def trl(self, key: str):
        """The key's value in the file, else TRL's default."""
        return self.config.get(key, TRL_DEFAULTS[key])


# TRL's defaults of the keys a converter reads when the file leaves them out
TRL_DEFAULTS = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "logging_steps": 10,
    "num_iterations": 1,
    "lora_r": 16,
}


@dataclass(frozen=True)
class When:
    """A test of a key's value (value, Context) -> bool, with its wording in the docs; `reads`: the
    other keys it reads (a refusal of one of them is the reason, not this key)."""

    text: str
    test: Callable
    reads: tuple = ()


@dataclass(frozen=True)
class Flag:
    flag: str
    convert: Callable | None = None  # (value, Context) -> {flag: value}; None: {flag: value}
    unless: tuple | When = ()  # what a script without the flag accepts


@dataclass(frozen=True)
class Refused:
    why: str
    unless: tuple | When = ()


@dataclass(frozen=True)
class Ignored:
    why: str


def says(text: str, reads: tuple = ()):
    """A converter's wording in the docs' table, and the other keys it reads (`When.reads`)."""

    def mark(convert: Callable) -> Callable:
        convert.says, convert.reads = text, reads
        return convert

    return mark


def _same(a, b) -> bool:
    """Two YAML values compared as TRL reads them: 1e-8 (a YAML string) equals 1.0e-8; a bool is
    not a number."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, (dict, list)) or isinstance(b, (dict, list)):
        return a == b
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-12)
    except (TypeError, ValueError):
        return str(a) == str(b)


def accepts(unless, value, ctx: Context) -> bool:
    if isinstance(unless, When):
        return bool(unless.test(value, ctx))
    return any(_same(value, neutral) for neutral in unless)


def _yaml(value) -> str:
    """A value as a YAML file writes it."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return f"{value:g}" if isinstance(value, float) else str(value)


def _wording(unless) -> str:
    if isinstance(unless, When):
        return unless.text
    return " or ".join(f"`{_yaml(value)}`" for value in unless)


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate launch / torchrun


# ---------------------------------------------------------------- values a script accepts anyway


def _on_policy(value, ctx: Context) -> bool:
    """One optimizer step per generated batch (num_iterations 1, steps_per_generation unset or the
    accumulation): the ratio pi / pi_old is then 1, so no clip range acts."""
    has_flag = "num_iterations" in ctx.flags
    iterations = ctx.value("num_iterations") if has_flag else ctx.trl("num_iterations")
    steps = ctx.config.get("steps_per_generation")
    return _same(iterations, 1) and (
        steps is None or _same(steps, ctx.trl("gradient_accumulation_steps"))
    )


def _normal(value):
    """TRL's spellings of one setting as one (scale_rewards: true = group, false = none)."""
    return {True: "group", False: "none"}[value] if isinstance(value, bool) else value


def _one_step_a_batch(value, ctx: Context) -> bool:
    accumulation = ctx.trl("gradient_accumulation_steps")
    if ctx.key == "steps_per_generation":
        return value is None or _same(value, accumulation)
    per_step = ctx.trl("per_device_train_batch_size") * _world() * accumulation
    return value is None or _same(value, per_step)


OFF = When("`null` (or empty)", lambda value, ctx: value is None or value in ({}, [], ""))
ON_POLICY_READS = ("num_iterations", "steps_per_generation", "gradient_accumulation_steps")
ON_POLICY = When(
    "num_iterations is 1 (any value: the ratio is then 1, no clip acts)",
    _on_policy,
    ON_POLICY_READS,
)
DECLARED = When(
    "it is the script's own method (its `Args.trl_equivalents`, below)",
    lambda value, ctx: _normal(value) == ctx.declared.get(ctx.key),
)
ONE_STEP = When(
    "`null`, or one optimizer step per generated batch",
    _one_step_a_batch,
    ("gradient_accumulation_steps", "per_device_train_batch_size"),
)
REENTRANT_OFF = When(
    "`null` or `{use_reentrant: false}`",
    lambda value, ctx: value in (None, {}, {"use_reentrant": False}),
)
KL_AS_K3 = When(
    "`false`, or beta 0",
    lambda value, ctx: value is False or _same(ctx.value("beta") or 0, 0),
    ("beta",),
)
ANY = When("ignored", lambda value, ctx: True)


# ---------------------------------------------------------------- converters


@says(
    "`--dtype`, the compute dtype (weights stay float32): bfloat16 when bf16 is true or dtype "
    "bfloat16, float32 when bf16 is false or dtype float32; float16 refused",
    reads=("fp16", "bf16", "dtype", "torch_dtype"),
)
def _precision(value, ctx: Context) -> dict:
    config = ctx.config
    weights = config.get("dtype", config.get("torch_dtype"))
    if config.get("fp16") is True or weights == "float16":
        raise Refusal("float16 is not a compute dtype here: use bf16 (--dtype bfloat16)")
    if config.get("bf16") is True or weights == "bfloat16":
        return {"dtype": "bfloat16"}
    if config.get("bf16") is False or weights == "float32":
        return {"dtype": "float32"}
    return {} if weights in (None, "auto") else {"dtype": weights}  # another name: --dtype names it


@says(
    "`--micro_batch_size` (the per-device batch), and `--prompts_per_step` = per-device batch x "
    "accumulation x processes / num_generations (one optimizer step's completions, as in TRL)",
    reads=("per_device_train_batch_size", "gradient_accumulation_steps"),
)
def _batch(value, ctx: Context) -> dict:
    per_device = ctx.trl("per_device_train_batch_size")
    accumulation = ctx.trl("gradient_accumulation_steps")
    counts = (per_device, accumulation)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in counts):
        raise Refusal("per_device_train_batch_size and gradient_accumulation_steps: integers >= 1")
    if "num_generations" not in ctx.flags:
        raise Refusal(
            f"{ctx.script} draws no fixed number of completions per prompt: set prompts_per_step "
            "and micro_batch_size instead"
        )
    completions, group = per_device * accumulation * _world(), ctx.value("num_generations")
    if not isinstance(group, int) or completions % group:
        raise Refusal(
            f"{per_device} x {accumulation} x {_world()} process(es) = {completions} completions "
            f"a step, not a multiple of num_generations {group}"
        )
    out = {"prompts_per_step": completions // group}
    if "per_device_train_batch_size" in ctx.config:
        out["micro_batch_size"] = per_device
    return out


def _steps(flag: str, value, ctx: Context) -> dict:
    """A step count, or TRL's ratio of max_steps (a float below 1)."""
    if isinstance(value, float) and 0 < value < 1:
        return {flag: math.ceil(int(ctx.value("max_steps")) * value)}
    return {flag: value}


@says("`--max_steps`; -1 (train by epochs) refused")
def _max_steps(value, ctx: Context) -> dict:
    if _same(value, -1):
        raise Refusal("-1 trains by num_train_epochs; this script counts updates: max_steps >= 1")
    return {"max_steps": value}


@says("ignored beside max_steps (as in TRL); alone refused: give max_steps", reads=("max_steps",))
def _epochs(value, ctx: Context) -> dict:
    if isinstance(ctx.config.get("max_steps"), int) and ctx.config["max_steps"] > 0:
        return {}
    if "max_steps" in ctx.given:  # --max_steps beside it, on the command line or in the file
        return {}
    raise Refusal("this script counts policy updates: give max_steps (a step = prompts_per_step)")


@says("`--warmup_steps`; a float below 1 (transformers 5's ratio): `--warmup_ratio`")
def _warmup(value, ctx: Context) -> dict:
    if isinstance(value, float) and 0 < value < 1:
        return {"warmup_ratio": value}
    return {
        "warmup_steps": int(value) if isinstance(value, float) and value.is_integer() else value
    }


@says(
    "`--eval_steps` (a float below 1: a ratio of max_steps); eval_strategy `no`: 0 (the held-out "
    "evaluation at the start and end only), `epoch`: refused",
    reads=("eval_strategy",),
)
def _eval(value, ctx: Context) -> dict:
    strategy = ctx.config.get("eval_strategy", "steps")
    if strategy == "no":
        return {"eval_steps": 0}
    if strategy != "steps":
        raise Refusal(f"eval_strategy {strategy!r}: this script evaluates every eval_steps steps")
    return _steps("eval_steps", ctx.config["eval_steps"], ctx) if "eval_steps" in ctx.config else {}


@says(
    "`--save_steps` (a float below 1: a ratio of max_steps); save_strategy `no`: 0 (a checkpoint "
    "at the end only), `epoch` / `best`: refused",
    reads=("save_strategy",),
)
def _save(value, ctx: Context) -> dict:
    strategy = ctx.config.get("save_strategy", "steps")
    if strategy == "no":
        return {"save_steps": 0}
    if strategy != "steps":
        raise Refusal(f"save_strategy {strategy!r}: this script saves every save_steps steps")
    return _steps("save_steps", ctx.config["save_steps"], ctx) if "save_steps" in ctx.config else {}


@says("`--save_total_limit` (null, TRL's keep-all: 0)")
def _keep(value, ctx: Context) -> dict:
    return {"save_total_limit": 0 if value is None else value}


def _list_or_text(flag: str, what: str) -> Callable:
    """A YAML list as this script's comma-separated string."""

    @says(f"`--{flag}` (a list: comma-joined{what})")
    def convert(value, ctx: Context) -> dict:
        if isinstance(value, (list, tuple)):
            return {flag: ",".join(_yaml(item) for item in value)}
        return {flag: value}

    return convert


# TRL's reward functions known by name (its `trl grpo` script's registry)
TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")


@says(
    "`--reward_funcs`: the reward model first, then each function: TRL's names as "
    "`trl.rewards:<name>`, a dotted path `a.b.f` as `a.b:f`"
)
def _rewards(value, ctx: Context) -> dict:
    funcs = ctx.config.get("reward_funcs")
    model = ctx.config.get("reward_model_name_or_path")
    if isinstance(funcs, str) and model is None:
        return {"reward_funcs": funcs}  # this script's own spelling
    if isinstance(funcs, str):
        funcs = [funcs]
    specs = [model] if model else []
    for name in funcs or []:
        name = str(name)
        if name == "get_soft_overlong_punishment":
            raise Refusal(
                "get_soft_overlong_punishment is a factory: make the function in a file of yours "
                "and name it `file.py:name` (docs/custom_task.md, From TRL)"
            )
        if name in TRL_REWARDS:
            specs.append(f"trl.rewards:{name}")
        elif ":" in name:
            specs.append(name)
        elif "." in name:
            module, _, function = name.rpartition(".")
            specs.append(f"{module}:{function}")
        else:
            raise Refusal(f"{name!r}: expected one of {list(TRL_REWARDS)} or a dotted import path")
    return {"reward_funcs": ",".join(specs) if specs else None}


@says(
    "`--lora_r`: with use_peft true lora_r (TRL's default 16), with use_peft false 0; lora_r "
    "without use_peft: this script's (LoRA when > 0)"
)
def _lora(value, ctx: Context) -> dict:
    if "use_peft" not in ctx.config:
        return {"lora_r": value}
    return {"lora_r": ctx.trl("lora_r") if ctx.config["use_peft"] is True else 0}


@says("`--fsdp` for `full_shard` (with `auto_wrap`); other options refused")
def _fsdp(value, ctx: Context) -> dict:
    if value is None or value in ("", []):
        return {}
    if isinstance(value, bool):
        return {"fsdp": value}
    options = set(value.split() if isinstance(value, str) else value)
    if "full_shard" in options and options <= {"full_shard", "auto_wrap"}:
        return {"fsdp": True}
    raise Refusal(
        "only full sharding (full_shard, a unit per decoder layer) is implemented: --fsdp"
    )


@says(
    "log_completions true: `--log_samples_every` logging_steps (rollouts in samples.jsonl); "
    "otherwise ignored: every step is logged"
)
def _samples(value, ctx: Context) -> dict:
    if ctx.config.get("log_completions") is True:
        return {"log_samples_every": ctx.trl("logging_steps")}
    return {}


@says("`--resume_from_checkpoint` (true: `auto`)")
def _resume(value, ctx: Context) -> dict:
    if value is True:
        return {"resume_from_checkpoint": "auto"}
    return {"resume_from_checkpoint": None if value is False else value}


@says("`--scale_rewards`: `group` / true: true, `none` / false: false, `batch`: refused")
def _scale(value, ctx: Context) -> dict:
    if _normal(value) not in ("group", "none"):
        raise Refusal(f"{value!r}: advantages are scaled by the group's std (true) or not (false)")
    return {"scale_rewards": _normal(value) == "group"}


@says("`--epsilon_high` (null: epsilon's value, TRL's symmetric clip)")
def _epsilon_high(value, ctx: Context) -> dict:
    return {"epsilon_high": ctx.value("epsilon") if value is None else value}


def _renamed(flag: str, what: str = "") -> Callable:
    """The value under this script's name for it (null: the flag's default)."""

    @says(f"`--{flag}`{what}")
    def convert(value, ctx: Context) -> dict:
        return {} if value is None else {flag: value}

    return convert


@says(
    "`--vllm_importance_sampling_correction`, as TRL reads it: true applies with vLLM only (unset: "
    "on with `use_vllm`), false turns it off"
)
def _sampler_correction(value, ctx: Context) -> dict:
    # GRPOConfig's default is true, and TRL ignores it without vLLM: unset follows --use_vllm
    return {} if value is None or value is True else {"vllm_importance_sampling_correction": value}


@says("`--max_prompt_length`: a longer prompt is dropped (counted in the log), where TRL cut it")
def _prompt_length(value, ctx: Context) -> dict:
    return {"max_prompt_length": value}


# ---------------------------------------------------------------- the table

A_PASS = "this script makes one optimizer step per generated batch"
LAUNCH = "a launcher setting: `accelerate launch --num_processes N --config_file F script.py ...`"
FULL = "training samples the model's full distribution (at --temperature)"
SAMPLER = "prompts come from this script's seeded sampler"
HUB = "a hub upload: the run uploads nothing"
LOGGING = "a logging detail (every step is in metrics.jsonl)"
ONLY_WITH = "only used with {}, refused here"


def _json_text(value, ctx) -> dict:
    """A YAML mapping (TRL's dict) as the JSON text --lr_scheduler_kwargs takes; null: unset."""
    if value is None or isinstance(value, str):
        return {"lr_scheduler_kwargs": value}
    return {"lr_scheduler_kwargs": json.dumps(value)}


TABLE: dict[str, Flag | Refused | Ignored] = {
    # ---- model and data: the CLI's ModelConfig and ScriptArguments
    "model_name_or_path": Flag("model_name_or_path"),
    "model_revision": Refused("the model loads at its default revision", ("main", None)),
    "dtype": Flag("dtype", _precision),
    "torch_dtype": Flag("dtype", _precision),
    "attn_implementation": Ignored("the attention kernel: speed, not the method"),
    "trust_remote_code": Refused("models load without remote code", (False,)),
    "model_init_kwargs": Refused("the model loads with its own settings", OFF),
    "use_peft": Flag("lora_r", _lora),
    "lora_r": Flag("lora_r", _lora),
    "lora_alpha": Flag("lora_alpha"),
    "lora_dropout": Refused("LoRA adapters here have no dropout", (0, None)),
    "lora_target_modules": Flag("lora_target_modules", _list_or_text("lora_target_modules", "")),
    "lora_target_parameters": Refused("LoRA adapts modules only", OFF),
    "lora_modules_to_save": Refused("only the adapters train under LoRA", OFF),
    "lora_task_type": Refused("the adapters are a causal LM's", ("CAUSAL_LM",)),
    "use_rslora": Refused("LoRA scales by lora_alpha / lora_r", (False,)),
    "use_dora": Refused("plain LoRA only", (False,)),
    "load_in_8bit": Refused("no quantized base models", (False,)),
    "load_in_4bit": Refused("no quantized base models", (False,)),
    "bnb_4bit_quant_type": Ignored(ONLY_WITH.format("load_in_4bit")),
    "use_bnb_nested_quant": Ignored(ONLY_WITH.format("load_in_4bit")),
    "bnb_4bit_quant_storage": Ignored(ONLY_WITH.format("load_in_4bit")),
    "dataset_name": Flag("dataset_name"),
    "dataset_config": Flag("dataset_config"),
    "dataset_train_split": Flag("dataset_train_split"),
    "dataset_test_split": Flag("dataset_test_split"),
    "dataset_streaming": Refused("datasets load whole", (False,)),
    "streaming": Refused("datasets load whole", (False,)),
    "datasets": Refused("one dataset_name here (and --eval_dataset for the evaluation)", OFF),
    "test_split_size": Ignored(ONLY_WITH.format("a datasets mixture")),
    "ignore_bias_buffers": Ignored("a DDP detail of TRL's scripts"),
    "reward_funcs": Flag("reward_funcs", _rewards),
    "reward_model_name_or_path": Flag("reward_funcs", _rewards),
    "reward_weights": Flag("reward_weights", _list_or_text("reward_weights", ", in order")),
    "remove_unused_columns": Ignored("every column reaches the reward functions here"),
    "shuffle_dataset": Refused("prompts are drawn in seeded shuffles, epoch after epoch", (True,)),
    # ---- the batch, the run's length, the optimizer and its schedule
    "per_device_train_batch_size": Flag("prompts_per_step", _batch),
    "gradient_accumulation_steps": Flag("prompts_per_step", _batch),
    "generation_batch_size": Refused(A_PASS, ONE_STEP),
    "steps_per_generation": Refused(A_PASS, ONE_STEP),
    "max_steps": Flag("max_steps", _max_steps),
    "num_train_epochs": Flag("max_steps", _epochs),
    "learning_rate": Flag("learning_rate"),
    "lr_scheduler_type": Flag("lr_scheduler_type"),
    "lr_scheduler_kwargs": Flag("lr_scheduler_kwargs", _json_text),
    "warmup_steps": Flag("warmup_steps", _warmup, unless=(0,)),
    "warmup_ratio": Flag("warmup_ratio", unless=(0, None)),
    "optim": Refused("the optimizer is torch's AdamW", ("adamw_torch", "adamw_torch_fused")),
    "optim_args": Refused("AdamW with torch's settings", OFF),
    "optim_target_modules": Refused("AdamW over every trained parameter", OFF),
    "weight_decay": Flag("weight_decay"),
    "adam_beta1": Refused("AdamW's betas are torch's", (0.9,)),
    "adam_beta2": Refused("AdamW's betas are torch's", (0.999,)),
    "adam_epsilon": Refused("AdamW's epsilon is torch's", (1e-8,)),
    "max_grad_norm": Flag("max_grad_norm"),
    "seed": Flag("seed"),
    "data_seed": Ignored("the data order follows --seed"),
    "full_determinism": Ignored("a resume here is exact already"),
    "average_tokens_across_devices": Ignored("each method normalises its own loss"),
    "label_smoothing_factor": Ignored("not used by GRPO"),
    "label_names": Ignored("not used by GRPO"),
    "neftune_noise_alpha": Refused("no noise on the embeddings", OFF),
    # ---- the method
    "num_generations": Flag("num_generations"),
    "beta": Flag("beta", unless=(0,)),
    "num_iterations": Flag("num_iterations", unless=(1,)),
    "epsilon": Flag("epsilon", unless=ON_POLICY),
    "epsilon_high": Flag("epsilon_high", _epsilon_high, unless=ON_POLICY),
    "delta": Refused(
        "no two-sided clipping", When("`null`, or num_iterations 1", _on_policy, ON_POLICY_READS)
    ),
    "loss_type": Refused("the loss is the method's own", DECLARED),
    "scale_rewards": Flag("scale_rewards", _scale, unless=DECLARED),
    "importance_sampling_level": Refused("token-level log-prob ratios", ("token",)),
    "multi_objective_aggregation": Refused(
        "the reward is the functions' weighted sum", ("sum_then_normalize",)
    ),
    "mask_truncated_completions": Flag("mask_truncated_completions"),
    "entropy_coef": Flag("entropy_coef", unless=(0,)),
    "use_adaptive_entropy": Refused("no adaptive entropy bonus", (False,)),
    "entropy_coef_min": Ignored(ONLY_WITH.format("use_adaptive_entropy")),
    "entropy_coef_max": Ignored(ONLY_WITH.format("use_adaptive_entropy")),
    "entropy_coef_delta": Ignored(ONLY_WITH.format("use_adaptive_entropy")),
    "entropy_target": Ignored(ONLY_WITH.format("use_adaptive_entropy")),
    "top_entropy_quantile": Refused("every completion token is trained", (1,)),
    "sync_ref_model": Refused("the KL reference is the initial policy", (False,)),
    "ref_model_mixup_alpha": Ignored(ONLY_WITH.format("sync_ref_model")),
    "ref_model_sync_steps": Ignored(ONLY_WITH.format("sync_ref_model")),
    "use_bias_correction_kl": Refused("the KL's gradient is the k3 estimator's", KL_AS_K3),
    "off_policy_mask_threshold": Refused("no off-policy sequence masking", OFF),
    "sapo_temperature_neg": Ignored(ONLY_WITH.format("loss_type sapo")),
    "sapo_temperature_pos": Ignored(ONLY_WITH.format("loss_type sapo")),
    "vespo_k_pos": Ignored(ONLY_WITH.format("loss_type vespo")),
    "vespo_lambda_pos": Ignored(ONLY_WITH.format("loss_type vespo")),
    "vespo_k_neg": Ignored(ONLY_WITH.format("loss_type vespo")),
    "vespo_lambda_neg": Ignored(ONLY_WITH.format("loss_type vespo")),
    "disable_dropout": Refused("dropout is what the model's config sets", (False,)),
    "cast_lm_head_to_fp32": Refused("the output head computes in --dtype", (False,)),
    "router_aux_loss_coef": Refused("no mixture-of-experts auxiliary loss", OFF),
    "max_tool_calling_iterations": Refused("no tool calling", OFF),
    # ---- generation
    "max_completion_length": Flag("max_completion_length"),
    "max_prompt_length": Flag("max_prompt_length", _prompt_length),  # earlier TRL versions
    "temperature": Flag("temperature"),
    "top_p": Refused(FULL, (1, None)),
    "top_k": Refused(FULL, (0, None)),
    "min_p": Refused(FULL, (0, None)),
    "repetition_penalty": Refused(FULL, (1,)),
    "generation_kwargs": Refused(FULL, OFF),
    "chat_template_kwargs": Refused("the chat template renders with its defaults", OFF),
    "cache_implementation": Flag("cache_implementation"),
    "num_generations_eval": Flag("eval_samples", _renamed("eval_samples")),
    "ds3_gather_for_generation": Ignored("DeepSpeed only (not used here)"),
    "pad_to_multiple_of": Ignored("padding: speed, not the method"),
    "use_transformers_continuous_batching": Ignored("generation speed (--use_vllm here)"),
    "transformers_continuous_batching_config": Ignored("generation speed (--use_vllm here)"),
    "use_transformers_paged": Ignored("generation speed (--use_vllm here)"),
    "use_vllm": Flag("use_vllm"),
    "vllm_mode": Refused("vLLM runs in the training process", ("colocate",)),
    "vllm_model_impl": Refused("vLLM's own model code", ("vllm",)),
    "vllm_enable_sleep_mode": Ignored("memory only"),
    "vllm_structured_outputs_regex": Refused("no constrained decoding", OFF),
    "vllm_server_base_url": Ignored(ONLY_WITH.format("vllm_mode server")),
    "vllm_server_host": Ignored(ONLY_WITH.format("vllm_mode server")),
    "vllm_server_port": Ignored(ONLY_WITH.format("vllm_mode server")),
    "vllm_server_timeout": Ignored(ONLY_WITH.format("vllm_mode server")),
    "vllm_group_port": Ignored(ONLY_WITH.format("vllm_mode server")),
    "vllm_gpu_memory_utilization": Flag("vllm_gpu_memory_utilization"),
    "vllm_max_model_length": Flag(
        "vllm_max_model_length", _renamed("vllm_max_model_length", " (null: 2048 here)")
    ),
    "vllm_tensor_parallel_size": Refused("one vLLM engine per process", (1,)),
    "vllm_importance_sampling_correction": Flag(
        "vllm_importance_sampling_correction", _sampler_correction
    ),
    "vllm_importance_sampling_mode": Flag("vllm_importance_sampling_mode"),
    "vllm_importance_sampling_clip_max": Flag("vllm_importance_sampling_clip_max"),
    "vllm_importance_sampling_clip_min": Flag("vllm_importance_sampling_clip_min"),
    "vllm_importance_sampling_cap": Flag(
        "vllm_importance_sampling_clip_max",
        _renamed("vllm_importance_sampling_clip_max", " (TRL's deprecated name for it)"),
    ),
    # ---- precision, memory, compilation, processes
    "bf16": Flag("dtype", _precision),
    "fp16": Flag("dtype", _precision),
    "tf32": Ignored("a GPU matmul setting: speed"),
    "bf16_full_eval": Ignored("the evaluation computes in --dtype"),
    "fp16_full_eval": Ignored("the evaluation computes in --dtype"),
    "gradient_checkpointing": Flag("gradient_checkpointing"),
    "gradient_checkpointing_kwargs": Refused("checkpointing is non-reentrant", REENTRANT_OFF),
    "torch_compile": Flag("torch_compile"),
    "torch_compile_backend": Refused("torch.compile's default backend", OFF),
    "torch_compile_mode": Refused("torch.compile's default mode", OFF),
    "use_liger_kernel": Ignored("log-probs are computed by this script's code"),
    "liger_kernel_config": Ignored("log-probs are computed by this script's code"),
    "use_cache": Ignored("generation uses the KV cache anyway"),
    "torch_empty_cache_steps": Ignored("memory only"),
    "auto_find_batch_size": Ignored("memory only"),
    "fsdp": Flag("fsdp", _fsdp),
    "fsdp_config": Ignored("FSDP here wraps each decoder layer"),
    "deepspeed": Refused("no DeepSpeed here: --fsdp shards", OFF),
    "accelerator_config": Refused("accelerate's defaults", OFF),
    "parallelism_config": Refused("data parallel (and --fsdp) only", OFF),
    "ddp_timeout": Flag("collective_timeout", _renamed("collective_timeout")),
    "ddp_find_unused_parameters": Ignored("a DDP detail"),
    "ddp_bucket_cap_mb": Ignored("a DDP detail"),
    "ddp_broadcast_buffers": Ignored("a DDP detail"),
    "ddp_static_graph": Ignored("a DDP detail"),
    "ddp_backend": Ignored("accelerate picks it"),
    "use_cpu": Ignored("the device is accelerate's (CUDA_VISIBLE_DEVICES= for the CPU)"),
    "local_rank": Ignored("set by the launcher"),
    "num_processes": Refused(LAUNCH, OFF),
    "accelerate_config": Refused(LAUNCH, OFF),
    "env": Refused("set environment variables in the shell, before the command", OFF),
    "dataloader_drop_last": Ignored(SAMPLER),
    "dataloader_num_workers": Ignored(SAMPLER),
    "dataloader_pin_memory": Ignored(SAMPLER),
    "dataloader_persistent_workers": Ignored(SAMPLER),
    "dataloader_prefetch_factor": Ignored(SAMPLER),
    "dataloader_multiprocessing_context": Ignored(SAMPLER),
    "dataloader_in_order": Ignored(SAMPLER),
    "train_sampling_strategy": Ignored(SAMPLER),
    "length_column_name": Ignored(SAMPLER),
    # ---- checkpoints, evaluation, resuming
    "output_dir": Flag("output_dir", _renamed("output_dir", " (null: runs/<script>-seed<seed>)")),
    "save_strategy": Flag("save_steps", _save),
    "save_steps": Flag("save_steps", _save),
    "save_total_limit": Flag("save_total_limit", _keep),
    "save_only_model": Ignored("a checkpoint here always holds what an exact resume needs"),
    "save_on_each_node": Ignored("the output folder is shared by every machine"),
    "enable_jit_checkpoint": Ignored("checkpoints are written between steps"),
    "resume_from_checkpoint": Flag("resume_from_checkpoint", _resume),
    "restore_callback_states_from_checkpoint": Ignored("no callbacks"),
    "ignore_data_skip": Ignored("a resume restores the prompt order exactly"),
    "eval_strategy": Flag("eval_steps", _eval),
    "eval_steps": Flag("eval_steps", _eval),
    "eval_on_start": Ignored("the evaluation always runs at the start"),
    "eval_delay": Ignored("the evaluation runs every eval_steps"),
    "per_device_eval_batch_size": Ignored("the evaluation batches as generation does"),
    "eval_accumulation_steps": Ignored("the evaluation is pass@k"),
    "prediction_loss_only": Ignored("the evaluation is pass@k"),
    "eval_do_concat_batches": Ignored("the evaluation is pass@k"),
    "eval_use_gather_object": Ignored("the evaluation is pass@k"),
    "include_for_metrics": Ignored("the evaluation is pass@k"),
    "batch_eval_metrics": Ignored("the evaluation is pass@k"),
    "load_best_model_at_end": Ignored("the saved model is the last step's"),
    "metric_for_best_model": Ignored("the saved model is the last step's"),
    "greater_is_better": Ignored("the saved model is the last step's"),
    "do_train": Ignored("a run trains"),
    "do_eval": Ignored("the held-out evaluation always runs"),
    "do_predict": Ignored("no prediction pass"),
    # ---- trackers and logging
    "report_to": Flag("report_to", _list_or_text("report_to", "")),
    "run_name": Flag("run_name", unless=ANY),
    "project": Flag("project", unless=ANY),
    "trackio_space_id": Ignored("a tracker detail"),
    "trackio_bucket_id": Ignored("a tracker detail"),
    "trackio_static_space_id": Ignored("a tracker detail"),
    "log_completions": Flag("log_samples_every", _samples),
    "logging_steps": Flag("log_samples_every", _samples),
    "logging_strategy": Ignored(LOGGING),
    "logging_first_step": Ignored(LOGGING),
    "logging_nan_inf_filter": Ignored(LOGGING),
    "log_on_each_node": Ignored(LOGGING),
    "log_level": Ignored(LOGGING),
    "log_level_replica": Ignored(LOGGING),
    "disable_tqdm": Ignored(LOGGING),
    "include_num_input_tokens_seen": Ignored(LOGGING),
    "log_multimodal": Ignored(LOGGING),
    "num_completions_to_print": Ignored(LOGGING),
    "log_unique_prompts": Ignored(LOGGING),
    "skip_memory_metrics": Ignored(LOGGING),
    "debug": Ignored(LOGGING),
    # ---- the hub
    "log_completions_hub_repo": Ignored(HUB),
    "push_to_hub": Ignored(HUB),
    "hub_model_id": Ignored(HUB),
    "hub_token": Ignored(HUB),
    "hub_private_repo": Ignored(HUB),
    "hub_strategy": Ignored(HUB),
    "hub_always_push": Ignored(HUB),
    "hub_revision": Ignored(HUB),
}


# ---------------------------------------------------------------- reading a file

# TRL 1.16 GRPOConfig's defaults of the keys whose default here differs in some script: a file
# that leaves one out trains with this script's value, which its first lines name
TRL_GRPO_DEFAULTS = {
    "beta": 0.0,
    "learning_rate": 1e-6,
    "num_generations": 8,
    "max_completion_length": 512,
    "lr_scheduler_type": "linear",
    "warmup_steps": 0,
    "epsilon_high": None,
    "scale_rewards": "group",
    "seed": 42,
    "gradient_checkpointing": True,
}


def left_out_defaults(data: dict, cls, heading: str, given=()) -> str | None:
    """The line naming the TRL GRPOConfig defaults that differ here, for the keys a TRL file
    (one with a key that is no flag of this script) leaves out and the command line does not set;
    None for any other file (a run's args.json) or when none differs."""
    flags = {
        f.name: None if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
    }
    if not any(key in TABLE and key not in flags for key in data):
        return None
    ctx = Context(data, flags, script_name(cls), dict(getattr(cls, "trl_equivalents", {})))
    differ = []
    for key, trl in TRL_GRPO_DEFAULTS.items():
        entry = TABLE[key]
        if key in data or entry.flag in given or entry.flag not in flags:
            continue
        try:
            ours = entry.convert(trl, ctx) if entry.convert else {entry.flag: trl}
        except Refusal:
            continue
        if entry.flag in ours and not _same(ours[entry.flag], flags[entry.flag]):
            theirs = "epsilon's" if key == "epsilon_high" else _yaml(trl)  # TRL's None: = epsilon
            differ.append(f"{key} {_yaml(flags[entry.flag])} (TRL {theirs})")
    if not differ:
        return None
    return (
        f"{heading}: keys it leaves out keep {ctx.script}'s defaults, not TRL GRPOConfig's: "
        + ", ".join(differ)
    )


def script_name(cls) -> str:
    module = sys.modules.get(cls.__module__)
    return Path(getattr(module, "__file__", None) or f"{cls.__module__}.py").name


def translate(
    data: dict, cls, heading: str, where=None, known=None, given=()
) -> tuple[list[tuple[str, str, object]], list[str], list[str]]:
    """The keys of `data` (a --config file's, or TRL names typed on the command line) as (key, flag,
    value) settings, TRL's keys through TABLE (any other key is left for the caller to check as a
    flag); the lines saying what became of TRL's keys, each starting with `heading`; and a line for
    each key this script cannot honour, blamed on that key alone (a refusal that follows from
    another refused key, as epsilon's from num_iterations', is that key's). `where(key)` names a
    key in those lines (default: `heading: key 'name'`); converters also read `known`, the script's
    flag values so far (default: its defaults), and `given`, the flags the user set outside
    `data`."""
    flags = {
        f.name: None if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(cls)
    }
    flags.update(known or {})
    noun = "flags" if where else "keys"  # the command line's names, or a file's
    where = where or (lambda key: f"{heading}: key {key!r}")
    ctx = Context(
        data, flags, script_name(cls), dict(getattr(cls, "trl_equivalents", {})), given=set(given)
    )
    settings, mapped, kept, ignored = [], {}, [], []
    refused: dict[str, str] = {}
    reads: dict[str, tuple] = {}  # the other keys a refusal's test read
    for key, value in data.items():
        entry, ctx.key = TABLE.get(key), key
        if entry is None:
            settings.append((key, key, value))
        elif isinstance(entry, Ignored) or (
            getattr(entry, "unless", None) is ANY and entry.flag not in flags
        ):
            ignored.append(key)
        elif isinstance(entry, Refused) or entry.flag not in flags:
            if not accepts(entry.unless, value, ctx):
                refused[key] = f"{where(key)}: {_yaml(value)} {_refusal(entry, ctx)}"
                reads[key] = getattr(entry.unless, "reads", ())
                continue
            kept.append(f"{key} {_yaml(value)}")
        else:
            try:
                out = entry.convert(value, ctx) if entry.convert else {entry.flag: value}
            except Refusal as why:
                refused[key] = f"{where(key)}: {why}"
                reads[key] = getattr(entry.convert, "reads", ())
                continue
            missing = [flag for flag in out if flag not in flags]
            if missing and not accepts(entry.unless, value, ctx):
                refused[key] = (
                    f"{where(key)}: {_yaml(value)} needs --{missing[0]}, which {ctx.script} has not"
                )
                reads[key] = getattr(entry.unless, "reads", ())
                continue
            if missing:
                kept.append(f"{key} {_yaml(value)}")
                continue
            if not out:
                ignored.append(key)
                continue
            settings.extend((key, flag, converted) for flag, converted in out.items())
            if out != {key: value}:
                shown = " ".join(f"--{flag} {_yaml(converted)}" for flag, converted in out.items())
                mapped.setdefault(shown, []).append(key)
    notes = []
    if mapped:
        pairs = [f"{', '.join(keys)} -> {shown}" for shown, keys in mapped.items()]
        became = "read as flags" if noun == "keys" else "became"
        notes.append(f"{heading}: TRL {noun} {became}: {'; '.join(pairs)}")
    if kept:
        notes.append(f"{heading}: TRL {noun} as {ctx.script} does already: {', '.join(kept)}")
    if ignored:
        notes.append(f"{heading}: TRL {noun} ignored (no effect here): {', '.join(ignored)}")
    order = list(refused)

    def follows(key: str, other: str) -> bool:  # key's refusal is other's (the first of two)
        mutual = key in reads.get(other, ())
        return other in reads.get(key, ()) and (not mutual or order.index(other) < order.index(key))

    problems = [
        line for key, line in refused.items() if not any(follows(key, o) for o in order if o != key)
    ]
    return settings, notes, problems


def _refusal(entry, ctx: Context) -> str:
    """Why a value is refused, and what this script accepts."""
    if entry.unless is DECLARED:
        own = ctx.declared.get(ctx.key)
        if own is None:
            return f"is refused: {ctx.script} implements no TRL {ctx.key} (remove the key)"
        return f"is refused: {ctx.script} implements {ctx.key} {own} (its Args.trl_equivalents)"
    if isinstance(entry, Flag):
        only = f" (accepted: {_wording(entry.unless)})" if entry.unless else ""
        return f"is refused: {ctx.script} has no --{entry.flag}{only}"
    return f"is refused: {entry.why} (accepted: {_wording(entry.unless)})"


# ---------------------------------------------------------------- the docs' table


def describe(entry) -> str:
    """An entry's row text in the docs."""
    if isinstance(entry, Ignored):
        return f"ignored: {entry.why}"
    if isinstance(entry, Refused):
        return f"refused unless {_wording(entry.unless)}: {entry.why}"
    text = getattr(entry.convert, "says", None) or "the flag of the same name"
    if entry.unless is ANY:
        return f"{text}; ignored by a script without it"
    if entry.unless:
        return f"{text}; a script without it: refused unless {_wording(entry.unless)}"
    return text


def declared_by_scripts() -> dict[str, dict]:
    """{script: its Args.trl_equivalents}, read from the files without importing them."""
    found = {}
    for path in sorted(ROOT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            target = getattr(node, "target", None)
            if isinstance(node, ast.AnnAssign) and getattr(target, "id", "") == "trl_equivalents":
                found[path.name] = ast.literal_eval(node.value)
    return found


def markdown() -> str:
    """docs/custom_task.md's table: a row per treatment, with every key of TABLE in one row."""
    rows: dict[str, list[str]] = {}
    for key, entry in TABLE.items():
        rows.setdefault(describe(entry), []).append(key)
    lines = ["| TRL key | here |", "|---|---|"]
    for kind in (Flag, Refused, Ignored):
        for text, keys in rows.items():
            if isinstance(TABLE[keys[0]], kind):
                lines.append(f"| {', '.join(f'`{key}`' for key in keys)} | {text} |")
    lines += [
        "",
        "What each method is in TRL's terms (`trl_equivalents` in the script's `Args`):",
        "",
    ]
    for script, values in declared_by_scripts().items():
        lines.append(f"- `{script}`: " + ", ".join(f"`{k}: {v}`" for k, v in values.items()))
    return "\n".join(lines)


DOCS = ROOT / "docs" / "custom_task.md"
BEGIN = "<!-- generated by python -m common.run.trl_config: begin -->"
END = "<!-- generated by python -m common.run.trl_config: end -->"


def docs_block(text: str) -> str:
    """The generated table as docs/custom_task.md holds it."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(
        description="Print the table of TRL GRPOConfig keys that docs/custom_task.md holds."
    )
    parser.add_argument(
        "--write_docs", action="store_true", help="write it into docs/custom_task.md instead"
    )
    if parser.parse_args().write_docs:
        text = DOCS.read_text()
        DOCS.write_text(text.replace(docs_block(text), markdown()))
    else:
        print(markdown())
