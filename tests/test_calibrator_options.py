"""permutation_average orders (cyclic | random, count) and the no-prior ablation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers import calibration_set, random_observation
from posdebias import get_calibrator
from posdebias.core.observation import Observation, log_softmax
from posdebias.errors import ConfigError, ObservationError


def content_observations(content: np.ndarray, orders: list[np.ndarray]) -> list[Observation]:
    """Observations of a bias-free model: each image's score is its content, wherever shown."""
    return [Observation(label_logprobs=log_softmax(content[order])) for order in orders]


@pytest.mark.parametrize("n", [3, 4, 6])
def test_random_permutations_default_to_min_16_n_factorial_identity_first(n):
    calibrator = get_calibrator("permutation_average", permutations="random")
    orders = calibrator.permutations(n)
    assert len(orders) == min(16, math.factorial(n)) == calibrator.forward_passes(n)
    assert orders[0].tolist() == list(range(n))
    assert len({tuple(o) for o in orders}) == len(orders)
    assert all(sorted(o.tolist()) == list(range(n)) for o in orders)
    again = get_calibrator("permutation_average", permutations="random").permutations(n)
    assert [o.tolist() for o in again] == [o.tolist() for o in orders]
    other = get_calibrator("permutation_average", permutations="random", seed=1).permutations(n)
    assert [o.tolist() for o in other] != [o.tolist() for o in orders] or n == 3


def test_cyclic_default_and_counts():
    cyclic = get_calibrator("permutation_average")
    assert [o.tolist() for o in cyclic.permutations(3)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    assert get_calibrator("permutation_average", count=2).forward_passes(4) == 2
    assert (
        get_calibrator("permutation_average", permutations="random", count=5).forward_passes(8) == 5
    )
    with pytest.raises(ConfigError, match="exceeds the N! = 6"):
        get_calibrator("permutation_average", permutations="random", count=7).permutations(3)
    with pytest.raises(ConfigError, match="cyclic shifts"):
        get_calibrator("permutation_average", count=5).permutations(4)


@pytest.mark.parametrize("options", [{}, {"permutations": "random"}, {"average": "prob"}])
def test_scores_are_mapped_back_to_the_images(options):
    """A model that scores images by content alone gives back exactly those scores."""
    rng = np.random.default_rng(0)
    content = rng.normal(size=5)
    calibrator = get_calibrator("permutation_average", **options)
    state = calibrator.fit([], n=5)
    orders = calibrator.permutations(5)
    observations = content_observations(content, orders)
    prediction = calibrator.predict(observations[0], state, rotations=observations)
    if options.get("average") == "prob":
        np.testing.assert_allclose(prediction.choice, int(np.argmax(content)))
    else:
        np.testing.assert_allclose(prediction.scores, log_softmax(content), atol=1e-12)
    with pytest.raises(ObservationError, match="candidate orders"):
        calibrator.predict(observations[0], state, rotations=observations[:-1])


def test_attention_guided_without_the_prior_reads_raw_attention():
    rng = np.random.default_rng(3)
    observations = calibration_set(rng, 4, 6, 5)
    # random attention beats chance in no layer: without fallback=False both would be PriDe
    full = get_calibrator("attention_guided", fallback=False)
    ablated = get_calibrator("attention_guided", attention_prior=False, fallback=False)
    state = full.fit(observations)
    ablated_state = ablated.fit(observations)
    assert ablated_state.options["attention_prior"] is False
    differs = False
    for _ in range(20):
        observation = random_observation(rng, 4, 6, None)
        with_prior = full.predict(observation, state).scores
        without = ablated.predict(observation, ablated_state).scores
        differs |= not np.allclose(with_prior, without)
        # the ablation equals the full method given a flat (all-ones) prior
        flat = state.model_copy(
            update={"attention_prior": np.ones_like(state.attention_prior_array).tolist()}
        )
        np.testing.assert_allclose(without, full.predict(observation, flat).scores, atol=1e-9)
    assert differs
