"""Layer choice from calibration evidence (core/layers.py): which rows, when none, and how a
candidate's span is read."""

from __future__ import annotations

import numpy as np
import pytest

from posdebias import CalibrationState, Observation, get_calibrator
from posdebias.core.layers import RELABELINGS, choose_layers, span_masses
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
        assert choice.p_value == pytest.approx(1 / (RELABELINGS + 1))  # the smallest there is
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


def content_following_views(truths, attended, n=4):
    """Every instance in its N cyclic rotations, one attention row that looks at the option
    ``attended[g]`` (by content, whatever its position) and never at anything else."""
    masses, targets, groups = [], [], []
    for g, (truth, look) in enumerate(zip(truths, attended, strict=True)):
        for shift in range(n):  # rotation r shows content k at position (k - r) % n
            row = np.ones(n)
            row[(look - shift) % n] += 4.0
            masses.append(row[None, :])
            targets.append((truth - shift) % n)
            groups.append(g)
    return np.array(masses), np.array(targets), np.array(groups)


def test_the_chance_test_counts_instances_not_orders():
    """A row that follows one option's content through the rotations is right in all N orders
    of an instance or in none: here in 3 of 5 instances (12 of 20 views, 60% against a chance
    of 25%). Counted per instance, 3 of 5 or more happens by chance with P(Bin(5, 1/4) >= 3) =
    0.1035 (all 4^5 relabelings, exactly): not informative. Taken as 20 independent orders it
    would look like p = 0.001."""
    masses, targets, groups = content_following_views([0, 1, 2, 3, 0], [0, 1, 2, 0, 1])
    choice = choose_layers({"mean": masses}, targets, groups, np.array([0]), top_k=1)
    assert choice.accuracy == (pytest.approx(12 / 20),)
    assert choice.p_value == pytest.approx(0.103515625, abs=1e-12)
    assert not choice.informative
    alone = choose_layers({"mean": masses}, targets, np.arange(20), np.array([0]), top_k=1)
    # the same views, each its own instance: P(Bin(20, 1/4) >= 12) = 0.00094
    assert alone.p_value < 0.005 and alone.informative


def test_more_instances_agreeing_make_the_row_informative():
    """The same content-following row right in all of 8 instances: (1/4)^8 of the 4^8
    relabelings reach it (2000 drawn with a fixed seed, plus the identity: p = 1/2001)."""
    masses, targets, groups = content_following_views(list(range(4)) * 2, list(range(4)) * 2)
    choice = choose_layers({"mean": masses}, targets, groups, np.array([0]), top_k=1)
    assert choice.informative and choice.accuracy == (1.0,)
    assert choice.p_value <= 2 / 2001
    again = choose_layers({"mean": masses}, targets, groups[::-1].copy(), np.array([0]), top_k=1)
    assert again == choice  # the numbering of the instances does not matter here


def test_a_second_row_and_reading_widen_the_correction():
    """Adding a row that follows content at random raises the best null count, so the p-value
    of the same best row can only grow (the max statistic corrects for every row tried)."""
    masses, targets, groups = content_following_views([0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 0, 2])
    one = choose_layers({"mean": masses}, targets, groups, np.array([0]), top_k=1)
    noise, _, _ = content_following_views([0, 1, 2, 3, 0, 1], [1, 3, 0, 2, 2, 3])
    both = np.concatenate([masses, noise], axis=1)
    two = choose_layers({"mean": both}, targets, groups, np.array([0, 1]), top_k=1)
    assert two.rows == (0,) and two.accuracy[0] == one.accuracy[0]
    assert two.p_value > one.p_value


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


def test_a_second_reading_that_agrees_costs_nothing():
    """Options of equal length: the sum and the mean point at the same options, so the max
    statistic over both readings equals that over one (no blanket doubling)."""
    rng = np.random.default_rng(5)
    calibration = views(rng, 3, 4, 6, (2,), bias=0)
    fixed = get_calibrator("attention_guided", span_mass="mean").fit(calibration).layer_choice
    chosen = get_calibrator("attention_guided").fit(calibration).layer_choice
    assert fixed is not None and chosen is not None
    assert chosen.span_mass == "mean"  # a tie goes to the per-token reading
    assert chosen.rows == fixed.rows
    assert chosen.p_value == fixed.p_value


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


