"""Run every method and its baseline on one harness: same base policy, prompts, step budget, seeds.

Each (config, seed) is one subprocess of the method's own script writing to
`<runs_dir>/<config>/seed<k>/` (metrics.jsonl, args.json, log.txt, bench.json). A run is finished when its
metrics.jsonl holds the final step's row with eval metrics: finished runs are skipped, unfinished ones are
continued with `--resume auto`, so re-running the same command completes a half-finished sweep. A config
whose script or flags do not exist (yet) is reported as "missing" and skipped.

A finished run is compacted (`compact_run`): checkpoints and samples.jsonl deleted, log.txt cut to its last lines.
metrics.jsonl, args.json and bench.json (plus the sweep's sweep.json) are what git tracks under benchmarks/sweep/runs/
(see benchmarks/.gitignore): commit them and a later sitting, on any clone, skips those runs.

    python benchmarks/sweep/run.py                            # the full sweep: 21 configs x seeds 0-4
    python benchmarks/sweep/run.py --quick                    # smoke check: 1 seed, fewer/smaller steps
    python benchmarks/sweep/run.py --only rloo,ra_rloo --seeds 0 --dry_run
    python benchmarks/sweep/run.py --lock /tmp/cpu.lock       # take a lock file around each run (shared machine)
    python benchmarks/sweep/report.py                         # then: table + plots in benchmarks/sweep/results/
"""
from __future__ import annotations

import ast
import fcntl
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from common.cli import parse_args  # noqa: E402  (light: no torch import)

# ----------------------------------------------------------------------------------------------------
# The configs: one method or baseline each, as flags of the method's own script
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    name: str
    script: str
    flags: tuple[str, ...]  # method flags; the shared budget flags are added by `build_command`
    label: str
    baseline: Optional[str] = None  # the config whose final pass@1 this one is measured against
    mechanism: tuple[str, ...] = ()  # the method's own metric names in metrics.jsonl (the table shows them)
    note: str = ""


