"""Studies of the paper's experiments, one command each (``posdebias sweep STUDY``).

A study is a list of *points* (one evaluation setting each) run on one model with one
observation cache, so a point never repeats a forward pass an earlier point made:

* ``n``: N candidates per instance (the paper's Figure 5); T is capped at N! per point;
* ``calibration_size``: |Dcal| = M calibration instances (Figure 6a): nested calibration sets
  held out by seed, the same test instances (and test observations) at every point;
* ``top_k`` / ``tau``: an option of the layer-selecting calibrators (Table 4 / Figure 6b): the
  same observations at every point, so only the first point runs the model;
* ``transfer``: calibrate on benchmark A, evaluate on B, for every ordered pair of the given
  benchmarks (Table 3); the test instances of B are the same whichever benchmark calibrated.

The run directory::

    sweep.json          what defines the study (checked by --resume; benchmarks by content hash)
    observations.jsonl  the shared observation cache (append-only, crash-safe)
    points/NNN.json     one finished point: its rows and the observations it used
    results.csv         the tidy table: one row per point x calibrator
    figure.png          the paper-style figure (also figure.pdf, figure.svg)
    report.md           the table per metric, the cost of each point, the settings
    timing.json         seconds per point (the only file that differs between reruns)

A killed study resumes with ``--resume``: finished points are read back, observations made
before the kill are not made again, and the final files are byte-identical to those of an
uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posdebias._inputs import excerpt
from posdebias._io import open_log
from posdebias.benchmarks.files import load_benchmark
from posdebias.errors import ConfigError, ResumeError
from posdebias.evaluation.config import EvaluateConfig, checked_config
from posdebias.evaluation.decoding import DecisionCache
from posdebias.evaluation.job import Prepared, adapter_identity, build_adapter, identity_reader
from posdebias.evaluation.preset import resolve_preset
from posdebias.evaluation.runner import ObservationCache
from posdebias.evaluation.sweep.outputs import (
    COLUMNS,
    figure_files,
    sweep_report_text,
    table_text,
    with_costs,
)
from posdebias.evaluation.sweep.plan import (
    DEFAULT_VALUES,
    STUDIES,
    Point,
    SweepSpec,
    plan_points,
)
from posdebias.evaluation.sweep.point import prepare_point, run_point
from posdebias.evaluation.sweep.store import (
    GENERATIONS_FILE,
    OBSERVATIONS_FILE,
    SweepDirectory,
)

__all__ = [
    "COLUMNS",
    "DEFAULT_VALUES",
    "STUDIES",
    "Point",
    "SweepResult",
    "SweepSpec",
    "plan_points",
    "prepare_point",
    "run_point",
    "run_sweep",
    "sweep_identity",
    "table_text",
]


@dataclass
class SweepResult:
    """What a finished study wrote."""

    out: Path
    rows: list[dict[str, Any]]
    figure: Path | None  # None where no figure was drawn
    report: Path
    seconds: float


def sweep_identity(
    study: str, points: list[Point], adapter: Any, task: str | None = None, *, images: bool = True
) -> dict[str, Any]:
    """What defines a study: the model's description (with ``task``'s prompt; without
    ``images``, no image option), every point's settings, and the content hash of every
    benchmark a point reads (a benchmark swapped under the same path refuses ``--resume``
    instead of mixing old points with new ones)."""
    paths = {
        str(path)
        for point in points
        for path in (point.config.benchmark, point.config.calibration_benchmark)
        if path is not None
    }
    return {
        "study": study,
        "adapter": adapter_identity(adapter, None, task, images, "device", "labels"),
        "benchmarks_sha256": {
            path: load_benchmark(Path(path)).fingerprint for path in sorted(paths)
        },
        "points": [
            {
                "label": point.label,
                "config": point.config.model_dump(
                    mode="json", exclude={"out", "batch_size", "adapter"}
                ),
            }
            for point in points
        ],
    }


def run_sweep(
    study: str,
    config: EvaluateConfig,
    spec: SweepSpec,
    out: Path,
    *,
    resume: bool = False,
    adapter: Any = None,
    on_point: Callable[[Point, dict[str, Any]], None] | None = None,
) -> SweepResult:
    """Run (or resume) a study into ``out``; returns the rows and the files written."""
    config = checked_config(config)
    if config.calibration is not None:  # its points would all read one state, silently
        raise ConfigError(
            "a sweep fits its own calibrators at every point (the calibration_size study "
            "varies them), so it takes no saved calibration: drop 'calibration' "
            f"({config.calibration}) from the configuration, or run `posdebias evaluate` with it"
        )
    points = plan_points(study, config, spec)
    started = time.perf_counter()
    resolved = resolve_preset(config)
    with resolved.threads():
        if adapter is None:
            adapter = build_adapter(resolved.config)
        prepared = []
        for point in points:
            point.config = resolve_preset(point.config).config
            # every check of `posdebias evaluate`, for every point, before the directory
            prepared.append(prepare_point(point, study, adapter))
        task = prepared[0].source.test[0].task if prepared[0].source.test else None
        images = any(point.source.shows_images for point in prepared)
        identity = sweep_identity(study, points, adapter, task, images=images)
        directory = SweepDirectory(out)
        directory.prepare(
            identity, resume=resume, read_saved=identity_reader(adapter, None, identity)
        )
        try:
            done, timing = _run_points(study, points, prepared, directory, config, on_point)
            rows = with_costs(done)
            drawn = figure_files(study, rows, task)
            report_text = sweep_report_text(study, rows, points, adapter, figure=bool(drawn))
            files = {
                "results.csv": table_text(rows).encode("utf-8"),
                **drawn,
                "report.md": report_text.encode("utf-8"),
            }
            directory.folder.write_files(files)
            figure = directory.out / "figure.png" if drawn else None
            report = directory.out / "report.md"
            seconds = time.perf_counter() - started
            timing["total_seconds_last_invocation"] = round(seconds, 3)
            directory.write_timing(timing)
        finally:
            directory.folder.unlock()
    return SweepResult(out, rows, figure, report, seconds)


def _check_saved_point(
    directory: SweepDirectory, point: Point, saved: dict[str, Any], rows: list[dict[str, Any]]
) -> None:
    """Refuse a finished point's file whose rows are not what its observations and the
    benchmark's truth give: a study's figures come from the benchmark, never from an edited
    copy of its results."""
    fresh = json.loads(json.dumps(rows))
    if saved["rows"] == fresh:
        return
    differences = [
        f"{row.get('calibrator')} {key} {excerpt(row.get(key), 20)} there, "
        f"{excerpt(new[key], 20)} now"
        for row, new in zip(saved["rows"], fresh, strict=False)
        for key in new
        if row.get(key) != new[key]
    ] or ["other rows"]
    raise ResumeError(
        f"{directory.point_path(point.index)} disagrees with what its observations and the "
        f"benchmark give ({'; '.join(differences[:3])}): the file was edited. Delete it and "
        "--resume computes the point again"
    )


def _run_points(
    study: str,
    points: list[Point],
    prepared: list[Prepared],
    directory: SweepDirectory,
    config: EvaluateConfig,
    on_point: Callable[[Point, dict[str, Any]], None] | None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every point not finished before (its file read back), with the shared logs open."""
    with contextlib.ExitStack() as logs:
        log = logs.enter_context(open_log(directory.folder.path(OBSERVATIONS_FILE)))
        cache = ObservationCache(log).load([log.path])  # not made again after a kill
        decisions = DecisionCache()
        if config.decoders:
            generation_log = logs.enter_context(open_log(directory.folder.path(GENERATIONS_FILE)))
            # nor its generated answers
            decisions = DecisionCache(generation_log).load([generation_log.path])
        timing = directory.read_timing()
        done: list[dict[str, Any]] = []
        for point, ready in zip(points, prepared, strict=True):
            saved = directory.read_point(point.index, point.label)
            begun = time.perf_counter()
            rows, keys, made = run_point(point, study, ready, cache, decisions)
            if saved is not None:  # from the cached observations: no forward pass again
                _check_saved_point(directory, point, saved, rows)
                done.append(saved)
                continue
            payload = {"label": point.label, "rows": rows, "keys": keys}
            directory.write_point(point.index, payload)
            done.append(payload)
            timing["points"][point.label] = {
                "seconds": round(time.perf_counter() - begun, 3),
                "observations_made_in_this_process": made,
            }
            directory.write_timing(timing)
            if on_point is not None:
                on_point(point, payload)
        return done, timing
