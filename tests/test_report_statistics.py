"""The default run's report carries intervals and paired tests; figures fit for print; old
results files still report (tests/test_run_comparisons.py: the statistics that read no
figure)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib
import pytest
from matplotlib.container import BarContainer

from posdebias.cli import main
from posdebias.evaluation.figures import (
    FORMATS,
    REPORT_FIGURES,
    choice_figure,
    position_accuracy_figure,
    sweep_figure,
)
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.table import interval_text

matplotlib.use("Agg", force=True)

# every test here reads the figures of a report; one worker makes the shared default run once
pytestmark = [pytest.mark.figures, pytest.mark.xdist_group("report_statistics")]

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF", "svg": b"<?xml"}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    """The bundled default run (organism, its benchmark and seed) on 60 instances x 2 orders,
    as the golden files pin it."""
    root = tmp_path_factory.mktemp("default")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("POSDEBIAS_CACHE_DIR", str(root / "cache"))
        patch.setenv("HF_HUB_OFFLINE", "1")
        assert main(["evaluate", "--count", "60", "--orders", "2", "--out", str(root / "run")]) == 0
    return root / "run"


def test_default_run_report_shows_intervals_and_paired_tests(default_run):
    results = EvaluationResults.load(default_run / "results.json")
    stats = results.statistics
    assert stats is not None and stats.bootstrap.resamples == 1000
    report = (default_run / "report.md").read_text()
    assert "| calibrator | Acc [95% CI] | RStd [95% CI] | Cons. [95% CI] |" in report
    for label, row in stats.rows.items():
        metrics = results.calibrators[label].metrics
        assert row.accuracy.value == pytest.approx(metrics.accuracy_mean)
        assert (
            f"| {label} | {metrics.accuracy_mean:.2f} ± {metrics.accuracy_std:.2f} "
            f"{interval_text(row.accuracy)} | {metrics.rstd:.2f} {interval_text(row.rstd)} "
            f"| {metrics.consistency:.2f} {interval_text(row.consistency)} |"
        ) in report
        assert row.flip_rate is not None and f"| {label} | {row.flip_rate.value:.2f}" in report
        assert row.circular is None  # random orders, not the N rotations
    assert "CircularEval is absent" in report
    assert "## Paired comparisons" in report and "McNemar" in report
    rows = [c.row for c in stats.comparisons]
    assert rows == [label for label in results.calibrators if label != "vanilla"]
    guided = next(c for c in stats.comparisons if c.row == "attention_guided")
    assert guided.difference.low > 0 and guided.p_value < 1e-5  # the organism is biased
    # McNemar's exact test: two-sided binomial tail of the discordant decisions at one half
    discordant = guided.row_only + guided.baseline_only
    tail = sum(
        math.comb(discordant, k) for k in range(min(guided.row_only, guided.baseline_only) + 1)
    )
    assert guided.p_value == pytest.approx(min(1.0, 2 * tail / 2**discordant), rel=1e-9)
    assert guided.decisions == 120 and guided.instances == 60
    for name, _title, _draw in REPORT_FIGURES:
        for fmt in FORMATS:
            data = (default_run / "figures" / f"{name}.{fmt}").read_bytes()
            assert data.startswith(MAGIC[fmt]), (name, fmt)
            assert f"figures/{name}.{fmt}" in report


def test_report_rerenders_the_same_bytes(default_run, capsys):
    figures = default_run / "figures"
    before = {p.name: p.read_bytes() for p in figures.iterdir()}
    report = (default_run / "report.md").read_bytes()
    for path in figures.iterdir():
        path.unlink()
    assert main(["report", str(default_run), "--ci"]) == 0
    assert {p.name: p.read_bytes() for p in figures.iterdir()} == before  # PDF and SVG too
    assert (default_run / "report.md").read_bytes() == report
    assert "95% bootstrap interval" in capsys.readouterr().out


def _patches_overlap_legend(figure) -> list[str]:
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    hits = []
    for axis in figure.axes:
        legends = [legend for legend in (axis.get_legend(), *figure.legends) if legend]
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for patch in axis.patches:
                bar = patch.get_window_extent(renderer)
                if bar.width > 0 and bar.height > 0 and box.overlaps(bar):
                    hits.append(str(patch.get_label() or patch))
    return hits


def _many_rows(results: EvaluationResults, count: int) -> EvaluationResults:
    """The run with ``count`` rows (copies of its rows under new labels)."""
    stats = results.statistics
    assert stats is not None
    labels = list(results.calibrators)
    source = [labels[k % len(labels)] for k in range(count)]
    return results.model_copy(
        update={
            "calibrators": {f"row{k}": results.calibrators[s] for k, s in enumerate(source)},
            "statistics": stats.model_copy(
                update={"rows": {f"row{k}": stats.rows[s] for k, s in enumerate(source)}}
            ),
        }
    )


@pytest.mark.parametrize("rows", [6, 12])
def test_legends_hide_no_bar_and_no_style_repeats(default_run, rows):
    import matplotlib.pyplot as plt

    results = _many_rows(EvaluationResults.load(default_run / "results.json"), rows)
    for draw in (position_accuracy_figure, choice_figure):
        figure = draw(results)
        assert _patches_overlap_legend(figure) == []
        axis = figure.axes[0]
        assert axis.get_title() and axis.get_xlabel() and "(%)" in axis.get_ylabel()
        bars = [c for c in axis.containers if isinstance(c, BarContainer)]
        styles = {(tuple(c.patches[0].get_facecolor()), c.patches[0].get_hatch()) for c in bars}
        assert len(bars) == len(styles) == rows  # every row its own colour (hatch past ten)
        assert len(axis.get_legend().legend_handles) >= rows  # every row in the legend
        plt.close(figure)
    figure = position_accuracy_figure(results)
    figure.axes[0].legend(loc="center")  # over the bars, as the old figure had it
    assert _patches_overlap_legend(figure) != []  # the check sees an overlap when there is one
    plt.close(figure)


def test_heat_maps_have_a_colour_bar_and_panels_in_a_grid(default_run):
    import matplotlib.pyplot as plt

    results = _many_rows(EvaluationResults.load(default_run / "results.json"), 7)
    draw = dict((name, d) for name, _t, d in REPORT_FIGURES)["confusion"]
    figure = draw(results)
    panels = [a for a in figure.axes if a.get_visible() and a.images]
    bars = [a for a in figure.axes if a.get_ylabel() == "decisions with that truth (%)"]
    assert len(panels) == 7 and len(bars) == 1
    columns = {round(a.get_position().x0, 3) for a in panels}
    assert len(columns) == 3  # 3 columns x 3 rows, not 7 side by side
    width = figure.get_size_inches()[0]
    assert width <= 7.01  # fits a two-column page at print size
    texts = [t for a in panels for t in a.texts]
    assert texts and min(t.get_fontsize() for t in texts) >= 7
    plt.close(figure)


def test_sweep_figures_have_bands_and_a_legend_over_no_bar():
    import matplotlib.pyplot as plt

    rows = []
    for p, point in enumerate(["a->b", "b->a"]):
        for k, label in enumerate(["vanilla", "attention_guided"]):
            value = 50.0 + 20 * k + p
            rows.append({"point": point, "value": point, "calibrator": label, "accuracy": value,
                         "accuracy_low": value - 5, "accuracy_high": value + 5, "rstd": 10.0,
                         "rstd_low": 8.0, "rstd_high": 12.0, "consistency": 90.0,
                         "consistency_low": "", "consistency_high": ""})  # fmt: skip
    figure = sweep_figure("transfer", rows, "")
    assert _patches_overlap_legend(figure) == []
    assert any(line.get_xydata().shape[0] for line in figure.axes[0].lines)  # error bars
    plt.close(figure)
    lines = [{**r, "value": float(i)} for i, r in enumerate(rows)]
    figure = sweep_figure("tau", lines, "tau")
    assert len(figure.axes[0].collections) == 2  # one 95% band per row
    assert len(figure.axes[2].collections) == 0  # no interval in the file: no band drawn
    plt.close(figure)


def _as_version_1(run: Path) -> None:
    payload = json.loads((run / "results.json").read_text())
    payload["schema_version"] = 1
    for section in ("statistics", "ranking", "groups"):  # none existed in version 1
        payload.pop(section, None)
    for key in ("resamples", "baseline"):
        payload["settings"].pop(key)
    (run / "results.json").write_text(json.dumps(payload))


@pytest.mark.figures("png")  # no figure is read: only that the missing statistics draw none
def test_version_1_results_still_report(default_run, tmp_path, capsys):
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_bytes((default_run / "results.json").read_bytes())
    _as_version_1(old)
    assert main(["report", str(old), "--ci"]) == 0
    report = (old / "report.md").read_text()
    assert "schema version 1" in report and "[95% CI]" not in report
    assert not (old / "figures" / "comparison.png").exists()  # nothing to draw, none drawn
    payload = json.loads((old / "results.json").read_text())
    payload["schema_version"] = 3
    (old / "results.json").write_text(json.dumps(payload))
    capsys.readouterr()
    assert main(["report", str(old)]) == 2
    assert "schema version 3" in capsys.readouterr().err


def test_statistics_of_other_rows_are_refused(default_run, tmp_path, capsys):
    """A results file whose statistics describe other rows (a row renamed in one place only)
    cannot be drawn: refused before any file is written."""
    edited = tmp_path / "edited"
    edited.mkdir()
    payload = json.loads((default_run / "results.json").read_text())
    payload["calibrators"]["renamed"] = payload["calibrators"].pop("pride")
    (edited / "results.json").write_text(json.dumps(payload))
    capsys.readouterr()
    assert main(["report", str(edited)]) == 2
    assert "are not the rows of calibrators" in capsys.readouterr().err
    assert sorted(p.name for p in edited.iterdir()) == ["results.json"]
