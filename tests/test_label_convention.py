"""One label convention for every adapter and door: each task's own labels (letters for
multiple choice and judged answers, digits for retrieval and passages) unless the user names a
label set; decided by core.tasks.task_label_set alone."""

from __future__ import annotations

import numpy as np
import pytest

import posdebias
from helpers import prompt_text
from posdebias.adapters.families.synthetic import SyntheticAdapter
from posdebias.core.instance import Instance
from posdebias.core.tasks import TASK_LABEL_SETS, task_label_set
from posdebias.evaluation.config import config_from_data
from posdebias.evaluation.job import build_adapter
from posdebias.testing import tiny_model_and_processor


def pair(k: int = 0) -> Instance:
    return Instance(stem=f"Which is better, {k}?", texts=(f"Yes {k}.", f"No {k}."), target=0,
                    id=f"p{k}", task="pairwise_judge")  # fmt: skip


def question() -> Instance:
    return Instance(stem="Which is a fruit?", texts=("stone", "apple", "car", "cloud"), target=1,
                    id="q", task="multiple_choice")  # fmt: skip


def test_the_one_rule():
    assert {task: task_label_set(task) for task in TASK_LABEL_SETS} == {
        "retrieval": "digits", "multiple_choice": "upper", "pairwise_judge": "upper",
        "rerank": "digits",
    }  # fmt: skip
    assert task_label_set("pairwise_judge", "roman") == "roman"


def test_a_wrapped_hugging_face_model_labels_each_task_its_own_way():
    """The API door (get_adapter without label_set) poses a judge with A / B, a question with
    A to D and a retrieval prompt with digits; each observation scores those labels."""
    adapter = posdebias.get_adapter(*tiny_model_and_processor("qwen3"))
    assert adapter.label_set is None
    assert "Respond with A or B only" in prompt_text(adapter.messages_for(pair()))
    assert "(A to D)" in prompt_text(adapter.messages_for(question()))
    judged = adapter.observe(pair())
    assert judged.label_logprobs.shape == (2,) and adapter.labels == ["A", "B"]
    adapter.observe(question())
    assert adapter.labels == ["A", "B", "C", "D"]
    # batches never mix two label sets: one batch per task, each scored with its own labels
    both = adapter.observe_many([pair(1), question(), pair(2)], batch_size=4)
    assert [o.label_logprobs.shape[0] for o in both] == [2, 4, 2]
    np.testing.assert_allclose(both[1].label_logprobs, adapter.observe(question()).label_logprobs,
                               atol=1e-5)  # fmt: skip


def test_the_simulated_model_follows_the_same_rule():
    adapter = SyntheticAdapter()
    assert adapter.labels_for(2, "pairwise_judge") == ["A", "B"]
    assert adapter.labels_for(3) == ["1", "2", "3"]


def test_every_door_of_the_cli_names_the_task_labels():
    """``--adapter openai`` without ``--model`` (the model named in the options) was built with
    the adapter's digits; now the task's letters, recorded in what the run describes."""
    options = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    config = config_from_data(
        {"adapter": {"name": "openai", "options": options}, "task": "pairwise_judge"}, "test"
    )
    adapter = build_adapter(config)
    assert adapter.label_set == "upper"
    assert adapter.describe(2)["labels"] == ["A", "B"]
    config = config_from_data({"adapter": {"name": "synthetic"}, "task": "rerank"}, "test")
    assert build_adapter(config).label_set == "digits"


def test_the_debiaser_calibrates_and_ranks_a_judge_with_its_letters():
    adapter = posdebias.get_adapter(*tiny_model_and_processor("qwen3"))
    debiaser = posdebias.Debiaser(adapter, ["vanilla", "pride"])
    debiaser.calibrate([pair(k) for k in range(3)])
    assert {label: state.label_set for label, state in debiaser.states.items()} == {
        "vanilla": ["A", "B"], "pride": ["A", "B"],
    }  # fmt: skip
    rankings = list(debiaser.rank_many([pair(7), pair(8)]))
    assert [len(r.probabilities) for r in rankings] == [2, 2]
    # a state made for another label set is refused, not silently used
    digits = posdebias.get_adapter(*tiny_model_and_processor("qwen3"), label_set="digits")
    other = posdebias.Debiaser(digits, "pride")
    other.states = dict(debiaser.states)
    with pytest.raises(posdebias.errors.PosdebiasError, match="label"):
        list(other.rank_many([pair(7)]))


def test_the_bundled_text_model_through_the_api_needs_no_label_set():
    """It failed ("labels '1' and '2' tokenize identically": its word vocabulary has letters,
    not digits) unless the user named a label set; now the API asks it with letters, as the
    CLI does."""
    adapter = posdebias.load_adapter("posdebias/text-organism", device="cpu")
    cases = [
        (("stone", "apple", "car", "cloud"), 1),
        (("pear", "shoe", "river", "chair"), 0),
        (("brick", "hammer", "lemon", "car"), 2),
    ]
    questions = [
        Instance("Which of these is a fruit?", texts=texts, target=target, id=f"q{k}",
                 task="multiple_choice")
        for k, (texts, target) in enumerate(cases)
    ]  # fmt: skip
    debiaser = posdebias.Debiaser(adapter, ["vanilla", "attention_guided"])
    debiaser.calibrate(questions[:2])
    assert debiaser.states["vanilla"].label_set == ["A", "B", "C", "D"]
    answers = [ranking.best_text for ranking in debiaser.rank_many(questions)]
    assert answers == ["apple", "pear", "lemon"]
