"""Property tests of the calibrators (METHOD.md invariances), on random observations.

hypothesis draws the sizes and a seed; numpy draws continuous values from it, so exact argmax
ties (which would make any positional statement ambiguous) have probability zero.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from helpers import calibration_set, random_observation, top_two_gap
from posdebias import Observation, get_calibrator
from posdebias.core.observation import softmax
from posdebias.core.stages import BiasProfiler, Corrector

SINGLE_PASS = [
    "vanilla",
    "pride",
    "contextual",
    "batch",
    "attention_readout",
    "purified_attention",
    "attention_guided",
]
VARIANTS = [
    ("attention_guided", {"mixture": "prob"}),
    ("attention_guided", {"average": "prob", "layer_average": "geometric"}),
    ("attention_guided", {"top_k": 1, "tau": 2.0}),
    ("purified_attention", {"layer_average": "geometric"}),
]

sizes = st.tuples(st.integers(2, 7), st.integers(1, 5), st.integers(1, 4), st.integers(0, 2**32))


def calibrators():
    return [(name, {}) for name in SINGLE_PASS] + VARIANTS


@pytest.mark.parametrize(("name", "options"), calibrators())
@given(sizes=sizes, shift=st.integers(1, 6))
# 28 views of no known instance, more relabelings than the chance test enumerates: its random
# relabelings once went to views numbered by their content as shown, so a shift moved them
@example(sizes=(7, 5, 4, 449), shift=1)
@example(sizes=(7, 5, 4, 449), shift=2)
def test_cyclic_relabelling_shifts_the_prediction(name, options, sizes, shift):
    """Relabelling positions by a cyclic shift in BOTH the calibration observations and the test
    observation shifts the chosen position by the same shift: no position is special."""
    n, layers, m, seed = sizes
    rng = np.random.default_rng(seed)
    calibration = calibration_set(rng, n, layers, m)
    test = random_observation(rng, n, layers, None)
    calibrator = get_calibrator(name, **options)
    state = calibrator.fit(calibration)
    base = calibrator.predict(test, state)
    assume(top_two_gap(base.scores) > 1e-9)
    shifted_state = calibrator.fit([obs.rotated(shift) for obs in calibration])
    shifted = calibrator.predict(test.rotated(shift), shifted_state)
    assert shifted.choice == (base.choice - shift) % n
    assert np.allclose(shifted.scores, base.scores[(np.arange(n) + shift) % n], atol=1e-9)


@pytest.mark.parametrize(("name", "options"), calibrators())
@given(sizes=sizes)
def test_fitted_state_ignores_calibration_order(name, options, sizes):
    """The fitted state does not depend on the order of the calibration observations."""
    n, layers, m, seed = sizes
    rng = np.random.default_rng(seed)
    calibration = calibration_set(rng, n, layers, m)
    calibrator = get_calibrator(name, **options)
    first = calibrator.fit(calibration).model_dump()
    shuffled = [calibration[i] for i in rng.permutation(len(calibration))]
    second = calibrator.fit(shuffled).model_dump()
    assert first.keys() == second.keys()
    for key, value in first.items():
        if isinstance(value, list | float) and key not in ("calibration_ids", "layer_kinds"):
            assert np.allclose(np.asarray(value, float), np.asarray(second[key], float)), key
        else:
            assert value == second[key], key


@given(sizes=sizes, constant=st.floats(-50, 50), mixture=st.sampled_from(["log", "prob"]))
def test_constant_added_to_label_scores_changes_no_correction(sizes, constant, mixture):
    """Adding one constant to all N label scores of the test observation, or to every entry of
    the bias matrix (all calibration scores moved by it), leaves the corrected scores unchanged."""
    n, _, _, seed = sizes
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=n)
    bias = rng.normal(size=(n, n))
    posterior = softmax(rng.normal(size=n))
    corrector = Corrector(mixture=mixture)
    plain = corrector.correct(scores, corrector.expected_bias(posterior, bias))
    moved_scores = corrector.correct(scores + constant, corrector.expected_bias(posterior, bias))
    moved_bias = corrector.correct(scores, corrector.expected_bias(posterior, bias + constant))
    assert np.allclose(plain, moved_scores, atol=1e-8)
    assert np.allclose(plain, moved_bias, atol=1e-8)


@given(sizes=sizes, offsets=st.lists(st.floats(-20, 20), min_size=7, max_size=7))
def test_row_constants_in_bias_matrix_change_nothing_with_log_mixture(sizes, offsets):
    """B[k, :] + c_k shifts b_j by sum_k pi_k c_k for every j: the argmax is unchanged."""
    n, _, _, seed = sizes
    rng = np.random.default_rng(seed)
    bias = rng.normal(size=(n, n))
    posterior = softmax(rng.normal(size=n))
    scores = rng.normal(size=n)
    corrector = Corrector(mixture="log")
    plain = corrector.correct(scores, corrector.expected_bias(posterior, bias))
    shifted_bias = bias + np.asarray(offsets[:n])[:, None]
    shifted = corrector.correct(scores, corrector.expected_bias(posterior, shifted_bias))
    assert np.allclose(plain, shifted, atol=1e-9)


@given(sizes=sizes)
def test_log_mixture_is_posterior_times_bias_matrix(sizes):
    n, _, _, seed = sizes
    rng = np.random.default_rng(seed)
    bias = rng.normal(size=(n, n))
    posterior = softmax(rng.normal(size=n))
    expected = np.array([sum(posterior[k] * bias[k, j] for k in range(n)) for j in range(n)])
    assert np.allclose(Corrector(mixture="log").expected_bias(posterior, bias), expected)


@given(sizes=sizes)
def test_prob_mixture_is_a_mixture_of_row_distributions(sizes):
    n, _, _, seed = sizes
    rng = np.random.default_rng(seed)
    bias = rng.normal(size=(n, n))
    posterior = softmax(rng.normal(size=n))
    rows = np.exp(bias) / np.exp(bias).sum(axis=1, keepdims=True)
    expected = np.log(posterior @ rows)
    assert np.allclose(Corrector(mixture="prob").expected_bias(posterior, bias), expected)


def test_bias_matrix_and_gamma_by_hand():
    profile = np.log(np.array([[0.7, 0.2, 0.1], [0.5, 0.4, 0.1], [0.1, 0.1, 0.8]]))
    gamma = BiasProfiler.visual_gain(profile)
    gaps = [profile[i, i] - profile[i, j] for i in range(3) for j in range(3) if i != j]
    assert np.isclose(gamma, max(gaps))
    bias = BiasProfiler.bias_matrix(profile, gamma)
    assert np.allclose(np.diag(bias), np.diag(profile) - gamma)
    assert np.allclose(bias - np.diag(np.diag(bias)), profile - np.diag(np.diag(profile)))


def test_attention_guided_undoes_a_conditional_bias_that_pride_cannot():
    """A clean conditional bias: truth at 1 is answered 0, truth elsewhere answered right.
    With perfect attention, attention_guided recovers every case; a static prior cannot."""
    n, layers = 3, 2
    profile_logits = np.array([[3.0, 0.0, 0.0], [3.5, 2.0, 0.0], [0.0, 0.0, 3.0]])

    def obs(target):
        attention = np.full((layers, n), 0.05)
        attention[:, target] = 0.6
        return Observation(
            profile_logits[target] - np.logaddexp.reduce(profile_logits[target]),
            attention=attention,
            target=target,
        )

    # three views per truth position: enough for the chance test to call the layers informative
    # (one view each, p = 2 * (1/3)^3 = 0.07, and the method would fall back to PriDe)
    calibration = [obs(t) for t in range(n)] * 3
    for name, expected in (("vanilla", [0, 0, 2]), ("attention_guided", [0, 1, 2])):
        calibrator = get_calibrator(name)
        state = calibrator.fit(calibration)
        assert [calibrator.predict(obs(t), state).choice for t in range(n)] == expected
    pride = get_calibrator("pride")
    # (the prior makes truth 1's scores tie exactly: rounding decides; one copy rounds to 0)
    state = pride.fit(calibration[:n])
    assert [pride.predict(obs(t), state).choice for t in range(n)] != [0, 1, 2]


@given(sizes=sizes, average=st.sampled_from(["log", "prob"]))
def test_permutation_average_chooses_the_same_image_under_every_rotation(sizes, average):
    """With the observations of all N rotations, the chosen IMAGE does not depend on which
    rotation is presented as the observation."""
    n, layers, _, seed = sizes
    rng = np.random.default_rng(seed)
    rotations = [random_observation(rng, n, layers, None) for _ in range(n)]
    calibrator = get_calibrator("permutation_average", average=average)
    state = calibrator.fit([], n=n)
    base = calibrator.predict(rotations[0], state, rotations=rotations)
    assume(top_two_gap(base.scores) > 1e-9)
    for r in range(1, n):
        # seen from rotation r, rotation s of it is base rotation (r + s) % N
        view = [rotations[(r + s) % n] for s in range(n)]
        choice = calibrator.predict(rotations[r], state, rotations=view).choice
        assert (choice + r) % n == base.choice  # same base image
