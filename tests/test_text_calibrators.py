"""Contextual calibration (Zhao et al. 2021) and batch calibration (Zhou et al. 2024): equal to
the papers' formulas on hand-made inputs, and in real runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

import posdebias.defaults as defaults
from posdebias import Observation, get_calibrator
from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
from posdebias.api import Debiaser
from posdebias.calibrators.contextual import content_free
from posdebias.cli import main
from posdebias.core.symmetry import symmetrized_calibration_set
from posdebias.errors import ConfigError, InputError
from posdebias.evaluation.runner import fit_calibrators, scored_views


def observation(probabilities):
    return Observation(label_logprobs=np.log(np.asarray(probabilities, dtype=float)))


def test_contextual_is_softmax_of_w_p_with_w_the_inverse_content_free_distribution():
    content_free_inputs = [observation([0.5, 0.3, 0.2]), observation([0.7, 0.1, 0.2])]
    state = get_calibrator("contextual").fit(content_free_inputs)
    p_cf = np.array([0.6, 0.2, 0.2])  # the mean of the two distributions, by hand
    np.testing.assert_allclose(np.exp(state.logit_prior), p_cf)
    p = np.array([0.5, 0.3, 0.2])
    w = np.diag(1 / p_cf)
    q = np.exp(w @ p) / np.exp(w @ p).sum()  # q = softmax(W p + b), b = 0
    prediction = get_calibrator("contextual").predict(observation(p), state)
    np.testing.assert_allclose(prediction.probabilities, q)
    assert prediction.choice == 1  # 0.3 / 0.2 beats 0.5 / 0.6: the prior is divided out
    assert np.argmax(p) == 0


def test_contextual_default_is_zhaos_ensemble_of_three_content_free_inputs():
    calibrator = get_calibrator("contextual")
    assert calibrator.options.texts == ["N/A", "", "[MASK]"]
    # Zhao et al.'s code: p_cf = the mean of the label distributions of "N/A", "" and "[MASK]"
    na, empty, mask = [0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.8, 0.1, 0.1]
    state = calibrator.fit([observation(na), observation(empty), observation(mask)])
    p_cf = np.array([1.5, 0.6, 0.9]) / 3
    np.testing.assert_allclose(np.exp(state.logit_prior), p_cf)
    p = np.array([0.4, 0.35, 0.25])
    q = np.exp(p / p_cf) / np.exp(p / p_cf).sum()  # softmax(diag(p_cf)^-1 p)
    prediction = calibrator.predict(observation(p), state)
    np.testing.assert_allclose(prediction.probabilities, q)
    assert prediction.choice == 1  # 0.35 / 0.2 beats 0.4 / 0.5 and 0.25 / 0.3
    # "N/A" alone (the paper's example) gives another p_cf, and here another answer
    alone = calibrator.fit([observation(na)])
    assert calibrator.predict(observation(p), alone).choice == 2  # 0.25 / 0.2 is largest


@pytest.mark.parametrize("texts", [[""], ["N/A", ""], ["", "[MASK]", "none"]])
def test_contextual_accepts_the_empty_string_as_a_content_free_stem(texts):
    adapter = SyntheticAdapter()
    instances = synthetic_instances(2, 3, seed=4)
    states = fit_calibrators(
        adapter, {"contextual": get_calibrator("contextual", texts=texts)}, instances
    )
    assert states["contextual"].diagnostics["content_free_views"] == 2 * 3 * len(texts)
    view = content_free(instances[0], "")
    assert view.stem == "" and view.target is None and view.content_free
    assert view.rotated(1).content_free and view.rotated(1).stem == ""


@pytest.mark.parametrize(
    ("texts", "message"),
    [([], "at least one"), ([" "], "only whitespace"), (["N/A", "N/A"], "repeat")],
)
def test_contextual_refuses_unusable_text_lists(texts, message):
    with pytest.raises(ConfigError, match=message):
        get_calibrator("contextual", texts=texts)


def test_an_ordinary_instance_still_needs_a_stem():
    with pytest.raises(InputError, match="stem"):
        synthetic_instances(1, 3, seed=0)[0].__class__(stem="", images=("a.png", "b.png"))


BATCH = [[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.7, 0.2, 0.1]]


def test_batch_calibration_default_subtracts_the_batch_mean_of_the_log_scores():
    """Zhou et al., Eqs. 1-2: p^(y|C) = mean_i of the scores, the prediction argmax of the score
    minus it; the scores are log-probabilities."""
    batch = [observation(p) for p in BATCH]
    calibrator = get_calibrator("batch")
    state = calibrator.fit(batch)
    log_scores = np.log(np.array(BATCH))
    mean = log_scores.mean(axis=0)  # by hand: (log 0.6 + log 0.2 + log 0.7) / 3, ...
    np.testing.assert_allclose(state.logit_prior, mean)
    np.testing.assert_allclose(mean[0], (np.log(0.6) + np.log(0.2) + np.log(0.7)) / 3)
    for row, item in zip(log_scores, batch, strict=True):
        shifted = row - mean
        expected = shifted - np.log(np.exp(shifted).sum())
        np.testing.assert_allclose(calibrator.predict(item, state).scores, expected)
    # the two definitions disagree on these numbers: (0.3, 0.35, 0.35) is label 2 under the
    # mean log-score (geometric means 0.438, 0.229, 0.182) and label 1 under the mean
    # probability (0.5, 0.233, 0.267)
    probe = observation([0.3, 0.35, 0.35])
    assert calibrator.predict(probe, state).choice == 2
    prob = get_calibrator("batch", average="prob")
    assert prob.predict(probe, prob.fit(batch)).choice == 1


def test_batch_calibration_prob_option_divides_out_the_mean_distribution():
    batch = [observation(p) for p in BATCH]
    calibrator = get_calibrator("batch", average="prob")
    state = calibrator.fit(batch)
    p_bc = np.array([1.5, 0.7, 0.8]) / 3  # mean_i p_i(j), by hand
    np.testing.assert_allclose(np.exp(state.logit_prior), p_bc)
    for item in batch:
        scores = item.label_logprobs - np.log(p_bc)  # score_j - log mean_i p_i(j)
        expected = scores - np.log(np.exp(scores).sum())
        np.testing.assert_allclose(calibrator.predict(item, state).scores, expected)
    assert calibrator.predict(batch[0], state).choice == 1  # 0.3 / 0.233 > 0.6 / 0.5


def test_contextual_fits_on_content_free_views_of_the_calibration_rotations():
    adapter = SyntheticAdapter()
    instances = synthetic_instances(3, 4, seed=1)
    calibrator = get_calibrator("contextual", texts=["N/A", "[MASK]"])
    states = fit_calibrators(adapter, {"contextual": calibrator}, instances)
    symmetrized = symmetrized_calibration_set(instances)
    views = [content_free(view, text) for text in ("N/A", "[MASK]") for view in symmetrized]
    assert all(view.stem in ("N/A", "[MASK]") and view.target is None for view in views)
    assert [v.candidate_ids for v in views[:12]] == [v.candidate_ids for v in symmetrized]
    by_hand = get_calibrator("contextual").fit(adapter.observe_many(views))
    np.testing.assert_allclose(states["contextual"].logit_prior, by_hand.logit_prior)
    assert states["contextual"].diagnostics["content_free_views"] == 24
    with pytest.raises(ConfigError, match="content-free text"):
        get_calibrator("contextual", texts=[" "])


def test_batch_fits_on_every_test_view_when_the_run_knows_them():
    adapter = SyntheticAdapter()
    calibration = synthetic_instances(2, 4, seed=1)
    test = synthetic_instances(5, 4, seed=2, prefix="t")
    views = scored_views(test, 3, 0)
    states = fit_calibrators(
        adapter, {"batch": get_calibrator("batch")}, calibration, test_views=views
    )
    by_hand = get_calibrator("batch").fit(adapter.observe_many(views))
    np.testing.assert_allclose(states["batch"].logit_prior, by_hand.logit_prior)
    assert states["batch"].diagnostics["batch_views"] == 15
    # the library without a test set: the batch is the calibration instances' rotations
    state = Debiaser(adapter, "batch").calibrate(calibration)
    rotations = adapter.observe_many(symmetrized_calibration_set(calibration))
    np.testing.assert_allclose(
        state.logit_prior, get_calibrator("batch").fit(rotations).logit_prior
    )


def _run(tmp_path, name, *args):
    out = tmp_path / name
    assert main(["evaluate", *map(str, args), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    return results, (out / "records.jsonl").read_text()


def test_selected_in_the_synthetic_pipeline_batch_size_independent(tmp_path):
    args = ["--adapter", "synthetic", "--calibrators", "vanilla,contextual,batch"]
    args += ["--count", "12", "--orders", "3"]
    one, records_one = _run(tmp_path, "b1", *args, "--batch-size", "1")
    seven, records_seven = _run(tmp_path, "b7", *args, "--batch-size", "7")
    assert records_one == records_seven
    assert one["calibrators"]["batch"]["metrics"] == seven["calibrators"]["batch"]["metrics"]
    assert one["calibrators"]["batch"]["diagnostics"]["batch_views"] == 12 * 3


def test_selected_in_the_organism_pipeline(tmp_path):
    results, _ = _run(
        tmp_path,
        "organism",
        "--calibrators",
        "vanilla,contextual,batch",
        "--count",
        "8",
        "--orders",
        "2",
    )
    rows = results["calibrators"]
    assert set(rows) == {"vanilla", "contextual", "batch"}
    assert rows["batch"]["diagnostics"]["batch_views"] == 16
    # M instances x 4 rotations x 3 content-free texts
    assert rows["contextual"]["diagnostics"]["content_free_views"] == (
        defaults.CALIBRATION_COUNT * 4 * 3
    )
