import json

import numpy as np
import pytest

from helpers import calibration_set
from posdebias import CalibrationState, get_calibrator
from posdebias.errors import CalibrationError


@pytest.fixture
def state():
    rng = np.random.default_rng(0)
    return get_calibrator("attention_guided").fit(
        calibration_set(rng, 4, 3, 5), adapter="synthetic", label_set=["1", "2", "3", "4"]
    )


def test_round_trip(tmp_path, state):
    path = state.save(tmp_path / "sub" / "state.json")
    loaded = CalibrationState.load(path)
    assert loaded == state
    assert loaded.num_layers == 3 and loaded.n == 4 and loaded.num_observations == 20
    assert not list(path.parent.glob(".*.tmp"))  # no temporary file left behind


def test_missing_file(tmp_path):
    with pytest.raises(CalibrationError, match="does not exist"):
        CalibrationState.load(tmp_path / "nope.json")


def test_corrupt_json(tmp_path, state):
    path = tmp_path / "state.json"
    path.write_text(state.to_json()[:50])
    with pytest.raises(CalibrationError, match="not valid JSON"):
        CalibrationState.load(path)


@pytest.mark.parametrize("version", [99, 2.0, 1.0, True, "2", None])
def test_wrong_schema_version(tmp_path, state, version):
    # a version is a whole number as written: 2.0 (a hand edit) was read as 2
    payload = json.loads(state.to_json())
    payload["schema_version"] = version
    path = tmp_path / "state.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(CalibrationError, match=f"schema version {version!r} is not supported"):
        CalibrationState.load(path)


def test_wrong_shapes_name_the_field(tmp_path, state):
    payload = json.loads(state.to_json())
    payload["bias_matrix"] = [[0.0, 1.0]]
    path = tmp_path / "state.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(CalibrationError, match="bias_matrix"):
        CalibrationState.load(path)


@pytest.mark.parametrize(
    ("use", "message"),
    [
        ({"n": 5}, "N=4 candidates, not N=5"),
        ({"num_layers": 7}, "3 layers but the model has 7"),
        ({"calibrator": "pride"}, "'attention_guided', not 'pride'"),
        ({"label_set": ["A", "B", "C", "D"]}, "labels"),
        ({"adapter": "llava"}, "adapter 'synthetic'"),
    ],
)
def test_incompatible_use_is_refused(state, use, message):
    with pytest.raises(CalibrationError, match=message):
        state.check_compatible(**use)


def test_predict_refuses_a_state_for_another_n(state):
    rng = np.random.default_rng(1)
    obs = calibration_set(rng, 5, 3, 1)[0]
    with pytest.raises(CalibrationError, match="N=4"):
        get_calibrator("attention_guided").predict(obs, state)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("bias_matrix", 1e308),
        ("bias_matrix", -1e308),
        ("bias_matrix", 2e5),
        ("observed_profile", -1e200),
        ("attention_prior", 1e300),
        ("gamma", 1e300),
        ("gamma", -3e5),
    ],
)
def test_fitted_numbers_beyond_the_finite_range_are_refused(tmp_path, state, field, value):
    # bias_matrix +-1e308 is finite, was accepted, and the correction overflowed: exit 1
    # "calibrator returned invalid scores"
    payload = json.loads(state.to_json())
    if field == "gamma":
        payload[field] = value
    else:
        payload[field][0][0] = value
    path = tmp_path / "state.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(CalibrationError, match=f"{field} holds .* beyond") as caught:
        CalibrationState.load(path)
    assert "fitted log-probabilities and attention masses are never that large" in str(caught.value)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_json_constants_in_a_state_are_refused_as_json(tmp_path, state, constant):
    text = state.to_json().replace('"gamma": ', f'"gamma": {constant}, "x": ', 1)
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(CalibrationError, match="is not valid JSON .*(no number JSON|too large)"):
        CalibrationState.load(path)


def test_the_largest_fitted_numbers_keep_every_correction_finite(state):
    # the bound is chosen so that the arithmetic of each calibrator stays finite
    from posdebias.core.observation import Observation
    from posdebias.core.state import MAX_FITTED

    n = state.n
    signs = np.where(np.indices((n, n)).sum(axis=0) % 2 == 0, 1.0, -1.0)
    observation = Observation(
        label_logprobs=np.log(np.full(n, 1 / n)), attention=np.full((3, n), 1 / n)
    )
    for mixture in ("log", "prob"):
        extreme = state.with_metadata(bias_matrix=(signs * MAX_FITTED).tolist())
        calibrator = get_calibrator("attention_guided", mixture=mixture)
        assert np.all(np.isfinite(calibrator.predict(observation, extreme).scores))
    for prior in (-MAX_FITTED, 0.0):
        fitted = get_calibrator("contextual").fit(
            [observation] * 2, adapter="synthetic", label_set=state.label_set
        )
        extreme = fitted.with_metadata(logit_prior=[prior] + [0.0] * (n - 1))
        scores = get_calibrator("contextual").predict(observation, extreme).scores
        assert np.all(np.isfinite(scores))
