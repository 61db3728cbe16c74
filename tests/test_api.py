"""The Debiaser library API and the `rank` command on the simulated model."""

from __future__ import annotations

import numpy as np
import pytest

import posdebias
from posdebias.adapters.synthetic import SyntheticAdapter, synthetic_instances
from posdebias.api import Debiaser
from posdebias.cli import main
from posdebias.errors import CalibrationError


def test_calibrate_save_load_rank(tmp_path):
    adapter = SyntheticAdapter()
    debiaser = Debiaser(adapter)
    state = debiaser.calibrate(synthetic_instances(5, 4, seed=11))
    assert state.calibrator == "attention_guided" and state.num_observations == 20
    path = debiaser.save(tmp_path / "cal.json")

    loaded = Debiaser.load(path, adapter)
    test = synthetic_instances(40, 4, seed=12)
    vanilla_right = guided_right = 0
    for instance in test:
        prediction = loaded.rank(instance.query, instance.images)
        assert np.isclose(prediction.probabilities.sum(), 1.0)
        # the same answer as the calibrator on the observation of the instance itself
        observation = adapter.observe(instance)
        expected = loaded.calibrator.predict(observation, loaded.state).choice
        assert prediction.choice == expected
        guided_right += prediction.choice == instance.target
        vanilla_right += int(np.argmax(observation.label_logprobs)) == instance.target
    assert guided_right > vanilla_right


def test_rank_needs_calibration_and_matching_n():
    adapter = SyntheticAdapter()
    debiaser = Debiaser(adapter)
    with pytest.raises(CalibrationError, match="not calibrated"):
        debiaser.rank("q", ["a", "b", "c", "d"])
    debiaser.calibrate(synthetic_instances(2, 4))
    with pytest.raises(CalibrationError, match="N=4 images, not N=3"):
        debiaser.rank("q", ["a", "b", "c"])


def test_permutation_average_debiaser_runs_the_rotations():
    debiaser = Debiaser(SyntheticAdapter(), "permutation_average")
    debiaser.calibrate(synthetic_instances(1, 4))
    images = [f"img{k}" for k in range(4)]
    chosen = debiaser.rank("q", images).choice
    rotated = images[1:] + images[:1]
    assert rotated[debiaser.rank("q", rotated).choice] == images[chosen]


def test_rank_command(tmp_path, capsys):
    states = tmp_path / "cal.json"
    assert (
        main(
            [
                "calibrate",
                "--adapter",
                "synthetic",
                "--calibrators",
                "attention_guided",
                "--out",
                str(states),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "rank",
                "--calibration",
                str(states),
                "--adapter",
                "synthetic",
                "a red circle",
                "a.png",
                "b.png",
                "c.png",
                "d.png",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    # the printed distribution is the Debiaser's own, and the mark sits on its argmax
    images = ["a.png", "b.png", "c.png", "d.png"]
    adapter = posdebias.get_registry().create_adapter("synthetic")
    expected = Debiaser.load(states, adapter).rank("a red circle", images)
    rows = {line.split("│")[2].strip(): line for line in out.splitlines() if ".png" in line}
    assert list(rows) == images
    for image, probability in zip(images, expected.probabilities, strict=True):
        assert f"{probability:.4f}" in rows[image]
    assert out.count("<- chosen") == 1 and "<- chosen" in rows[images[expected.choice]]
    assert expected.choice == int(np.argmax(expected.probabilities))


def test_rank_with_a_state_from_another_adapter_is_refused(tmp_path, capsys):
    state = Debiaser(SyntheticAdapter()).calibrate(synthetic_instances(2, 4))
    path = state.with_metadata(adapter="llava").save(tmp_path / "cal.json")
    assert (
        main(
            ["rank", "--calibration", str(path), "--adapter", "synthetic", "q", "a", "b", "c", "d"]
        )
        == 2
    )
    assert "made with adapter 'llava', not 'synthetic'" in capsys.readouterr().err
