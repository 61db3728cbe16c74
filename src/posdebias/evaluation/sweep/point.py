"""Running one point of a study on the shared observation cache."""

from __future__ import annotations

import hashlib
from typing import Any

from posdebias.benchmarks.files import load_benchmark
from posdebias.core.instance import check_order_count
from posdebias.core.observation import Observation
from posdebias.errors import InputError
from posdebias.evaluation.config import orders_of
from posdebias.evaluation.decoding import DecisionCache, DecoderRows, decoder_costs
from posdebias.evaluation.job import (
    build_calibrators,
    build_decoders,
    load_instances,
    split_held_out,
)
from posdebias.evaluation.preset import resolve_preset
from posdebias.evaluation.protocol import apply_specs, get_protocol
from posdebias.evaluation.runner import (
    Evaluator,
    ObservationCache,
    fit_calibrators,
    scored_views,
    summarize,
)
from posdebias.evaluation.statistics import record_outcomes, run_statistics
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


def _digest(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def point_instances(point: Point, adapter: Any, study: str) -> tuple[list, list]:
    """(calibration, test) of a point. Transfer: calibration held out of A by seed, test = B
    minus its own held-out calibration, so every pair tests B on the same instances."""

    config = point.config
    if study != "transfer":
        source = load_instances(config, adapter, resolve_preset(config).benchmark_factory())
        calibration = source.calibration
        if study == "calibration_size":
            calibration = calibration[: int(point.value)]
        return calibration, source.test

    if config.benchmark is None or config.calibration_benchmark is None:
        raise InputError(f"point {point.label}: transfer needs both benchmarks")
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
    calibration, test = point_instances(point, adapter, study)
    if not test:
        raise InputError(f"point {point.label}: no test instances")
    n = test[0].n
    orders = orders_of(config, n)
    check_order_count(n, orders)
    recorder = _KeyRecorder(cache)
    states = fit_calibrators(
        adapter,
        calibrators,
        calibration,
        batch_size=config.batch_size,
        cache=recorder,
        test_views=scored_views(test, orders, config.seed, shared=protocol.shared_orders),
    )
    evaluator = Evaluator(
        adapter,
        calibrators,
        states,
        orders=orders,
        seed=config.seed,
        batch_size=config.batch_size,
        cache=recorder,
        shared_orders=protocol.shared_orders,
    )
    records = [evaluator.evaluate_instance(instance) for instance in test]
    passes: dict[str, float] = {
        label: orders * c.passes_with(n, states[label]) for label, c in calibrators.items()
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
    outcomes, _ = record_outcomes(records, [*calibrators, *decoders])
    intervals = run_statistics(
        outcomes, n, baselines=[], resamples=config.resamples, seed=config.seed
    ).rows
    rows = []
    for label in [*calibrators, *decoders]:
        m = metrics[label]
        ci = intervals[label]
        rows.append(
            {
                "study": study,
                "point": point.label,
                "value": point.value,
                "calibration_benchmark": point.calibration_benchmark,
                "benchmark": point.benchmark,
                "n": n,
                "orders": orders,
                "instances": len(test),
                "calibration_instances": len(calibration),
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
                "forward_passes_per_instance": passes[label],
            }
        )
    return rows, sorted(_digest(key) for key in recorder.keys), recorder.made