CONFIGS: tuple[Config, ...] = (
    Config("grpo_n4", "ada_seq.py", ("--max_rounds", "1", "--round_repeat", "4", "--final_keep_per_prompt", "4",
                                     "--adv_std_norm", "true"),
           "GRPO-n4", None, ("frac_zero_var_groups",),
           "Reinforce-Ada's baseline: one round of 4 samples, nothing adaptive, A = (r - mean) / std (eq. 2)"),
    Config("dr_grpo_n4", "ada_seq.py", ("--max_rounds", "1", "--round_repeat", "4", "--final_keep_per_prompt", "4",
                                        "--adv_std_norm", "false"),
           "Dr. GRPO-n4", "grpo_n4", ("frac_zero_var_groups",), "GRPO-n4 without the std division: A = r - mean"),
    Config("grpo_n8", "ada_seq.py", ("--max_rounds", "1", "--round_repeat", "8", "--final_keep_per_prompt", "8",
                                     "--adv_std_norm", "true"),
           "GRPO-n8", "grpo_n4", ("frac_zero_var_groups",), "twice the samples of GRPO-n4, all trained on (eq. 2)"),
    Config("grpo_n16", "ada_seq.py", ("--max_rounds", "1", "--round_repeat", "16", "--final_keep_per_prompt", "16",
                                      "--adv_std_norm", "true"),
           "GRPO-n16", "grpo_n4", ("frac_zero_var_groups",),
           "Reinforce-Ada's strong baseline: 16 samples per prompt, all trained on (SEQ-BALANCE is claimed to match "
           "it while training on 4)"),
    Config("dapo_n4", "ada_seq.py", ("--max_rounds", "1", "--round_repeat", "4", "--final_keep_per_prompt", "4",
                                     "--adv_std_norm", "true", "--dynamic_sampling", "true"),
           "DAPO dynamic sampling (n4)", "grpo_n4",
           ("frac_zero_var_groups", "dapo_rounds", "dapo_kept_groups", "dapo_sampled_groups", "ada_inference_cost_rel"),
           "Reinforce-Ada's Table 2 baseline: GRPO-n4 dropping zero-variance groups and refilling the batch with new "
           "prompts (up to 4 extra rounds)"),
    Config("rloo", "ra_rloo.py", ("--replay", "none"), "RLOO", None,
           ("frac_zero_var_groups", "ra_zero_var_frac_post"), "RA-RLOO's baseline (K=4, reward {0, 0.1, 1})"),
    Config("ra_rloo", "ra_rloo.py", ("--replay", "on_demand"), "RA-RLOO", "rloo",
           ("ra_zero_var_frac_post", "ra_replay_fired_frac", "ra_is_weight_mean"),
           "stored successes spliced into groups without a fresh success"),
    Config("ps_off", "ps_grpo.py", ("--mode", "multiturn", "--prefix_sampling", "false"),
           "GRPO-n8 (r - mean) + rejection, multi-turn", None, ("ps_trained_groups", "ps_solve_partial"),
           "Prefix Sampling's baseline in the Countdown environment (one action per turn, the paper's agentic "
           "setting): GRPO with A = r - mean (the paper's appendix), all-fail / all-pass groups dropped. Multi-turn "
           "runs start from the multi-turn warm-up of the base policy and are evaluated as episodes, so the PS rows "
           "compare with each other only"),
    Config("ps_fixed", "ps_grpo.py", ("--mode", "multiturn", "--prefix_sampling", "true", "--adaptive", "false"),
           "PS (fixed), multi-turn", "ps_off",
           ("ps_prefix_pass_rate", "ps_trained_groups", "ps_solve_partial", "ps_prefix_tasks"),
           "a prefix task replays the first K actions of a stored episode in a fresh environment"),
    Config("ps_adaptive", "ps_grpo.py", ("--mode", "multiturn", "--prefix_sampling", "true", "--adaptive", "true",
                                         "--ema_reset", "false"),
           "PS (adaptive), multi-turn", "ps_off",
           ("ps_prefix_pass_rate", "ps_trained_groups", "ps_solve_partial", "ps_ratio_hard", "ps_ratio_easy"),
           "the paper's EMA controller (one EMA, never reset) steering prefix tasks to a 50% pass rate"),
    Config("ps_adaptive_reset", "ps_grpo.py", ("--mode", "multiturn", "--prefix_sampling", "true", "--adaptive",
                                               "true", "--ema_reset", "true"),
           "PS (adaptive, EMA reset), multi-turn", "ps_off",
           ("ps_prefix_pass_rate", "ps_trained_groups", "ps_solve_partial", "ps_ratio_hard", "ps_ratio_easy"),
           "our variant of the controller: the EMA restarts after every move (sees only the current ratio)"),
    Config("seq_pos", "ada_seq.py", ("--exit_condition", "positive"), "SEQ-POS", "grpo_n4",
           ("ada_samples_per_prompt_mean", "ada_samples_per_prompt_max", "ada_frac_zero_var_groups_post",
            "ada_inference_cost_rel"), "n=4 trained per prompt, up to 4 rounds of 8 samples"),
    Config("seq_balance", "ada_seq.py", ("--exit_condition", "balanced"), "SEQ-BALANCE", "grpo_n4",
           ("ada_samples_per_prompt_mean", "ada_samples_per_prompt_max", "ada_frac_zero_var_groups_post",
            "ada_inference_cost_rel"), "n=4 trained per prompt, up to 4 rounds of 8 samples"),
    Config("est", "ada_est.py", (), "EST", "grpo_n8",
           ("est_calibration_error", "est_alloc_min", "est_alloc_max", "est_p_hat_mean"),
           "8 x prompts samples per step, allocated by the pass-rate estimate (compare GRPO-n8)"),
    Config("est_pool2048", "ada_est.py", ("--prompt_pool", "2048"), "EST (2048-prompt pool)", "grpo_n8_pool2048",
           ("est_calibration_error", "est_alloc_min", "est_alloc_max", "est_p_hat_mean"),
           "EST on ada_est.py's own default pool (a prompt returns every 64 steps): does the sweep's shared 256-prompt "
           "pool hold EST back? (its flag wins over the harness's --prompt_pool; compared with GRPO-n8 on the same "
           "pool, and with `est` on the results page)"),
    Config("grpo_n8_pool2048", "ada_seq.py", ("--max_rounds", "1", "--round_repeat", "8", "--final_keep_per_prompt",
                                              "8", "--adv_std_norm", "true", "--prompt_pool", "2048"),
           "GRPO-n8 (2048-prompt pool)", "grpo_n8", ("frac_zero_var_groups",),
           "EST's baseline on EST's own pool: whatever the larger pool does for every method is not credited to EST"),
    Config("ppo", "pros_ppo.py", ("--pros", "off"), "PPO", None, ("frac_zero_var_groups",),
           "PROS's baseline: PPO with a critic (GAE), K=4"),
    Config("ppo_pros", "pros_ppo.py", ("--pros", "bayes"), "PPO+PROS", "ppo",
           ("pros_calib_error", "pros_frac_children_in_batch", "pros_prefix_len_mean"),
           "augmented prefix queries picked by the Polya-Gamma Gibbs pass-rate model"),
    Config("ppo_pros_random", "pros_ppo.py", ("--pros", "random"), "PPO+PROS (random selection)", "ppo",
           ("pros_calib_error", "pros_frac_children_in_batch", "pros_prefix_len_mean"),
           "PROS's ablation: the same prefix queries, picked uniformly from the pool"),
    Config("grpo_k4", "pros_ppo.py", ("--adv", "grpo", "--pros", "off"), "GRPO (pros_ppo.py)", None,
           ("frac_zero_var_groups",),
           "critic-free GRPO advantage in pros_ppo.py's PPO loop (2 epochs x 2 minibatches)"),
    Config("grpo_pros", "pros_ppo.py", ("--adv", "grpo", "--pros", "bayes"), "GRPO+PROS", "grpo_k4",
           ("pros_calib_error", "pros_frac_children_in_batch", "pros_prefix_len_mean"),
           "PROS on the critic-free GRPO advantage (the paper runs it on both)"),
)


