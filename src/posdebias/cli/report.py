"""``posdebias report RUN_DIR``: re-render the table, figures and summary of a saved run;
``posdebias report --compare RUN_A RUN_B``: the paired comparison of two runs (printed only)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.table import Table

import posdebias.defaults as defaults
from posdebias._inputs import check_whole_number
from posdebias._io import DirectoryLock
from posdebias.cli import make_console, printable
from posdebias.cli.evaluate import add_ci_argument, print_results
from posdebias.errors import InputError
from posdebias.evaluation.compare import RunComparison, compare_runs
from posdebias.evaluation.export import FORMATS as EXPORT_FORMATS
from posdebias.evaluation.export import export
from posdebias.evaluation.report import p_value_text, write_report
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.statistics import check_resamples
from posdebias.evaluation.table import interval_text, value_interval_text


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        description="Re-render the table, figures and report.md of a run directory from its "
        "results.json; with --compare, print the paired comparison of two run directories on "
        "their shared instances and orders (nothing is written).",
    )
    parser.add_argument("run_dir", type=Path, nargs="?", help="directory written by evaluate --out")
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("RUN_A", "RUN_B"),
        help="compare two run directories row by row (B - A) on their shared decisions",
    )
    parser.add_argument(
        "--resamples",
        type=int,
        default=defaults.RESAMPLES,
        help="--compare: bootstrap resamples of the shared instances (1000; 100 to 100000)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="--compare: seed of the bootstrap resamples (0)"
    )
    parser.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default=None,
        help="print the run's tables as csv, latex or markdown for pasting (nothing is written)",
    )
    add_ci_argument(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.compare is not None:
        if args.run_dir is not None:
            raise InputError("give either RUN_DIR or --compare RUN_A RUN_B, not both")
        check_whole_number("--seed", args.seed, 0, defaults.MAX_SEED)
        comparison = compare_runs(
            *args.compare, resamples=check_resamples(args.resamples), seed=args.seed
        )
        make_console().print(comparison_table(comparison))
        return 0
    if args.run_dir is None:
        raise InputError("name a run directory (RUN_DIR) or two with --compare RUN_A RUN_B")
    results = EvaluationResults.load(args.run_dir / "results.json")  # validated before writing
    if args.format is not None:
        sys.stdout.write(export(results, args.format))  # every cell escaped for its format
        return 0
    console = make_console()
    print_results(results, console, ci=args.ci)
    with DirectoryLock(args.run_dir):
        report = write_report(results, args.run_dir)
    console.print(f"report: {report}")
    return 0


def comparison_table(comparison: RunComparison) -> Table:
    """B - A per row, each run's accuracy on the shared decisions, and McNemar's p."""
    table = Table(
        title=f"A = {printable(comparison.run_a)}\nB = {printable(comparison.run_b)}\n"
        f"{comparison.instances} shared instances, {comparison.decisions} shared decisions "
        f"(N = {comparison.n})",
        title_justify="left",
        caption=f"[low, high]: 95% paired bootstrap interval ({comparison.bootstrap.resamples} "
        f"resamples of the shared instances, seed {comparison.bootstrap.seed}); p: exact "
        "McNemar test",
        caption_justify="left",
    )
    for name in ("row", "Acc A", "Acc B", "B - A (pp)", "A only", "B only", "p"):
        table.add_column(name, justify="left" if name == "row" else "right")
    for row in comparison.rows:
        table.add_row(
            printable(row.row),
            value_interval_text(row.accuracy_a),
            value_interval_text(row.accuracy_b),
            f"{row.difference.value:+.2f} {interval_text(row.difference)}",
            str(row.a_only),
            str(row.b_only),
            p_value_text(row.p_value),
        )
    return table
