"""Layer choice from calibration evidence (core/layers.py): which rows, when none, and how a
candidate's span is read."""

from __future__ import annotations

import numpy as np
import pytest

from posdebias import CalibrationState, Observation, get_calibrator
from posdebias.core.layers import _binomial_tail, choose_layers, span_masses
from posdebias.core.observation import log_softmax
from posdebias.core.stages import Corrector


def views(rng, instances: int, n: int, layers: int, informative: tuple[int, ...], bias: int):
    """Instance-major cyclic views: rows in ``informative`` put 3x mass on the truth, the
    others are noise; the answer always says position ``bias``."""
    out = []
    for _ in range(instances):
        for shift in range(n):
            target = shift
            attention = rng.random((layers, n)) + 0.05
            for row in informative:
                attention[row, target] *= 3
            scores = np.full(n, -3.0)
            scores[bias] = 0.0
            scores[target] += 0.5
            out.append(
                Observation(
                    label_logprobs=log_softmax(scores),
                    attention=attention,
                    target=target,
                    span_lengths=np.full(n, 2),
                )
            )
    return out


def test_binomial_tail_is_exact():
    assert _binomial_tail(3, 4, 0.25) == pytest.approx(4 * 0.25**3 * 0.75 + 0.25**4, abs=1e-15)
    assert _binomial_tail(0, 10, 0.5) == 1.0
    assert _binomial_tail(10, 10, 0.5) == pytest.approx(0.5**10, rel=1e-12)


@pytest.mark.parametrize(("rows", "informative"), [((3,), (3,)), ((1, 6), (1, 6)), ((), ())])
def test_evidence_chooses_the_rows_that_point_at_the_truth(rows, informative):
    rng = np.random.default_rng(7)
    calibration = views(rng, 10, 4, 8, rows, bias=0)
    state = get_calibrator("purified_attention", top_k=max(1, len(rows))).fit(calibration)
    choice = state.layer_choice
    assert choice is not None
    assert choice.views == 40
    assert choice.informative == bool(informative)
    if informative:
        assert tuple(choice.rows) == informative
        assert choice.p_value < 1e-6
        assert "warning" not in state.diagnostics
    else:
        assert choice.p_value >= 0.05
        assert "no attention layer" in state.diagnostics["warning"]


def test_method_falls_back_to_the_answers_own_calibration_without_evidence():
    rng = np.random.default_rng(3)
    calibration = views(rng, 8, 4, 6, (), bias=1)
    test = views(rng, 3, 4, 6, (), bias=1)
    method = get_calibrator("attention_guided")
    pride = get_calibrator("pride")
    state, pride_state = method.fit(calibration), pride.fit(calibration)
    assert state.layer_choice is not None and not state.layer_choice.informative
    for observation in test:
        np.testing.assert_allclose(
            method.predict(observation, state).scores,
            pride.predict(observation, pride_state).scores,
            atol=1e-12,
        )
    # without the fallback the posterior of noise is used, and the scores differ
    noisy = get_calibrator("attention_guided", fallback=False)
    noisy_state = noisy.fit(calibration)
    assert any(
        not np.allclose(
            noisy.predict(obs, noisy_state).scores, pride.predict(obs, pride_state).scores
        )
        for obs in test
    )


def test_each_view_is_scored_against_the_other_instances_prior():
    """Row 0 points at the truth in instance 1 only; row 1 nowhere. With the prior of the other
    instance, instance 1's four views are right in row 0 (4 of 8), and the chance-level rows
    tie with the posterior mass deciding."""
    masses = np.ones((8, 2, 4))
    masses[:, :, 0] += 0.01  # a slight pull to position 0 in every view and row
    targets = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    groups = np.repeat([0, 1], 4)
    masses[4 + np.arange(4), 0, targets[4:]] = 5.0
    choice = choose_layers(masses, targets, groups, np.array([0, 1]), top_k=1, span_mass="mean")
    # row 0: instance 0's views see instance 1's prior (high everywhere the truth went):
    # position 0's slight pull wins once (target 0); instance 1's four views are right
    assert choice.accuracy[0] == pytest.approx(5 / 8)
    assert choice.accuracy[1] == pytest.approx(2 / 8)  # position 0 wins: right when target 0
    assert choice.rows == (0,)
    assert choice.p_value == pytest.approx(min(1.0, 2 * _binomial_tail(5, 8, 0.25)))
    assert not choice.informative


def test_span_mass_mean_removes_the_length_advantage():
    """Equal attention per token on options of 1, 1, 1 and 3 tokens: summed, the long option
    takes 0.988 of the posterior (tau 5, uniform prior); read per token, none is favoured."""
    attention = np.array([[0.1, 0.1, 0.1, 0.3]])
    lengths = np.array([1, 1, 1, 3])
    corrector = Corrector()
    prior = np.full((1, 4), 1.0)
    rows = np.array([0])
    summed = corrector.visual_posterior(
        corrector.purified_log_attention(span_masses(attention, lengths, "sum"), prior, rows)
    )
    per_token = corrector.visual_posterior(
        corrector.purified_log_attention(span_masses(attention, lengths, "mean"), prior, rows)
    )
    assert summed[3] == pytest.approx(0.988, abs=5e-4)
    np.testing.assert_allclose(per_token, 0.25)
    assert span_masses(attention, None, "mean") is attention  # no lengths: read as summed