def on_pool2048(cfg: Config) -> Config:
    """The same config in the second data regime: a 2,048-prompt pool (the harness's 32 prompts a step return to a
    prompt about every 64 steps instead of every 8, so 200 steps visit each about 3 times instead of 25), paired with
    its baseline on the same pool."""
    return replace(cfg, name=f"{cfg.name}_pool2048", flags=(*cfg.flags, "--prompt_pool", "2048"),
                   label=f"{cfg.label} (2048-prompt pool)",
                   baseline=cfg.baseline and f"{cfg.baseline}_pool2048", note=f"{cfg.note}; on the 2,048-prompt pool")


SECOND_REGIME = ("grpo_n4", "grpo_n16", "dapo_n4", "seq_pos", "seq_balance", "rloo", "ra_rloo", "ps_off",
                 "ps_adaptive", "ppo", "ppo_pros", "ppo_pros_random", "grpo_k4", "grpo_pros")
_BY_NAME = {c.name: c for c in CONFIGS}
CONFIGS += tuple(on_pool2048(_BY_NAME[name]) for name in SECOND_REGIME) + (
    replace(on_pool2048(_BY_NAME["ppo_pros"]), name="ppo_pros_visit_pool2048",
            flags=(*_BY_NAME["ppo_pros"].flags, "--forget_on", "visit", "--prompt_pool", "2048"),
            label="PPO+PROS, forgetting on visit (2048-prompt pool)",
            note="PROS's ablation: a node's counts decay only when it is observed again (on a large pool a node is "
                 "rarely revisited, so per-iteration forgetting leaves it about one effective trial)"),)
BY_NAME = {c.name: c for c in CONFIGS}

# Budgets of the two settings (a flag given on the command line wins).
FULL = {"seeds": [0, 1, 2, 3, 4], "max_steps": 200, "prompts_per_step": 32, "eval_every": 25, "eval_prompts": 256,
        "eval_samples": 8}
# --quick is a smoke check of all 21 configs (GRPO-n16 and multi-turn PS among them, 48-token answers) that must stay
# under 10 minutes: 20 steps of 8 prompts, evaluations at steps 0 and 20 on 32 x 2
QUICK = {"seeds": [0], "max_steps": 20, "prompts_per_step": 8, "eval_every": 20, "eval_prompts": 32,
         "eval_samples": 2}


