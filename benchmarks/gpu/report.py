"""The spell's report: the verdict line, smoke.md's tables, smoke.json, and the GPU paragraph of the docs
(regenerated from the newest committed spell under benchmarks/gpu/results/)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from benchmarks.gpu.budget import ROOT, Stop
from benchmarks.gpu.learning import pairs

GPU_RESULTS = ROOT / "benchmarks" / "gpu" / "results"


def verdict(runs: list[dict]) -> str:
    """'policy updated in N of M runs' over the runs that started (an error counts as not updated), naming every
    run whose policy did not change; runs the budget or a signal skipped are counted apart."""
    started = [r for r in runs if not r["status"].startswith("skipped")]
    stale = [
        f"{r['script']}/{r['variant']}"
        + ("" if "policy_changed_frac" in r else f" ({r['status'][:60]})")
        for r in started
        if r.get("policy_changed_frac", 0) <= 0
    ]
    line = f"policy updated in {len(started) - len(stale)} of {len(started)} runs"
    skipped = len(runs) - len(started)
    return (
        line
        + (f"; not updated: {', '.join(stale)}" if stale else "")
        + (f"; {skipped} skipped" if skipped else "")
    )


def peer_ratios(peer: dict) -> str:
    """Ours / TRL against TRL at its default cache and, where measured, with ours' cache."""
    ratio, same, cache = peer["ratio"], peer.get("ratio_same_cache"), peer.get("cache") or {}
    text = f"ours / TRL: {ratio['steps_per_s']:.2f}x steps/s, {ratio['tokens_per_s']:.2f}x tokens/s"
    if (
        not cache
    ):  # a peer run from before the same-cache comparison: both sides at HF generate's default
        return text + " (HF generate's default cache on both sides)"
    text += f" (TRL at its default cache, ours {cache.get('ours')})"
    if same:
        text += (
            f"; with the same cache on both sides ({cache.get('trl_same')}): {same['steps_per_s']:.2f}x steps/s, "
            f"{same['tokens_per_s']:.2f}x tokens/s"
        )
    elif cache.get("trl_same_error"):
        text += f"; TRL with {cache.get('trl_same')} failed: {cache['trl_same_error']}"
    return text


