"""Figures fit for print, drawn from a results file (never from live state).

One style for every figure of the package (run reports and sweeps): sizes in inches at the
width they are printed (one column 3.4 in, two columns 7 in), fonts of 7 to 9 pt at that size,
Paul Tol's colour-blind-safe "muted" palette (ten colours; beyond ten rows hatches or line
styles keep every row distinct), legends outside the axes so they hide no data, a colour bar
beside every heat map, and every figure written as PNG (300 dpi), PDF and SVG (vector) with no
date or version stamp, so a seeded run writes identical bytes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from posdebias._text import file_text
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.statistics import Interval

#: Paul Tol's muted qualitative scheme (colour-blind safe), then its pale grey.
PALETTE = (
    "#332288",
    "#88CCEE",
    "#44AA99",
    "#117733",
    "#999933",
    "#DDCC77",
    "#CC6677",
    "#882255",
    "#AA4499",
    "#BBBBBB",
)
HATCHES = ("", "//", "..", "xx", "\\\\", "oo")
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")
FORMATS = ("png", "pdf", "svg")
COLUMN = 3.4
PAGE = 7.0
DPI = 300

STYLE = {
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 7,
    "figure.titlesize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "pdf.fonttype": 42,  # TrueType: text stays text in the PDF
    "svg.fonttype": "none",
    "svg.hashsalt": "posdebias",  # stable element ids: reproducible SVG bytes
    "hatch.linewidth": 0.6,
}
#: No version or date stamps: identical figures give identical bytes.
METADATA = {
    "png": {"Software": None},
    "pdf": {"Creator": None, "Producer": None, "CreationDate": None},
    "svg": {"Creator": None, "Date": None},
}


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend with the print style applied."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update(STYLE)
    return plt


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def hatch(index: int) -> str:
    """No hatch for the first ten rows; then one per further lap of the palette."""
    return HATCHES[(index // len(PALETTE)) % len(HATCHES)]


def line_style(index: int) -> dict[str, Any]:
    """Colour, line style and marker of the ``index``-th line: distinct for 60 lines."""
    lap = index // len(PALETTE)
    return {
        "color": colour(index),
        "linestyle": LINESTYLES[lap % len(LINESTYLES)],
        "marker": MARKERS[(index + lap) % len(MARKERS)],
    }


def bar_style(index: int) -> dict[str, Any]:
    """Colour, hatch and edge of the ``index``-th series of bars (hatched past ten rows)."""
    edge = "black" if hatch(index) else colour(index)
    return {"color": colour(index), "hatch": hatch(index), "edgecolor": edge, "linewidth": 0.3}


def render(figure: Any) -> dict[str, bytes]:
    """The figure in every format (``{"png": ..., "pdf": ..., "svg": ...}``); closes it."""
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    for artist in figure.findobj(Text):  # titles, labels, legends, cells: no ESC in a file
        artist.set_text(file_text(artist.get_text()))
    out = {}
    for fmt in FORMATS:
        buffer = io.BytesIO()
        figure.savefig(buffer, format=fmt, dpi=DPI, bbox_inches="tight", metadata=METADATA[fmt])
        out[fmt] = buffer.getvalue()
    plt.close(figure)
    return out


def plain(text: str) -> str:
    """``text`` shown as written by matplotlib: ``$`` would start math mode (and a bad formula
    fails the whole figure), a leading ``_`` would hide a legend entry."""
    text = file_text(text).replace("$", r"\$")
    return "\u200b" + text if text.startswith("_") else text


def legend_below(figure: Any, axis: Any, entries: int) -> Any:
    """A legend under the axes (it cannot cover data there), as many columns as fit."""
    columns = max(1, min(entries, 3 if figure.get_figwidth() <= COLUMN + 0.5 else 4))
    return axis.legend(
        loc="upper center",
        bbox_to_anchor=(0.5, -0.22),
        ncols=columns,
        frameon=False,
        borderaxespad=0.0,
    )


#: Most tick labels an axis of a page-wide figure shows (more overlap at 7 pt).
MAX_TICKS = 16


def tick_positions(count: int, most: int = MAX_TICKS) -> list[int]:
    """Indices of at most ``most`` evenly spaced ticks of ``count`` categories, always the
    first and last (every one when they fit)."""
    if count <= most:
        return list(range(count))
    step = -(-(count - 1) // (most - 1))
    shown = list(range(0, count, step))
    if shown[-1] != count - 1:
        shown[-1] = count - 1  # the last category is labelled; its neighbour gives way
    return shown


def panel_title(label: str, detail: str, width: int = 24) -> str:
    """A heat-map panel's title that fits its panel: the label cut to ``width`` characters
    (an ellipsis marks the cut), the detail on its own line."""
    text = plain(label)
    if len(text) > width:
        text = text[: width - 1] + "\u2026"
    return f"{text}\n{detail}"


def _errors(intervals: Sequence[Interval | None], values: Sequence[float]) -> np.ndarray:
    """[2, K] error-bar lengths below and above each value (0 where no interval)."""
    pairs = list(zip(values, intervals, strict=True))
    low = [0.0 if ci is None else max(v - ci.low, 0.0) for v, ci in pairs]
    high = [0.0 if ci is None else max(ci.high - v, 0.0) for v, ci in pairs]
    return np.array([low, high])


def grouped_bars(
    labels: list[str],
    values: list[list[float | None]],
    intervals: list[list[Interval | None]] | None,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    ylim: tuple[float, float] | None = None,
    reference: tuple[float, str] | None = None,
) -> Any:
    """Bars per position (x) and row (colour), with 95% intervals as error bars when given."""
    plt = pyplot()
    n = len(values[0]) if values else 0
    width_in = min(PAGE, max(COLUMN, 0.35 * n * max(len(labels), 1) / 1.6 + 1.2))
    figure, axis = plt.subplots(figsize=(width_in, 2.6))
    width = 0.8 / max(len(labels), 1)
    for index, label in enumerate(labels):
        heights = [np.nan if v is None else v for v in values[index]]
        position = np.arange(n) + index * width - 0.4 + width / 2
        errors = None
        if intervals is not None:
            errors = _errors(intervals[index], [0.0 if v is None else v for v in values[index]])
        axis.bar(
            position,
            np.nan_to_num(heights),
            width,
            label=plain(label),
            **bar_style(index),
            yerr=errors,
            error_kw={"elinewidth": 0.7, "capsize": 1.5, "ecolor": "black"},
        )
    if reference is not None:
        axis.axhline(reference[0], color="black", linestyle=":", linewidth=0.8, label=reference[1])
    axis.set_xticks(range(n), [str(i + 1) for i in range(n)])
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    if ylim is not None:
        axis.set_ylim(*ylim)
    legend_below(figure, axis, len(labels) + (reference is not None))
    return figure


def heat_maps(
    panels: list[tuple[str, np.ndarray]],
    *,
    scale: float,
    xlabel: str,
    ylabel: str,
    colourbar: str,
    title: str | None = None,
    columns: int = 3,
) -> Any:
    """Heat maps in a grid of ``columns`` with one shared colour bar; cell values are written
    for N up to 12 (beyond that they would be unreadable)."""
    plt = pyplot()
    count = len(panels)
    columns = max(1, min(columns, count))
    rows = -(-count // columns)
    figure, axes = plt.subplots(
        rows,
        columns,
        figsize=(min(PAGE, 2.3 * columns + 0.6), 2.25 * rows + 0.3),
        squeeze=False,
        layout="constrained",
    )
    image = None
    for axis, (name, matrix) in zip(axes.flat, panels, strict=False):
        n = matrix.shape[0]
        image = axis.imshow(matrix, cmap="viridis", vmin=0, vmax=scale)
        axis.set_title(name, fontsize=8)
        ticks = tick_positions(n, 12)
        axis.set_xticks(ticks, [str(i + 1) for i in ticks])
        axis.set_yticks(ticks, [str(i + 1) for i in ticks])
        axis.tick_params(labelsize=7 if n <= 9 else 5.5, length=2)  # "10 11 12" stay apart
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
        axis.spines[:].set_visible(False)
        if n <= 12:
            size = 8 if n <= 5 else 6 if n <= 8 else 5 if n <= 10 else 4.5
            for i in range(n):
                for j in range(n):
                    value = matrix[i, j]
                    if np.isnan(value):
                        continue
                    text = f"{value:.0f}" if scale > 1 else f"{value:.2f}"
                    if scale <= 1 and n > 6:  # three characters fit a cell of N = 12
                        text = text[1:] if text.startswith("0") else f"{value:.1f}"
                    ink = "black" if value > 0.55 * scale else "white"  # viridis: light top
                    axis.text(j, i, text, ha="center", va="center", fontsize=size, color=ink)
    for axis in list(axes.flat)[count:]:
        axis.set_visible(False)
    if image is not None:
        bar = figure.colorbar(image, ax=axes, shrink=0.8, pad=0.02)
        bar.set_label(colourbar)
    if title:
        figure.suptitle(title)
    return figure


def confusion_figure(results: EvaluationResults) -> Any:
    """Truth position x chosen position (% of the truth's decisions), one panel per row."""
    panels = []
    for label, result in results.calibrators.items():
        metrics = result.metrics
        matrix = np.array([[np.nan if v is None else v for v in row] for row in metrics.confusion])
        panels.append((panel_title(label, f"Acc {metrics.accuracy_mean:.1f}%"), matrix))
    return heat_maps(
        panels,
        scale=100.0,
        xlabel="chosen position",
        ylabel="truth position",
        colourbar="decisions with that truth (%)",
        title="Confusion: truth position x chosen position",
    )


def _position_bars(
    results: EvaluationResults, metric: str, field: str, title: str, **bars: Any
) -> Any:
    """Each row's ``metric`` per position as :func:`grouped_bars`, with the intervals of its
    statistics' ``field`` where the run has them (95% CI)."""
    labels = list(results.calibrators)
    values = [list(getattr(results.calibrators[k].metrics, metric)) for k in labels]
    stats = results.statistics
    intervals = None if stats is None else [list(getattr(stats.rows[k], field)) for k in labels]
    title += " (95% CI)" if stats else ""
    return grouped_bars(labels, values, intervals, title=title, **bars)


def position_accuracy_figure(results: EvaluationResults) -> Any:
    """Accuracy (recall) per truth position with 95% bootstrap intervals."""
    return _position_bars(
        results,
        "recall_per_position",
        "accuracy_by_position",
        title="Accuracy by truth position",
        xlabel="truth position",
        ylabel="accuracy (%)",
        ylim=(0, 105),
    )


def choice_figure(results: EvaluationResults) -> Any:
    """Where the rows choose whatever the truth (the model's preference) against the uniform
    share 100/N of an unbiased chooser."""
    rates = [v for result in results.calibrators.values() for v in result.metrics.selection_rate]
    return _position_bars(
        results,
        "selection_rate",
        "choice_by_position",
        title="Choice distribution by position",
        xlabel="chosen position",
        ylabel="decisions (%)",
        ylim=(0, min(105.0, max(rates, default=100.0) * 1.15 + 5)),
        reference=(100.0 / results.n, f"uniform (100/N = {100.0 / results.n:.0f}%)"),
    )


def comparison_figure(results: EvaluationResults) -> Any:
    """Each row's accuracy difference from a baseline with its paired 95% interval."""
    stats = results.statistics
    if stats is None or not stats.comparisons:
        return None
    plt = pyplot()
    comparisons = stats.comparisons
    figure, axis = plt.subplots(figsize=(COLUMN + 1.2, 0.32 * len(comparisons) + 1.1))
    names = [f"{plain(c.row)} - {plain(c.baseline)}" for c in comparisons]
    ys = np.arange(len(comparisons))[::-1]
    for y, c in zip(ys, comparisons, strict=True):
        index = list(results.calibrators).index(c.row)
        d = c.difference
        axis.errorbar(
            d.value,
            y,
            xerr=[[d.value - d.low], [d.high - d.value]],
            fmt="o",
            color=colour(index),
            ecolor="black",
            elinewidth=0.8,
            capsize=2,
            markersize=4,
        )
    axis.axvline(0.0, color="black", linewidth=0.6, linestyle=":")
    axis.set_yticks(ys, names)
    axis.set_xlabel("accuracy difference (percentage points)")
    axis.set_title("Paired accuracy difference (95% CI)")
    return figure


def divergence_figure(results: EvaluationResults) -> Any:
    """Where label probabilities, raw attention and purified attention point, per truth
    position: the logit-attention divergence picture."""
    profile = results.divergence
    if profile is None:
        return None
    panels = [
        ("label probabilities", np.asarray(profile.label_probabilities)),
        ("raw attention", np.asarray(profile.raw_attention)),
    ]
    if profile.purified_attention is not None:
        panels.append(("purified attention", np.asarray(profile.purified_attention)))
    return heat_maps(
        panels,
        scale=1.0,
        xlabel="candidate position",
        ylabel="truth position",
        colourbar="mean share (0 to 1)",
        title=f"Logit-attention divergence ({plain(profile.calibrator)} layers)",
    )


def layers_figure(results: EvaluationResults) -> Any:
    """Per attention layer, the share of its attention on the right candidate and on the
    position its static prior favours (when the right one is elsewhere), raw and purified: where the
    evidence is, and what dividing by the prior removes."""
    profile = results.divergence
    if profile is None or not profile.layers:
        return None
    layers = profile.layers
    panels = [("raw attention", "raw_truth", "raw_positional")]
    if layers[0].purified_truth is not None:
        panels.append(("purified (divided by the prior)", "purified_truth", "purified_positional"))
    plt = pyplot()
    figure, axes = plt.subplots(
        1,
        len(panels),
        figsize=(PAGE if len(panels) > 1 else COLUMN, 3.0),
        sharey=True,
        layout="constrained",
    )
    axes = np.atleast_1d(axes)
    xs = np.arange(len(layers))
    shown = tick_positions(len(layers), MAX_TICKS if len(panels) > 1 else MAX_TICKS - 2)
    series = ("right candidate", "prior's favourite position (right candidate elsewhere)")
    selected = [100.0 * entry.selected for entry in layers]
    twins = []
    for axis, (title, truth, positional) in zip(axes, panels, strict=True):
        for index, field in enumerate((truth, positional)):
            heights = [getattr(entry, field) for entry in layers]
            axis.bar(
                xs + (index - 0.5) * 0.38,
                [np.nan if h is None else h for h in heights],
                0.38,
                label=series[index],
                **bar_style(index),
            )
        axis.axhline(1 / results.n, color="black", linestyle=":", linewidth=0.8, label="chance")
        axis.set_xticks(shown, [str(layers[k].layer) for k in shown])
        axis.set_xlim(-0.7, len(layers) - 0.3)
        axis.set_xlabel("layer")
        axis.set_title(title)
        axis.set_ylim(0, 1)
        twin = axis.twinx()  # how often the layer is selected: a line, not a crowded label
        twin.plot(xs, selected, color="black", linewidth=0.8, marker=".", markersize=2.5,
                  label="layer selected (% of observations, right axis)")  # fmt: skip
        twin.set_ylim(0, 100)
        twin.spines["right"].set_visible(True)
        twins.append(twin)
    for twin in twins[:-1]:  # one right axis, on the last panel
        twin.tick_params(right=False, labelright=False)
        twin.spines["right"].set_visible(False)
    twins[-1].set_ylabel("selected (%)")
    axes[0].set_ylabel("mean share of the attention on the candidates")
    handles, labels = axes[0].get_legend_handles_labels()
    more_handles, more_labels = twins[0].get_legend_handles_labels()
    handles, labels = handles + more_handles, labels + more_labels
    figure.legend(handles, labels, loc="outside lower center", ncols=2, frameon=False)
    figure.suptitle(f"Attention per layer ({plain(profile.calibrator)} prior)")
    return figure


#: (name, title in report.md, builder); a builder returning None has nothing to draw.
REPORT_FIGURES = (
    ("confusion", "Confusion matrices (truth x chosen position, %)", confusion_figure),
    ("recall", "Accuracy by truth position", position_accuracy_figure),
    ("choice", "Choice distribution by position", choice_figure),
    ("comparison", "Paired accuracy differences", comparison_figure),
    ("divergence", "Logit-attention divergence", divergence_figure),
    ("layers", "Attention per layer: right candidate vs positional component", layers_figure),
)


#: The three panels of a sweep figure: (column, title, y label).
SWEEP_PANELS = (
    ("accuracy", "Acc", "accuracy (%)"),
    ("rstd", "RStd", "RStd (percentage points)"),
    ("consistency", "Cons.", "consistent instances (%)"),
)


def row_interval(row: dict[str, Any], metric: str) -> Interval | None:
    """A study row's ``metric`` with its 95% interval, or None (rows of an older study have
    none)."""
    low, high = row.get(f"{metric}_low"), row.get(f"{metric}_high")
    if low in (None, "") or high in (None, ""):
        return None
    return Interval(value=float(row[metric]), low=float(low), high=float(high))


def sweep_figure(study: str, rows: list[dict[str, Any]], xlabel: str) -> Any:
    """Acc, RStd and Cons. against the study's value (lines with 95% bands), or per benchmark
    pair (bars with 95% error bars) for the transfer study; one legend below all panels."""
    plt = pyplot()
    labels = list(dict.fromkeys(row["calibrator"] for row in rows))
    figure, axes = plt.subplots(1, 3, figsize=(PAGE, 2.5), layout="constrained")
    transfer = study == "transfer"
    points = list(dict.fromkeys(row["point"] for row in rows))
    width = 0.8 / max(len(labels), 1)
    for axis, (metric, title, ylabel) in zip(axes, SWEEP_PANELS, strict=True):
        for k, label in enumerate(labels):
            mine = (
                [
                    next(r for r in rows if r["point"] == p and r["calibrator"] == label)
                    for p in points
                ]
                if transfer
                else [row for row in rows if row["calibrator"] == label]
            )
            if any(r[metric] in (None, "") for r in mine):
                continue  # an order-independent row (cloze) has no RStd or Cons.
            values = [float(r[metric]) for r in mine]
            spans = [row_interval(r, metric) for r in mine]
            if transfer:
                axis.bar(
                    [i + k * width for i in range(len(points))],
                    values,
                    width,
                    label=plain(label),
                    **bar_style(k),
                    yerr=_errors(spans, values),
                    error_kw={"elinewidth": 0.6, "capsize": 1.2, "ecolor": "black"},
                )
                continue
            xs = [float(r["value"]) for r in mine]
            style = line_style(k)
            axis.plot(xs, values, markersize=3, linewidth=1.0, label=plain(label), **style)
            if all(span is not None for span in spans):
                axis.fill_between(
                    xs,
                    [span.low for span in spans if span is not None],
                    [span.high for span in spans if span is not None],
                    color=style["color"],
                    alpha=0.2,
                    linewidth=0,
                )
        if transfer:
            axis.set_xticks([i + 0.4 - width / 2 for i in range(len(points))])
            axis.set_xticklabels([plain(p) for p in points], rotation=30, ha="right")
        axis.set_xlabel("calibration -> test benchmark" if transfer else xlabel)
        axis.set_ylabel(ylabel)
        axis.set_title(title)
        if study == "tau":
            axis.set_xscale("log")
    if study == "n":
        ns = sorted({float(row["value"]) for row in rows})
        axes[0].plot(ns, [100 / n for n in ns], "k:", linewidth=1, label="chance (100/N)")
    handles, names = axes[0].get_legend_handles_labels()
    figure.legend(
        handles,
        names,
        loc="outside lower center",
        ncols=min(len(names), 4),
        frameon=False,
    )
    figure.suptitle(f"Study {plain(study)} (shaded / bars: 95% bootstrap interval)")
    return figure
