"""Log-domain averages stay finite and exact far from zero (a label 800 nats below the best)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from posdebias import Observation, get_calibrator
from posdebias.core.observation import log_mean_exp, log_softmax, logsumexp
from posdebias.core.stages import BiasProfiler

FAR = 800.0  # exp(-800) underflows to 0.0 in float64: the naive log(mean(exp)) gives -inf


def exact_log_mean_exp(values):
    """The reference in exact arithmetic of the shifted form, with Python floats."""
    peak = max(values)
    return peak + math.log(math.fsum(math.exp(v - peak) for v in values) / len(values))


@pytest.mark.parametrize(
    "values", [[0.0, -1.0, -2.5], [-FAR, -FAR - 1, -FAR + 0.5], [700.0, 710.0]]
)
def test_logsumexp_and_log_mean_exp_are_exact_far_from_zero(values):
    array = np.array(values)
    expected = exact_log_mean_exp(values)
    assert np.isfinite(log_mean_exp(array))
    assert log_mean_exp(array) == pytest.approx(expected, abs=1e-12)
    assert logsumexp(array) == pytest.approx(expected + math.log(len(values)), abs=1e-12)
    rows = np.stack([array, array + 3.0])
    np.testing.assert_allclose(logsumexp(rows, axis=1), logsumexp(array) + np.array([0.0, 3.0]))


def test_all_minus_infinity_is_minus_infinity_not_nan():
    assert logsumexp(np.array([-np.inf, -np.inf])) == -np.inf


def _far_observation(shift: float, target: int | None = None) -> Observation:
    """Four labels, the third FAR nats below the best, shifted a little per rotation."""
    return Observation(
        label_logprobs=log_softmax(np.array([0.0, -1.0 + shift, -FAR - shift, -2.0])),
        target=target,
    )


def test_permutation_average_prob_with_a_label_800_nats_below():
    calibrator = get_calibrator("permutation_average", average="prob")
    observation = _far_observation(0.0)
    # rotation r shows old position (i + r) % N at position i
    rotations = [
        Observation(label_logprobs=np.roll(_far_observation(0.1 * r).label_logprobs, -r))
        for r in range(4)
    ]
    state = calibrator.fit([], n=4)
    scores = calibrator.predict(observation, state, rotations=rotations).scores
    assert np.all(np.isfinite(scores))
    per_image = [
        [float(_far_observation(0.1 * r).label_logprobs[k]) for r in range(4)] for k in range(4)
    ]
    expected = log_softmax(np.array([exact_log_mean_exp(v) for v in per_image]))
    np.testing.assert_allclose(scores, expected, atol=1e-9)
    assert scores[2] == pytest.approx(-FAR, abs=3.0)  # right, not clamped to log(epsilon)


def test_prob_bias_profile_with_a_label_800_nats_below():
    observations = [
        Observation(label_logprobs=np.roll(_far_observation(0.2 * k).label_logprobs, t), target=t)
        for t in range(4)
        for k in range(3)
    ]
    profile = BiasProfiler(average="prob").observed_profile(observations)
    assert np.all(np.isfinite(profile))
    for t in range(4):
        for j in range(4):
            values = [float(o.label_logprobs[j]) for o in observations if o.target == t]
            assert profile[t, j] == pytest.approx(exact_log_mean_exp(values), abs=1e-9)
    assert profile.min() < -FAR + 5  # the far label keeps its true, very low, average
