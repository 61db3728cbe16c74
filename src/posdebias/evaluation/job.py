"""One evaluation job from a config: build the adapter, instances and calibrators, run, report."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from posdebias.adapters.base import Adapter
from posdebias.adapters.synthetic import synthetic_instances
from posdebias.calibrators.base import Calibrator
from posdebias.core.instance import RetrievalInstance
from posdebias.evaluation.config import EvaluateConfig
from posdebias.evaluation.results import CalibratorResult, EvaluationResults
from posdebias.evaluation.runner import (
    Evaluator,
    InstanceRecord,
    ObservationCache,
    fit_calibrators,
    summarize,
)
from posdebias.registry import get_registry


def build_adapter(config: EvaluateConfig) -> Adapter:
    """The adapter named by the config (``--model`` loads a Hugging Face model)."""
    if config.model is not None:
        from posdebias.adapters.loading import load_adapter

        return load_adapter(config.model, **config.adapter.options)
    return get_registry().create_adapter(config.adapter.name, **config.adapter.options)


def build_calibrators(config: EvaluateConfig) -> dict[str, Calibrator]:
    registry = get_registry()
    return {
        spec.key: registry.create_calibrator(spec.name, **spec.options)
        for spec in config.calibrators
    }


def load_instances(
    config: EvaluateConfig,
) -> tuple[list[RetrievalInstance], list[RetrievalInstance]]:
    """(calibration, test) instances; without a benchmark, the simulated model's instances."""
    calibration = synthetic_instances(config.calibration_count, config.n, config.seed + 1, "cal")
    test = synthetic_instances(config.count, config.n, config.seed, "test")
    return calibration, test


def run_evaluation(
    config: EvaluateConfig,
    *,
    on_record: Callable[[InstanceRecord], None] | None = None,
) -> EvaluationResults:
    """Calibrate on the symmetrised calibration set, evaluate T orders per test instance."""
    started = time.perf_counter()
    calibrators = build_calibrators(config)
    adapter = build_adapter(config)
    calibration, test = load_instances(config)
    cache = ObservationCache()
    states = fit_calibrators(
        adapter, calibrators, calibration, batch_size=config.batch_size, cache=cache
    )
    fitted = time.perf_counter()
    evaluator = Evaluator(
        adapter,
        calibrators,
        states,
        orders=config.orders,
        seed=config.seed,
        batch_size=config.batch_size,
        cache=cache,
    )
    records = evaluator.run(test, on_record=on_record)
    n = test[0].n
    metrics = summarize(records, calibrators, n)
    settings = config.model_dump(mode="json", exclude={"out"})
    return EvaluationResults(
        settings=settings,
        adapter=adapter.describe(),
        n=n,
        orders=config.orders,
        seed=config.seed,
        num_instances=len(records),
        calibration_ids=[instance.id for instance in calibration],
        calibrators={
            label: CalibratorResult(
                name=calibrator.name,
                options=calibrator.options.model_dump(mode="json"),
                metrics=metrics[label],
                cost={
                    "forward_passes_per_instance": evaluator.costs[label].per_instance()[
                        "forward_passes_per_instance"
                    ]
                },
            )
            for label, calibrator in calibrators.items()
        },
        timing={
            "calibration_seconds": fitted - started,
            "total_seconds": time.perf_counter() - started,
            "seconds_per_instance": {
                label: cost.per_instance()["seconds_per_instance"]
                for label, cost in evaluator.costs.items()
            },
        },
    )


def write_results(results: EvaluationResults, out: Path) -> Path:
    return results.save(Path(out) / "results.json")
