"""Layer sets: which model layers an observation's attention rows come from, carried through
states, checked on use, and used by layer selection (by kind and by range)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import calibration_set
from posdebias import CalibrationState, Observation, get_calibrator
from posdebias.core.layers import LayerSet
from posdebias.core.observation import log_softmax
from posdebias.core.stages import LayerSelector
from posdebias.errors import CalibrationError, ConfigError, InputError, ObservationError

G, S, C = "global", "sliding", "chunked"
# Gemma-3-like: five sliding layers, then a global one, twice.
GEMMA = LayerSet(tuple(range(12)), (S, S, S, S, S, G, S, S, S, S, S, G))
QWEN35 = LayerSet((3, 7, 11), (G, G, G))


def hybrid_observation(rng, layers: LayerSet, n: int, target: int | None) -> Observation:
    """Windowed rows see only the last image (zero elsewhere), as a short window would."""
    attention = rng.random((len(layers), n)) + 1e-3
    for row, kind in enumerate(layers.kinds):
        if kind != G:
            attention[row, :-1] = 0.0
            attention[row, -1] *= 5  # more mass than any global row: tempting, but structural
    return Observation(
        label_logprobs=log_softmax(rng.normal(size=n)),
        attention=attention,
        target=target,
        layers=layers,
    )


@pytest.mark.parametrize(
    ("indices", "kinds", "message"),
    [
        ((3, 1), (G, G), "strictly increasing"),
        ((0, 0), (G, G), "strictly increasing"),
        ((-1, 2), (G, G), "non-negative"),
        ((0, 1), (G,), "2 indices but 1 kinds"),
        ((0, 1), (G, "linear"), "unknown attention layer kind"),
        ((0.5,), (G,), "integers"),
        ((), (), "at least one layer"),
    ],
)
def test_layer_sets_are_validated(indices, kinds, message):
    with pytest.raises(ObservationError, match=message):
        LayerSet(indices, kinds)


def test_layer_sets_describe_themselves():
    assert LayerSet.dense(28).describe() == "layers 0-27 (global)"
    assert QWEN35.describe() == "layers 3, 7, 11 (global)"
    assert GEMMA.describe() == "layers 0-11 (2 global, 10 sliding)"
    assert LayerSet.dense(4).is_dense and not QWEN35.is_dense
    assert GEMMA.rows_of_kinds([G]) == [5, 11]


def test_observations_carry_their_layers_through_rotation_and_records():
    rng = np.random.default_rng(0)
    observation = hybrid_observation(rng, QWEN35, 4, 1)
    assert observation.rotated(1).layers == QWEN35
    record = observation.to_dict()
    assert (record["layers"], record["layer_kinds"]) == ([3, 7, 11], [G, G, G])
    again = Observation.from_dict(json.loads(json.dumps(record)))
    assert again.layers == QWEN35
    np.testing.assert_array_equal(again.attention, observation.attention)
    # dense observations read and write exactly as before layer sets existed
    dense = calibration_set(rng, 4, 3, 1)[0]
    assert dense.layers == LayerSet.dense(3)
    assert "layers" not in dense.to_dict()
    assert Observation.from_dict(dense.to_dict()).layers == LayerSet.dense(3)


def test_observations_refuse_rows_that_do_not_match_their_layers():
    scores = log_softmax(np.zeros(3))
    with pytest.raises(ObservationError, match="2 rows but its layers are layers 3, 7, 11"):
        Observation(scores, attention=np.ones((2, 3)), layers=QWEN35)
    with pytest.raises(ObservationError, match="without attention"):
        Observation(scores, layers=QWEN35)
    bad = {"label_logprobs": scores.tolist(), "attention": [[0.1] * 3], "layers": [1]}
    with pytest.raises(ObservationError, match="both their indices and their kinds"):
        Observation.from_dict(bad)
    bad["layer_kinds"] = "global"
    with pytest.raises(ObservationError, match="must be lists"):
        Observation.from_dict(bad)


def test_states_record_layers_and_refuse_another_layer_set(tmp_path):
    rng = np.random.default_rng(1)
    calibration = [hybrid_observation(rng, GEMMA, 3, i % 3) for i in range(9)]
    state = get_calibrator("attention_guided").fit(calibration)
    assert state.layers == list(range(12)) and state.layer_kinds == list(GEMMA.kinds)
    assert state.num_layers == 12 and state.layer_set == GEMMA
    loaded = CalibrationState.load(state.save(tmp_path / "state.json"))
    assert loaded.layer_set == GEMMA and loaded.schema_version == 2
    # same depth, other kinds: refused with both layer sets named
    other = LayerSet(tuple(range(12)), (G,) * 12)
    both = r"layers 0-11 \(2 global, 10 sliding.*layers 0-11 \(global\)"
    with pytest.raises(CalibrationError, match=both):
        loaded.check_compatible(layers=other)
    dense_observation = calibration_set(rng, 3, 12, 1)[0]
    with pytest.raises(CalibrationError, match="attention rows come from"):
        get_calibrator("attention_guided").predict(dense_observation, loaded)
    prediction = get_calibrator("attention_guided").predict(calibration[0], loaded)
    assert np.isfinite(prediction.scores).all()


def test_version_1_states_read_as_dense(tmp_path):
    rng = np.random.default_rng(2)
    state = get_calibrator("purified_attention").fit(calibration_set(rng, 4, 5, 2))
    payload = json.loads(state.to_json())
    payload["schema_version"] = 1
    del payload["layers"], payload["layer_kinds"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(payload))
    old = CalibrationState.load(path)
    assert old.layer_set == LayerSet.dense(5) and old.layers is None
    old.check_compatible(layers=LayerSet.dense(5))
    with pytest.raises(CalibrationError, match="layers 0-4 \\(global\\)"):
        old.check_compatible(layers=LayerSet((1, 2, 3, 4, 5), (G,) * 5))
    payload["layers"] = [0, 1, 2, 3, 4]
    path.write_text(json.dumps(payload))
    with pytest.raises(CalibrationError, match="version 1"):
        CalibrationState.load(path)
    payload.update(schema_version=2, layers=[0, 1, 2, 3], layer_kinds=[G] * 4)
    path.write_text(json.dumps(payload))
    with pytest.raises(CalibrationError, match="5 rows but its layer set names 4"):
        CalibrationState.load(path)


def test_selection_keeps_to_global_layers_by_default():
    """The windowed rows carry more mass (on the one image they can see), yet the default
    candidates are the global layers; `layer_kinds` opens the others."""
    rng = np.random.default_rng(3)
    observation = hybrid_observation(rng, GEMMA, 4, None)
    default = LayerSelector(top_k=2)
    assert default.select(observation.attention, observation.layers).tolist() == [5, 11]
    every = LayerSelector(top_k=2, layer_kinds=(G, S))
    chosen = every.select(observation.attention, observation.layers)
    assert all(GEMMA.kinds[row] == S for row in chosen)
    # a range is over MODEL layer indices (Qwen3.5: rows 0, 1, 2 are layers 3, 7, 11)
    ranged = LayerSelector(top_k=3, layer_range=(4, 12))
    assert ranged.candidates(QWEN35).tolist() == [1, 2]
    assert LayerSelector(layer_range=(-5, 12)).candidates(QWEN35).tolist() == [1, 2]
    assert LayerSelector().candidates(4).tolist() == [0, 1, 2, 3]  # dense: every layer


def test_selection_errors_name_what_the_model_has():
    with pytest.raises(InputError, match=r"selects no layer.*set layer_kinds to some of"):
        LayerSelector(layer_kinds=(C,)).candidates(GEMMA)
    with pytest.raises(InputError, match="layer_range \\[0, 3\\] selects no candidate"):
        LayerSelector(layer_range=(0, 3)).candidates(QWEN35)
    all_sliding = LayerSet((0, 1), (S, S))
    with pytest.raises(InputError, match="layer_kinds \\['global'\\]"):
        LayerSelector().candidates(all_sliding)


def test_layer_kinds_option_is_checked_and_used():
    with pytest.raises(ConfigError, match="unknown layer kind"):
        get_calibrator("attention_readout", layer_kinds=["linear"])
    rng = np.random.default_rng(4)
    observation = hybrid_observation(rng, GEMMA, 4, None)
    calibration = [hybrid_observation(rng, GEMMA, 4, i % 4) for i in range(8)]
    mass = get_calibrator("attention_readout", layer_selection="mass")
    default = mass.predict(observation, mass.fit(calibration))
    windowed = get_calibrator(
        "attention_readout", layer_selection="mass", layer_kinds=["global", "sliding"]
    )
    tempted = windowed.predict(observation, windowed.fit(calibration))
    assert tempted.choice == 3  # the sliding rows only see the last image
    readout = observation.attention[[5, 11]].mean(axis=0)
    assert default.choice == int(np.argmax(readout))
    # evidence selection never chooses a row whose window cuts a candidate off
    evidence = get_calibrator("attention_readout", layer_kinds=["global", "sliding"])
    state = evidence.fit(calibration)
    assert state.layer_choice is not None
    assert {GEMMA.kinds[row] for row in state.layer_choice.rows} == {G}
