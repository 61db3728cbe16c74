"""Figures and a markdown summary rendered from a results file (never from live state), so
``posdebias report RUN_DIR`` reproduces exactly what the run wrote."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from posdebias._io import atomic_write_bytes, atomic_write_text, remove_stale, write_files_together
from posdebias.errors import OutputError
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.table import plain_results_table

FIGURES = "figures"


def _png(figure: Any) -> bytes:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(
        buffer, format="png", dpi=120, bbox_inches="tight", metadata={"Software": None}
    )  # no version stamp: reproducible bytes
    plt.close(figure)
    return buffer.getvalue()


def _save(figure: Any, path: Path) -> Path:
    return atomic_write_bytes(path, _png(figure))


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
    return _save(_confusion(results), path)


def _confusion(results: EvaluationResults) -> Any:
    plt = _pyplot()
    labels = list(results.calibrators)
    figure, axes = plt.subplots(1, len(labels), figsize=(2.6 * len(labels), 2.8), squeeze=False)
    for axis, label in zip(axes[0], labels, strict=True):
        metrics = results.calibrators[label].metrics
        matrix = np.array([[np.nan if v is None else v for v in row] for row in metrics.confusion])
        _heatmap(
            axis, matrix, f"{label}\nAcc {metrics.accuracy_mean:.1f}", "predicted", "truth", 100.0
        )
    return figure


def recall_figure(results: EvaluationResults, path: Path) -> Path:
    """Recall per truth position, grouped bars per calibrator."""
    return _save(_recall(results), path)


def _recall(results: EvaluationResults) -> Any:
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
    return figure


def divergence_figure(results: EvaluationResults, path: Path) -> Path | None:
    """Where label probabilities, raw attention and purified attention point, per truth
    position: the logit-attention divergence picture."""
    figure = _divergence(results)
    return None if figure is None else _save(figure, path)


def _divergence(results: EvaluationResults) -> Any:
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
    return figure


def write_report(results: EvaluationResults, out: str | Path) -> Path:
    """Render every figure and ``report.md`` into the run directory; returns the report path.

    Everything is rendered in memory first: a results file that cannot be drawn fails before
    any file is written. The figures then appear together, then ``report.md``.
    """
    root = Path(out)
    rendered: dict[str, bytes] = {}
    written: list[tuple[str, str | None]] = []
    for title, name, draw in (
        ("Confusion matrices (truth x predicted position, %)", "confusion.png", _confusion),
        ("Recall per truth position", "recall.png", _recall),
        ("Logit-attention divergence", "divergence.png", _divergence),
    ):
        figure = draw(results)
        if figure is not None:
            rendered[name] = _png(figure)
        written.append((title, name if figure is not None else None))
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
    for title, figure_file in written:
        if figure_file is not None:
            lines += ["", f"## {title}", "", f"![{title}]({FIGURES}/{figure_file})"]
    text = "\n".join(lines) + "\n"
    figures = root / FIGURES
    if figures.is_symlink():
        raise OutputError(f"{figures} is a symbolic link; posdebias does not write through links")
    remove_stale(figures)
    write_files_together(figures, rendered)
    return atomic_write_text(root / "report.md", text)
