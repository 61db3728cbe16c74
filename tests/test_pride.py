"""PriDe (Zheng et al., ICLR 2024) as its paper defines it: label-free, its prior and its
permutation-based debiasing equal to the paper's formulas on fixed numbers, and its own
workflow (a share alpha of the test items answered by cyclic permutation averaging, whose prior
debiases the rest) in `posdebias evaluate` and in the API."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from posdebias import Observation, get_calibrator
from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
from posdebias.api import Debiaser
from posdebias.calibrators.pride import estimation_ids
from posdebias.cli import main
from posdebias.core.instance import rotation_order
from posdebias.errors import ConfigError
from posdebias.evaluation.metrics import compute_metrics
from posdebias.evaluation.runner import Evaluator, fit_calibrators, scored_views

# one 3-option question in its 3 cyclic permutations: row r is P_observed(o_i | x^{I_r}),
# where in permutation r position i shows option (i + r) % 3
OBSERVED = np.array([[0.6, 0.3, 0.1], [0.5, 0.1, 0.4], [0.7, 0.2, 0.1]])


def observation(probabilities, target=None):
    return Observation(label_logprobs=np.log(np.asarray(probabilities, dtype=float)), target=target)


def pride_prior(observed: np.ndarray) -> np.ndarray:
    """PriDe's estimate: P_prior(o_i) = softmax_i of the mean over the cyclic permutations of
    log P_observed(o_i | x^I) (the contents cancel: each visits every position once)."""
    mean = np.log(observed).mean(axis=0)
    return np.exp(mean) / np.exp(mean).sum()


def test_the_prior_and_the_debiased_distribution_are_pride_s():
    calibrator = get_calibrator("pride")
    state = calibrator.fit([observation(p) for p in OBSERVED])
    prior = pride_prior(OBSERVED)
    np.testing.assert_allclose(np.exp(state.logit_prior) / np.exp(state.logit_prior).sum(), prior)
    new = np.array([0.5, 0.3, 0.2])
    debiased = (new / prior) / (new / prior).sum()  # P_debiased ∝ P_observed / P_prior
    prediction = calibrator.predict(observation(new), state)
    np.testing.assert_allclose(prediction.probabilities, debiased)
    assert prediction.choice == int(np.argmax(debiased)) == 1  # the prior's first position falls


def test_the_fit_reads_no_target():
    labelled = [observation(p, target=t) for p, t in zip(OBSERVED, (0, 2, 1), strict=True)]
    plain = [observation(p) for p in OBSERVED]
    calibrator = get_calibrator("pride")
    assert not calibrator.needs_targets
    np.testing.assert_array_equal(
        calibrator.fit(labelled).logit_prior, calibrator.fit(plain).logit_prior
    )
    adapter = SyntheticAdapter()
    unlabelled = [type(i)(stem=i.stem, images=i.images, id=i.id) for i in synthetic_instances(3, 4)]
    state = Debiaser(adapter, "pride").calibrate(unlabelled)  # no targets needed
    assert state.num_observations == 12


def test_estimation_items_are_answered_by_pride_s_permutation_debiasing():
    """P_debiased(d | x) = softmax over the options of the mean over the cyclic permutations of
    log P_observed at the position each option takes there."""
    calibrator = get_calibrator("pride", workflow="test")
    orders = [rotation_order(3, r) for r in range(3)]
    rotations = [observation(p) for p in OBSERVED]
    state = calibrator.fit(rotations)
    prediction = calibrator.predict(rotations[0], state, rotations=rotations, orders=orders)
    # option k sits at position (k - r) % 3 of permutation r
    by_option = np.array(
        [np.mean([np.log(OBSERVED[r, (k - r) % 3]) for r in range(3)]) for k in range(3)]
    )
    expected = np.exp(by_option) / np.exp(by_option).sum()
    np.testing.assert_allclose(prediction.probabilities, expected)


@pytest.mark.parametrize(
    ("count", "alpha", "chosen"),
    [(200, 0.05, 10), (40, 0.05, 2), (7, 0.05, 1), (10, 1.0, 10), (30, 0.1, 3)],
)
def test_ceil_alpha_k_items_are_chosen_by_the_seed_alone(count, alpha, chosen):
    ids = [f"q{i}" for i in range(count)]
    picked = estimation_ids(ids, alpha, seed=0)
    assert len(picked) == chosen == max(1, math.ceil(alpha * count - 1e-9))
    assert picked == estimation_ids(list(reversed(ids)) + ids[:3], alpha, seed=0)  # order-free
    if chosen < count:
        assert picked != estimation_ids(ids, alpha, seed=1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"alpha": 0.1}, "workflow: test"),
        ({"seed": 3}, "workflow: test"),
        ({"workflow": "test", "alpha": 0}, "greater than 0"),
        ({"workflow": "test", "alpha": 1.5}, "less than or equal to 1"),
        ({"workflow": "held_out"}, "workflow"),
    ],
)
def test_unusable_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        get_calibrator("pride", **options)


def test_the_test_workflow_in_a_run_equals_the_paper_s_procedure():
    adapter = SyntheticAdapter()
    calibration = synthetic_instances(3, 4, seed=1)
    test = synthetic_instances(40, 4, seed=2, prefix="t")
    orders = 3
    views = scored_views(test, orders, 0)
    calibrators = {
        "pride": get_calibrator("pride", workflow="test", alpha=0.1),
        "perm": get_calibrator("permutation_average"),
        "plain": get_calibrator("pride"),
    }
    states = fit_calibrators(adapter, calibrators, calibration, test_views=views)
    chosen = estimation_ids([i.id for i in test], 0.1, 0)
    assert states["pride"].extra["estimation_ids"] == chosen and len(chosen) == 4
    assert states["pride"].diagnostics == {
        "estimation_items": 4,
        "test_items": 40,
        "estimation_views": 4 * orders * 4,
    }
    # the prior: the mean log-score over the estimation items' views in their 4 rotations
    rotated = [
        view.permuted(rotation_order(4, r)) for view in views if view.id in chosen for r in range(4)
    ]
    by_hand = np.mean([obs.label_logprobs for obs in adapter.observe_many(rotated)], axis=0)
    np.testing.assert_allclose(states["pride"].logit_prior, by_hand)
    evaluator = Evaluator(adapter, calibrators, states, orders=orders)
    records = evaluator.run(test)
    plain_prior = np.asarray(states["pride"].logit_prior)
    for record, instance in zip(records, test, strict=True):
        if instance.id in chosen:  # answered by cyclic permutation averaging
            assert record.choices["pride"] == record.choices["perm"]
            continue
        for t, order in enumerate(record.orders):
            scores = adapter.observe_many([instance.permuted(order)])[0].label_logprobs
            assert record.choices["pride"][t] == int(np.argmax(scores - plain_prior))
    passes = evaluator.costs["pride"].forward_passes
    assert passes == (36 + 4 * 4) * orders  # 1 per view, 4 per view of an estimation item
    assert calibrators["pride"].passes_with(4, states["pride"]) == pytest.approx(1 + 0.1 * 3)


def test_evaluate_counts_every_item_and_the_api_follows_the_same_workflow(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "adapter: {name: synthetic}\ncount: 20\norders: 2\ncalibrators:\n"
        "  - {name: pride, label: pride_test, options: {workflow: test, alpha: 0.1}}\n"
        "  - permutation_average\n"
    )
    out = tmp_path / "run"
    assert main(["evaluate", "--config", str(config), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    row = results["calibrators"]["pride_test"]
    assert row["metrics"]["num_instances"] == 20  # the estimation items are counted too
    assert row["diagnostics"]["estimation_items"] == 2
    assert row["cost"]["forward_passes_per_instance"] == pytest.approx(2 * (1 + 0.1 * 3))
    # the API: calibrate on the (unlabelled) instances to rank, then rank them
    adapter = SyntheticAdapter()
    items = synthetic_instances(20, 4, seed=5)
    unlabelled = [type(i)(stem=i.stem, images=i.images, id=i.id) for i in items]
    debiaser = Debiaser(adapter, "pride", workflow="test", alpha=0.1)
    state = debiaser.calibrate(unlabelled)
    chosen = set(state.extra["estimation_ids"])
    assert len(chosen) == 2
    averaged = Debiaser(adapter, "permutation_average")
    prior = np.asarray(state.logit_prior)
    for ranking, instance in zip(debiaser.rank_many(unlabelled), unlabelled, strict=True):
        if instance.id in chosen:
            assert ranking.choice == next(averaged.rank_many([instance])).choice
        else:
            scores = adapter.observe_many([instance])[0].label_logprobs
            assert ranking.choice == int(np.argmax(scores - prior))


def test_rstd_population_is_pride_s_ddof_0():
    targets = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [0, 0]])
    choices = np.array([[0, 1], [1, 1], [2, 0], [0, 0], [1, 0]])
    metrics = compute_metrics(targets, choices, choices, 4)
    recalls = np.array(metrics.recall_per_position)
    assert metrics.rstd == pytest.approx(np.std(recalls, ddof=1))
    assert metrics.rstd_population == pytest.approx(np.std(recalls, ddof=0))
    assert metrics.rstd_population == pytest.approx(metrics.rstd * math.sqrt(3 / 4))
