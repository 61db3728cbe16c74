"""A run's tables for pasting: CSV (one tidy line per number), LaTeX (booktabs) or markdown.

``posdebias report RUN_DIR --format csv|latex|markdown`` prints them from ``results.json``, for
any run directory: the headline table (Acc, RStd, Cons.), the ranking measures where the rows
rank, and the per-group table with its macro average where the benchmark names groups. Every
cell a user or a file supplied (a row label, a group name) is escaped for its format.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable

from posdebias._text import one_line
from posdebias.errors import InputError
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.statistics import Interval
from posdebias.evaluation.table import markdown_table, value_interval_text

FORMATS = ("csv", "latex", "markdown")
#: The headline measures: the results' key and the name a table shows.
HEADLINE = (("accuracy", "Acc"), ("rstd", "RStd"), ("consistency", "Cons."))
CSV_COLUMNS = ("section", "row", "group", "measure", "value", "low", "high")

_LATEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_text(text: str) -> str:
    """``text`` as LaTeX prints it literally (special characters escaped, one line)."""
    return "".join(_LATEX.get(ch, ch) for ch in one_line(text))


def markdown_text(text: str) -> str:
    """``text`` for a markdown table cell: one line, ``|`` and ``\\`` escaped."""
    return one_line(text).replace("\\", "\\\\").replace("|", "\\|")


def csv_text(text: str) -> str:
    """``text`` for a CSV cell a spreadsheet opens: one line, and a leading ``= + - @`` (a
    formula to a spreadsheet) prefixed with an apostrophe."""
    text = one_line(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def tables(results: EvaluationResults) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table of the run, cells as plain (unescaped) text."""
    stats = results.statistics
    out: list[tuple[str, list[str], list[list[str]]]] = []
    header = ["row", *(name for _, name in HEADLINE)]
    rows = []
    for label, result in results.calibrators.items():
        found = stats.rows.get(label) if stats is not None else None
        if found is None:
            m = result.metrics
            rows.append([label, f"{m.accuracy_mean:.2f}", f"{m.rstd:.2f}", f"{m.consistency:.2f}"])
        else:
            rows.append([label, *(value_interval_text(getattr(found, key)) for key, _ in HEADLINE)])
    out.append(("Results (%, 95% CI)", header, rows))
    if results.ranking is not None:
        measures = list(next(iter(results.ranking.rows.values())))
        out.append(
            (
                "Ranking (%, 95% CI)",
                ["row", *measures],
                [
                    [label, *(value_interval_text(row.get(m)) for m in measures)]
                    for label, row in results.ranking.rows.items()
                ],
            )
        )
    if results.groups is not None:
        groups = list(results.groups.instances)
        header = ["row", *(f"{g} (n={results.groups.instances[g]})" for g in groups), "macro"]
        out.append(
            (
                "Accuracy by group (%, 95% CI)",
                header,
                [
                    [
                        label,
                        *(value_interval_text(per[g].accuracy) for g in groups),
                        value_interval_text(results.groups.macro[label].accuracy),
                    ]
                    for label, per in results.groups.rows.items()
                ],
            )
        )
        out.append(
            (
                f"Macro average over the {len(groups)} groups (%, 95% CI)",
                ["row", *(name for _, name in HEADLINE)],
                [
                    [label, *(value_interval_text(getattr(row, key)) for key, _ in HEADLINE)]
                    for label, row in results.groups.macro.items()
                ],
            )
        )
    return out


def _intervals(results: EvaluationResults) -> list[tuple[str, str, str, str, Interval]]:
    """(section, row, group, measure, interval) of every interval of the run."""
    found: list[tuple[str, str, str, str, Interval]] = []
    stats = results.statistics
    if stats is not None:
        for label, row in stats.rows.items():
            found += [("results", label, "", name, getattr(row, key)) for key, name in HEADLINE]
    if results.ranking is not None:
        for label, measures in results.ranking.rows.items():
            found += [("ranking", label, "", m, ci) for m, ci in measures.items()]
    if results.groups is not None:
        for label, per in results.groups.rows.items():
            for group, grouped in [*per.items(), ("macro", results.groups.macro[label])]:
                found += [
                    ("groups", label, group, name, getattr(grouped, key)) for key, name in HEADLINE
                ]
    return found


def to_csv(results: EvaluationResults) -> str:
    """Every number as one tidy line: section, row, group, measure, value, low, high."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    if results.statistics is None:  # a version-1 file: the estimates without intervals
        for label, result in results.calibrators.items():
            m = result.metrics
            values = (m.accuracy_mean, m.rstd, m.consistency)
            for (_, name), value in zip(HEADLINE, values, strict=True):
                writer.writerow(["results", csv_text(label), "", name, repr(value), "", ""])
    for section, label, group, measure, ci in _intervals(results):
        writer.writerow(
            [section, csv_text(label), csv_text(group), measure, repr(ci.value), repr(ci.low),
             repr(ci.high)]
        )  # fmt: skip
    return buffer.getvalue()


def _markdown(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
    escaped = [[markdown_text(cell) for cell in row] for row in [header, *rows]]
    return [f"**{markdown_text(title)}**", "", *markdown_table(escaped[0], escaped[1:]), ""]


def markdown_tables(
    results: EvaluationResults, keep: Callable[[str], bool] = lambda title: True
) -> list[str]:
    """The run's tables in markdown (those whose title ``keep`` accepts)."""
    return [line for table in tables(results) if keep(table[0]) for line in _markdown(*table)]


def _latex(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
    spec = "l" + "r" * (len(header) - 1)
    return [
        f"% {latex_text(title)}",
        r"\begin{tabular}{" + spec + "}",
        r"\toprule",
        " & ".join(latex_text(h) for h in header) + r" \\",
        r"\midrule",
        *(" & ".join(latex_text(c) for c in row) + r" \\" for row in rows),
        r"\bottomrule",
        r"\end{tabular}",
        "",
    ]


def export(results: EvaluationResults, fmt: str) -> str:
    """The run's tables in ``fmt`` (:data:`FORMATS`)."""
    if fmt == "csv":
        return to_csv(results)
    writers: dict[str, Callable[[str, list[str], list[list[str]]], list[str]]] = {
        "latex": _latex,
        "markdown": _markdown,
    }
    if fmt not in writers:
        raise InputError(f"--format {one_line(fmt)[:20]} is not one of {', '.join(FORMATS)}")
    lines = [line for table in tables(results) for line in writers[fmt](*table)]
    return "\n".join(lines).rstrip("\n") + "\n"
