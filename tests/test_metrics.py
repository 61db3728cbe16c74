import numpy as np
import pytest

from posdebias.evaluation.metrics import compute_metrics


def test_small_case_by_hand():
    # 2 instances x 2 orders, N=2
    targets = np.array([[0, 1], [1, 0]])
    choices = np.array([[0, 0], [0, 0]])  # always answers position 0
    images = np.array([[0, 1], [1, 0]])  # image identities of the choices
    m = compute_metrics(targets, choices, images, n=2)
    assert m.accuracy_per_order == [50.0, 50.0]
    assert m.accuracy_mean == 50.0 and m.accuracy_std == 0.0
    assert m.recall_per_position == [100.0, 0.0]
    assert m.rstd == pytest.approx(np.std([100.0, 0.0], ddof=1))  # 70.71
    assert m.consistency == 0.0  # a different image each order
    assert m.confusion == [[100.0, 0.0], [100.0, 0.0]]
    assert m.selection_rate == [100.0, 0.0]


def test_consistency_is_100_when_predictions_follow_images():
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 4, size=(10, 5))
    chosen_image = rng.integers(0, 4, size=(10, 1))
    images = np.repeat(chosen_image, 5, axis=1)
    choices = rng.integers(0, 4, size=(10, 5))  # positions vary, the image does not
    assert compute_metrics(targets, choices, images, n=4).consistency == 100.0


def test_accuracy_std_is_sample_std_over_orders():
    targets = np.zeros((4, 3), dtype=int)
    choices = np.array([[0, 0, 1], [0, 1, 1], [0, 1, 1], [0, 1, 1]])
    m = compute_metrics(targets, choices, choices, n=2)
    assert m.accuracy_per_order == [100.0, 25.0, 0.0]
    assert m.accuracy_std == pytest.approx(np.std([100.0, 25.0, 0.0], ddof=1))


def test_position_never_true_is_reported_as_missing():
    targets = np.array([[0, 0]])
    m = compute_metrics(targets, targets, targets, n=3)
    assert m.recall_per_position == [100.0, None, None]
    assert m.rstd == 0.0