@dataclass
class Args:
    only: str = ""
    """comma-separated config names to run (default: all); `--only list` prints the configs and exits"""
    seeds: Optional[list[int]] = None
    """seeds to run (default 0 1 2 3 4; --quick: 0)"""
    quick: bool = False
    """smoke-check setting: 1 seed, 20 steps of 8 prompts, 2 small evaluations (its duration: docs/benchmark.md); its
    runs go to benchmarks/sweep/runs-quick"""
    dry_run: bool = False
    """print each run's state and command, run nothing"""
    runs_dir: str = ""
    """where runs go (default benchmarks/sweep/runs, or benchmarks/sweep/runs-quick with --quick)"""
    max_steps: Optional[int] = None
    """policy updates per run, the same for every config (default 200; --quick: 20)"""
    prompts_per_step: Optional[int] = None
    """prompts per step, the same for every config (default 32; --quick: 8)"""
    eval_every: Optional[int] = None
    """held-out evaluation every N steps, plus step 0 and the last (default 25; --quick: 20)"""
    eval_prompts: Optional[int] = None
    """held-out prompts per evaluation (default 256; --quick: 32)"""
    eval_samples: Optional[int] = None
    """samples per held-out prompt (default 8; --quick: 2)"""
    max_new_tokens: int = 48
    """completion length cap, the same for every config (answers take up to 4 lines)"""
    prompt_pool: int = 256
    """every config trains on the same first N training prompts, so prompts recur (EST's estimates, RA-RLOO's
    buffers and PROS's pool need recurrence; ada_est.py's own default is 2048, config `est_pool2048`); 0 = the whole
    training set"""
    learning_rate: float = 5e-5
    """learning rate passed to every run (the project's measured default for the embedded model); 0 = each
    script's own default"""
    warmup_steps: int = 5
    """linear warm-up steps passed to every run, so configs differ only in their method (5: what every run of the
    sweep used; the Reinforce-Ada scripts' own default is the paper's 10); 0 = each script's own default"""
    model_name_or_path: str = "embedded"
    """base policy of every run (`embedded`: the cached tiny Countdown model)"""
    num_threads: int = 0
    """torch CPU threads per run (OMP_NUM_THREADS is set to the same); 0 = each run's own policy, a count that
    follows the free cores (docs/cpu_threads.md); two runners side by side: 1 each"""
    extra: str = ""
    """extra flags appended to every run, space-separated (they become part of each run's recorded command)"""
    lock: str = ""
    """a lock file taken (flock) around each run, so other heavy jobs on a shared machine interleave; empty = no
    lock (do not also wrap the runner itself in flock on the same file: it would wait for itself)"""
    keep_checkpoints: bool = False
    """keep the final checkpoint and samples.jsonl of finished runs (default: deleted once finished; only
    metrics.jsonl, args.json and bench.json are needed)"""
    progress_every: float = 60.0
    """seconds between progress lines of a running run (0 = only start and end)"""
    python: str = sys.executable
    """interpreter for the runs"""

    def validate(self) -> None:
        unknown = [n for n in self.only_names() if n not in BY_NAME]
        if unknown and self.only != "list":
            raise SystemExit(f"--only: unknown config(s) {unknown}; known: {', '.join(BY_NAME)}")
        if self.seeds is not None and not self.seeds:
            raise SystemExit("--seeds: give at least one seed")

    def only_names(self) -> list[str]:
        return [n.strip() for n in self.only.split(",") if n.strip()] if self.only and self.only != "list" else []


@dataclass
class Settings:
    """The resolved budget every run of this invocation shares."""
    seeds: list[int]
    max_steps: int
    prompts_per_step: int
    eval_every: int
    eval_prompts: int
    eval_samples: int
    max_new_tokens: int = 48
    prompt_pool: int = 256
    learning_rate: float = 5e-5
    warmup_steps: int = 5
    model_name_or_path: str = "embedded"
    num_threads: int = 0
    extra: list[str] = field(default_factory=list)


def resolve(args: Args) -> tuple[Settings, Path]:
    base = QUICK if args.quick else FULL
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else base[name]  # noqa: E731
    s = Settings(seeds=list(pick("seeds")), max_steps=pick("max_steps"), prompts_per_step=pick("prompts_per_step"),
                 eval_every=pick("eval_every"), eval_prompts=pick("eval_prompts"), eval_samples=pick("eval_samples"),
                 max_new_tokens=args.max_new_tokens, prompt_pool=args.prompt_pool, learning_rate=args.learning_rate,
                 warmup_steps=args.warmup_steps, model_name_or_path=args.model_name_or_path,
                 num_threads=args.num_threads, extra=args.extra.split())
    runs_dir = Path(args.runs_dir) if args.runs_dir else ROOT / "benchmarks" / "sweep" / ("runs-quick" if args.quick else "runs")
    return s, runs_dir


