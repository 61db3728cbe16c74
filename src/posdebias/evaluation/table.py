"""The paper's table: rows calibrators, columns Acc (mean +- std over orders), RStd, Cons."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

from posdebias.evaluation.metrics import Metrics


def results_table(metrics: Mapping[str, Metrics], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("calibrator", style="bold")
    table.add_column("Acc ↑", justify="right")
    table.add_column("RStd ↓", justify="right")
    table.add_column("Cons. ↑", justify="right")
    for label, row in metrics.items():
        table.add_row(
            label,
            f"{row.accuracy_mean:6.2f} ± {row.accuracy_std:5.2f}",
            f"{row.rstd:6.2f}",
            f"{row.consistency:6.2f}",
        )
    return table


def print_results_table(
    metrics: Mapping[str, Metrics], title: str | None = None, console: Console | None = None
) -> None:
    (console or Console(markup=False, emoji=False)).print(results_table(metrics, title))


def plain_results_table(metrics: Mapping[str, Metrics]) -> str:
    """The same table as aligned plain text (markdown summaries, logs)."""
    lines = ["| calibrator | Acc | RStd | Cons. |", "|---|---:|---:|---:|"]
    for label, row in metrics.items():
        lines.append(
            f"| {label} | {row.accuracy_mean:.2f} ± {row.accuracy_std:.2f} | {row.rstd:.2f} "
            f"| {row.consistency:.2f} |"
        )
    return "\n".join(lines)
