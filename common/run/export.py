"""The trained model, ready to serve: at a run's end (finished, or stopped after its checkpoint)
`<output_dir>/model/` holds a Hugging Face model directory: the weights in --save_dtype, the
tokenizer, a generation_config.json whose `eos_token_id` lists every id that ended a completion in
training, and a model card (README.md). Under LoRA it holds the adapter, and with
--lora_merged_export `model-merged/` beside it holds the plain model with the adapters folded in.
Written to `.tmp-model/` and renamed when complete: a stop never leaves half a model there."""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
from dataclasses import fields
from functools import partial
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch.distributed.fsdp import FSDPModule

from common.distributed.ranks import first_failure, stop_every_rank
from common.model.policy import DTYPES, library_bars_off, tied_keys
from common.run.flags import given_flags, parse_args
from common.run.folder_lock import lost_hold
from common.run.run_folder import EXPORT, EXPORT_MERGED, SAME_RUN
from common.run.summary import evaluations, read_metrics

PROJECT = "rlvr-sampling"
# a failed write (a full disk, no permission): the same errors a checkpoint write meets
_WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


# transformers' "Writing model shards" bar: the step bar stays the run's only bar
@library_bars_off()
def export_model(
    args, accelerator, policy, tokenizer, end_ids: list[int], script: str, method_doc: str
) -> Path:
    """Write `<args.output_dir>/model/` and return it; every rank calls it (under --fsdp each takes
    part in gathering the whole weights), the main process writes. `script` and `method_doc`: the
    script's name (`ra_rloo`) and module docstring. A failed write stops every rank (one line)."""
    output_dir = Path(args.output_dir)
    folder, tmp = output_dir / EXPORT, output_dir / f".tmp-{EXPORT}"
    model = accelerator.unwrap_model(policy)
    lora = hasattr(model, "get_base_model")
    dtype = DTYPES[args.save_dtype] if args.save_dtype else None
    # --fsdp: each rank holds 1/world of the weights; the whole ones reach the main process
    weights = None
    if isinstance(model, FSDPModule):
        from common.distributed.fsdp import full_state_dict

        weights = full_state_dict(model)
    card = partial(
        model_card, args, script, method_doc, tokenizer, end_ids, accelerator.num_processes
    )
    failed = []
    if accelerator.is_main_process:
        try:
            _stop_if_lost(output_dir)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            text = card(adapter=lora)
            _write_model(tmp / EXPORT, model, tokenizer, end_ids, weights, dtype, text)
            if lora and args.lora_merged_export:  # the adapters folded into the base weights
                from common.model.lora import merged_state_dict

                base, whole = model.get_base_model(), merged_state_dict(model)
                text = card(adapter=False)
                _write_model(tmp / EXPORT_MERGED, base, tokenizer, end_ids, whole, dtype, text)
            # a long write: another launch may have taken the folder meanwhile
            _stop_if_lost(output_dir)
            # an earlier end's export (a resumed run) is replaced whole
            for name in (EXPORT, EXPORT_MERGED):
                shutil.rmtree(output_dir / name, ignore_errors=True)
                if (tmp / name).is_dir():
                    (tmp / name).rename(output_dir / name)
            tmp.rmdir()
        except (*_WRITE_ERRORS, _Lost) as error:
            failed.append(str(error))
    if (reason := first_failure(accelerator, failed)) is not None:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        stop_every_rank(
            accelerator,
            f"{folder}: could not write the trained model: {reason}; the run's checkpoints hold "
            "its weights",
        )
    return folder


class _Lost(Exception):
    """This launch no longer holds the output folder: write nothing more there."""


def _stop_if_lost(output_dir: Path) -> None:
    if lost := lost_hold(output_dir):
        raise _Lost(lost)


def _write_model(folder: Path, model, tokenizer, end_ids, weights, dtype, card: str) -> None:
    """The model dir (main process): the weights (`weights`: the whole ones under --fsdp, the merged
    ones, else the model's own; LoRA: the adapter) in `dtype` (None: as they are), the tokenizer,
    generation_config.json and the model card."""
    lora = hasattr(model, "get_base_model")
    if weights is None and dtype is not None:
        # LoRA: the adapters only (peft saves no more), not a cast copy of the whole base
        weights = {k: v for k, v in model.state_dict().items() if not lora or "lora_" in k}
    model.save_pretrained(folder, state_dict=_cast(weights, dtype, model))
    tokenizer.save_pretrained(folder)
    base = model.get_base_model() if lora else model
    generation_config(base, tokenizer, end_ids).save_pretrained(folder)
    if not lora:
        _set_config_dtype(folder, dtype)
    (folder / "README.md").write_text(card)


