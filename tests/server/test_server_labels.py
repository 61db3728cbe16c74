"""The ``openai`` adapter labels each task its own way (letters for a pairwise judge, as the
local adapters do), through a real local HTTP server."""

from __future__ import annotations

import numpy as np
from test_server_errors import Server

from helpers import prompt_text
from posdebias.adapters.server import ServerAdapter
from posdebias.core.instance import Instance


def pair() -> Instance:
    return Instance(stem="Which is better?", texts=("Yes.", "No."), target=0, id="p",
                    task="pairwise_judge")  # fmt: skip


def test_the_openai_adapter_asks_a_judge_for_a_or_b():
    """Through a real local HTTP server: the prompt sent asks for A or B, and the labels
    scored are A and B (the adapter's default was digits: "1 or 2")."""
    top = [{"token": "A", "logprob": -0.25}, {"token": "B", "logprob": -1.5}]
    answer = {"choices": [{"index": 0, "logprobs": {"content": [{"top_logprobs": top}]}}]}
    with Server(lambda path, body, count: (200, answer, {})) as server:
        adapter = ServerAdapter(base_url=server.url, model="m", scoring="top_logprobs",
                                backoff=0.01, timeout=5)  # fmt: skip
        assert adapter.labels_for(2, "pairwise_judge") == ["A", "B"]
        assert adapter.labels_for(2, "retrieval") == ["1", "2"]
        observation = adapter.observe(pair())
        (_, body) = server.requests[0]
    assert "Respond with A or B only" in prompt_text(body["messages"])
    expected = np.array([-0.25, -1.5]) - np.logaddexp(-0.25, -1.5)
    np.testing.assert_allclose(observation.label_logprobs, expected, atol=1e-12)
    assert adapter.labels == ["A", "B"]


def test_a_named_label_set_wins_for_every_task():
    adapter = ServerAdapter(base_url="http://127.0.0.1:9/v1", model="m", label_set="digits")
    assert "Respond with 1 or 2 only" in prompt_text(adapter.messages(pair()))
    assert adapter.labels_for(4, "multiple_choice") == ["1", "2", "3", "4"]
