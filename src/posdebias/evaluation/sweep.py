"""Studies of the paper's experiments, one command each (``posdebias sweep STUDY``).

A study is a list of *points* (one evaluation setting each) run on one model with one
observation cache, so a point never repeats a forward pass an earlier point made:

* ``n``: N images per instance (the paper's Figure 5); T is capped at N! per point;
* ``calibration_size``: |Dcal| = M calibration instances (Figure 6a): nested calibration sets
  held out by seed, the same test instances (and test observations) at every point;
* ``top_k`` / ``tau``: an option of the layer-selecting calibrators (Table 4 / Figure 6b): the
  same observations at every point, so only the first point runs the model;
* ``transfer``: calibrate on benchmark A, evaluate on B, for every ordered pair of the given
  benchmarks (Table 3); the test instances of B are the same whichever benchmark calibrated.

The run directory::

    sweep.json          what defines the study (checked by --resume)
    observations.jsonl  the shared observation cache (append-only, crash-safe)
    points/NNN.json     one finished point: its rows and the observations it used
    results.csv         the tidy table: one row per point x calibrator
    figure.png          the paper-style figure
    report.md           the table per metric, the cost of each point, the settings
    timing.json         seconds per point (the only file that differs between reruns)

A killed study resumes with ``--resume``: finished points are read back, observations made
before the kill are not made again, and the final files are byte-identical to those of an
uninterrupted run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from posdebias._io import (
    JsonlAppender,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    truncate_torn_tail,
)
from posdebias.benchmarks.files import load_benchmark
from posdebias.core.instance import check_order_count
from posdebias.core.observation import Observation
from posdebias.errors import InputError, OutputError, ResumeError
from posdebias.evaluation.config import CalibratorSpec, EvaluateConfig
from posdebias.evaluation.decoding import DecisionCache, DecoderRows, decoder_costs
from posdebias.evaluation.job import (
    build_adapter,
    build_calibrators,
    build_decoders,
    load_instances,
    split_held_out,
)
from posdebias.evaluation.preset import resolve_preset
from posdebias.evaluation.protocol import apply_specs, get_protocol
from posdebias.evaluation.report import _pyplot
from posdebias.evaluation.runner import (
    Evaluator,
    ObservationCache,
    fit_calibrators,
    scored_views,
    summarize,
)
from posdebias.evaluation.store import PersistentObservationCache
from posdebias.registry import get_registry

STUDIES = ("n", "calibration_size", "top_k", "tau", "transfer")
#: The decoder rows' generated answers (one JSON line per decided view), shared by every point.
GENERATIONS_FILE = "generations.jsonl"

#: Values a study sweeps when the config gives none.
DEFAULT_VALUES: dict[str, list[float]] = {
    "n": [float(n) for n in range(2, 13)],
    "calibration_size": [float(m) for m in range(1, 21)],
    "top_k": [1.0, 2.0, 3.0, 4.0],
    "tau": [0.5, 1.0, 2.0, 5.0, 10.0, 20.0],
}

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


class SweepSpec(BaseModel):
    """The ``sweep`` section of a config file (everything else is an evaluation config)."""

    model_config = ConfigDict(extra="forbid")

    values: list[float] | None = Field(
        default=None, description="N, |Dcal|, K or tau values (default per study)"
    )
    benchmarks: list[Path] | None = Field(
        default=None, description="transfer: the benchmarks to pair (every ordered pair)"
    )


@dataclass
class Point:
    """One setting of a study: what it evaluates and how it is labelled."""

    index: int
    value: float | str
    label: str
    config: EvaluateConfig
    calibration_benchmark: str = ""
    benchmark: str = ""


class _KeyRecorder(ObservationCache):
    """The shared cache, recording which observation keys a point reads."""

    def __init__(self, inner: ObservationCache) -> None:
        super().__init__()
        self.inner = inner
        self.keys: set[str] = set()
        self.made = 0

    def get(self, key: str) -> Observation | None:
        self.keys.add(key)
        return self.inner.get(key)

    def put(self, key: str, observation: Observation) -> None:
        self.made += 1
        self.inner.put(key, observation)


def _digest(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


# -- points ----------------------------------------------------------------------------------


def _calibrators_with_option(specs: list[CalibratorSpec], option: str) -> list[CalibratorSpec]:

    registry = get_registry()
    chosen = [
        spec
        for spec in specs
        if option in getattr(registry.calibrator_class(spec.name).Options, "model_fields", {})
    ]
    if not chosen:
        names = ", ".join(spec.name for spec in specs)
        raise InputError(
            f"the {option} study needs a calibrator with the option {option!r} (e.g. "
            f"attention_guided); the config has: {names}"
        )
    return chosen


def plan_points(study: str, config: EvaluateConfig, spec: SweepSpec) -> list[Point]:
    """The points of a study, in the order they run (checked before any model is loaded)."""
    if study not in STUDIES:
        raise InputError(f"unknown study {study!r}; choose one of: {', '.join(STUDIES)}")
    if study == "transfer":
        return _transfer_points(config, spec)
    if spec.benchmarks is not None:
        raise InputError(f"'benchmarks' is for the transfer study, not {study!r}")
    values = spec.values if spec.values is not None else DEFAULT_VALUES[study]
    if not values:
        raise InputError(f"the {study} study needs at least one value")
    if len(set(values)) != len(values):
        raise InputError(f"the {study} study's values repeat: {values}")
    points = []
    for index, value in enumerate(values):
        if study in ("n", "calibration_size", "top_k") and (value != int(value) or value < 1):
            raise InputError(f"{study} values must be whole numbers >= 1, got {value}")
        update: dict[str, Any]
        if study == "n":
            n = int(value)
            if n < 2:
                raise InputError(f"n values must be at least 2, got {n}")
            update = {"n": n, "orders": min(config.orders, math.factorial(n))}
            if config.benchmark is not None:
                pattern = str(config.benchmark)
                if "{n}" not in pattern:
                    raise InputError(
                        "the n study needs one benchmark per N: give benchmark as a pattern "
                        "with {n}, e.g. runs/coco-random-n{n}"
                    )
                update["benchmark"] = Path(pattern.replace("{n}", str(n)))
        elif study == "calibration_size":
            # one held-out pool of the largest M: nested calibration sets, one test set
            update = {"calibration_count": int(max(values))}
        else:
            option = study
            chosen = {s.key for s in _calibrators_with_option(config.calibrators, option)}
            update = {
                "calibrators": [
                    s.model_copy(update={"options": {**s.options, option: _number(value)}})
                    if s.key in chosen
                    else s
                    for s in config.calibrators
                ]
            }
        label = f"{study}={_number(value)}"
        points.append(Point(index, _number(value), label, config.model_copy(update=update)))
    return points


def _transfer_points(config: EvaluateConfig, spec: SweepSpec) -> list[Point]:

    if spec.values is not None:
        raise InputError("the transfer study takes 'benchmarks', not 'values'")
    if not spec.benchmarks or len(spec.benchmarks) < 2:
        raise InputError(
            "the transfer study needs at least two benchmarks: --benchmarks A B (or "
            "sweep.benchmarks in the config)"
        )
    loaded = [load_benchmark(path) for path in spec.benchmarks]
    sizes = {
        str(path): {inst.n for inst in b.instances}
        for path, b in zip(spec.benchmarks, loaded, strict=True)
    }
    for path, found in sizes.items():
        if len(found) != 1:
            raise InputError(f"benchmark {path} mixes N = {sorted(found)}; use one N per benchmark")
    distinct = {next(iter(found)) for found in sizes.values()}
    if len(distinct) > 1:
        listed = ", ".join(f"{path} (N={next(iter(found))})" for path, found in sizes.items())
        raise InputError(
            "transfer needs benchmarks with the same number of images per instance: a "
            f"calibration fitted at one N does not apply at another. Got {listed}"
        )
    names = _short_names(spec.benchmarks)
    points: list[Point] = []
    for a, source in enumerate(spec.benchmarks):
        for b, target in enumerate(spec.benchmarks):
            update = {"benchmark": Path(target), "calibration_benchmark": Path(source)}
            points.append(
                Point(
                    len(points),
                    f"{names[a]}->{names[b]}",
                    f"{names[a]} -> {names[b]}",
                    config.model_copy(update=update),
                    calibration_benchmark=names[a],
                    benchmark=names[b],
                )
            )
    return points


def _short_names(paths: Sequence[Path]) -> list[str]:
    """The shortest trailing parts of the paths that tell them apart (``coco/random-n4``)."""
    parts = [Path(path).resolve().parts for path in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(path) for path in paths]


# -- running ---------------------------------------------------------------------------------


def _instances(point: Point, adapter: Any, study: str) -> tuple[list, list]:
    """(calibration, test) of a point. Transfer: calibration held out of A by seed, test = B
    minus its own held-out calibration, so every pair tests B on the same instances."""

    config = point.config
    if study != "transfer":
        source = load_instances(config, adapter, resolve_preset(config).benchmark_factory())
        calibration = source.calibration
        if study == "calibration_size":
            calibration = calibration[: int(point.value)]
        return calibration, source.test

    assert config.benchmark is not None and config.calibration_benchmark is not None
    a = load_benchmark(config.calibration_benchmark)
    b = load_benchmark(config.benchmark)
    calibration, _ = split_held_out(a.instances, config.calibration_count, config.seed)
    _, test = split_held_out(b.instances, config.calibration_count, config.seed)
    return calibration, test[: config.count]


def run_point(
    point: Point,
    study: str,
    adapter: Any,
    cache: ObservationCache,
    decisions: DecisionCache | None = None,
) -> tuple[list[dict[str, Any]], list[str], int]:
    """Evaluate one point: (rows, digests of the observation keys used, observations made).

    The config's decoders (generated answers, prompting baselines, SoFA) add one row each on
    the same T orders; their decisions are cached in ``decisions`` like the observations, so
    a point re-uses what an earlier point (or an interrupted run) generated.
    """

    config = point.config
    protocol = get_protocol(config.protocol)
    if config.protocol != "default":
        config = apply_specs(protocol, config, adapter.num_layers)
    calibrators = build_calibrators(config)
    calibration, test = _instances(point, adapter, study)
    if not test:
        raise InputError(f"point {point.label}: no test instances")
    n = test[0].n
    check_order_count(n, config.orders)
    recorder = _KeyRecorder(cache)
    states = fit_calibrators(
        adapter,
        calibrators,
        calibration,
        batch_size=config.batch_size,
        cache=recorder,
        test_views=scored_views(test, config.orders, config.seed, shared=protocol.shared_orders),
    )
    evaluator = Evaluator(
        adapter,
        calibrators,
        states,
        orders=config.orders,
        seed=config.seed,
        batch_size=config.batch_size,
        cache=recorder,
        shared_orders=protocol.shared_orders,
    )
    records = [evaluator.evaluate_instance(instance) for instance in test]
    passes: dict[str, float] = {
        label: config.orders * c.forward_passes(n) for label, c in calibrators.items()
    }
    decoders = build_decoders(config)
    if decoders:
        decisions = decisions if decisions is not None else DecisionCache()
        adder = DecoderRows(
            adapter, decoders, decisions, batch_size=config.batch_size, seed=config.seed
        )
        records = [adder.add(r, instance) for r, instance in zip(records, test, strict=True)]
        views = {
            instance.id: [instance.permuted(order) for order in record.orders]
            for record, instance in zip(records, test, strict=True)
        }
        for label, cost in decoder_costs(decoders, views, decisions).items():
            passes[label] = round(cost.forward_passes, 4)
    metrics = summarize(records, [*calibrators, *decoders], n)
    rows = []
    for label in [*calibrators, *decoders]:
        m = metrics[label]
        rows.append(
            {
                "study": study,
                "point": point.label,
                "value": point.value,
                "calibration_benchmark": point.calibration_benchmark,
                "benchmark": point.benchmark,
                "n": n,
                "orders": config.orders,
                "instances": len(test),
                "calibration_instances": len(calibration),
                "calibrator": label,
                "accuracy": round(m.accuracy_mean, 4),
                "accuracy_std": round(m.accuracy_std, 4),
                "rstd": round(m.rstd, 4),
                "consistency": round(m.consistency, 4),
                "forward_passes_per_instance": passes[label],
            }
        )
    return rows, sorted(_digest(key) for key in recorder.keys), recorder.made


@dataclass
class SweepResult:
    """What a finished study wrote."""

    out: Path
    rows: list[dict[str, Any]]
    figure: Path
    report: Path
    seconds: float


def sweep_identity(study: str, points: list[Point], adapter: Any) -> dict[str, Any]:
    described = {k: v for k, v in adapter.describe().items() if k not in ("device", "labels")}
    return {
        "study": study,
        "adapter": json.loads(json.dumps(described, sort_keys=True, default=str)),
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

    points = plan_points(study, config, spec)
    started = time.perf_counter()
    resolved = resolve_preset(config)
    with resolved.threads():
        if adapter is None:
            adapter = build_adapter(resolved.config)
        for point in points:
            point.config = resolve_preset(point.config).config
            build_calibrators(point.config)  # unknown names or options: refused before any work
            build_decoders(point.config)
        _prepare(out, sweep_identity(study, points, adapter), resume=resume)
        log_path = out / "observations.jsonl"
        truncate_torn_tail(log_path)
        log = JsonlAppender(log_path)
        cache = PersistentObservationCache(log)
        cache.load([log_path])  # observations of an interrupted run are not made again
        generation_path = out / GENERATIONS_FILE
        generation_log = None
        decisions = DecisionCache()
        if config.decoders:
            truncate_torn_tail(generation_path)
            generation_log = JsonlAppender(generation_path)
            decisions = DecisionCache(generation_log)
            decisions.load([generation_path])  # nor are its generated answers
        timing: dict[str, Any] = {"points": {}}
        timing_path = out / "timing.json"
        if timing_path.exists():
            try:
                timing = json.loads(timing_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                timing = {"points": {}}
        done: list[dict[str, Any]] = []
        try:
            for point in points:
                path = out / "points" / f"{point.index:03d}.json"
                if path.exists():
                    saved = json.loads(path.read_text(encoding="utf-8"))
                    if saved.get("label") == point.label:
                        done.append(saved)
                        continue
                begun = time.perf_counter()
                rows, keys, made = run_point(point, study, adapter, cache, decisions)
                payload = {"label": point.label, "rows": rows, "keys": keys}
                atomic_write_json(path, payload)
                done.append(payload)
                timing["points"][point.label] = {
                    "seconds": round(time.perf_counter() - begun, 3),
                    "observations_made_in_this_process": made,
                }
                atomic_write_json(timing_path, timing)
                if on_point is not None:
                    on_point(point, payload)
        finally:
            log.close()
            if generation_log is not None:
                generation_log.close()
    rows = _with_costs(done)
    write_table(rows, out / "results.csv")
    figure = write_figure(study, rows, out / "figure.png")
    report = write_sweep_report(study, rows, points, adapter, out / "report.md")
    seconds = time.perf_counter() - started
    timing["total_seconds_last_invocation"] = round(seconds, 3)
    atomic_write_json(timing_path, timing)
    return SweepResult(out, rows, figure, report, seconds)


def _prepare(out: Path, identity: dict[str, Any], *, resume: bool) -> None:
    marker = out / "sweep.json"
    if marker.exists():
        if not resume:
            raise ResumeError(
                f"{out} already holds a sweep; add --resume to continue it or choose another --out"
            )
        try:
            saved = json.loads(marker.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ResumeError(f"{marker} is corrupt ({exc}); use a new --out") from exc
        if saved != identity:
            keys = sorted(k for k in set(saved) | set(identity) if saved.get(k) != identity.get(k))
            raise ResumeError(
                f"cannot resume {out}: it was made with a different study or configuration "
                f"(differs in: {', '.join(keys)}). Use the original settings or a new --out."
            )
        return
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputError(f"--out {out} exists and is not an empty folder; choose a new folder")
    try:
        (out / "points").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {out}: {exc.strerror}") from exc
    atomic_write_json(marker, identity)


def _with_costs(done: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
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
