import numpy as np
import pytest

from posdebias import Observation, Prediction
from posdebias.core.observation import log_softmax
from posdebias.errors import ObservationError


def good_scores(n=4):
    return log_softmax(np.arange(n, dtype=float))


def test_valid_observation_keeps_arrays_read_only():
    obs = Observation(good_scores(), attention=np.ones((3, 4)), target=2)
    assert obs.n == 4 and obs.num_layers == 3 and obs.target == 2
    with pytest.raises(ValueError):
        obs.label_logprobs[0] = 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"label_logprobs": [0.0, np.nan]}, "NaN"),
        ({"label_logprobs": [[0.0, 0.0]]}, "1 dimension"),
        ({"label_logprobs": [0.0]}, "at least 2"),
        ({"label_logprobs": [0.0, 0.0]}, "logsumexp"),
        ({"attention": np.ones((2, 3))}, "shape"),
        ({"attention": -np.ones((2, 4))}, "non-negative"),
        ({"attention": np.ones(4)}, "2 dimension"),
        ({"target": 4}, "out of range"),
        ({"target": -1}, "out of range"),
        ({"target": True}, "int position"),
    ],
)
def test_invalid_observations_name_the_problem(kwargs, message):
    fields = {"label_logprobs": good_scores(), **kwargs}
    with pytest.raises(ObservationError, match=message):
        Observation(**fields)


def test_rotation_relabels_scores_attention_and_target():
    scores = good_scores()
    attention = np.arange(8, dtype=float).reshape(2, 4)
    obs = Observation(scores, attention=attention, target=1)
    rotated = obs.rotated(1)
    assert np.allclose(rotated.label_logprobs, scores[[1, 2, 3, 0]])
    assert np.allclose(rotated.attention, attention[:, [1, 2, 3, 0]])
    assert rotated.target == 0


def test_round_trip_through_dict():
    obs = Observation(good_scores(), attention=np.ones((2, 4)) / 4, target=3)
    back = Observation.from_dict(obs.to_dict())
    assert np.array_equal(back.label_logprobs, obs.label_logprobs)
    assert np.array_equal(back.attention, obs.attention)
    assert back.target == 3


def test_prediction_probabilities_and_choice():
    prediction = Prediction(scores=np.array([0.0, 2.0, 1.0]))
    assert prediction.choice == 1
    assert np.isclose(prediction.probabilities.sum(), 1.0)
    assert prediction.probabilities.argmax() == 1
