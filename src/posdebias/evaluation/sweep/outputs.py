"""A study's outputs: the tidy table, the paper-style figure and the report.

Each is rendered to bytes here; :meth:`SweepDirectory.write_outputs` writes them together
through the run-directory layer (all or none, never through a link)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

from posdebias._text import file_text, one_line
from posdebias.core.instance import candidate_noun
from posdebias.evaluation.export import HEADLINE
from posdebias.evaluation.figures import render, row_interval, sweep_figure
from posdebias.evaluation.sweep.plan import Point
from posdebias.evaluation.sweep.store import PointRow
from posdebias.evaluation.table import markdown_table

#: The columns of results.csv: a point's row (:class:`PointRow`), then the point's costs.
COLUMNS = (*PointRow.model_fields, "point_forward_passes", "point_new_forward_passes")


def with_costs(done: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with each point's forward passes: all it used, and those no earlier point used
    (a logical count: the same whether or not the study was interrupted)."""
    seen: set[str] = set()
    rows = []
    for payload in done:
        keys = set(payload["keys"])
        new = len(keys - seen)
        seen |= keys
        for row in payload["rows"]:
            rows.append({**row, "point_forward_passes": len(keys), "point_new_forward_passes": new})
    return rows


# -- outputs ---------------------------------------------------------------------------------


def table_text(rows: list[dict[str, Any]]) -> str:
    """results.csv: one line per point and calibrator, every cell on one line."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        cells = {key: row.get(key, "") for key in COLUMNS}  # no interval: empty
        writer.writerow({k: one_line(v) if isinstance(v, str) else v for k, v in cells.items()})
    return buffer.getvalue()


_AXIS = {
    "calibration_size": "|Dcal| (calibration instances)",
    "top_k": "K (selected layers)",
    "tau": "tau (posterior temperature)",
}


def axis_label(study: str, task: str | None) -> str:
    """The x axis of a study's figure, in the task's own noun ("N (options per instance)")."""
    if study == "n":
        return f"N ({candidate_noun(task)} per instance)"
    return _AXIS.get(study, study)


def figure_files(study: str, rows: list[dict[str, Any]], task: str | None) -> dict[str, bytes]:
    """The study's figure as figure.png, figure.pdf and figure.svg (name: bytes)."""
    rendered = render(sweep_figure(study, rows, axis_label(study, task)))
    return {f"figure.{fmt}": data for fmt, data in rendered.items()}


def sweep_report_text(
    study: str, rows: list[dict[str, Any]], points: list[Point], adapter: Any, *, figure: bool
) -> str:
    """report.md: the figure (where ``figure`` says it was drawn), one table per metric and the
    cost table."""
    labels = list(dict.fromkeys(row["calibrator"] for row in rows))
    described = adapter.describe()
    intervals = (
        "[low, high]: 95% bootstrap interval over the point's test instances (results.csv: "
        "*_low, *_high)"
    )
    drawn = [
        "![figure](figure.png)",
        "",
        "Vector versions: [PDF](figure.pdf), [SVG](figure.svg). "
        f"{intervals}, drawn as shaded bands or error bars.",
    ]
    lines = [
        f"# Study `{study}`",
        "",
        f"Model: {described.get('model_id') or described.get('adapter')}; protocol "
        f"{points[0].config.protocol}; seed {points[0].config.seed}. One row per point; "
        "results.csv has every number.",
        "",
        *(drawn if figure else [f"{intervals}."]),
        "",
    ]
    if any(row["rstd"] in (None, "") for row in rows):
        lines += [
            "RStd and Cons. `-`: an order-independent row (cloze), which chooses the same "
            "option under every order by construction, so it has no position bias to measure.",
            "",
        ]
    for metric, title in HEADLINE:
        lines += [f"## {title}", ""]
        table = []
        for point in dict.fromkeys(row["point"] for row in rows):
            mine = {r["calibrator"]: r for r in rows if r["point"] == point}
            cells = []
            for label in labels:
                value = mine[label][metric]
                if value in (None, ""):
                    cells.append("-")  # an order-independent row (cloze): not measured
                    continue
                cell = (
                    f"{value:.2f} +- {mine[label]['accuracy_std']:.2f}"
                    if metric == "accuracy"
                    else f"{value:.2f}"
                )
                interval = row_interval(mine[label], metric)
                if interval is not None:
                    cell += f" [{interval.low:.1f}, {interval.high:.1f}]"
                cells.append(cell)
            table.append([point, *cells])
        lines += [*markdown_table(["point", *labels], table, len(labels) + 1), ""]
    lines += [
        "## Cost",
        "",
        "Forward passes per point: all observations it used, and those no earlier point had "
        "made (the shared cache makes the rest free). Seconds are in timing.json.",
        "",
        "| point | N | T | test instances | calibration instances | forward passes | new |",
        "|---|---|---|---|---|---|---|",
    ]
    for point in dict.fromkeys(row["point"] for row in rows):
        r = next(row for row in rows if row["point"] == point)
        lines.append(
            f"| {point} | {r['n']} | {r['orders']} | {r['instances']} | "
            f"{r['calibration_instances']} | {r['point_forward_passes']} | "
            f"{r['point_new_forward_passes']} |"
        )
    lines.append("")
    return file_text("\n".join(lines))