def table(report: dict) -> str:
    runs = report["runs"]
    lines = [
        f"# GPU smoke on {report['device']}",
        "",
        f"Versions: {report['versions']}. Budget {report['budget_s']:.0f} s; elapsed {report['elapsed_s']:.0f} s; "
        f"stopped: {report['stopped'] or 'no'}.",
        "",
    ]
    warm = report.get("warm_start") or {}
    if warm:
        lines += [
            f"Warm start: {warm.get('steps')} SFT steps, {warm.get('seconds')} s, greedy pass@1 on training "
            f"prompts {warm.get('greedy_pass@1', 0):.3f}{' (cached)' if warm.get('cached') else ''}.",
            "",
        ]
    lines += [
        "| script | variant | status | reward | policy changed | critic changed | grad norm | groups kept | "
        "gen tokens/s | s/step: gen / train / rest | peak GPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "policy_changed_frac" not in r:
            lines.append(f"| {r['script']} | {r['variant']} | {r['status']} | | | | | | | | |")
            continue
        critic = "" if r.get("critic_changed_frac") is None else f"{r['critic_changed_frac']:.1%}"
        peak = "n/a (CPU)" if r["peak_gpu_gib"] is None else f"{r['peak_gpu_gib']:.2f} GiB"
        lines.append(
            f"| {r['script']} | {r['variant']} | {r['status']} | {r['reward_mean']:.3f} | "
            f"{r['policy_changed_frac']:.1%} | {critic} | {r['grad_norm_mean']:.3g} | "
            f"{r.get('groups_kept', '')} | {r['gen_tokens_per_s']:,.0f} | {r['gen_s_per_step']:.2f} / "
            f"{r['train_s_per_step']:.2f} / {r['other_s_per_step']:.2f} | {peak} |"
        )
    split_runs = [r for r in runs if "split_s_per_step" in r]
    if split_runs:
        lines += [
            "",
            "Each step's split (the scripts' time/ keys, seconds a step; they add up to it):",
            "",
        ]
        for r in split_runs:
            parts = " / ".join(f"{name} {sec:.3f}" for name, sec in r["split_s_per_step"].items())
            lines.append(
                f"- {r['script']} {r['variant']}: {parts}; other {r['other_share']:.1%} of the step"
            )
    lines += ["", f"**{verdict(runs)}**"]
    learning = report.get("learning")
    if learning and "start" in learning:
        lines += [
            "",
            "## Learning: each method against its baseline",
            "",
            f"Held-out pass@1 ({learning['prompts']} prompts x {learning['samples']} samples, T = 1; 95% "
            f"interval over prompts). Start (the warm-started model): {learning['start']['pass@1']:.3f} "
            f"± {learning['start']['ci95']:.3f}.",
            "",
            "| script | run | steps | s/step | end pass@1 | change from start |",
            "|---|---|---|---|---|---|",
        ]
        for pair in pairs(learning):
            if pair.get("status"):  # the budget left it out
                lines.append(f"| {pair['script']} | {pair['status']} | | | | |")
            for arm in ("method", "baseline"):
                run = pair.get(arm) or {}
                label = run.get("label", arm) + (" (baseline)" if arm == "baseline" else "")
                step_s = f"{run['step_s']:.2f}" if run.get("step_s") else ""
                if "end" in run:
                    lines.append(
                        f"| {pair['script']} | {label} | {run['steps']} | {step_s} | {run['end']['pass@1']:.3f} ± "
                        f"{run['end']['ci95']:.3f} | {run['end']['pass@1'] - learning['start']['pass@1']:+.3f} |"
                    )
                elif run:  # it did not reach its measurement: its own status says why
                    lines.append(
                        f"| {pair['script']} | {label} | {run.get('steps', 0)} | {step_s} | {run['status']} | |"
                    )
        lines.append(f"\n{learning.get('plot', '')}")
    speed = report.get("speed") or []
    if speed:
        lines += [
            "",
            "## Speed (ra_rloo.py, HF generate)",
            "",
            "| run | s/step (steps 2+, compile apart) | median s/step (steps 2+) | gen tokens/s (steps 2+) | "
            "first step s (gen s) | compile s | graphs compiled |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {s['cache_implementation']} | {s.get('step_s_after_first', 0):.3f} | "
            f"{s.get('step_s_median_after_first', 0):.3f} | "
            f"{s.get('gen_tokens_per_s_after_first', 0):,.0f} | {s.get('first_step_s') or 0:.2f} "
            f"({s.get('first_step_gen_s', 0):.2f}) | "
            f"{'' if s.get('compile_s') is None else format(s['compile_s'], '.1f')} | "
            f"{s.get('compiled_graphs', '')} |"
            if s["status"] == "ok"
            else f"| {s['cache_implementation']} | {s['status']} | | | | | |"
            for s in speed
        ]
    peer = report.get("peer")
    if peer:
        lines += ["", "## TRL peer", "", f"status: {peer['status']}"]
        if peer["status"] == "ok":
            lines.append(
                f"{peer_ratios(peer)}; definition check {'agrees' if peer['check_agree'] else 'DOES NOT agree'}"
            )
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path, stop: Stop) -> None:
    report["elapsed_s"] = stop.elapsed()
    report["stopped"] = stop.reason
    report["verdict"] = verdict(report["runs"])
    (out / "smoke.json").write_text(json.dumps(report, indent=2))
    (out / "smoke.md").write_text(table(report))