def _cast(weights: dict | None, dtype, model) -> dict | None:
    """Floating-point tensors in `dtype` (None: unchanged), a tied output head left out: as copies
    (gathered, cast or merged) save_pretrained would store it twice."""
    if weights is None:
        return None
    tied = tied_keys(model)
    return {
        key: value.to(dtype) if dtype is not None and torch.is_floating_point(value) else value
        for key, value in weights.items()
        if key not in tied
    }


def _set_config_dtype(folder: Path, dtype) -> None:
    """config.json names the dtype the weights are stored in, which `from_pretrained(dtype="auto")`
    and vLLM load them in (save_pretrained writes the live model's, fp32)."""
    if dtype is None:
        return
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config["dtype"] = str(dtype).removeprefix("torch.")
    path.write_text(json.dumps(config, indent=2) + "\n")


def generation_config(model, tokenizer, end_ids: list[int]):
    """The model's generation config with `eos_token_id` listing every id that ended a completion
    in training, so that the served model stops where the trained one did."""
    from transformers import GenerationConfig

    own = getattr(model, "generation_config", None)
    config = (
        copy.deepcopy(own) if own is not None else GenerationConfig.from_model_config(model.config)
    )
    config.eos_token_id = list(end_ids)
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    return config


# flags a launch may set from accelerate's own settings without the user typing them: the card
# names them so that its command runs the same way under any accelerate config
FROM_LAUNCH = ("fsdp", "dtype")


def changed_flags(args) -> dict:
    """{flag: value} of every flag the user (or accelerate's settings) set to a value other than
    the script's default, but how the command reached the run (--output_dir, --config, resume
    flags); for `args` built in code, every flag that differs from the default."""
    defaults = parse_args(type(args), [])
    given = given_flags(args)
    return {
        name: getattr(args, name)
        for name in flag_order(type(args))
        if name not in SAME_RUN
        and getattr(args, name) != getattr(defaults, name)
        and getattr(args, name) is not None
        and (not given or name in given or name in FROM_LAUNCH)
    }


def flag_order(cls) -> list[str]:
    """The flags of `cls` as its class line reads: each shared group in turn (model, data, ...),
    then the method's own (a dataclass lists the last base's fields first)."""
    names = {field.name for field in fields(cls)}
    own = [name for name in cls.__dict__.get("__annotations__", {}) if name in names]
    shared = []
    for klass in cls.__mro__[1:]:
        for name in klass.__dict__.get("__annotations__", {}):
            if name in names and name not in own and name not in shared:
                shared.append(name)
    return shared + own


def shareable(value):
    """`value` with every absolute local path (a file, a folder, or a `file.py:function` spec,
    comma-separated) cut to its last part: a card is read on other machines."""
    if not isinstance(value, str):
        return value
    parts = []
    for part in value.split(","):
        head, sep, tail = part.rpartition(":")
        target, suffix = (head, sep + tail) if sep and tail.isidentifier() else (part, "")
        path = target.strip()
        if path.startswith("~") or Path(path).is_absolute():
            target = target.replace(path, Path(path).expanduser().name or path)
        parts.append(target + suffix)
    return ",".join(parts)


def command(script: str, flags: dict, processes: int) -> str:
    """The command that runs these flags (under `accelerate launch` on several processes, one
    machine), absolute paths cut to their last part."""
    launch = (
        f"accelerate launch --multi_gpu --num_machines 1 --num_processes {processes} {script}.py"
        if processes > 1
        else f"python {script}.py"
    )
    words = [
        f"--{name} "
        + shlex.quote(str(value).lower() if isinstance(value, bool) else str(shareable(value)))
        for name, value in flags.items()
    ]
    return " ".join([launch, *words])


def method_lines(method_doc: str) -> tuple[str, str]:
    """(the method, its paper) from a script's module docstring: its first paragraph and the one
    that starts with `Paper:`."""
    paragraphs = [" ".join(part.split()) for part in (method_doc or "").split("\n\n")]
    method = re.sub(r",? one file(?=[.;])|\s*One file\.", "", paragraphs[0])
    paper = next((part for part in paragraphs if part.startswith("Paper:")), "")
    paper = re.sub(r"\s*Docs: \S+$", "", paper.removeprefix("Paper:").strip())
    return method, paper


def _on_hub(name: str) -> bool:
    """Whether a model or dataset name is a Hub id (`name` or `owner/name`): not a local path (here
    or on the training machine), not a data file, not the embedded ones."""
    return (
        bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name))
        and not name.startswith(".")
        and not name.endswith((".jsonl", ".json", ".parquet", ".csv", ".py"))
        and not Path(name).exists()
        and name not in ("embedded", "countdown")
    )


