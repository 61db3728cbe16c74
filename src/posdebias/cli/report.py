"""``posdebias report RUN_DIR``: re-render the table, figures and summary of a saved run."""

from __future__ import annotations

import argparse
from pathlib import Path

from posdebias._io import DirectoryLock
from posdebias.cli import make_console
from posdebias.evaluation.report import write_report
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.table import print_results_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report")
    parser.add_argument("run_dir", type=Path, help="directory written by evaluate --out")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:

    results = EvaluationResults.load(args.run_dir / "results.json")  # validated before writing
    console = make_console()
    print_results_table(results.metrics(), console=console, generated=results.generated_rows())
    with DirectoryLock(args.run_dir):
        report = write_report(results, args.run_dir)
    console.print(f"report: {report}")
    return 0