def spell_reports(results: Path = GPU_RESULTS) -> tuple[Path | None, list[tuple[Path, dict]]]:
    """The newest committed GPU record (`benchmarks/gpu/results/<date>-<device>/`, the newest name holding a
    smoke.json at any depth) and every smoke.json in it, by path: a record of several calls on one machine keeps each
    call's files in a folder of its own."""
    found = sorted(results.glob("**/smoke.json")) if results.is_dir() else []
    if not found:
        return None, []
    folder = max(results / path.relative_to(results).parts[0] for path in found)
    return folder, [
        (path, json.loads(path.read_text())) for path in found if folder in path.parents
    ]


def peer_pages(folder: Path) -> list[tuple[Path, dict]]:
    """The standalone benchmarks/speed/trl_peer.py results (`--json`) committed with a record."""
    pages = []
    for path in sorted(folder.glob("**/*.json")):
        try:
            data = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
        if isinstance(data, dict) and {"ratio", "rounds", "trl", "ours", "repeats"} <= set(data):
            pages.append((path, data))
    return pages


def docs_block(results: Path = GPU_RESULTS) -> str:
    """The GPU paragraph of docs/scaling.md and docs/benchmark.md, from the newest committed GPU record
    (`benchmarks/gpu/results/<date>-<device>/`: every smoke.json in it, and its trl_peer.py results), regenerated by
    `python benchmarks/sweep/report.py --write_docs`."""
    import textwrap

    folder, reports = spell_reports(results)
    if not reports:
        return "No GPU spell of `benchmarks/gpu/spell.sh` has been committed under `benchmarks/gpu/results/` yet.\n"
    rel = Path(os.path.relpath(folder, ROOT)).as_posix()
    first = reports[0][0].parent
    device_txt = next(
        (
            (p / "device.txt").read_text().split("\n")[0].strip()
            for p in (folder, first)
            if (p / "device.txt").exists()
        ),
        reports[0][1]["device"],
    )
    calls = "; ".join(
        (f"`{path.parent.relative_to(folder).as_posix()}/`: " if len(reports) > 1 else "")
        + f"budget {report['budget_s']:.0f} s, {report['elapsed_s']:.0f} s used"
        + (f" (stopped: {report['stopped']})" if report.get("stopped") else "")
        + f", parts `{report['args']['parts']}`"
        for path, report in reports
    )
    args = reports[0][1]["args"]
    lines = [
        f"The newest GPU record, `bash benchmarks/gpu/spell.sh` (results: [{rel}/](../{rel}/)): {device_txt}; "
        f"{reports[0][1]['versions']}; "
        + (f"{len(reports)} calls on the same machine: " if len(reports) > 1 else "")
        + f"{calls}; --size {args['size']}, --dtype {args['dtype']}, {args['prompts_per_step']} prompts a step, at "
        f"most {args['max_completion_length']} new tokens.",
        "",
    ]
    warm = next((r["warm_start"] for _, r in reports if r.get("warm_start")), None) or {}
    if "pass_rate" in warm or "greedy_pass@1" in warm:
        rate = warm.get("greedy_pass@1", warm.get("pass_rate"))
        lines.append(
            f"- warm start: greedy pass@1 {rate:.3f} on training prompts after {warm.get('steps', '?')} SFT "
            f"steps, {warm.get('seconds', warm.get('wall_s', 0)):.0f} s"
        )
    for _, report in reports:
        if not report["runs"]:
            continue
        ran = [r for r in report["runs"] if not r["status"].startswith("skipped")]
        per = "; ".join(
            f"{r['script']}/{r['variant']} {r['status']}"
            + (
                f", {r['gen_tokens_per_s']:,.0f} gen tokens/s, {r['step_s']:.2f} s/step, peak "
                f"{r['peak_gpu_gib']:.2f} GiB, {100 * r['policy_changed_frac']:.0f}% of weights changed"
                if r["status"] == "ok" and r.get("peak_gpu_gib") is not None
                else ""
            )
            for r in ran
        )
        lines.append(
            f"- smoke ({report['args']['steps']} steps a run): **{report['verdict']}**"
            + (f" ({per})" if per else "")
        )
    for _, report in reports:
        learning = report.get("learning") or {}
        for pair in pairs(learning):
            diff = pair.get("method_minus_baseline")
            if not diff:
                if pair.get("status"):
                    lines.append(f"- learning, {pair['script']}.py: {pair['status']}")
                continue
            low, high = diff["mean"] - diff["ci95"], diff["mean"] + diff["ci95"]
            word = (
                "method above baseline"
                if low > 0
                else "method below baseline"
                if high < 0
                else "inconclusive"
            )
            arms = "; ".join(
                f"{pair[a]['label']} {pair[a]['steps']} steps, {pair[a]['end']['pass@1']:.3f}"
                for a in ("method", "baseline")
            )
            lines.append(
                f"- learning, {pair['script']}.py (held-out pass@1, {learning['prompts']} prompts x "
                f"{learning['samples']} samples): start {learning['start']['pass@1']:.3f}; {arms}; "
                f"{pair['method']['label']} minus {pair['baseline']['label']} {diff['mean']:+.3f} "
                f"[{low:+.3f}, {high:+.3f}] (95%, paired by prompt): **{word}**"
            )
        if learning.get("status") and not pairs(learning):
            lines.append(f"- learning: {learning['status']}")
    for _, report in reports:
        speed = [
            s
            for s in report.get("speed") or []
            if s.get("status") == "ok" and "step_s_after_first" in s
        ]
        if speed:
            figures = "; ".join(
                f"`{s['cache_implementation']}`"
                + (" (dynamic)" if s["cache_implementation"] == "default" else "")
                + f" {s['step_s_after_first']:.3f} s/step (median "
                f"{s.get('step_s_median_after_first', 0):.3f}), "
                f"{s['gen_tokens_per_s_after_first']:,.0f} gen tokens/s (first step "
                f"{s['first_step_s']:.1f} s"
                + (
                    f"; {s['compile_s']:.1f} s compiling in all, step 0's "
                    f"evaluation included, {s['compile_recompiles']} "
                    "recompilation(s)"
                    if s.get("compile_s") is not None
                    else ""
                )
                + ")"
                for s in speed
            )
            lines.append(
                f"- speed (ra_rloo.py, {report['args']['speed_steps']} steps; mean of steps 2+ less their compile "
                f"time, and its median): {figures}"
            )
        for s in report.get("speed") or []:
            if s.get("status") != "ok":
                lines.append(f"- speed `{s['cache_implementation']}`: {s['status']}")
    for _, report in reports:
        peer = report.get("peer") or {}
        if peer.get("status") == "ok":
            lines.append(
                f"- against TRL {peer['versions'].get('trl', '')} `GRPOTrainer` on the same GPU "
                f"(`benchmarks/speed/trl_peer.py`, 5 steps, one round): {peer_ratios(peer)}; definition check "
                + ("agrees" if peer["check_agree"] else "DOES NOT agree")
            )
        elif peer:
            lines.append(f"- TRL peer: {peer['status']}")
    for path, page in peer_pages(folder):
        rounds = ", ".join(f"{r['steps_per_s']:.2f}x" for r in page["rounds"])
        lines.append(
            f"- against TRL {page['versions'].get('trl', '')} again (`trl_peer.py`, "
            f"`{path.relative_to(folder).as_posix()}`: {page['steps']} steps, {page['repeats']} rounds): "
            f"{peer_ratios({**page, 'cache': page.get('cache')})}; by round {rounds}"
        )
    if (folder / "README.md").exists():  # what went wrong in that spell, and what was done about it
        lines += [
            "",
            f"What this record showed and what failed in it: [{rel}/README.md](../{rel}/README.md).",
        ]
    return (
        "\n".join(
            textwrap.fill(
                line,
                120,
                subsequent_indent="  " if line.startswith("- ") else "",
                break_on_hyphens=False,
                break_long_words=False,
            )
            if line
            else ""
            for line in lines
        )
        + "\n"
    )
