"""The paper's table: rows calibrators (and decoders), columns Acc (mean +- std over orders),
RStd, Cons.; with generated rows also the parse-failure rate (% of orders without a valid
answer; "-" for scored rows, which always answer)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from rich.console import Console
from rich.table import Table

from posdebias._text import SafeConsole
from posdebias.evaluation.metrics import Metrics


def _parse_failures(label: str, row: Metrics, generated: Collection[str]) -> str:
    return f"{row.no_answer:6.2f}" if label in generated else "-"


def results_table(
    metrics: Mapping[str, Metrics], title: str | None = None, generated: Collection[str] = ()
) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("calibrator", style="bold")
    table.add_column("Acc ↑", justify="right")
    table.add_column("RStd ↓", justify="right")
    table.add_column("Cons. ↑", justify="right")
    if generated:
        table.add_column("Parse fail. % ↓", justify="right")
    for label, row in metrics.items():
        cells = [
            label,
            f"{row.accuracy_mean:6.2f} ± {row.accuracy_std:5.2f}",
            f"{row.rstd:6.2f}",
            f"{row.consistency:6.2f}",
        ]
        if generated:
            cells.append(_parse_failures(label, row, generated))
        table.add_row(*cells)
    return table


def print_results_table(
    metrics: Mapping[str, Metrics],
    title: str | None = None,
    console: Console | None = None,
    generated: Collection[str] = (),
) -> None:
    (console or SafeConsole()).print(results_table(metrics, title, generated))


def plain_results_table(metrics: Mapping[str, Metrics], generated: Collection[str] = ()) -> str:
    """The same table as aligned plain text (markdown summaries, logs)."""
    if not generated:
        lines = ["| calibrator | Acc | RStd | Cons. |", "|---|---:|---:|---:|"]
    else:
        lines = [
            "| calibrator | Acc | RStd | Cons. | Parse fail. % |",
            "|---|---:|---:|---:|---:|",
        ]
    for label, row in metrics.items():
        line = (
            f"| {label} | {row.accuracy_mean:.2f} ± {row.accuracy_std:.2f} | {row.rstd:.2f} "
            f"| {row.consistency:.2f} |"
        )
        if generated:
            line += f" {_parse_failures(label, row, generated).strip()} |"
        lines.append(line)
    return "\n".join(lines)
