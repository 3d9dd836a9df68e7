"""The sweep's configs: one method or baseline each, as flags of the method's own script, in two data regimes
(the 256- and 2,048-prompt pools), the two budgets (full, --quick), and the check of a config against its
script (read from the source: nothing is imported or run)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Config:
    name: str
    script: str
    flags: tuple[str, ...]  # method flags; the shared budget flags are added by `build_command`
    label: str
    baseline: Optional[str] = None  # the config whose final pass@1 this one is measured against
    mechanism: tuple[
        str, ...
    ] = ()  # the method's own metric names in metrics.jsonl (the table shows them)
    note: str = ""


CONFIGS: tuple[Config, ...] = (
    Config(
        "grpo_n4",
        "ada_seq.py",
        (
            "--max_rounds",
            "1",
            "--round_repeat",
            "4",
            "--num_generations",
            "4",
            "--scale_rewards",
            "true",
        ),
        "GRPO-n4",
        None,
        ("frac_zero_var_groups",),
        "Reinforce-Ada's baseline: one round of 4 samples, nothing adaptive, A = (r - mean) / std (eq. 2)",
    ),
    Config(
        "dr_grpo_n4",
        "ada_seq.py",
        (
            "--max_rounds",
            "1",
            "--round_repeat",
            "4",
            "--num_generations",
            "4",
            "--scale_rewards",
            "false",
        ),
        "Dr. GRPO-n4",
        "grpo_n4",
        ("frac_zero_var_groups",),
        "GRPO-n4 without the std division: A = r - mean",
    ),
    Config(
        "grpo_n8",
        "ada_seq.py",
        (
            "--max_rounds",
            "1",
            "--round_repeat",
            "8",
            "--num_generations",
            "8",
            "--scale_rewards",
            "true",
        ),
        "GRPO-n8",
        "grpo_n4",
        ("frac_zero_var_groups",),
        "twice the samples of GRPO-n4, all trained on (eq. 2)",
    ),
    Config(
        "grpo_n16",
        "ada_seq.py",
        (
            "--max_rounds",
            "1",
            "--round_repeat",
            "16",
            "--num_generations",
            "16",
            "--scale_rewards",
            "true",
        ),
        "GRPO-n16",
        "grpo_n4",
        ("frac_zero_var_groups",),
        "Reinforce-Ada's strong baseline: 16 samples per prompt, all trained on (SEQ-BALANCE is claimed to match "
        "it while training on 4)",
    ),
    Config(
        "dapo_n4",
        "ada_seq.py",
        (
            "--max_rounds",
            "1",
            "--round_repeat",
            "4",
            "--num_generations",
            "4",
            "--scale_rewards",
            "true",
            "--dynamic_sampling",
            "true",
        ),
        "DAPO dynamic sampling (n4)",
        "grpo_n4",
        (
            "frac_zero_var_groups",
            "dapo_rounds",
            "dapo_kept_groups",
            "dapo_sampled_groups",
            "ada_inference_cost_rel",
        ),
        "Reinforce-Ada's Table 2 baseline: GRPO-n4 dropping zero-variance groups and refilling the batch with new "
        "prompts (up to 4 extra rounds)",
    ),
    Config(
        "rloo",
        "ra_rloo.py",
        ("--replay", "none"),
        "RLOO",
        None,
        ("frac_zero_var_groups", "ra_zero_var_frac_post"),
        "RA-RLOO's baseline (K=4, reward {0, 0.1, 1})",
    ),
    Config(
        "ra_rloo",
        "ra_rloo.py",
        ("--replay", "on_demand"),
        "RA-RLOO",
        "rloo",
        ("ra_zero_var_frac_post", "ra_replay_fired_frac", "ra_is_weight_mean"),
        "stored successes spliced into groups without a fresh success",
    ),
    Config(
        "ps_off",
        "ps_grpo.py",
        ("--mode", "multiturn", "--prefix_sampling", "false"),
        "GRPO-n8 (r - mean) + rejection, multi-turn",
        None,
        ("ps_trained_groups", "ps_solve_partial"),
        "Prefix Sampling's baseline in the Countdown environment (one action per turn, the paper's agentic "
        "setting): GRPO with A = r - mean (the paper's appendix), all-fail / all-pass groups dropped. Multi-turn "
        "runs start from the multi-turn warm-up of the base policy and are evaluated as episodes, so the PS rows "
        "compare with each other only",
    ),
    Config(
        "ps_fixed",
        "ps_grpo.py",
        ("--mode", "multiturn", "--prefix_sampling", "true", "--adaptive", "false"),
        "PS (fixed), multi-turn",
        "ps_off",
        ("ps_prefix_pass_rate", "ps_trained_groups", "ps_solve_partial", "ps_prefix_tasks"),
        "a prefix task replays the first K actions of a stored episode in a fresh environment",
    ),
    Config(
        "ps_adaptive",
        "ps_grpo.py",
        (
            "--mode",
            "multiturn",
            "--prefix_sampling",
            "true",
            "--adaptive",
            "true",
            "--ema_reset",
            "false",
        ),
        "PS (adaptive), multi-turn",
        "ps_off",
        (
            "ps_prefix_pass_rate",
            "ps_trained_groups",
            "ps_solve_partial",
            "ps_ratio_hard",
            "ps_ratio_easy",
        ),
        "the paper's EMA controller (one EMA, never reset) steering prefix tasks to a 50% pass rate",
    ),
    Config(
        "ps_adaptive_reset",
        "ps_grpo.py",
        (
            "--mode",
            "multiturn",
            "--prefix_sampling",
            "true",
            "--adaptive",
            "true",
            "--ema_reset",
            "true",
        ),
        "PS (adaptive, EMA reset), multi-turn",
        "ps_off",
        (
            "ps_prefix_pass_rate",
            "ps_trained_groups",
            "ps_solve_partial",
            "ps_ratio_hard",
            "ps_ratio_easy",
        ),
        "our variant of the controller: the EMA restarts after every move (sees only the current ratio)",
    ),
    Config(
        "seq_pos",
        "ada_seq.py",
        ("--exit_condition", "positive"),
        "SEQ-POS",
        "grpo_n4",
        (
            "ada_samples_per_prompt_mean",
            "ada_samples_per_prompt_max",
            "ada_frac_zero_var_groups_post",
            "ada_inference_cost_rel",
        ),
        "n=4 trained per prompt, up to 4 rounds of 8 samples",
    ),
    Config(
        "seq_balance",
        "ada_seq.py",
        ("--exit_condition", "balanced"),
        "SEQ-BALANCE",
        "grpo_n4",
        (
            "ada_samples_per_prompt_mean",
            "ada_samples_per_prompt_max",
            "ada_frac_zero_var_groups_post",
            "ada_inference_cost_rel",
        ),
        "n=4 trained per prompt, up to 4 rounds of 8 samples",
    ),
    Config(
        "est",
        "ada_est.py",
        (),
        "EST",
        "grpo_n8",
        ("est_calibration_error", "est_alloc_min", "est_alloc_max", "est_p_hat_mean"),
        "8 x prompts samples per step, allocated by the pass-rate estimate (compare GRPO-n8)",
    ),
    Config(
        "est_pool2048",
        "ada_est.py",
        ("--prompt_pool", "2048"),
        "EST (2048-prompt pool)",
        "grpo_n8_pool2048",
        ("est_calibration_error", "est_alloc_min", "est_alloc_max", "est_p_hat_mean"),
        "EST on ada_est.py's own default pool (a prompt returns every 64 steps): does the sweep's shared 256-prompt "
        "pool hold EST back? (its flag wins over the harness's --prompt_pool; compared with GRPO-n8 on the same "
        "pool, and with `est` on the results page)",
    ),
    Config(
        "grpo_n8_pool2048",
        "ada_seq.py",
        (
            "--max_rounds",
            "1",
            "--round_repeat",
            "8",
            "--num_generations",
            "8",
            "--scale_rewards",
            "true",
            "--prompt_pool",
            "2048",
        ),
        "GRPO-n8 (2048-prompt pool)",
        "grpo_n8",
        ("frac_zero_var_groups",),
        "EST's baseline on EST's own pool: whatever the larger pool does for every method is not credited to EST",
    ),
    Config(
        "ppo",
        "pros_ppo.py",
        ("--pros", "off"),
        "PPO",
        None,
        ("frac_zero_var_groups",),
        "PROS's baseline: PPO with a critic (GAE), K=4",
    ),
    Config(
        "ppo_pros",
        "pros_ppo.py",
        ("--pros", "bayes"),
        "PPO+PROS",
        "ppo",
        ("pros_calib_error", "pros_frac_children_in_batch", "pros_prefix_len_mean"),
        "augmented prefix queries picked by the Polya-Gamma Gibbs pass-rate model",
    ),
    Config(
        "ppo_pros_random",
        "pros_ppo.py",
        ("--pros", "random"),
        "PPO+PROS (random selection)",
        "ppo",
        ("pros_calib_error", "pros_frac_children_in_batch", "pros_prefix_len_mean"),
        "PROS's ablation: the same prefix queries, picked uniformly from the pool",
    ),
    Config(
        "grpo_k4",
        "pros_ppo.py",
        ("--adv", "grpo", "--pros", "off"),
        "GRPO (pros_ppo.py)",
        None,
        ("frac_zero_var_groups",),
        "critic-free GRPO advantage in pros_ppo.py's PPO loop (2 epochs x 2 minibatches)",
    ),
    Config(
        "grpo_pros",
        "pros_ppo.py",
        ("--adv", "grpo", "--pros", "bayes"),
        "GRPO+PROS",
        "grpo_k4",
        ("pros_calib_error", "pros_frac_children_in_batch", "pros_prefix_len_mean"),
        "PROS on the critic-free GRPO advantage (the paper runs it on both)",
    ),
)


def on_pool2048(cfg: Config) -> Config:
    """The same config in the second data regime: a 2,048-prompt pool (the harness's 32 prompts a step return to a
    prompt about every 64 steps instead of every 8, so 200 steps visit each about 3 times instead of 25), paired with
    its baseline on the same pool."""
    return replace(
        cfg,
        name=f"{cfg.name}_pool2048",
        flags=(*cfg.flags, "--prompt_pool", "2048"),
        label=f"{cfg.label} (2048-prompt pool)",
        baseline=cfg.baseline and f"{cfg.baseline}_pool2048",
        note=f"{cfg.note}; on the 2,048-prompt pool",
    )


SECOND_REGIME = (
    "grpo_n4",
    "grpo_n16",
    "dapo_n4",
    "seq_pos",
    "seq_balance",
    "rloo",
    "ra_rloo",
    "ps_off",
    "ps_adaptive",
    "ppo",
    "ppo_pros",
    "ppo_pros_random",
    "grpo_k4",
    "grpo_pros",
)

_BY_NAME = {c.name: c for c in CONFIGS}

CONFIGS += tuple(on_pool2048(_BY_NAME[name]) for name in SECOND_REGIME) + (
    replace(
        on_pool2048(_BY_NAME["ppo_pros"]),
        name="ppo_pros_visit_pool2048",
        flags=(*_BY_NAME["ppo_pros"].flags, "--forget_on", "visit", "--prompt_pool", "2048"),
        label="PPO+PROS, forgetting on visit (2048-prompt pool)",
        note="PROS's ablation: a node's counts decay only when it is observed again (on a large pool a node is "
        "rarely revisited, so per-iteration forgetting leaves it about one effective trial)",
    ),
)
BY_NAME = {c.name: c for c in CONFIGS}


# Budgets of the two settings (a flag given on the command line wins).
FULL = {
    "seeds": [0, 1, 2, 3, 4],
    "max_steps": 200,
    "prompts_per_step": 32,
    "eval_steps": 25,
    "eval_prompts": 256,
    "eval_samples": 8,
}
# --quick is a smoke check of all 21 configs (GRPO-n16 and multi-turn PS among them, 48-token answers) that must stay
# under 10 minutes: 20 steps of 8 prompts, evaluations at steps 0 and 20 on 32 x 2
QUICK = {
    "seeds": [0],
    "max_steps": 20,
    "prompts_per_step": 8,
    "eval_steps": 20,
    "eval_prompts": 32,
    "eval_samples": 2,
}


def _class_fields(cls: ast.ClassDef) -> dict[str, Optional[list]]:
    """{field: Literal choices or None} of a dataclass body."""
    out: dict[str, Optional[list]] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            ann, choices = node.annotation, None
            if (
                isinstance(ann, ast.Subscript)
                and getattr(ann.value, "id", getattr(ann.value, "attr", "")) == "Literal"
            ):
                elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
                choices = [e.value for e in elts if isinstance(e, ast.Constant)]
            out[node.target.id] = choices
    return out


def flag_classes() -> dict[str, ast.ClassDef]:
    """common/run/flags.py's classes by name (the shared flag groups and BaseArgs), from the
    source."""
    tree = ast.parse((ROOT / "common" / "run" / "flags.py").read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def composed_fields(cls: ast.ClassDef, known: dict[str, ast.ClassDef]):
    """{field: Literal choices or None} of a dataclass and of the classes of `known` it composes
    (its bases, theirs...)."""
    fields: dict[str, Optional[list]] = {}
    for base in cls.bases:
        if getattr(base, "id", "") in known:
            fields.update(composed_fields(known[base.id], known))
    fields.update(_class_fields(cls))
    return fields


def script_flags(script: Path) -> Optional[dict[str, Optional[list]]]:
    """Every `--flag` of a script's `Args` (its own fields and those of the shared flag groups it
    composes) with its Literal choices; None when the script has no `Args` class."""
    tree = ast.parse(script.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if "Args" not in classes:
        return None
    return composed_fields(classes["Args"], flag_classes())


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
        if (
            flags[name] is not None
            and value is not None
            and value not in [str(c) for c in flags[name]]
        ):
            return (
                f"missing: {cfg.script} --{name} has no choice {value!r} (choices: {flags[name]})"
            )
    return None


# ----------------------------------------------------------------------------------------------------
# A user's task (run.py --task): the configs that apply to a single-turn text task
# ----------------------------------------------------------------------------------------------------

# Configs a task sweep leaves out, and why (run.py --task prints these; `--only` can still name
# dr_grpo_n4).
TASK_LEFT_OUT = {
    "dr_grpo_n4": "no paper claim reads it (a GRPO-n4 variant; name it in --only to run it)",
    "_pool2048": "the Countdown sweep's second data regime; on a task, set its prompt_pool instead",
}


TEXT_NOTES = {
    "ps_off": "Prefix Sampling's baseline on a text task: GRPO with A = r - mean, all-fail / "
    "all-pass groups dropped",
    "ps_fixed": "a prefix task replays the first lines of a stored response (a step is a line)",
}


def on_text_task(cfg: Config) -> Config:
    """A config as it runs on a single-turn text task: Prefix Sampling's multi-turn Countdown
    environment becomes its text mode (a step is a line of the response); every other config is
    unchanged."""
    if "--mode" not in cfg.flags:
        return cfg
    flags = list(cfg.flags)
    flags[flags.index("--mode") + 1] = "text"
    return replace(
        cfg,
        flags=tuple(flags),
        label=cfg.label.replace(", multi-turn", ", text"),
        note=TEXT_NOTES.get(cfg.name, cfg.note),
    )


# Your environment (a task file's `environment`): the notes that name the embedded Countdown one
ENV_NOTES = {
    "ps_off": "Prefix Sampling's baseline in your environment (one action per turn): GRPO with "
    "A = r - mean (the paper's appendix), all-fail / all-pass groups dropped; episodes are evaluated "
    "whole",
}


def in_environment(cfg: Config) -> Config:
    """A multi-turn config as it runs in your environment (`ps_grpo.py --environment`): the same
    flags, a note that does not name the embedded Countdown environment."""
    return replace(cfg, note=ENV_NOTES.get(cfg.name, cfg.note))


def task_configs(environment: bool = False) -> dict[str, Config]:
    """{name: config} of a task sweep, in the harness's order: every config a paper claim reads,
    on one data regime (the task's own pool); with your environment (a task file's `environment`),
    Prefix Sampling's multi-turn configs, the only ones that play an environment."""
    if environment:
        return {
            c.name: in_environment(c)
            for c in CONFIGS
            if c.script == "ps_grpo.py"
            and "multiturn" in c.flags
            and not c.name.endswith("_pool2048")
        }
    return {
        c.name: on_text_task(c)
        for c in CONFIGS
        if c.name not in TASK_LEFT_OUT and not c.name.endswith("_pool2048")
    }


def task_config(name: str, environment: bool = False) -> Config:
    """One config as a task sweep runs it (also those left out by default, e.g. dr_grpo_n4)."""
    return in_environment(BY_NAME[name]) if environment else on_text_task(BY_NAME[name])
