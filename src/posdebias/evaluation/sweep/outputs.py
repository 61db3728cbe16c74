"""A study's outputs: the tidy table, the paper-style figure and the report."""

from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posdebias._io import atomic_write_bytes, atomic_write_text
from posdebias.evaluation.report import _pyplot
from posdebias.evaluation.sweep.plan import Point

COLUMNS = (
    "study",
    "point",
    "value",
    "calibration_benchmark",
    "benchmark",
    "n",
    "orders",
    "instances",
    "calibration_instances",
    "calibrator",
    "accuracy",
    "accuracy_std",
    "rstd",
    "consistency",
    "forward_passes_per_instance",
    "point_forward_passes",
    "point_new_forward_passes",
)


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


def write_table(rows: list[dict[str, Any]], path: Path) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: row[key] for key in COLUMNS})
    return atomic_write_text(path, buffer.getvalue())


def read_table(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


_AXIS = {
    "n": "N (images per instance)",
    "calibration_size": "|Dcal| (calibration instances)",
    "top_k": "K (selected layers)",
    "tau": "tau (posterior temperature)",
}


def write_figure(study: str, rows: list[dict[str, Any]], path: Path) -> Path:

    plt = _pyplot()
    labels = list(dict.fromkeys(row["calibrator"] for row in rows))
    metrics = [("accuracy", "Acc (%)"), ("rstd", "RStd"), ("consistency", "Cons. (%)")]
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    if study == "transfer":
        points = list(dict.fromkeys(row["point"] for row in rows))
        width = 0.8 / max(len(labels), 1)
        for axis, (metric, title) in zip(axes, metrics, strict=True):
            for k, label in enumerate(labels):
                values = [
                    next(r[metric] for r in rows if r["point"] == p and r["calibrator"] == label)
                    for p in points
                ]
                axis.bar([i + k * width for i in range(len(points))], values, width, label=label)
            axis.set_xticks([i + 0.4 - width / 2 for i in range(len(points))])
            axis.set_xticklabels(points, rotation=30, ha="right", fontsize=7)
            axis.set_title(title)
    else:
        for axis, (metric, title) in zip(axes, metrics, strict=True):
            for label in labels:
                mine = [row for row in rows if row["calibrator"] == label]
                axis.plot([r["value"] for r in mine], [r[metric] for r in mine], marker="o",
                          markersize=3, label=label)  # fmt: skip
            axis.set_xlabel(_AXIS[study])
            axis.set_title(title)
            if study == "tau":
                axis.set_xscale("log")
        if study == "n":
            ns = sorted({row["value"] for row in rows})
            axes[0].plot(ns, [100 / n for n in ns], "k:", linewidth=1, label="chance")
    handles, names = axes[0].get_legend_handles_labels()
    axes[-1].legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    with warnings.catch_warnings():  # long transfer labels: bbox_inches="tight" fits them
        warnings.simplefilter("ignore", UserWarning)
        figure.tight_layout()
    buffer = io.BytesIO()  # small (docs embed them), no version stamp: reproducible bytes
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    plt.close(figure)
    return atomic_write_bytes(path, buffer.getvalue())


def write_sweep_report(
    study: str, rows: list[dict[str, Any]], points: list[Point], adapter: Any, path: Path
) -> Path:
    labels = list(dict.fromkeys(row["calibrator"] for row in rows))
    described = adapter.describe()
    lines = [
        f"# Study `{study}`",
        "",
        f"Model: {described.get('model_id') or described.get('adapter')}; protocol "
        f"{points[0].config.protocol}; seed {points[0].config.seed}. One row per point; "
        "results.csv has every number.",
        "",
        "![figure](figure.png)",
        "",
    ]
    for metric, title in (("accuracy", "Acc"), ("rstd", "RStd"), ("consistency", "Cons.")):
        lines += [f"## {title}", "", "| point | " + " | ".join(labels) + " |"]
        lines.append("|---" * (len(labels) + 1) + "|")
        for point in dict.fromkeys(row["point"] for row in rows):
            mine = {r["calibrator"]: r for r in rows if r["point"] == point}
            cells = []
            for label in labels:
                value = mine[label][metric]
                cells.append(
                    f"{value:.2f} +- {mine[label]['accuracy_std']:.2f}"
                    if metric == "accuracy"
                    else f"{value:.2f}"
                )
            lines.append(f"| {point} | " + " | ".join(cells) + " |")
        lines.append("")
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
    return atomic_write_text(path, "\n".join(lines))
