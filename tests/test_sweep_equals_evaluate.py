"""A sweep point is the evaluation with its settings, number for number, for every study and
both order kinds: the sweep runs the phases of `posdebias evaluate`, not a copy of them."""

from __future__ import annotations

import pytest

from helpers import build_shapes_benchmark
from posdebias.errors import InputError
from posdebias.evaluation.config import EvaluateConfig
from posdebias.evaluation.job import run_evaluation
from posdebias.evaluation.sweep import STUDIES, SweepSpec, plan_points, run_sweep

METRICS = ("accuracy", "accuracy_std", "rstd", "consistency")
INTERVALS = ("accuracy", "rstd", "consistency")


def evaluate_rows(config: EvaluateConfig) -> dict[str, dict[str, float]]:
    """The numbers `posdebias evaluate` gives for ``config``, rounded as a sweep writes them."""
    results = run_evaluation(config.model_copy(update={"out": None}))
    assert results is not None
    rows = {}
    for label, row in results.calibrators.items():
        m = row.metrics
        ci = results.statistics.rows[label]
        numbers = {
            "accuracy": m.accuracy_mean,
            "accuracy_std": m.accuracy_std,
            "rstd": m.rstd,
            "consistency": m.consistency,
        }
        for name in INTERVALS:
            numbers[f"{name}_low"] = getattr(ci, name).low
            numbers[f"{name}_high"] = getattr(ci, name).high
        numbers["forward_passes_per_instance"] = row.cost.forward_passes_per_instance
        rows[label] = {k: round(v, 4) for k, v in numbers.items()}
    return rows


def sweep_rows(rows: list[dict], point: str) -> dict[str, dict[str, float]]:
    keys = (*METRICS, *(f"{n}_{end}" for n in INTERVALS for end in ("low", "high")))
    return {
        row["calibrator"]: {k: row[k] for k in (*keys, "forward_passes_per_instance")}
        for row in rows
        if row["point"] == point
    }


def study_setup(study: str, tmp_path, order_kind: str) -> tuple[EvaluateConfig, SweepSpec]:
    base = {
        "adapter": {"name": "synthetic"},
        "n": 3,
        "orders": 3,
        "order_kind": order_kind,
        "count": 6,
        "calibration_count": 3,
        "resamples": 100,
        "calibrators": ["vanilla", "pride", "attention_guided"],
    }
    if study == "n":  # its points set N (a config's n is refused)
        return EvaluateConfig(**{k: v for k, v in base.items() if k != "n"}), SweepSpec(
            values=[2.0, 3.0]
        )
    if study == "calibration_size":
        return EvaluateConfig(**base), SweepSpec(values=[1.0, 3.0])
    if study in ("top_k", "tau"):
        return EvaluateConfig(**base), SweepSpec(values=[1.0, 2.0])
    a = build_shapes_benchmark(tmp_path / "a", count=10, n=3, seed=1)
    b = build_shapes_benchmark(tmp_path / "b", count=10, n=3, seed=2)
    return EvaluateConfig(**base), SweepSpec(benchmarks=[a, b])


def equivalent_evaluations(
    study: str, config: EvaluateConfig, spec: SweepSpec
) -> list[tuple[str, EvaluateConfig]]:
    """(point label, the evaluate config with the same instances and settings).

    calibration_size: a point calibrates on the first M of one held-out pool (nested sets),
    which is the evaluation's own hold-out at the largest M. transfer: every pair is the
    evaluation with ``--calibration-benchmark A --benchmark B``, and a benchmark calibrating
    itself is also the evaluation without it (its calibration held out as by default)."""
    points = plan_points(study, config, spec)
    if study == "calibration_size":
        return [(points[-1].label, points[-1].config)]
    pairs = [(p.label, p.config) for p in points]
    if study == "transfer":
        pairs += [
            (p.label, p.config.model_copy(update={"calibration_benchmark": None}))
            for p in points
            if p.calibration_benchmark == p.benchmark
        ]
    return pairs


