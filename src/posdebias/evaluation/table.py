"""The paper's table: rows calibrators (and decoders), columns Acc (mean +- std over orders),
RStd, Cons.; with generated rows also the parse-failure rate (% of orders without a valid
answer; "-" for scored rows, which always answer).

An order-independent row (cloze: the same candidate under every order by construction) shows
"-" for RStd and Cons.: they would measure nothing about position (Cons. is 100% and RStd
only where the orders put the truth), so they are not shown as if they did.

With the run's statistics each metric also shows its 95% instance-bootstrap interval,
``[low, high]``: always in markdown (report.md, what a paper cites), on request (``--ci``) in
the terminal, where the paper's table stays within 80 columns without them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from rich.console import Console
from rich.table import Table

from posdebias._text import SafeConsole
from posdebias.evaluation.judging import JudgeMetrics
from posdebias.evaluation.metrics import Metrics
from posdebias.evaluation.statistics import Interval, RunStatistics


def _parse_failures(label: str, row: Metrics, generated: Collection[str]) -> str:
    return f"{row.no_answer:6.2f}" if label in generated else "-"


def markdown_table(
    header: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1
) -> list[str]:
    """The lines of a markdown table: ``header``, its rule (the first ``left`` columns aligned
    left, the others right) and a line per row; cells as given (user text escaped first)."""
    lines = ["| " + " | ".join(cells) + " |" for cells in [header, *rows]]
    return [lines[0], "|" + "---|" * left + "---:|" * (len(header) - left), *lines[1:]]


def interval_text(interval: Interval | None) -> str:
    """``[low, high]`` to one decimal, or ``-`` when there is none."""
    return "-" if interval is None else f"[{interval.low:.1f}, {interval.high:.1f}]"


def value_interval_text(interval: Interval | None) -> str:
    """``value [low, high]``, the value to two decimals, or ``-`` when there is none."""
    return "-" if interval is None else f"{interval.value:.2f} {interval_text(interval)}"


def _cells(
    label: str,
    row: Metrics,
    statistics: RunStatistics | None,
    padded: bool,
    order_independent: bool = False,
) -> list[str]:
    wide, narrow = ("6", "5") if padded else ("", "")  # aligned in a terminal
    cells = [
        f"{row.accuracy_mean:{wide}.2f} ± {row.accuracy_std:{narrow}.2f}",
        f"{row.rstd:{wide}.2f}",
        f"{row.consistency:{wide}.2f}",
    ]
    found = None if statistics is None else statistics.rows.get(label)
    if found is not None:
        intervals = (found.accuracy, found.rstd, found.consistency)
        cells = [f"{cell} {interval_text(ci)}" for cell, ci in zip(cells, intervals, strict=True)]
    if order_independent:
        cells[1:] = ["-", "-"]
    return cells


def print_results_table(
    metrics: Mapping[str, Metrics],
    title: str | None = None,
    console: Console | None = None,
    generated: Collection[str] = (),
    statistics: RunStatistics | None = None,
    order_independent: Collection[str] = (),
) -> None:
    """The paper's table in the terminal (its 95% intervals with ``statistics``)."""
    table = Table(title=title, title_justify="left")
    table.add_column("calibrator", style="bold")
    for header in ("Acc ↑", "RStd ↓", "Cons. ↑", *(["Parse fail. % ↓"] if generated else [])):
        table.add_column(header, justify="right")
    for label, row in metrics.items():
        cells = [label, *_cells(label, row, statistics, True, label in order_independent)]
        if generated:
            cells.append(_parse_failures(label, row, generated))
        table.add_row(*cells)
    if statistics is not None:
        boot = statistics.bootstrap
        table.caption = (
            f"[low, high]: 95% bootstrap interval ({boot.resamples} resamples of the test "
            f"instances, seed {boot.seed})"
        )
        table.caption_justify = "left"
    (console or SafeConsole()).print(table)