def test_layer_choice_survives_a_saved_state(tmp_path):
    rng = np.random.default_rng(1)
    state = get_calibrator("attention_guided").fit(views(rng, 5, 4, 6, (2,), bias=0))
    path = state.save(tmp_path / "state.json")
    loaded = CalibrationState.load(path)
    assert loaded.layer_choice == state.layer_choice
    assert loaded.layer_choice is not None and 2 in loaded.layer_choice.rows


def test_observation_span_lengths_are_checked_and_rotate():
    obs = Observation(label_logprobs=log_softmax(np.zeros(3)), span_lengths=[1, 2, 3])
    assert obs.rotated(1).span_lengths.tolist() == [2, 3, 1]
    assert Observation.from_dict(obs.to_dict()).span_lengths.tolist() == [1, 2, 3]
    for bad in ([1, 2], [0, 1, 1], [1.5, 1, 1]):
        with pytest.raises(Exception, match="span_lengths"):
            Observation(label_logprobs=log_softmax(np.zeros(3)), span_lengths=bad)


def length_views(rng, truths, *, per_token_truth: bool):
    """Cyclic views of options 1, 1, 1 and 4 tokens long (content 3 is the long one; it moves
    with the rotation), one instance per truth. Row 0 puts its attention on the truth: per token
    when ``per_token_truth`` (so the sum favours the long option over a short truth), else in
    total (so the mean disfavours a long truth). Row 1 is noise."""
    out = []
    n = 4
    for truth in truths:
        for shift in range(n):
            order = [(i + shift) % n for i in range(n)]
            lengths = np.array([4 if c == 3 else 1 for c in order])
            target = order.index(truth)
            per_token = np.full(n, 0.05)
            per_token[target] = 0.12
            row0 = per_token * lengths if per_token_truth else per_token.copy()
            row1 = (rng.random(n) + 0.5) * lengths
            out.append(
                Observation(
                    label_logprobs=log_softmax(np.zeros(n)),
                    attention=np.stack([row0, row1]),
                    target=target,
                    span_lengths=lengths,
                )
            )
    return out


@pytest.mark.parametrize(("per_token_truth", "reading"), [(True, "mean"), (False, "sum")])
def test_the_evidence_chooses_how_a_candidates_attention_is_read(per_token_truth, reading):
    """On calibration views whose truth shows only under one reading, the default finds that
    reading, the state records it, and predictions read the test views the same way."""
    rng = np.random.default_rng(11)
    # the truth is never the long option where the attention is per token: a long truth would
    # win under both readings there and tell them apart nowhere
    truths = [0, 1, 2] if per_token_truth else [0, 1, 2, 3]
    calibration = length_views(rng, truths * 2, per_token_truth=per_token_truth)
    test = length_views(rng, truths, per_token_truth=per_token_truth)
    calibrator = get_calibrator("purified_attention", top_k=1)
    state = calibrator.fit(calibration)
    choice = state.layer_choice
    assert choice is not None and choice.span_mass == reading and choice.rows == [0]
    assert choice.informative
    assert all(calibrator.predict(obs, state).choice == obs.target for obs in test)
    # the other fixed reading misses the truth in some test views
    other = get_calibrator(
        "purified_attention", top_k=1, span_mass="sum" if reading == "mean" else "mean"
    )
    other_state = other.fit(calibration)
    assert sum(other.predict(obs, other_state).choice == obs.target for obs in test) < len(test)


def test_trying_two_readings_doubles_the_chance_correction():
    rng = np.random.default_rng(5)
    calibration = views(rng, 3, 4, 6, (2,), bias=0)  # equal lengths: both readings tie
    fixed = get_calibrator("attention_guided", span_mass="mean").fit(calibration).layer_choice
    chosen = get_calibrator("attention_guided").fit(calibration).layer_choice
    assert fixed is not None and chosen is not None
    assert chosen.span_mass == "mean"  # a tie goes to the per-token reading
    assert chosen.rows == fixed.rows
    assert chosen.p_value == pytest.approx(min(1.0, 2 * fixed.p_value), rel=1e-12)


@pytest.mark.parametrize("option", ["sum", "mean"])
def test_a_state_saved_before_the_reading_was_chosen_reads_as_its_option(option):
    rng = np.random.default_rng(2)
    calibration = views(rng, 4, 4, 6, (2,), bias=0)
    calibrator = get_calibrator("attention_guided", span_mass=option)
    saved = calibrator.fit(calibration).model_dump(mode="json")
    del saved["layer_choice"]["span_mass"]
    state = CalibrationState.model_validate(saved)
    assert state.layer_choice is not None and state.layer_choice.span_mass is None
    assert calibrator.options.reading(state) == option


def test_mass_selection_reads_the_papers_sum_by_default():
    options = get_calibrator("attention_guided", layer_selection="mass").options
    assert options.readings() == ("sum",) and options.reading() == "sum"
    assert get_calibrator("attention_guided").options.readings() == ("mean", "sum")