# ----------------------------------------------------------------------------------------------------
# Checking a config against its script (read from the source: nothing is imported or run)
# ----------------------------------------------------------------------------------------------------


def _class_fields(cls: ast.ClassDef) -> dict[str, Optional[list]]:
    """{field: Literal choices or None} of a dataclass body."""
    out: dict[str, Optional[list]] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            ann, choices = node.annotation, None
            if isinstance(ann, ast.Subscript) and getattr(ann.value, "id", getattr(ann.value, "attr", "")) == "Literal":
                elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                choices = [e.value for e in elts if isinstance(e, ast.Constant)]
            out[node.target.id] = choices
    return out


def script_flags(script: Path) -> Optional[dict[str, Optional[list]]]:
    """Every `--flag` of a script's `Args` (its own fields and, if it subclasses BaseArgs, the shared ones)
    with its Literal choices; None when the script has no `Args` class."""
    tree = ast.parse(script.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if "Args" not in classes:
        return None
    fields: dict[str, Optional[list]] = {}
    if any(getattr(b, "id", "") == "BaseArgs" for b in classes["Args"].bases):
        base = {n.name: n for n in ast.parse((ROOT / "common" / "args.py").read_text()).body
                if isinstance(n, ast.ClassDef)}
        fields.update(_class_fields(base["BaseArgs"]))
    fields.update(_class_fields(classes["Args"]))
    return fields


def check_config(cfg: Config, root: Path = ROOT) -> Optional[str]:
    """None when the config can run, else why not ("missing: ...")."""
    path = root / cfg.script
    if not path.exists():
        return f"missing: {cfg.script} does not exist yet"
    try:
        flags = script_flags(path)
    except SyntaxError as e:
        return f"missing: {cfg.script} does not parse ({e.msg}, line {e.lineno})"
    if flags is None:
        return f"missing: {cfg.script} has no Args dataclass"
    toks = list(cfg.flags)
    for i, t in enumerate(toks):
        if not t.startswith("--"):
            continue
        name = t[2:]
        if name not in flags:
            return f"missing: {cfg.script} has no --{name}"
        value = toks[i + 1] if i + 1 < len(toks) and not toks[i + 1].startswith("--") else None
        if flags[name] is not None and value is not None and value not in [str(c) for c in flags[name]]:
            return f"missing: {cfg.script} --{name} has no choice {value!r} (choices: {flags[name]})"
    return None


# ----------------------------------------------------------------------------------------------------
# Commands and run state
# ----------------------------------------------------------------------------------------------------


def shared_flags(s: Settings, seed: int, out_dir: Path) -> list[str]:
    flags = ["--seed", str(seed), "--max_steps", str(s.max_steps), "--prompts_per_step", str(s.prompts_per_step),
             "--eval_every", str(s.eval_every), "--eval_prompts", str(s.eval_prompts),
             "--eval_samples", str(s.eval_samples), "--max_new_tokens", str(s.max_new_tokens),
             "--prompt_pool", str(s.prompt_pool), "--model_name_or_path", s.model_name_or_path,
             "--num_threads", str(s.num_threads),
             # checkpoints at every evaluation make an interrupted run resumable; keep only the latest
             "--save_every", str(s.eval_every or s.max_steps), "--keep_checkpoints", "1",
             "--output_dir", str(out_dir)]
    if s.learning_rate > 0:
        flags += ["--learning_rate", repr(s.learning_rate)]
    if s.warmup_steps > 0:
        flags += ["--warmup_steps", str(s.warmup_steps)]
    return flags + list(s.extra)


def build_command(cfg: Config, s: Settings, seed: int, out_dir: Path) -> list[str]:
    """The run's command without interpreter and without `--resume` (this is what bench.json records). A flag the
    config sets itself (e.g. `est_pool2048`'s --prompt_pool) wins: the shared one is left out."""
    own = {t for t in cfg.flags if t.startswith("--")}
    shared, kept = shared_flags(s, seed, out_dir), []
    i = 0
    while i < len(shared):
        takes_value = i + 1 < len(shared) and not shared[i + 1].startswith("--")
        if shared[i] not in own:
            kept += shared[i:i + 1 + takes_value]
        i += 1 + takes_value
    return [cfg.script, *cfg.flags, *kept]


def read_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl rows; a torn last line (a run killed mid-write) is ignored."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def is_finished(rows: list[dict], max_steps: int) -> bool:
    """Finished = the final step's row is there and carries the final evaluation."""
    return any(r.get("step") == max_steps and r.get("eval_pass@1") is not None for r in rows)


def has_checkpoint(run_dir: Path) -> bool:
    return any((p / "trainer_state.pt").exists() for p in Path(run_dir).glob("checkpoint-*"))


def testbed_id(model_name_or_path: str) -> str:
    """What a run trains: the embedded base's cache name (it hashes the base recipe and the task's levels, so a
    changed testbed gets a new name), or the model given."""
    if model_name_or_path != "embedded":
        return model_name_or_path
    from common.tiny_model import BaseRecipe  # imports torch: only here

    return f"countdown-base-{BaseRecipe().key()}"


def run_state(run_dir: Path, cmd: list[str], max_steps: int, testbed: Optional[str] = None) -> str:
    """new | done | resume | restart | conflict | stale.

    resume: unfinished with a checkpoint; restart: unfinished without one (`--resume auto` then starts
    fresh); conflict: the directory holds a run of a different command (changed flags or budget), which
    is neither skipped nor overwritten; stale: a run of the same command on another testbed (`testbed`, see
    `testbed_id`; runs recorded without one count as another), likewise left alone.
    """
    run_dir = Path(run_dir)
    meta_path = run_dir / "bench.json"
    rows = read_rows(run_dir)
    if not meta_path.exists():
        return "new" if not rows and not has_checkpoint(run_dir) else "conflict"
    meta = json.loads(meta_path.read_text())
    if meta.get("cmd") != cmd:
        return "conflict"
    if testbed is not None and meta.get("testbed") != testbed:
        return "stale"
    if is_finished(rows, max_steps):
        return "done"
    return "resume" if has_checkpoint(run_dir) else ("restart" if rows or meta.get("attempts") else "new")


def conflict_diff(run_dir: Path, cmd: list[str]) -> str:
    path = Path(run_dir) / "bench.json"
    if not path.exists():
        return "the directory holds files but no bench.json (not written by this runner)"
    old = json.loads(path.read_text()).get("cmd", [])
    a, b = " ".join(old), " ".join(cmd)
    return f"recorded: {a}\n        wanted:   {b}" if a != b else ""


def clean_checkpoints(run_dir: Path) -> None:
    for p in list(Path(run_dir).glob("checkpoint-*")) + list(Path(run_dir).glob(".tmp-checkpoint-*")):
        shutil.rmtree(p, ignore_errors=True)


LOG_KEEP_LINES = 200  # a finished run's log.txt keeps its tail (the final evaluation, timings, any warning)


def compact_run(run_dir: Path, keep_checkpoints: bool = False) -> None:
    """Shrink a finished run to what the report and the skip check read (metrics.jsonl, args.json, bench.json)
    plus a short log: checkpoints and samples.jsonl go unless `keep_checkpoints`."""
    run_dir = Path(run_dir)
    if not keep_checkpoints:
        clean_checkpoints(run_dir)
        (run_dir / "samples.jsonl").unlink(missing_ok=True)
    log = run_dir / "log.txt"
    if log.exists():
        lines = log.read_text(errors="replace").splitlines(keepends=True)
        if len(lines) > LOG_KEEP_LINES + 1:  # + 1: the note of an earlier cut (compacting twice changes nothing)
            cut = len(lines) - LOG_KEEP_LINES
            log.write_text(f"[{cut} earlier lines cut by benchmarks/sweep/run.py]\n" + "".join(lines[cut:]))


def machine_info() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        info["torch"] = version("torch")
        info["transformers"] = version("transformers")
    except Exception:  # noqa: BLE001 (informational only)
        pass
    return info


# ----------------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------------


class FileLock:
    """flock on a file around one run; prints when it has to wait."""

    def __init__(self, path: str):
        self.path, self.fd = path, None

    def __enter__(self):
        if not self.path:
            return self
        self.fd = open(self.path, "a")
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"    waiting for the lock {self.path} ...", flush=True)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.fd.close()
            self.fd = None


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM to the runner: stop its run gracefully, like Ctrl-C


