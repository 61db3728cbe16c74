"""Figures and a markdown summary rendered from a results file (never from live state), so
``posdebias report RUN_DIR`` reproduces exactly what the run wrote."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from posdebias._io import remove_stale
from posdebias._rundir import RunFolder
from posdebias._text import file_text
from posdebias.core.instance import candidate_noun
from posdebias.evaluation.diagnosis import run_notes
from posdebias.evaluation.export import markdown_tables, markdown_text
from posdebias.evaluation.figures import FORMATS, REPORT_FIGURES, plain, render
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.statistics import (
    INTERVAL_METHOD,
    Interval,
    PairedComparison,
    RunStatistics,
)
from posdebias.evaluation.table import (
    judge_legend,
    markdown_table,
    plain_judge_table,
    plain_results_table,
    value_interval_text,
)

FIGURES = "figures"


def _figure_files() -> list[str]:
    """Every file a report may draw into FIGURES (those it does not draw this time are
    removed), read when a report is written: a run without figures draws none and removes none."""
    return [f"{name}.{fmt}" for name, _, _ in REPORT_FIGURES for fmt in FORMATS]


__all__ = ["FIGURES", "comparison_lines", "p_value_text", "plain", "write_report"]


def p_value_text(p: float) -> str:
    """A p-value as a paper prints it: 3 significant digits, scientific below 0.001, and an
    honest bound where the double underflows."""
    if p <= 0.0:
        return "< 1e-300"
    return f"{p:.3g}" if p >= 1e-3 else f"{p:.1e}"


def comparison_lines(comparisons: list[PairedComparison]) -> list[str]:
    """The paired comparisons as a markdown table."""
    header = ["row", "baseline", "ΔAcc (pp) [95% CI]", "row only right", "baseline only right"]
    rows = [
        [c.row, c.baseline, difference_text(c.difference)]
        + [str(count) for count in (c.row_only, c.baseline_only, c.decisions)]
        + [p_value_text(c.p_value)]
        for c in comparisons
    ]
    return markdown_table([*header, "decisions", "McNemar p"], rows, left=2)


def difference_text(d: Interval) -> str:
    """A paired difference and its interval, in points: ``+1.23 [-0.5, +2.9]``."""
    return f"{d.value:+.2f} [{d.low:+.1f}, {d.high:+.1f}]"


def _statistics_lines(results: EvaluationResults, stats: RunStatistics) -> list[str]:
    n = results.n
    boot = stats.bootstrap
    method = (
        "percentiles moved by the bootstrap's median bias, so each holds its estimate"
        if boot.method == INTERVAL_METHOD
        else f"{boot.method} method"
    )
    lines = [
        "",
        f"[low, high]: 95% bootstrap interval over the test instances ({boot.resamples} "
        f"resamples, seed {boot.seed}; all orders of an instance resampled together; {method}).",
    ]
    if stats.comparisons:
        lines += [
            "",
            "## Paired comparisons",
            "",
            "Each row against "
            + " and ".join(f"`{b}`" for b in stats.baselines)
            + " on the same instances and orders: the accuracy difference with its paired "
            "bootstrap interval, and an exact McNemar test on the "
            f"{stats.comparisons[0].decisions} (instance, order) decisions (two-sided binomial "
            "test on the decisions exactly one of the two got right).",
            "",
            *comparison_lines(stats.comparisons),
        ]
    lines += ["", "## Position views"]
    for intro, column, field in (
        ("Accuracy by the truth's position (%), with 95% intervals:", "truth at", "accuracy"),
        (
            "Choice distribution by position (% of all decisions, whatever the truth; an "
            f"unbiased chooser picks each position {100.0 / n:.1f}% of the time):",
            "chose",
            "choice",
        ),
    ):
        rows = [
            [label, *map(value_interval_text, getattr(row, f"{field}_by_position"))]
            for label, row in stats.rows.items()
        ]
        lines += ["", intro, ""]
        lines += markdown_table(["row", *(f"{column} {i + 1}" for i in range(n))], rows)
    circular = any(row.circular is not None for row in stats.rows.values())
    lines += [
        "",
        "Flip rate: % of (instance, pair of orders) whose chosen candidate differs between the "
        "two orders (a missing answer counts as a change)."
        + (
            " CircularEval: % of instances answered right under all N cyclic rotations."
            if circular
            else " CircularEval is absent: the orders are not the N cyclic rotations of one order."
        ),
        "",
    ]
    header = ["row", "flip rate [95% CI]", *(["CircularEval [95% CI]"] if circular else [])]
    rows = [
        [label, value_interval_text(row.flip_rate)]
        + ([value_interval_text(row.circular)] if circular else [])
        for label, row in stats.rows.items()
    ]
    return lines + markdown_table(header, rows)


def _ranking_lines(results: EvaluationResults) -> list[str]:
    ranking = results.ranking
    if ranking is None:
        return []
    relevance = (
        "graded relevance from the benchmark"
        if ranking.graded
        else "relevance 1 for the right candidate, 0 for the others"
    )
    lines = [
        "",
        "## Ranking",
        "",
        f"Every row's full ranking of the N candidates in each order, scored with {relevance}: "
        "nDCG@k (linear gain, normalised by the ideal order of the N candidates), MRR (1 / rank "
        "of the first relevant candidate) and Recall@k, in %, averaged over orders and "
        "instances, with 95% intervals from the same instance bootstrap.",
        "",
        *markdown_tables(results, keep=lambda title: title.startswith("Ranking")),
    ]
    if ranking.comparisons:
        lines += [
            "Paired differences (points) against the baseline with their bootstrap interval, "
            f"and p from a {ranking.test}:",
            "",
        ]
        rows = [
            [
                markdown_text(c.row),
                markdown_text(c.baseline),
                c.measure,
                difference_text(c.difference),
                p_value_text(c.p_value),
            ]
            for c in ranking.comparisons
        ]
        lines += markdown_table(["row", "baseline", "measure", "Δ [95% CI]", "p"], rows, left=3)
    return lines


def _group_lines(results: EvaluationResults) -> list[str]:
    groups = results.groups
    if groups is None:
        return []
    return [
        "",
        "## Groups",
        "",
        f"Per group of the benchmark (`meta.{markdown_text(groups.key)}`): accuracy on the "
        "group's instances, and the macro average (the unweighted mean over groups) of Acc, "
        "RStd and Cons.; 95% intervals resample instances within each group.",
        "",
        *markdown_tables(results, keep=lambda title: "group" in title.lower()),
    ]


def write_report(results: EvaluationResults, out: str | Path) -> Path:
    """Render every figure (PNG, PDF, SVG) and ``report.md`` into the run directory; returns
    the report path.

    Everything is rendered in memory first: a results file that cannot be drawn fails before
    any file is written. The figures then appear together, then ``report.md``.
    """
    root = Path(out)
    # through the run-directory layer: a link at any name we may write (every figure's too) is
    # refused before the seconds of drawing and before anything is written, never replaced
    own = re.compile(r"^[\w.-]+\Z")
    drawn = RunFolder(root / FIGURES, marker=None, own=own, flag="RUN_DIR")
    top = RunFolder(root, marker=None, own=own, flag="RUN_DIR")
    top.refuse_links([FIGURES, "report.md"])
    drawn.refuse_links(_figure_files())
    rendered: dict[str, bytes] = {}
    written: list[tuple[str, str]] = []
    for name, title, draw in REPORT_FIGURES:
        figure = draw(results)
        if figure is None:
            continue
        for fmt, data in render(figure).items():
            rendered[f"{name}.{fmt}"] = data
        written.append((title, name))
    adapter = results.adapter
    stats = results.statistics
    lines = [
        "# posdebias results",
        "",
        f"- model: `{adapter.model_id}` (adapter `{adapter.adapter}`)",
        f"- N = {results.n} {candidate_noun(results.settings.task)}, "
        f"{results.num_instances} test instances x "
        f"{results.orders} orders, seed {results.seed}",
        f"- calibration instances: {len(results.calibration_ids)}",
        "",
        plain_results_table(
            results.metrics(), results.generated_rows(), stats, results.order_independent_rows()
        ),
        "",
        "Acc: accuracy per order, mean ± std over orders. RStd: std of the recall per truth "
        "position (lower is better). Cons.: % of instances with the same "
        f"{candidate_noun(results.settings.task, plural=False)} chosen under every order.",
    ]
    for note in run_notes(results):
        lines += ["", note]
    if stats is None:
        lines += [
            "",
            "This results file (schema version 1) holds no statistics: re-run the same "
            "`posdebias evaluate --out DIR --resume` to add intervals and paired tests (the "
            "records are reused; no forward pass is repeated).",
        ]
    else:
        lines += _statistics_lines(results, stats)
    lines += _ranking_lines(results) + _group_lines(results)
    if results.judge:
        lines += [
            "",
            "## Pairwise judge",
            "",
            plain_judge_table(results.judge),
            "",
            judge_legend(results.judge),
        ]
    lines += [
        "",
        "## Cost",
        "",
        "Cost per test instance (all orders): forward passes (prompt passes plus decoding "
        "steps), generated tokens, seconds (model and method).",
        "",
    ]
    seconds = results.timing.seconds_per_instance
    rows = []
    for label, result in results.calibrators.items():
        cost, spent = result.cost, seconds.get(label)
        passes, tokens = cost.forward_passes_per_instance, cost.generated_tokens_per_instance
        rows.append([label, f"{passes:g}", f"{tokens:g}", "-" if spent is None else f"{spent:.4f}"])
    lines += markdown_table(["row", "forward passes", "generated tokens", "seconds"], rows)
    warnings = [
        (label, result.diagnostics["warning"])
        for label, result in results.calibrators.items()
        if result.diagnostics.get("warning")
    ]
    if warnings:
        lines += ["", "## Calibration warnings", ""]
        lines += [f"- **{label}**: {warning}" for label, warning in warnings]
    for title, name in written:
        vector = ", ".join(f"[{fmt.upper()}]({FIGURES}/{name}.{fmt})" for fmt in FORMATS[1:])
        lines += ["", f"## {title}", "", f"![{title}]({FIGURES}/{name}.png)", "", vector]
    text = file_text("\n".join(lines)) + "\n"
    figures = root / FIGURES
    remove_stale(figures)
    _remove_outdated(figures, set(rendered))
    drawn.write_files(rendered)
    return top.write_files({"report.md": text.encode("utf-8")})[0]


def _remove_outdated(figures: Path, keep: set[str]) -> None:
    """Delete figures of ours this report does not draw (e.g. a comparison an earlier version
    drew), so the folder never shows a figure the results no longer hold."""
    for name in _figure_files():
        path = figures / name
        if name not in keep and path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.unlink()
