"""The Debiaser on real model code: a tiny random-weight Qwen2.5-VL."""

from __future__ import annotations

import numpy as np

import posdebias
from posdebias import Debiaser
from posdebias.testing import tiny_model_and_processor


def test_rank_many_on_a_tiny_model_batches_without_changing_results(make_instances):
    adapter = posdebias.get_adapter(*tiny_model_and_processor("qwen2_5_vl", seed=0))
    names = ["attention_guided", "label_free", "vanilla", "permutation_average", "pride_default"]
    # the posterior path itself: two random-weight calibration instances cannot show a layer
    # beating chance, so the default would fall back to PriDe (checked below as pride_default)
    calibrators = {
        "attention_guided": posdebias.get_calibrator("attention_guided", fallback=False),
        "label_free": "label_free",
        "vanilla": "vanilla",
        "permutation_average": "permutation_average",
        "pride_default": "attention_guided",
    }
    debiaser = Debiaser(adapter, calibrators, batch_size=3)
    debiaser.calibrate(make_instances(2, 3))
    assert debiaser.states["label_free"].diagnostics["instances"] == 2
    queries = make_instances(5, 3, offset=7)  # captions of different lengths: padded batches
    single = list(debiaser.rank_many(queries, batch_size=1, explain=True))
    batched = list(debiaser.rank_many(queries, batch_size=4, explain=True))
    for one, many, query in zip(single, batched, queries, strict=True):
        assert one.images == query.images and one.id == query.id
        for name in names:
            a, b = one.of(name), many.of(name)
            np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)
            assert a.choice == b.choice and a.best == b.best
            np.testing.assert_allclose(
                a.evidence.label_probabilities, b.evidence.label_probabilities, atol=1e-5
            )
        guided = one.of("attention_guided").evidence
        assert guided.posterior is not None and guided.expected_bias is not None
        # the layers chosen at calibration (evidence selection), the same for every query
        choice = debiaser.states["attention_guided"].layer_choice
        assert choice is not None and list(guided.layers) == choice.rows
        assert one.of("vanilla").evidence.posterior is None  # vanilla uses no posterior
        fallback = one.of("pride_default").evidence
        assert fallback.posterior is None and fallback.expected_bias is not None