@pytest.mark.parametrize("order_kind", ["random", "cyclic"])
@pytest.mark.parametrize("study", STUDIES)
def test_every_sweep_point_is_the_evaluation_with_its_settings(tmp_path, study, order_kind):
    config, spec = study_setup(study, tmp_path, order_kind)
    result = run_sweep(study, config, spec, tmp_path / "sweep")
    expected = equivalent_evaluations(study, config, spec)
    assert expected
    for label, evaluate_config in expected:
        assert sweep_rows(result.rows, label) == evaluate_rows(evaluate_config), label


def test_a_cyclic_sweep_shows_rotations_not_random_orders(tmp_path):
    """The sweep recorded "cyclic" but drew random orders: the same numbers either way."""
    rows = {}
    for kind in ("random", "cyclic"):
        config, spec = study_setup("top_k", tmp_path, kind)
        config = config.model_copy(update={"n": 4, "orders": 4, "count": 12})
        rows[kind] = run_sweep("top_k", config, spec, tmp_path / kind).rows
    accuracy = {kind: [r["accuracy"] for r in table] for kind, table in rows.items()}
    assert accuracy["random"] != accuracy["cyclic"]


def test_a_sweep_point_runs_the_checks_of_evaluate_before_its_directory(tmp_path):
    """More cyclic orders than a point's rotations are refused for a sweep as for `posdebias
    evaluate`, before the study's directory exists."""
    config, spec = study_setup("top_k", tmp_path, "cyclic")
    with pytest.raises(InputError, match="only 3 rotations"):
        run_sweep("top_k", config.model_copy(update={"orders": 4}), spec, tmp_path / "cyclic")
    assert not (tmp_path / "cyclic").exists()


@pytest.mark.parametrize("calibration_count", [2, 3, 10])
def test_a_calibration_benchmark_never_lends_test_instances_and_holds_what_is_asked(
    tmp_path, calibration_count
):
    """`--calibration-benchmark` tests the instances a run without it tests (its calibration
    never among them, even when it is the evaluated benchmark), calibrates on M of it chosen by
    seed (all of it when M is its size) and refuses an M it cannot hold."""
    a = build_shapes_benchmark(tmp_path / "a", count=10, n=3, seed=1)
    b = build_shapes_benchmark(tmp_path / "b", count=12, n=3, seed=2)
    config, _ = study_setup("top_k", tmp_path, "random")
    config = config.model_copy(update={"calibration_count": calibration_count, "count": 20})
    plain = run_evaluation(config.model_copy(update={"benchmark": b}))
    assert plain is not None
    for source in (a, b):
        results = run_evaluation(
            config.model_copy(update={"benchmark": b, "calibration_benchmark": source})
        )
        assert results is not None
        assert results.test_ids == plain.test_ids  # B less its own held-out calibration
        assert len(results.calibration_ids) == calibration_count
        if source == b:
            assert results.calibration_ids == plain.calibration_ids
            assert not set(results.calibration_ids) & set(results.test_ids)
    too_many = config.model_copy(
        update={"benchmark": b, "calibration_benchmark": a, "calibration_count": 11}
    )
    with pytest.raises(InputError, match=r"has 10 instances, fewer than the calibration count 11"):
        run_evaluation(too_many)


def test_a_benchmark_too_small_to_hold_out_m_is_tested_whole_with_a_calibration_benchmark(
    tmp_path,
):
    """Calibrating on another benchmark needs none of the evaluated one: one of M instances or
    fewer is tested whole (a run without a calibration benchmark is refused: nothing would be
    left to test), and the simulated model, which makes its own instances, refuses one."""
    a = build_shapes_benchmark(tmp_path / "a", count=10, n=3, seed=1)
    b = build_shapes_benchmark(tmp_path / "b", count=4, n=3, seed=2)
    config, _ = study_setup("top_k", tmp_path, "random")
    config = config.model_copy(update={"calibration_count": 5, "benchmark": b})
    with pytest.raises(InputError, match="holding out 5 for calibration leaves none to test"):
        run_evaluation(config)
    results = run_evaluation(config.model_copy(update={"calibration_benchmark": a}))
    assert results is not None and len(results.test_ids) == 4
    assert len(results.calibration_ids) == 5
    synthetic = config.model_copy(update={"benchmark": None, "calibration_benchmark": a})
    with pytest.raises(InputError, match="makes retrieval instances of its own, to test and to"):
        run_evaluation(synthetic)