def model_card(
    args, script: str, method_doc: str, tokenizer, end_ids: list[int], processes: int, adapter: bool
) -> str:
    """README.md of the trained model (`adapter`: the LoRA adapter, else a whole model): metadata
    for the Hub, then what a user needs to know."""
    method, paper = method_lines(method_doc)
    base = args.model_name_or_path
    base_text = (
        "the embedded ~1M-parameter Countdown model (built by rlvr-sampling)"
        if base == "embedded"
        else f"`{shareable(base)}`"
    )
    dataset = shareable(args.dataset_name) + (
        f" ({args.dataset_config})" if args.dataset_config else ""
    )
    data_text = (
        "the embedded Countdown task (generated arithmetic puzzles)"
        if args.dataset_name == "countdown"
        else f"`{dataset}`, split `{args.dataset_train_split}`"
    )
    rows = read_metrics(args.output_dir)
    steps = rows[-1]["step"] if rows else 0
    flags = changed_flags(args)

    # the run's name, as the trackers know it
    title = args.run_name or Path(args.output_dir).resolve().name
    # the Hub's metadata, as TRL's cards carry it (a local base or dataset has no Hub id to name)
    meta = ["---", f"library_name: {'peft' if adapter else 'transformers'}"]
    meta += [f"model_name: {json.dumps(title)}"]
    meta += [f"base_model: {base}"] if _on_hub(base) else []
    meta += [f"datasets:\n- {args.dataset_name}"] if _on_hub(args.dataset_name) else []
    tags = [PROJECT, script, "rlvr", "reinforcement-learning"]
    meta += ["pipeline_tag: text-generation", "tags:", *(f"- {tag}" for tag in tags), "---"]

    lines = [*meta, "", f"# {title}", ""]
    lines += [
        f"{base_text} trained with reinforcement learning from verifiable rewards on {data_text}, "
        f"by `{script}.py` of {PROJECT}.",
        "",
        "## Method",
        "",
        f"{method.rstrip('.')}: `{script}.py` of {PROJECT}. The flags below say which variant ran "
        "(each file runs its baseline behind one flag).",
        "",
    ]
    lines += [f"Paper: {paper}", ""] if paper else []
    lines += ["## Training", "", f"- base model: {base_text}", f"- dataset: {data_text}"]
    lines += [f"- steps: {steps} (of --max_steps {args.max_steps})"]
    if args.lora_r:
        kind = "the adapter" if adapter else "the base with the adapters folded in"
        lora = f"r {args.lora_r}, alpha {args.lora_alpha}, {args.lora_target_modules}"
        lines += [f"- LoRA ({lora}): this folder holds {kind}"]
    lines += [f"- weights: {args.save_dtype or 'as trained'}"]
    lines += ["", "Flags that differ from the defaults:", ""]
    if flags:
        lines += ["| flag | value |", "|---|---|"]
        lines += [f"| `--{name}` | `{shareable(value)}` |" for name, value in flags.items()]
    else:
        lines += ["none"]
    lines += ["", "The command:", "", "```bash", command(script, flags, processes), "```", ""]
    cut = [f"`--{name}`" for name, value in flags.items() if shareable(value) != value]
    if cut:  # local paths of the training machine: the command runs once they are given again
        lines += [
            f"Local paths in it are cut to their last part ({', '.join(cut)}): give the paths "
            "of those files and folders on your machine to run it.",
            "",
        ]

    lines += ["## Held-out evaluation", ""]
    found = evaluations(rows)
    if found is None:
        lines += ["No evaluation was logged.", ""]
    else:
        first, last, names = found
        lines += [
            f"| metric | step {first['step']} (start) | step {last['step']} (end) |",
            "|---|---|---|",
        ]
        lines += [f"| {label} | {first[key]:.3f} | {last[key]:.3f} |" for label, key in names]
        lines += [""]

    names = ", ".join(f"{token} {tokenizer.convert_ids_to_tokens(token)!r}" for token in end_ids)
    template = (
        "The tokenizer carries its chat template (`apply_chat_template`)."
        if tokenizer.chat_template
        else "The tokenizer has no chat template: prompts are plain text."
    )
    imports = (
        ["from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer"]
        if adapter
        else ["from transformers import AutoModelForCausalLM, AutoTokenizer"]
    )
    loader = "AutoPeftModelForCausalLM" if adapter else "AutoModelForCausalLM"
    lines += [
        "## Use",
        "",
        f"Generation ends at token ids {names} (generation_config.json), as it did in training. "
        + template,
        "",
        "```python",
        *imports,
        "",
        'path = "."  # this folder, or its Hub repo id',
        f"model = {loader}.from_pretrained(path)",
        "tokenizer = AutoTokenizer.from_pretrained(path)",
        "```",
        "",
    ]
    if adapter and args.lora_merged_export:
        lines += [
            f"`{EXPORT_MERGED}/`, beside this folder in the run's output folder, holds the same "
            "model with the adapters folded in: a plain model directory (`from_pretrained`, vLLM).",
            "",
        ]
    return "\n".join(lines)
