"""The benchmark report: the committed runs in, the results page, the docs' generated blocks and the figures out
(`python -m benchmarks.sweep.report`, or `python benchmarks/sweep/report.py`; flags in cli.py). One module per
stage, each importing only the stages before it:

    load.py         the runs of a runs folder, their recorded settings, the two data regimes (256 / 2,048 prompts)
    commands.py     the benchmarks/sweep/run.py commands that re-make the runs
    curves.py       per-run evaluation curves and metric series, the seed-mean aggregate of each config
    stats.py        intervals over seeds from scipy.stats (t, F), paired differences, the number formats
    claims.py       the papers' claims, their verdict rules and the judge of each
    tables.py       the results page's tables
    figures.py      the PNG plots (matplotlib)
    page.py         the results page, benchmarks/sweep/results/README.md
    docs_pages.py   each method page's generated results
    docs_blocks.py  every generated block of README.md and docs/ (`BLOCKS`), rewriting and checking them
    cli.py          the command's flags and main()

"""

# re-exported for the tests and other scripts
from benchmarks.sweep.report.claims import (  # noqa: F401
    CLAIMS,
    VERDICT_RULES,
    Claim,
    ClaimSpec,
    claim_rows,
    judged,
    verdict_greater,
    verdict_not_below,
    verdict_within,
)
from benchmarks.sweep.report.cli import Args, cli, main  # noqa: F401
from benchmarks.sweep.report.commands import commands_text, rerun_commands, runner_flags  # noqa: F401
from benchmarks.sweep.report.curves import (  # noqa: F401
    Agg,
    build_aggs,
    cost_to_reach,
    eval_curve,
    final_gaps,
    final_value,
    gap_cell,
    mechanism_summary,
    reach,
    run_summary,
    step_walls,
    value_at,
)
from benchmarks.sweep.report.docs_blocks import (  # noqa: F401
    BLOCKS,
    MARK_BEGIN,
    MARK_END,
    doc_blocks,
    durations_block,
    readme_block,
    replace_blocks,
    stale_blocks,
    write_doc_blocks,
)
from benchmarks.sweep.report.docs_pages import DOC_PAGES, method_block  # noqa: F401
from benchmarks.sweep.report.figures import DOC_FIGURES, make_doc_figures, make_plots, train_curve  # noqa: F401
from benchmarks.sweep.report.load import (  # noqa: F401
    POOL256,
    POOL2048,
    REGIMES,
    ROOT,
    RUNS_DIR,
    Regime,
    RunData,
    load_runs,
)
from benchmarks.sweep.report.page import write_report  # noqa: F401
from benchmarks.sweep.report.stats import (  # noqa: F401
    TARGET_HALF,
    Interval,
    binomial_abs_floor,
    equal_tokens_diffs,
    f_quantile,
    paired,
    reach_ratios,
    seeds_for,
    std_ratio_interval,
    t975,
    t_interval,
)
from benchmarks.sweep.report.tables import (  # noqa: F401
    claims_table,
    difference_table,
    mechanism_tables,
    reach_cells,
    regime_table,
    results_table,
)
