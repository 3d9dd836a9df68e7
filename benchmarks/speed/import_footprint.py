"""Which `common/` modules a method script loads on the real-data path, and how many lines they hold.

Each script runs one step (`--max_steps 1`) on a local Hugging Face model directory and a local `.jsonl` dataset
(both generated here: an untrained tiny Llama with the char tokenizer, and arithmetic questions with `####` gold
answers), in its own process; at exit the `common/*.py` files in `sys.modules` are listed with their line counts.
This is what you copy together with one method file to use it on your own model and data.

    python benchmarks/speed/import_footprint.py                # table for the five scripts
    python benchmarks/speed/import_footprint.py --markdown     # a markdown table (docs/development.md)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common.run.flags import parse_args  # noqa: E402

SCRIPTS = ("ra_rloo.py", "ada_seq.py", "ada_est.py", "ps_grpo.py", "pros_ppo.py")
DEMO_MODULES = (
    "common.demo.countdown",
    "common.demo.countdown_env",
    "common.demo.tiny_model",
)  # the embedded demo only
ONLY_WHEN_ASKED = (
    "common.run.trl_config",  # --config, or a TRL GRPOConfig name on the command line
    "common.generation.vllm_backend",  # --use_vllm
    "common.rl.sampler_correction",  # --vllm_importance_sampling_correction (on with --use_vllm)
    "common.generation.compile",  # --torch_compile
    "common.distributed.fsdp",  # --fsdp
    "common.model.lora",  # --lora_r
    "common.tasks.rewards",  # --reward_funcs
    "common.run.resume",  # --resume_from_checkpoint
    "common.run.resume_checks",  # --resume_from_checkpoint
    "common.run.clear_run",  # --overwrite_output_dir, --discard_later_checkpoints
    "common.run.flag_sources",  # --config, a TRL name, or a word that is not a flag
    "common.run.trackers",  # --report_to
    "common.run.accelerate_env",  # accelerate launch (its ACCELERATE_* variables)
    "common.run.shared_folder",  # several processes
    "common.distributed.timeouts",  # a collective that timed out, in several processes
    "common.run.folder_errors",  # a failed write in the output folder, or another launch holding it
    "common.run.mixed_precision",  # ACCELERATE_MIXED_PRECISION set (accelerate config)
    "common.tasks.hub_datasets",  # a hub dataset or a save_to_disk folder (not a local file)
    "common.tasks.dataset_errors",  # a dataset column or row the run cannot use
    "common.generation.stop_tokens",  # --stop_token_ids
    "common.run.schedulers",  # --lr_scheduler_type other than warmup_constant, or --lr_scheduler_kwargs
    "common.run.flag_help",  # --help
    "common.run.used_folder",  # --resume_from_checkpoint, or an --output_dir that holds a run
)
KL_REFERENCE = "common.model.reference"
"""loaded only with --beta > 0 (the default of ra_rloo.py alone)"""
MAX_LINES = 4550
"""the most lines of common/ a one-step real-data run of a script may load (tests/test_layout.py)"""

PROBE = """
import atexit, json, runpy, sys
from pathlib import Path

out, script = sys.argv[1], sys.argv[2]

def report():
    files = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (name == "common" or name.startswith("common.")) and path:
            files[name] = len(Path(path).read_text().splitlines())
    Path(out).write_text(json.dumps(files))

atexit.register(report)
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


@dataclass
class Args:
    markdown: bool = False
    """print a markdown table instead of one line per script"""
    max_lines: int = MAX_LINES
    """exit with status 1 when a script loads more lines of common/ than this"""


def make_inputs(tmp: Path) -> tuple[str, str]:
    """An untrained tiny model directory and a 40-row local jsonl dataset."""
    from common.demo.tiny_model import BaseRecipe, build_char_tokenizer, build_tiny_model

    model_dir = tmp / "model"
    tokenizer = build_char_tokenizer()
    build_tiny_model(BaseRecipe(num_layers=1), len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"}) + "\n"
            for i in range(40)
        )
    )
    return str(model_dir), str(data)


def footprint(script: str, model_dir: str, data: str, tmp: Path) -> dict[str, int]:
    """{module: lines} of the `common` modules `script` has loaded when it exits after one real-data step."""
    out = tmp / f"{script}.json"
    flags = [
        "--model_name_or_path",
        model_dir,
        "--dataset_name",
        data,
        "--output_dir",
        str(tmp / f"run-{script}"),
        "--max_steps",
        "1",
        "--eval_steps",
        "0",
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
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), script, *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(
            f"{script} failed on the real-data path ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads(out.read_text())


def main(args: Args) -> int:
    results = {}
    with tempfile.TemporaryDirectory(prefix="footprint-") as tmp_name:
        tmp = Path(tmp_name)
        model_dir, data = make_inputs(tmp)
        for script in SCRIPTS:
            results[script] = footprint(script, model_dir, data, tmp)
    worst = 0
    if args.markdown:
        print(
            "| script | its own lines | `common/` files it loads (real-data path) | `common/` lines |"
        )
        print("|---|---|---|---|")
    for script, modules in results.items():
        total = sum(modules.values())
        worst = max(worst, total)
        own = len((ROOT / script).read_text().splitlines())
        names = ", ".join(
            f"{name.split('.', 1)[1]}.py ({lines})"
            for name, lines in sorted(modules.items())
            if name != "common"
        )
        demo = [name for name in modules if name in DEMO_MODULES]
        if args.markdown:
            print(f"| `{script}` | {own} | {names} | {total} |")
        else:
            flag = f" DEMO: {demo}" if demo else ""
            print(f"{script}: {own} lines; common/: {total} lines in {len(modules)} files{flag}")
            print(f"    {names}")
    return 1 if worst > args.max_lines else 0


if __name__ == "__main__":
    raise SystemExit(main(parse_args(Args, description=__doc__.split("\n\n")[0])))