def _eval_summary(rows: list[dict]) -> str:
    ev = [r for r in rows if r.get("eval_pass@1") is not None]
    if not ev:
        return "no evaluation yet"
    return (f"eval_pass@1 {ev[0]['eval_pass@1']:.3f} (step {ev[0]['step']}) -> "
            f"{ev[-1]['eval_pass@1']:.3f} (step {ev[-1]['step']})")


def execute(cfg: Config, s: Settings, seed: int, run_dir: Path, cmd: list[str], state: str, args: Args,
            testbed: str) -> str:
    """Run (or continue) one run as a subprocess; returns done | failed | interrupted | incomplete."""
    run_dir.mkdir(parents=True, exist_ok=True)
    meta_path = run_dir / "bench.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {
        "config": cfg.name, "script": cfg.script, "seed": seed, "cmd": cmd, "attempts": 0, "wall_s": 0.0,
        "testbed": testbed}
    meta["attempts"] += 1
    meta["settings"] = asdict(s)
    meta_path.write_text(json.dumps(meta, indent=2))
    full = [args.python, *cmd] + (["--resume", "auto"] if state in ("resume", "restart") else [])
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    env.pop("OMP_NUM_THREADS", None)
    if s.num_threads > 0:
        env["OMP_NUM_THREADS"] = str(s.num_threads)
    rc, t0 = None, time.time()
    with FileLock(args.lock), open(run_dir / "log.txt", "a") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(full)}\n")
        log.flush()
        t0 = time.time()
        # its own session: a terminal Ctrl-C reaches only this runner, which forwards it exactly once
        proc = subprocess.Popen(full, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            while rc is None:
                try:
                    rc = proc.wait(timeout=args.progress_every if args.progress_every > 0 else None)
                except subprocess.TimeoutExpired:
                    rows = read_rows(run_dir)
                    last = rows[-1]["step"] if rows else 0
                    print(f"    ... step {last}/{s.max_steps}, {time.time() - t0:.0f} s, {_eval_summary(rows)}",
                          flush=True)
        except KeyboardInterrupt:
            # the scripts' first SIGINT means: finish this step, checkpoint, exit 130; a second one aborts
            proc.send_signal(signal.SIGINT)
            print("    interrupted: the run saves a checkpoint after its current step (Ctrl-C again aborts it)",
                  flush=True)
            try:
                proc.wait()
            except KeyboardInterrupt:
                proc.kill()
                proc.wait()
            rc = "interrupted"
        finally:
            signal.signal(signal.SIGTERM, old_term)
    wall = time.time() - t0
    meta["wall_s"] = meta.get("wall_s", 0.0) + wall
    rows = read_rows(run_dir)
    finished = is_finished(rows, s.max_steps)
    meta["finished"] = finished
    meta_path.write_text(json.dumps(meta, indent=2))
    if rc == "interrupted":
        return "interrupted"
    if finished:
        compact_run(run_dir, args.keep_checkpoints)
        print(f"    done in {wall:.0f} s ({wall / max(1, s.max_steps):.2f} s/step incl. start-up and evals): "
              f"{_eval_summary(rows)}",
              flush=True)
        return "done"
    tail = (run_dir / "log.txt").read_text().splitlines()[-15:]
    print(f"    FAILED (exit code {rc}) after {wall:.0f} s; last lines of {run_dir / 'log.txt'}:", flush=True)
    for line in tail:
        print(f"      | {line}", flush=True)
    return "failed" if rc != 0 else "incomplete"


def _portable(path: Path) -> Path:
    """A run directory as the recorded command names it: relative to the repo root when inside it."""
    try:
        return path.resolve().relative_to(ROOT)
    except ValueError:
        return path


def plan(args: Args, s: Settings, runs_dir: Path) -> list[dict]:
    """Every (config, seed) with its directory, command and state; seed-major, so that a partly finished
    sweep already has every config at seed 0."""
    names = args.only_names() or [c.name for c in CONFIGS]
    missing = {n: check_config(BY_NAME[n]) for n in names}
    testbed = testbed_id(s.model_name_or_path)
    items = []
    for seed in s.seeds:
        for n in names:
            cfg = BY_NAME[n]
            run_dir = runs_dir / n / f"seed{seed}"
            cmd = build_command(cfg, s, seed, _portable(run_dir))
            state = missing[n] or run_state(run_dir, cmd, s.max_steps, testbed)
            items.append({"cfg": cfg, "seed": seed, "dir": run_dir, "cmd": cmd, "state": state, "testbed": testbed})
    return items


def record_invocation(runs_dir: Path, s: Settings, argv: list[str]) -> None:
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / "sweep.json"
    data = json.loads(path.read_text()) if path.exists() else {"invocations": []}
    data["settings"] = asdict(s)
    data["machine"] = machine_info()
    data["invocations"].append({"time": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "command": shlex.join(["python", "benchmarks/sweep/run.py", *argv])})
    path.write_text(json.dumps(data, indent=2))


def main(args: Args, argv: list[str]) -> int:
    if args.only == "list":
        for c in CONFIGS:
            print(f"{c.name:12s} {c.label:20s} {c.script} {' '.join(c.flags)}   (baseline: {c.baseline or '-'})")
        return 0
    s, runs_dir = resolve(args)
    items = plan(args, s, runs_dir)
    print(f"benchmark: {len(items)} runs in {runs_dir} (steps {s.max_steps}, prompts/step {s.prompts_per_step}, "
          f"eval every {s.eval_every} on {s.eval_prompts}x{s.eval_samples}, seeds {s.seeds})", flush=True)
    if not args.dry_run:
        record_invocation(runs_dir, s, argv)
    results: dict[str, int] = {}
    for i, it in enumerate(items, 1):
        cfg, seed, state = it["cfg"], it["seed"], it["state"]
        head = f"[{i}/{len(items)}] {cfg.name} seed{seed}"
        if state.startswith("missing"):
            print(f"{head}: {state}", flush=True)
            results["missing"] = results.get("missing", 0) + 1
            continue
        if state == "done":
            print(f"{head}: finished, skipped ({_eval_summary(read_rows(it['dir']))})", flush=True)
            results["skipped (finished)"] = results.get("skipped (finished)", 0) + 1
            continue
        if state == "conflict":
            print(f"{head}: CONFLICT, skipped: {it['dir']} holds a run of another command; delete it or use "
                  f"another --runs_dir\n        {conflict_diff(it['dir'], it['cmd'])}", flush=True)
            results["conflict"] = results.get("conflict", 0) + 1
            continue
        if state == "stale":
            recorded = json.loads((it["dir"] / "bench.json").read_text()).get("testbed", "not recorded")
            print(f"{head}: STALE, skipped: {it['dir']} holds a run on another testbed ({recorded}; now "
                  f"{it['testbed']}); delete it to run this one again", flush=True)
            results["stale"] = results.get("stale", 0) + 1
            continue
        resume = state in ("resume", "restart")
        full = [args.python, *it["cmd"]] + (["--resume", "auto"] if resume else [])
        if args.dry_run:
            threads = f"OMP_NUM_THREADS={s.num_threads} " if s.num_threads > 0 else ""
            print(f"{head}: {state}\n    {threads}{' '.join(full)}", flush=True)
            results[f"would run ({state})"] = results.get(f"would run ({state})", 0) + 1
            continue
        rows = read_rows(it["dir"])
        where = f" from step {rows[-1]['step']}" if resume and rows else ""
        print(f"{head}: {state}{where} -> {it['dir']}", flush=True)
        out = execute(cfg, s, seed, it["dir"], it["cmd"], state, args, it["testbed"])
        results[out] = results.get(out, 0) + 1
        if out == "interrupted":
            print("sweep interrupted; run the same command again to continue", flush=True)
            break
    print("summary: " + ", ".join(f"{k} {v}" for k, v in results.items()), flush=True)
    return 1 if results.get("failed") or results.get("incomplete") else 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    raise SystemExit(main(parse_args(Args, argv, description=__doc__.split("\n\n")[0]), argv))
