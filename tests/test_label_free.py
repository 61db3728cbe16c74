"""label_free: calibration without targets (EM over the cyclic rotations of each instance)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posdebias import get_calibrator
from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
from posdebias.api import CalibrationWarning, Debiaser
from posdebias.calibrators.label_free import attention_consistency, rotation_positions
from posdebias.cli import main
from posdebias.core.observation import Observation, log_softmax
from posdebias.core.symmetry import symmetrized_calibration_set
from posdebias.errors import InputError


def observe_rotations(adapter, instances):
    return adapter.observe_many(symmetrized_calibration_set(instances))


@st.composite
def noise_free_models(draw):
    n = draw(st.integers(2, 8))
    bias = draw(
        st.lists(
            st.lists(st.floats(-3, 3, allow_nan=False), min_size=n, max_size=n),
            min_size=n,
            max_size=n,
        )
    )
    # sinks no stronger than the attention's evidence, and at most 1: a stronger sink inside each
    # layer's softmax does not cancel from the product over the rotations, and the attention
    # itself points at a wrong candidate in a few fits at any N (docs/method.md, label_free)
    sink_strength = draw(st.floats(0, 1))
    options = dict(
        bias=bias,
        noise=0.0,
        content_noise=0.0,
        logit_evidence=draw(st.floats(0, 3)),
        attention_evidence=draw(st.floats(max(0.5, sink_strength), 4)),
        sink_strength=sink_strength,
        num_layers=draw(st.integers(2, 6)),
        seed=draw(st.integers(0, 1000)),
    )
    return options, draw(st.integers(1, 5)), n, draw(st.integers(0, 99))


@given(noise_free_models())
def test_noise_free_observations_give_the_labelled_bias_matrix(model):
    options, m, n, seed = model
    adapter = SyntheticAdapter(**options)
    instances = synthetic_instances(m, n, seed=seed)
    observations = observe_rotations(adapter, instances)
    labelled = get_calibrator("attention_guided").fit(observations)
    # the consistency check is per rotation; positional sinks can fool it where the product
    # over the rotations (what the fit uses) still finds the image: the check is off
    # likewise the shift check: with an arbitrary bias the scores need not favour the truth
    free = get_calibrator("label_free", min_consistency=-1, check_shift=False).fit(observations)
    assert free.diagnostics["attention_informative"] is True
    np.testing.assert_allclose(free.bias_matrix, labelled.bias_matrix, atol=1e-9)
    np.testing.assert_allclose(free.observed_profile, labelled.observed_profile, atol=1e-9)
    np.testing.assert_allclose(free.attention_prior, labelled.attention_prior)
    # the soft targets found every instance's true image
    targets = np.array(free.diagnostics["soft_targets"])
    assert np.argmax(targets, axis=1).tolist() == [i.target for i in instances]


def test_the_fit_never_sees_the_targets():
    adapter = SyntheticAdapter()
    observations = observe_rotations(adapter, synthetic_instances(5, 4, seed=3))
    hidden = [Observation(o.label_logprobs, o.attention) for o in observations]
    # wrong targets change nothing either
    wrong = [Observation(o.label_logprobs, o.attention, (o.target + 1) % 4) for o in observations]
    states = [get_calibrator("label_free").fit(obs) for obs in (observations, hidden, wrong)]
    assert states[0].to_json() == states[1].to_json() == states[2].to_json()


@pytest.mark.parametrize("n", [4, 8])
def test_accuracy_within_two_points_of_labelled_and_better_with_more(n):
    adapter = SyntheticAdapter()
    pool = synthetic_instances(20, n, seed=40 + n, prefix="cal")
    test = synthetic_instances(150, n, seed=50 + n, prefix="test")
    test_observations = adapter.observe_many(test)

    def accuracy(name, instances):
        calibrator = get_calibrator(name)
        state = calibrator.fit(observe_rotations(adapter, instances))
        choices = [calibrator.predict(o, state).choice for o in test_observations]
        return 100 * np.mean([c == i.target for c, i in zip(choices, test, strict=True)])

    labelled = accuracy("attention_guided", pool[:5])
    unlabelled = [replace(i, target=None) for i in pool]
    assert accuracy("label_free", unlabelled[:5]) >= labelled - 2
    assert accuracy("label_free", unlabelled) >= labelled
    assert accuracy("vanilla", pool[:5]) < labelled - 10  # the correction matters here


@pytest.mark.parametrize(
    "options",
    [
        {"informative_layers": [], "attention_evidence": 0.0},  # attention: positional only
        {"attention_evidence": 0.0, "content_noise": 0.0},  # attention: noise around the sinks
    ],
)
def test_uninformative_attention_is_reported_not_fitted(options, tmp_path):
    adapter = SyntheticAdapter(**options)
    instances = synthetic_instances(5, 4, seed=8)
    observations = observe_rotations(adapter, instances)
    state = get_calibrator("label_free").fit(observations)
    assert state.diagnostics["attention_informative"] is False
    assert state.diagnostics["attention_consistency"] < 0.25
    assert "uninformative" in state.diagnostics["warning"]
    # no conditional profile fitted to noise: the static logit prior (PriDe), whatever pi says
    pride = get_calibrator("pride").fit(observations)
    bias = np.array(state.bias_matrix)
    np.testing.assert_allclose(bias, np.tile(pride.logit_prior, (4, 1)))
    observation = adapter.observe(synthetic_instances(1, 4, seed=9)[0])
    np.testing.assert_allclose(
        get_calibrator("label_free").predict(observation, state).scores,
        get_calibrator("pride").predict(observation, pride).scores,
    )
    with pytest.warns(CalibrationWarning, match="label_free: attention is uninformative"):
        Debiaser(adapter, "label_free").calibrate(instances)


def test_the_report_and_the_cli_show_the_diagnostic(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "adapter": {
                    "name": "synthetic",
                    "options": {"informative_layers": [], "attention_evidence": 0.0},
                },
                "calibrators": ["label_free", "attention_guided"],
                "count": 20,
                "orders": 2,
            }
        )
    )
    out = tmp_path / "run"
    assert main(["evaluate", "--config", str(config), "--out", str(out)]) == 0
    assert "warning: label_free: attention is uninformative" in capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert results["calibrators"]["label_free"]["diagnostics"]["attention_informative"] is False
    # the method says only what its own layer choice found (here: no layer beats chance)
    assert "attention_informative" not in results["calibrators"]["attention_guided"]["diagnostics"]
    report = (out / "report.md").read_text()
    assert "## Calibration warnings" in report and "**label_free**: attention is" in report


def test_informative_attention_has_no_warning():
    state = Debiaser(SyntheticAdapter(), "label_free")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fitted = state.calibrate([replace(i, target=None) for i in synthetic_instances(5, 4)])
    assert "warning" not in fitted.diagnostics and fitted.diagnostics["converged"] is True


def test_the_rotations_of_every_instance_are_needed():
    observations = observe_rotations(SyntheticAdapter(), synthetic_instances(2, 4))
    with pytest.raises(InputError, match="needs the N=4 cyclic rotations"):
        get_calibrator("label_free").fit(observations[:-1])


def test_consistency_is_one_for_content_and_negative_for_position():
    n = 4
    positions = rotation_positions(n)
    on_image = np.full((3, n, n), -5.0)
    for r in range(n):
        on_image[:, r, positions[r, 2]] = 0.0  # every rotation points at base image 2
    assert attention_consistency(log_softmax(on_image)) == pytest.approx(1.0)
    on_position = np.full((3, n, n), -5.0)
    on_position[:, :, 0] = 0.0  # every rotation points at position 1, a different image each:
    # positional, so removed; nothing is left (ties go to position 1): below chance
    assert attention_consistency(log_softmax(on_position)) == pytest.approx(-1 / (n - 1))
    rng = np.random.default_rng(0)
    noise = rng.normal(size=(200, n, n))  # points at images at random
    assert abs(attention_consistency(noise)) < 0.05
    skewed = on_image + on_position + 0.01 * rng.normal(size=(3, n, n))  # both: image wins
    assert attention_consistency(skewed) == pytest.approx(1.0)


def test_attention_shifted_by_one_image_is_reported_and_not_fitted():
    """Attention that consistently singles out the image after the truth passes the
    consistency check, and the EM would fit a confidently wrong profile; the score check
    catches it and falls back to the static prior."""
    adapter = SyntheticAdapter(attention_shift=1)
    instances = synthetic_instances(5, 4, seed=8)
    observations = observe_rotations(adapter, instances)
    unchecked = get_calibrator("label_free", check_shift=False).fit(observations)
    assert unchecked.diagnostics["attention_informative"] is True  # the old check passes
    found = np.argmax(unchecked.diagnostics["soft_targets"], axis=1)
    assert found.tolist() == [(i.target + 1) % 4 for i in instances]  # one image off
    state = get_calibrator("label_free").fit(observations)
    diagnostics = state.diagnostics
    assert diagnostics["attention_informative"] is False and diagnostics["attention_shift"] == 1
    assert diagnostics["score_agreement_by_offset"][1] >= 0.5 > diagnostics["score_agreement"]
    assert "attention looks shifted" in diagnostics["warning"]
    pride = get_calibrator("pride").fit(observations)
    np.testing.assert_allclose(np.array(state.bias_matrix), np.tile(pride.logit_prior, (4, 1)))
    clean = get_calibrator("label_free").fit(observe_rotations(SyntheticAdapter(), instances))
    assert clean.diagnostics["attention_shift"] == 0
    assert clean.diagnostics["score_agreement"] >= 0.8


def test_shifted_attention_diagnostic_in_results_and_report(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        json.dumps(
            {
                "adapter": {"name": "synthetic", "options": {"attention_shift": 1}},
                "calibrators": ["label_free", "pride"],
                "count": 40,
                "orders": 2,
            }
        )
    )
    out = tmp_path / "run"
    assert main(["evaluate", "--config", str(config), "--out", str(out)]) == 0
    assert "warning: label_free: attention looks shifted" in capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    diagnostics = results["calibrators"]["label_free"]["diagnostics"]
    assert diagnostics["attention_shift"] == 1 and diagnostics["attention_informative"] is False
    report = (out / "report.md").read_text()
    assert "**label_free**: attention looks shifted" in report
    metrics = {k: v["metrics"]["accuracy_mean"] for k, v in results["calibrators"].items()}
    assert metrics["label_free"] == metrics["pride"]  # the fallback is PriDe's prediction
