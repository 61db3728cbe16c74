"""Restricted label scoring: the trie, cached decoding vs full re-forwards, normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adapter_reference import reforward_scores, score_tolerance, tiny_pair

from posdebias import get_adapter
from posdebias.adapters.hf.scoring import plan_labels, restricted_scores
from posdebias.core import get_label_set
from posdebias.errors import AdapterError

END = 99


def test_plan_for_twelve_digit_labels():
    # Qwen-like tokenisation: one token per digit, "1"=1 ... "9"=9, "0"=0.
    tokens = [[d] for d in range(1, 10)] + [[1, 0], [1, 1], [1, 2]]
    plan = plan_labels(tokens, END)
    assert plan.paths[0] == (1, END)  # "1" may stop where "10".."12" continue
    assert plan.paths[1] == (2,)
    assert plan.paths[9] == (1, 0)
    assert plan.options[()] == tuple(range(1, 10))
    assert plan.options[(1,)] == (0, 1, 2, END)
    assert plan.steps == ((1,),)  # one cached decoding step for the one shared prefix


def test_restricted_scores_sum_to_one_and_follow_the_logits():
    tokens = [[d] for d in range(1, 10)] + [[1, 0], [1, 1], [1, 2]]
    plan = plan_labels(tokens, END)
    generator = torch.Generator().manual_seed(0)
    logits = {prefix: torch.randn(3, 128, generator=generator) for prefix in plan.options}
    scores = restricted_scores(plan, logits)
    assert torch.allclose(torch.logsumexp(scores, dim=1), torch.zeros(3), atol=1e-6)
    root = torch.log_softmax(logits[()][:, 1:10], dim=1)
    step = torch.log_softmax(logits[(1,)][:, [0, 1, 2, END]], dim=1)
    assert torch.allclose(scores[:, 1], root[:, 1], atol=1e-6)  # "2": one step
    assert torch.allclose(scores[:, 0], root[:, 0] + step[:, 3], atol=1e-6)  # "1" + end
    assert torch.allclose(scores[:, 10], root[:, 0] + step[:, 1], atol=1e-6)  # "11"


def test_identical_label_tokens_are_rejected():
    with pytest.raises(AdapterError, match="tokenize identically"):
        plan_labels([[5], [5]], END, ["x", "y"])


def test_prefix_labels_need_an_end_token():
    with pytest.raises(AdapterError, match="end_token"):
        plan_labels([[1], [1, 0]], None)


def test_multi_token_scores_equal_full_reforward(family, make_instances):
    """N=12 digits, a left-padded batch of 2: the cached decoding step of each row equals
    full forwards of that row alone with the label tokens appended."""
    adapter = get_adapter(*tiny_pair(family))
    instances = make_instances(2, 12)
    batch = adapter.prepare_batch(instances)
    assert (batch.inputs["attention_mask"][0] == 0).any(), "row 0 must be left padded"
    assert batch.plan.steps, "N=12 digits must need a cached decoding step"
    scores, _ = adapter.run_batch(batch)
    for row, instance in enumerate(instances):
        reference = reforward_scores(adapter, adapter.prepare_batch([instance]))
        assert torch.max(torch.abs(scores[row].double() - reference)) < score_tolerance(adapter)
        assert abs(float(torch.logsumexp(scores[row].double(), dim=0))) < 1e-6


@pytest.mark.parametrize("label_set", ["roman", "words", "upper"])
def test_other_label_sets_equal_full_reforward(label_set, make_instances):
    model, processor = tiny_pair("qwen2_5_vl")
    adapter = get_adapter(model, processor, label_set=label_set)
    batch = adapter.prepare_batch(make_instances(1, 9))
    scores, _ = adapter.run_batch(batch)
    reference = reforward_scores(adapter, batch)
    assert torch.max(torch.abs(scores[0].double() - reference)) < 1e-5
    last = get_label_set(label_set).labels(9)[-1]  # IX, nine, I: the prompt names the range
    assert f"to {last}" in adapter.render(make_instances(1, 9)[0])


def test_scores_are_normalised_and_batch_independent(family, make_instances):
    adapter = get_adapter(*tiny_pair(family))
    instances = make_instances(3, 4, offset=1)
    one = adapter.observe_many(instances, batch_size=1)
    two = adapter.observe_many(instances, batch_size=2)
    for a, b in zip(one, two, strict=True):
        assert abs(np.logaddexp.reduce(a.label_logprobs)) < 1e-6
        np.testing.assert_allclose(a.label_logprobs, b.label_logprobs, atol=1e-5, rtol=0)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-5, rtol=0)
        assert a.target == b.target


def test_mixed_n_batches_keep_the_order(make_instances):
    adapter = get_adapter(*tiny_pair("qwen2_5_vl"))
    mixed = [make_instances(1, 3)[0], make_instances(1, 2, offset=5)[0]]
    observations = adapter.observe_many(mixed, batch_size=2)
    assert [o.n for o in observations] == [3, 2]
    single = adapter.observe(mixed[1])
    np.testing.assert_allclose(observations[1].label_logprobs, single.label_logprobs, atol=1e-6)


def test_scores_without_the_probe_equal_scores_with_it(make_instances):
    adapter = get_adapter(*tiny_pair("qwen2_5_vl"))
    batch = adapter.prepare_batch(make_instances(2, 3))
    probed, attention = adapter.run_batch(batch)
    plain, none = adapter.run_batch(batch, attention=False)
    assert attention is not None and none is None
    assert torch.equal(plain, probed)
