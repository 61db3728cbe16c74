"""Figures and a markdown summary rendered from a results file (never from live state), so
``posdebias report RUN_DIR`` reproduces exactly what the run wrote."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from posdebias._io import atomic_write_bytes, atomic_write_text
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.table import plain_results_table

FIGURES = "figures"


def _save(figure: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(
        buffer, format="png", dpi=120, bbox_inches="tight", metadata={"Software": None}
    )  # no version stamp: reproducible bytes
    plt.close(figure)
    return atomic_write_bytes(path, buffer.getvalue())


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _heatmap(
    axis: Any, matrix: np.ndarray, title: str, xlabel: str, ylabel: str, scale: float
) -> None:
    n = matrix.shape[0]
    axis.imshow(matrix, cmap="Blues", vmin=0, vmax=scale)
    axis.set_title(title, fontsize=9)
    axis.set_xticks(range(n), [str(i + 1) for i in range(n)], fontsize=7)
    axis.set_yticks(range(n), [str(i + 1) for i in range(n)], fontsize=7)
    axis.set_xlabel(xlabel, fontsize=8)
    axis.set_ylabel(ylabel, fontsize=8)
    if n <= 12:
        for i in range(n):
            for j in range(n):
                value = matrix[i, j]
                if np.isnan(value):
                    continue
                text = f"{value:.0f}" if scale > 1 else f"{value:.2f}"
                color = "white" if value > 0.6 * scale else "black"
                axis.text(j, i, text, ha="center", va="center", fontsize=6, color=color)


def confusion_figure(results: EvaluationResults, path: Path) -> Path:
    """Truth position x predicted position (%), one heat map per calibrator (paper Fig. 1)."""
    plt = _pyplot()
    labels = list(results.calibrators)
    figure, axes = plt.subplots(1, len(labels), figsize=(2.6 * len(labels), 2.8), squeeze=False)
    for axis, label in zip(axes[0], labels, strict=True):
        metrics = results.calibrators[label].metrics
        matrix = np.array([[np.nan if v is None else v for v in row] for row in metrics.confusion])
        _heatmap(
            axis, matrix, f"{label}\nAcc {metrics.accuracy_mean:.1f}", "predicted", "truth", 100.0
        )
    return _save(figure, path)


def recall_figure(results: EvaluationResults, path: Path) -> Path:
    """Recall per truth position, grouped bars per calibrator."""
    plt = _pyplot()
    labels = list(results.calibrators)
    n = results.n
    figure, axis = plt.subplots(figsize=(max(5.0, 0.6 * n * len(labels) / 2), 3.0))
    width = 0.8 / len(labels)
    for index, label in enumerate(labels):
        recall = [
            0.0 if v is None else v for v in results.calibrators[label].metrics.recall_per_position
        ]
        axis.bar(np.arange(n) + index * width - 0.4 + width / 2, recall, width, label=label)
    axis.set_xticks(range(n), [str(i + 1) for i in range(n)])
    axis.set_xlabel("truth position")
    axis.set_ylabel("recall (%)")
    axis.set_ylim(0, 105)
    axis.legend(fontsize=7, ncols=min(3, len(labels)), loc="lower right")
    return _save(figure, path)


def divergence_figure(results: EvaluationResults, path: Path) -> Path | None:
    """Where label probabilities, raw attention and purified attention point, per truth
    position: the logit-attention divergence picture."""
    profile = results.divergence
    if profile is None:
        return None
    plt = _pyplot()
    panels = [
        ("label probabilities", profile.label_probabilities),
        ("raw attention", profile.raw_attention),
    ]
    if profile.purified_attention is not None:
        panels.append(("purified attention", profile.purified_attention))
    figure, axes = plt.subplots(1, len(panels), figsize=(2.8 * len(panels), 2.9), squeeze=False)
    for axis, (title, matrix) in zip(axes[0], panels, strict=True):
        _heatmap(axis, np.asarray(matrix), title, "position", "truth position", 1.0)
    figure.suptitle(f"logit-attention divergence ({profile.calibrator} layers)", fontsize=9)
    return _save(figure, path)


def write_report(results: EvaluationResults, out: str | Path) -> Path:
    """Render every figure and ``report.md`` into the run directory; returns the report path."""
    root = Path(out)
    figures = root / FIGURES
    written = [
        (
            "Confusion matrices (truth x predicted position, %)",
            confusion_figure(results, figures / "confusion.png"),
        ),
        ("Recall per truth position", recall_figure(results, figures / "recall.png")),
        ("Logit-attention divergence", divergence_figure(results, figures / "divergence.png")),
    ]
    adapter = results.adapter
    lines = [
        "# posdebias results",
        "",
        f"- model: `{adapter.get('model_id')}` (adapter `{adapter.get('adapter')}`)",
        f"- N = {results.n} images, {results.num_instances} test instances x "
        f"{results.orders} orders, seed {results.seed}",
        f"- calibration instances: {len(results.calibration_ids)}",
        "",
        plain_results_table(results.metrics(), results.generated_rows()),
        "",
        "Acc: accuracy per order, mean ± std over orders. RStd: std of the recall per truth "
        "position (lower is better). Cons.: % of instances with the same image chosen under "
        "every order.",
        "",
        "Cost per test instance (all orders): forward passes (prompt passes plus decoding "
        "steps), generated tokens, seconds (model and method).",
        "",
        "| row | forward passes | generated tokens | seconds |",
        "|---|---:|---:|---:|",
    ]
    seconds = results.timing.get("seconds_per_instance", {})
    for label, result in results.calibrators.items():
        cost = result.cost
        spent = seconds.get(label)
        lines.append(
            f"| {label} | {cost.get('forward_passes_per_instance', 0):g} "
            f"| {cost.get('generated_tokens_per_instance', 0):g} "
            f"| {'-' if spent is None else f'{spent:.4f}'} |"
        )
    warnings = [
        (label, result.diagnostics["warning"])
        for label, result in results.calibrators.items()
        if result.diagnostics.get("warning")
    ]
    if warnings:
        lines += ["", "## Calibration warnings", ""]
        lines += [f"- **{label}**: {warning}" for label, warning in warnings]
    for title, path in written:
        if path is not None:
            lines += ["", f"## {title}", "", f"![{title}]({FIGURES}/{path.name})"]
    return atomic_write_text(root / "report.md", "\n".join(lines) + "\n")
