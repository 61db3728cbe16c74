"""Cloze through the ``openai`` adapter (scoring echo) against a small real HTTP server that
scores prompts as vLLM's ``prompt_logprobs`` does; vLLM itself: test_vllm.py."""

from __future__ import annotations

import pytest
from test_server_errors import Server, adapter

from posdebias.adapters import ReplyRequest
from posdebias.core.instance import Instance
from posdebias.decoders.cloze import Cloze, ClozeMean
from posdebias.errors import AdapterError


def word_scores(path, body, count):
    """A server whose tokens are words and whose log-probability of a word is minus its
    length: the prompt is ``user: MESSAGE assistant:``, then a continued final turn."""
    assert path == "/v1/chat/completions" and body["prompt_logprobs"] == 0
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    words = ["user:", *user.split(), "assistant:"]
    if body["messages"][-1]["role"] == "assistant":
        words += body["messages"][-1]["content"].split()
    entries = [None, *({"1": {"logprob": -float(len(w)), "decoded_token": w}} for w in words[1:])]
    return 200, {"prompt_logprobs": entries, "usage": {"prompt_tokens": len(words)}}, {}


def test_reply_scores_are_the_server_log_probabilities_of_the_reply_tokens():
    requests = [
        ReplyRequest("What is the sea?", "deep blue water", "a"),
        ReplyRequest("What is the sea?", "salt", "a"),
        ReplyRequest("Name a fruit", "a ripe pear", "b"),
    ]
    with Server(word_scores) as server:
        scores = adapter(server.url).score_replies(requests)
        sent = list(server.requests)
    assert [(s.logprob, s.tokens, s.characters) for s in scores] == [
        (-13.0, 3, 15),
        (-4.0, 1, 4),
        (-9.0, 3, 11),
    ]
    prompts = [body for _, body in sent if body["messages"][-1]["role"] == "user"]
    assert len(prompts) == 2 and len(sent) == 2 + 3  # each message once, then each reply


@pytest.mark.parametrize(("decoder", "best"), [(Cloze(), "sea"), (ClozeMean(), "I do not know")])
def test_a_cloze_row_through_a_server(decoder, best):
    question = Instance(
        stem="Where do fish live?",
        texts=("I do not know", "sea", "mountains"),
        target=0,
        id="fish",
        task="multiple_choice",
    )
    views = [question.rotated(shift) for shift in range(3)]
    with Server(word_scores) as server:
        served = adapter(server.url)
        decoder.check(served, views)
        decisions = decoder.decide(served, views, seeds=[0, 0, 0])
    # sum: "sea" (-3) beats "I do not know" (-10); per token: -10 / 4 = -2.5 beats -3
    chosen = {view.texts[d.choice] for view, d in zip(views, decisions, strict=True)}
    assert chosen == {best}


def test_top_logprobs_scoring_refuses_cloze():
    served = adapter("http://127.0.0.1:9/v1", scoring="top_logprobs")
    with pytest.raises(AdapterError, match="scoring top_logprobs cannot score a text"):
        served.score_replies([ReplyRequest("q", "a")])
