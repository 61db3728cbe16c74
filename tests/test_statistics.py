"""Instance bootstrap, paired comparisons, position views (evaluation/statistics.py)."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np
import pytest

from posdebias.errors import InputError
from posdebias.evaluation.metrics import compute_metrics
from posdebias.evaluation.statistics import (
    Outcomes,
    check_resamples,
    cyclic_orders,
    mcnemar_exact,
    paired_comparison,
    resample_weights,
    run_statistics,
)


def outcomes(targets, choices, chosen=None) -> Outcomes:
    targets, choices = np.asarray(targets), np.asarray(choices)
    return Outcomes(targets, choices, choices if chosen is None else np.asarray(chosen))


def test_bernoulli_interval_covers_the_truth_at_its_nominal_rate():
    """300 seeded samples of 100 Bernoulli(0.3) decisions (T = 1): the 95% interval of Acc
    holds 30% in 95% +- 4% of them (the percentile bootstrap's known small undercoverage at
    I = 100 included; 4 points are 3 standard errors of a coverage over 300 samples)."""
    rng = np.random.default_rng(1234)
    truth, covered, repetitions = 30.0, 0, 300
    for repetition in range(repetitions):
        right = rng.random((100, 1)) < truth / 100
        row = outcomes(np.zeros((100, 1), int), np.where(right, 0, 1))
        ci = run_statistics({"r": row}, 2, seed=repetition).rows["r"].accuracy
        covered += ci.low <= truth <= ci.high
    assert abs(covered / repetitions - 0.95) <= 0.04, covered / repetitions


def test_instance_bootstrap_keeps_an_instances_orders_together():
    """Orders of one instance agree (all right or all wrong): resampling instances gives the
    width of I = 50 samples, not of the 250 decisions a decision bootstrap would pretend."""
    rng = np.random.default_rng(0)
    right = np.repeat(rng.random((50, 1)) < 0.5, 5, axis=1)
    row = outcomes(np.zeros((50, 5), int), np.where(right, 0, 1))
    ci = run_statistics({"r": row}, 2, seed=0).rows["r"].accuracy
    p = right.mean()
    se_instances = 100 * np.sqrt(p * (1 - p) / 50)
    assert ci.high - ci.low == pytest.approx(2 * 1.96 * se_instances, rel=0.2)


@pytest.mark.parametrize(
    ("row_only", "baseline_only", "expected"),
    [
        (0, 0, Fraction(1)),
        (1, 5, Fraction(2 * (1 + 6), 2**6)),  # 2 * P(X <= 1), X ~ Bin(6, 1/2)
        (5, 1, Fraction(2 * (1 + 6), 2**6)),
        (3, 3, Fraction(1)),  # 2 * P(X <= 3) > 1: capped
        (10, 2, Fraction(2 * (1 + 12 + 66), 2**12)),
        (0, 7, Fraction(2, 2**7)),
        (20, 30, Fraction(2 * sum(comb(50, k) for k in range(21)), 2**50)),
    ],
)
def test_mcnemar_is_the_exact_binomial_test(row_only, baseline_only, expected):
    assert mcnemar_exact(row_only, baseline_only) == float(expected)


def test_paired_comparison_counts_discordant_decisions():
    # decisions: both right 4, row only 3, baseline only 1, both wrong 2 (5 instances x 2)
    row = np.array([[1, 1], [1, 1], [1, 1], [1, 0], [0, 0]], bool)
    base = np.array([[1, 1], [1, 1], [0, 0], [0, 1], [0, 0]], bool)
    weights = resample_weights(5, 200, 0)
    c = paired_comparison("row", "base", row, base, weights)
    assert (c.row_only, c.baseline_only, c.decisions, c.instances) == (3, 1, 10, 5)
    assert c.p_value == float(Fraction(2 * (1 + 4), 2**4))
    assert c.difference.value == pytest.approx(100 * (7 - 5) / 10)
    assert c.difference.low <= c.difference.value <= c.difference.high


def test_point_estimates_equal_the_metrics_and_intervals_hold_them():
    rng = np.random.default_rng(3)
    targets = rng.integers(0, 4, (80, 5))
    choices = np.where(rng.random((80, 5)) < 0.7, targets, rng.integers(0, 4, (80, 5)))
    images = rng.integers(0, 4, (80, 5))
    m = compute_metrics(targets, choices, images, 4)
    s = run_statistics({"r": outcomes(targets, choices, images)}, 4).rows["r"]
    assert s.accuracy.value == pytest.approx(m.accuracy_mean)
    assert s.rstd.value == pytest.approx(m.rstd)
    assert s.consistency.value == pytest.approx(m.consistency)
    for ci, recall in zip(s.accuracy_by_position, m.recall_per_position, strict=True):
        assert ci is not None and ci.value == pytest.approx(recall)
        assert ci.low <= ci.high
    assert [ci.value for ci in s.choice_by_position] == pytest.approx(m.selection_rate)
    for ci in (s.accuracy, s.consistency):
        assert ci.low <= ci.value <= ci.high


def test_intervals_are_byte_reproducible_with_the_seed():
    rng = np.random.default_rng(5)
    targets = rng.integers(0, 3, (40, 3))
    rows = {"vanilla": outcomes(targets, rng.integers(0, 3, (40, 3))),
            "other": outcomes(targets, targets)}  # fmt: skip
    first = run_statistics(rows, 3, seed=7).model_dump_json()
    assert run_statistics(rows, 3, seed=7).model_dump_json() == first
    assert run_statistics(rows, 3, seed=8).model_dump_json() != first


def test_flip_rate_counts_changed_order_pairs():
    targets = np.zeros((2, 3), int)
    chosen = np.array([[0, 0, 1], [2, 2, 2]])  # pairs changed: 2 of 3, then 0 of 3
    s = run_statistics({"r": outcomes(targets, chosen, chosen)}, 3).rows["r"]
    assert s.flip_rate is not None and s.flip_rate.value == pytest.approx(100 * (2 / 3) / 2)
    missing = np.array([[0, -1, 0], [2, 2, 2]])  # a missing answer changes both its pairs
    s = run_statistics({"r": outcomes(targets, missing, missing)}, 3).rows["r"]
    assert s.flip_rate is not None and s.flip_rate.value == pytest.approx(100 * (2 / 3) / 2)
    one = run_statistics({"r": outcomes(targets[:, :1], chosen[:, :1])}, 3).rows["r"]
    assert one.flip_rate is None  # one order: nothing can flip


def test_circular_eval_only_for_the_n_cyclic_rotations():
    n = 3
    base = [np.array([2, 0, 1]), np.array([0, 1, 2])]
    rotations = np.array([[np.roll(b, s) for s in range(n)] for b in base])
    assert cyclic_orders(rotations)
    truth = np.array([[int(np.where(o == 0)[0][0]) for o in inst] for inst in rotations])
    choices = truth.copy()
    choices[1, 2] = (truth[1, 2] + 1) % n  # instance 1 is wrong in one rotation
    row = outcomes(truth, choices)
    s = run_statistics({"r": row}, n, orders=rotations).rows["r"]
    assert s.circular is not None and s.circular.value == 50.0
    shuffled = rotations.copy()
    shuffled[0, 1] = shuffled[0, 1][[1, 0, 2]]  # no longer a rotation
    assert not cyclic_orders(shuffled)
    assert run_statistics({"r": row}, n, orders=shuffled).rows["r"].circular is None
    assert run_statistics({"r": row}, n).rows["r"].circular is None


def test_comparisons_against_vanilla_and_a_chosen_baseline():
    targets = np.zeros((10, 2), int)
    rows = {
        "vanilla": outcomes(targets, np.ones((10, 2), int)),
        "a": outcomes(targets, targets),
        "b": outcomes(targets, np.ones((10, 2), int)),
    }
    stats = run_statistics(rows, 2, baselines=["vanilla", "a"])
    pairs = [(c.row, c.baseline) for c in stats.comparisons]
    assert pairs == [("a", "vanilla"), ("b", "vanilla"), ("vanilla", "a"), ("b", "a")]
    assert run_statistics({"a": rows["a"]}, 2).comparisons == []  # no vanilla: none


@pytest.mark.parametrize("bad", [0, 99, 100_001, True, 1.5])
def test_resamples_outside_the_range_are_refused(bad):
    with pytest.raises(InputError, match="from 100 to 100,000"):
        check_resamples(bad)
