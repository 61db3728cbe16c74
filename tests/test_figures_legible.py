"""Figures stay legible at 36 layers and N = 12: no two tick labels overlap, no panel title
is cut by the figure's edge or covered by the colour bar, and every format is written."""

from __future__ import annotations

import pytest

from posdebias.evaluation.config import load_config
from posdebias.evaluation.figures import (
    FORMATS,
    confusion_figure,
    divergence_figure,
    layers_figure,
    render,
    tick_positions,
)
from posdebias.evaluation.job import run_evaluation


@pytest.fixture(scope="module")
def wide_run():
    config = load_config(
        None,
        adapter={"name": "synthetic", "options": {"num_layers": 36}},
        n=12,
        count=24,
        orders=1,
        calibrators=[
            {"name": name}
            for name in (
                "vanilla",
                "pride",
                "purified_attention",
                "attention_guided",
                "permutation_self_consistency",
                "label_free",
            )
        ],
    )
    results = run_evaluation(config)
    assert results is not None and len(results.divergence.layers) == 36
    return results


def _boxes(figure, texts):
    renderer = figure.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in texts if t.get_visible() and t.get_text()]


def _overlapping(boxes):
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :] if a.overlaps(b)]


def _tick_labels_apart(figure):
    figure.canvas.draw()
    for axis in figure.axes:
        for labels in (axis.get_xticklabels(), axis.get_yticklabels()):
            assert not _overlapping(_boxes(figure, labels)), axis.get_title()


@pytest.mark.parametrize("draw", [layers_figure, confusion_figure, divergence_figure])
def test_tick_labels_never_overlap(wide_run, draw):
    _tick_labels_apart(draw(wide_run))


def test_titles_are_inside_the_figure_and_clear_of_the_colour_bar(wide_run):
    figure = confusion_figure(wide_run)
    figure.canvas.draw()
    whole = figure.bbox
    panels = [axis for axis in figure.axes if axis.get_label() != "<colorbar>"]
    (bar,) = [axis for axis in figure.axes if axis.get_label() == "<colorbar>"]
    bar_box = bar.get_tightbbox(figure.canvas.get_renderer())
    titles = _boxes(figure, [axis.title for axis in panels])
    assert len(titles) == 6
    for box in titles:
        assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and box.y1 <= whole.y1
        assert not box.overlaps(bar_box)
    assert not _overlapping(titles)
    assert "permutation_self_consis\u2026" in [axis.get_title().split("\n")[0] for axis in panels]


def test_every_figure_is_written_in_every_format(wide_run):
    assert set(render(layers_figure(wide_run))) == set(FORMATS)


@pytest.mark.parametrize(
    ("count", "most", "expected"),
    [(5, 16, [0, 1, 2, 3, 4]), (36, 16, [0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 35]),
     (13, 12, [0, 2, 4, 6, 8, 10, 12])],
)  # fmt: skip
def test_tick_positions_are_even_and_keep_both_ends(count, most, expected):
    assert tick_positions(count, most) == expected