@pytest.mark.parametrize(("option", "divide"), [("evidence", True), ("mean", True), ("sum", False)])
def test_label_free_fits_its_prior_on_the_reading_it_predicts_with(option, divide):
    """Without targets no reading can be chosen by evidence: label_free reads the option's first
    (the per-token mean by default) in its fit and in its predictions alike."""
    rng = np.random.default_rng(4)
    views = length_views(rng, [0, 1, 2], per_token_truth=True)
    calibrator = get_calibrator("label_free", span_mass=option)
    state = calibrator.fit(views)
    lengths = np.stack([obs.span_lengths for obs in views])[:, None, :]
    attention = np.stack([obs.attention_matrix for obs in views])
    expected = (attention / lengths if divide else attention).mean(axis=0)
    np.testing.assert_allclose(state.attention_prior_array, expected, rtol=1e-12)
    assert calibrator.options.reading(state) == ("mean" if divide else "sum")


@pytest.mark.parametrize(("fitted", "used"), [("sum", "mean"), ("mean", "sum")])
def test_a_state_whose_reading_contradicts_the_options_is_refused(fitted, used):
    from posdebias.errors import CalibrationError

    rng = np.random.default_rng(8)
    calibration = length_views(rng, [0, 1, 2], per_token_truth=True)
    state = get_calibrator("purified_attention", span_mass=fitted).fit(calibration)
    other = get_calibrator("purified_attention", span_mass=used)
    with pytest.raises(CalibrationError, match=f"reading span_mass '{fitted}'"):
        other.predict(calibration[0], state)
    # the default reads whatever the evidence recorded; a record removed by hand is refused
    evidence = get_calibrator("purified_attention")
    assert evidence.options.reading(state) == fitted
    saved = state.model_dump(mode="json")
    saved["layer_choice"]["span_mass"] = None
    with pytest.raises(CalibrationError, match="records no span_mass reading"):
        evidence.predict(calibration[0], CalibrationState.model_validate(saved))


def test_without_span_lengths_the_sum_is_recorded_and_a_mixed_set_is_refused():
    from dataclasses import replace

    from posdebias.errors import InputError

    rng = np.random.default_rng(9)
    calibration = length_views(rng, [0, 1, 2], per_token_truth=False)
    bare = [replace(obs, span_lengths=None) for obs in calibration]
    state = get_calibrator("attention_guided").fit(bare)
    assert state.layer_choice is not None and state.layer_choice.span_mass == "sum"
    mixed = bare[:-1] + calibration[-1:]
    with pytest.raises(InputError, match="span_lengths and others do not"):
        get_calibrator("attention_guided").fit(mixed)


@pytest.mark.parametrize("ids", ["", "same", "distinct"])
def test_calibration_instances_without_distinct_ids_still_count_one_by_one(ids):
    """Instances an API caller leaves without ids (or with one id for all) are told apart by
    their place, not merged into one instance whose test could never pass."""
    from dataclasses import replace

    from posdebias import Debiaser
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances

    instances = synthetic_instances(12, 4, 0, "cal")
    if ids != "distinct":
        instances = [replace(instance, id=ids) for instance in instances]
    debiaser = Debiaser(SyntheticAdapter(), "attention_guided")
    state = debiaser.calibrate(instances)
    assert state.layer_choice is not None and state.layer_choice.informative
    assert state.layer_choice.p_value < 0.01


def test_the_choice_does_not_depend_on_the_order_of_the_views_even_at_exact_ties():
    """Masses on a coarse grid tie exactly: the prior is summed in sorted order, so shuffling
    the calibration set leaves the whole state unchanged."""
    rng = np.random.default_rng(12)
    views = []
    for k in range(12):
        for shift in range(4):
            attention = np.round(rng.random((3, 4)) * 8) / 8 + 0.125 + 0.01 * np.arange(3)[:, None]
            views.append(
                Observation(
                    label_logprobs=log_softmax(np.zeros(4)),
                    attention=attention,
                    target=shift,
                    span_lengths=np.array([1, 2, 1, 3]),
                    instance_id=f"q{k}",
                )
            )
    calibrator = get_calibrator("attention_guided")
    first = calibrator.fit(views).model_dump(mode="json")
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(len(views))
        again = calibrator.fit([views[i] for i in order]).model_dump(mode="json")
        assert again["layer_choice"] == first["layer_choice"]
        np.testing.assert_allclose(again["attention_prior"], first["attention_prior"], rtol=0)
