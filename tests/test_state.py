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
