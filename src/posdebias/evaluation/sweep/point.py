"""Running one point of a study on the shared observation cache."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from posdebias.core.observation import Observation
from posdebias.evaluation.decoding import DecisionCache
from posdebias.evaluation.distributed import Shard
from posdebias.evaluation.job import (
    InstanceSource,
    Prepared,
    calibrate,
    evaluate_shard,
    finish,
    load_instances,
    prepare,
)
from posdebias.evaluation.preset import ResolvedConfig, resolve_preset
from posdebias.evaluation.runner import ObservationCache
from posdebias.evaluation.sweep.plan import Point


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


def point_instances(point: Point, adapter: Any, study: str) -> InstanceSource:
    """The calibration and test instances of a point: those of ``posdebias evaluate`` with its
    settings (a transfer point: calibration held out of A by seed, the test B less its own
    held-out calibration, so every pair tests B on the same instances)."""
    source = load_instances(point.config, adapter, resolve_preset(point.config).benchmark_factory())
    if study == "calibration_size":
        source.calibration = source.calibration[: int(point.value)]
    return source


def prepare_point(point: Point, study: str, adapter: Any) -> Prepared:
    """A point built and checked as ``posdebias evaluate`` checks a run (attention the
    calibrators need, the adapter's scores, data it would misread, the orders), on the sweep's
    shared adapter and before the study's directory is touched."""
    return prepare(
        ResolvedConfig(point.config.model_copy(update={"out": None})),
        shard=Shard(),
        adapter=adapter,
        source=point_instances(point, adapter, study),
    )


def run_point(
    point: Point,
    study: str,
    prepared: Prepared,
    cache: ObservationCache,
    decisions: DecisionCache | None = None,
) -> tuple[list[dict[str, Any]], list[str], int]:
    """Evaluate one prepared point: (rows, digests of the observation keys used, observations
    made).

    A point runs the phases of ``posdebias evaluate`` (calibrate, evaluate, finish) on the
    shared observation cache, so its numbers are those of an evaluation with the same settings.
    The config's decoders (generated answers, prompting baselines, SoFA) add one row each;
    their decisions are cached in ``decisions`` like the observations, so a point re-uses what
    an earlier point (or an interrupted run) generated.
    """
    recorder = _KeyRecorder(cache)
    prepared = replace(
        prepared,
        cache=recorder,
        decisions=decisions if decisions is not None else DecisionCache(),
    )
    calibrated = calibrate(prepared)
    results = finish(prepared, calibrated, evaluate_shard(prepared, calibrated))
    statistics = results.statistics
    assert statistics is not None  # finish computes them for every run
    rows = []
    for label, row in results.calibrators.items():
        m = row.metrics
        passes = row.cost.forward_passes_per_instance
        ci = statistics.rows[label]
        entry: dict[str, Any] = {
            "study": study,
            "point": point.label,
            "value": point.value,
            "calibration_benchmark": point.calibration_benchmark,
            "benchmark": point.benchmark,
            "n": results.n,
            "orders": results.orders,
            "instances": results.num_instances,
            "calibration_instances": len(results.calibration_ids),
            "calibrator": label,
            "accuracy": round(m.accuracy_mean, 4),
            "accuracy_std": round(m.accuracy_std, 4),
            "accuracy_low": round(ci.accuracy.low, 4),
            "accuracy_high": round(ci.accuracy.high, 4),
            "rstd": round(m.rstd, 4),
            "rstd_low": round(ci.rstd.low, 4),
            "rstd_high": round(ci.rstd.high, 4),
            "consistency": round(m.consistency, 4),
            "consistency_low": round(ci.consistency.low, 4),
            "consistency_high": round(ci.consistency.high, 4),
            "forward_passes_per_instance": int(passes)
            if float(passes).is_integer()
            else round(passes, 4),
        }
        if row.order_independent:  # the same choice in every order: no position bias to measure
            # RStd and Cons. with their intervals left empty (see posdebias.evaluation.table)
            entry.update(dict.fromkeys(k for k in entry if k.startswith(("rstd", "consistency"))))
        rows.append(entry)
    digests = sorted(hashlib.sha1(key.encode()).hexdigest()[:16] for key in recorder.keys)
    return rows, digests, recorder.made