def plain_results_table(
    metrics: Mapping[str, Metrics],
    generated: Collection[str] = (),
    statistics: RunStatistics | None = None,
    order_independent: Collection[str] = (),
) -> str:
    """The same table as markdown (summaries, logs); with ``statistics`` every metric carries
    its 95% interval."""
    suffix = " [95% CI]" if statistics is not None else ""
    header = ["calibrator", f"Acc{suffix}", f"RStd{suffix}", f"Cons.{suffix}"]
    rows = [
        [
            label,
            *_cells(label, row, statistics, False, label in order_independent),
            *([_parse_failures(label, row, generated).strip()] if generated else []),
        ]
        for label, row in metrics.items()
    ]
    return "\n".join(markdown_table([*header, *(["Parse fail. %"] if generated else [])], rows))


#: The pairwise judge table's columns: header, JudgeMetrics field.
JUDGE_COLUMNS = (
    ("Consist. ↑", "consistency"),
    ("1st both %", "first_position"),
    ("2nd both %", "second_position"),
    ("Pref. 1st %", "first_preference"),
    ("Agree ↑", "agreement"),
    ("Agree w/ tie ↑", "agreement_with_ties"),
)
#: What the pairwise judge table's columns mean (terminal caption and report.md).
JUDGE_LEGEND = (
    "Consist.: % of pairs with the same answer in both orders. 1st / 2nd both: % of pairs "
    "answered by position 1 (2) in both orders. Pref. 1st: % of those position-biased pairs "
    "that favour position 1 (50: no side). Agree: % of the human votes that prefer the "
    "verdict (the answer chosen in both orders; an inconsistent pair is a tie), tie votes and "
    "tie verdicts left out; w/ tie: % of all votes equal to the verdict."
)


#: The columns a run with a tie label (``task_prompt.tie_label``) adds, and what they mean.
TIE_LABEL_COLUMNS = (("Tie label %", "tie_answers"), ("Tie once %", "one_tie"))
TIE_LABEL_LEGEND = (
    " Tie label: % of the answers (two per pair) that are the tie label; Tie once: % of pairs "
    "answered with it in one order only (a tie verdict; with it in both, a consistent tie)."
)


def judge_columns(judge: Mapping[str, JudgeMetrics]) -> tuple[tuple[str, str], ...]:
    """The judge table's columns: :data:`JUDGE_COLUMNS`, plus the tie-label counts when the
    run had a tie label."""
    with_tie = any(row.tie_answers is not None for row in judge.values())
    return JUDGE_COLUMNS + (TIE_LABEL_COLUMNS if with_tie else ())


def judge_legend(judge: Mapping[str, JudgeMetrics]) -> str:
    """:data:`JUDGE_LEGEND`, and the tie-label columns' meaning when they are shown."""
    shown = len(judge_columns(judge)) > len(JUDGE_COLUMNS)
    return JUDGE_LEGEND + (TIE_LABEL_LEGEND if shown else "")


def _judge_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def judge_table(judge: Mapping[str, JudgeMetrics]) -> Table:
    """The pairwise judge measures of a run, one row per calibrator or decoder."""
    pairs = next(iter(judge.values())).pairs if judge else 0
    columns = judge_columns(judge)
    table = Table(title=f"pairwise judge: {pairs} pairs in both orders", title_justify="left")
    table.add_column("calibrator", style="bold")
    for header, _ in columns:
        table.add_column(header, justify="right")
    for label, row in judge.items():
        table.add_row(label, *(_judge_cell(getattr(row, field)) for _, field in columns))
    return table


def plain_judge_table(judge: Mapping[str, JudgeMetrics]) -> str:
    """The same as :func:`judge_table`, in markdown."""
    columns = judge_columns(judge)
    rows = [
        [label, *(_judge_cell(getattr(row, field)) for _, field in columns)]
        for label, row in judge.items()
    ]
    return "\n".join(markdown_table(["calibrator", *(header for header, _ in columns)], rows))
