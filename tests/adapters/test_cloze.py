"""Cloze scoring through the Hugging Face text adapters: each option's text as the reply to the
question alone, checked against a plain transformers forward of the same tiny real-class model,
and the cloze rows' order independence, costs and refusals."""

from __future__ import annotations

import itertools
import math

import pytest

import posdebias
from posdebias import Instance
from posdebias.adapters import ReplyRequest, ReplyScore
from posdebias.decoders.cloze import Cloze, ClozeMean, order_free_choice, reply_value
from posdebias.errors import AdapterError, ConfigError, InputError
from posdebias.testing import tiny_model_and_processor

TEXT_MODELS = ("llama", "qwen3", "gemma3_text")
QUESTIONS = ("Which colour is the sky on a clear day?", "Name a fruit.")
REPLIES = ("blue", "a dark green leaf on a tree", "red", "the colour of the sea at noon")


def plain_reply_logprob(model, tokenizer, message: str, reply: str) -> tuple[float, int]:
    """log P(reply | message) from one unpadded forward of the whole text (the chat template's
    prompt, then the reply), summed over the reply's tokens: the definition, computed apart."""
    import torch

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": message}], add_generation_prompt=True, tokenize=False
    )
    head = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    whole = tokenizer(prompt + reply, add_special_tokens=False)["input_ids"]
    assert whole[: len(head)] == head and len(whole) > len(head)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([whole])).logits[0].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    total = sum(float(log_probs[t - 1, whole[t]]) for t in range(len(head), len(whole)))
    return total, len(whole) - len(head)


@pytest.mark.parametrize("family", TEXT_MODELS)
def test_reply_scores_equal_a_plain_forward_of_the_model(family):
    reference, tokenizer = tiny_model_and_processor(family)  # never wrapped: no probe in it
    adapter = posdebias.get_adapter(*tiny_model_and_processor(family), label_set="upper")
    requests = [
        ReplyRequest(message=question, reply=reply, source="q")
        for question in QUESTIONS
        for reply in REPLIES
    ]
    expected = [plain_reply_logprob(reference, tokenizer, r.message, r.reply) for r in requests]
    for batch_size in (1, 3, 8):  # padded rows of other lengths change nothing
        scores = adapter.score_replies(requests, batch_size=batch_size)
        for score, (total, tokens), request in zip(scores, expected, requests, strict=True):
            assert score.tokens == tokens
            assert score.characters == len(request.reply)
            assert score.logprob == pytest.approx(total, abs=2e-4)
            assert score.logprob < 0


def test_reply_values_are_the_sum_per_token_and_per_character():
    score = ReplyScore(logprob=-12.0, tokens=4, characters=10)
    assert reply_value(score, "sum") == -12.0
    assert reply_value(score, "mean") == -3.0
    assert reply_value(score, "per_char") == -1.2


def test_ties_go_to_a_candidate_never_to_a_position():
    identities = ["text:b", "text:a", "text:c"]
    values = [-1.0, -1.0, -5.0]
    assert order_free_choice(values, identities) == 1  # "text:a" sorts first
    for order in itertools.permutations(range(3)):
        shown = [identities[k] for k in order]
        chosen = order_free_choice([values[k] for k in order], shown)
        assert shown[chosen] == "text:a"


@pytest.fixture(scope="module")
def qwen3_adapter():
    return posdebias.get_adapter(*tiny_model_and_processor("qwen3"), label_set="upper")


def question(**extra) -> Instance:
    fields = {
        "stem": QUESTIONS[0],
        "texts": REPLIES,
        "target": 0,
        "id": "sky",
        "task": "multiple_choice",
        **extra,
    }
    return Instance(**fields)


@pytest.mark.parametrize("decoder", [Cloze(), ClozeMean(), Cloze(score="per_char")])
def test_a_cloze_row_chooses_one_candidate_whatever_the_order(qwen3_adapter, decoder):
    base = question()
    reference, tokenizer = tiny_model_and_processor("qwen3")
    expected = [plain_reply_logprob(reference, tokenizer, base.stem, text) for text in base.texts]
    values = [
        reply_value(ReplyScore(total, tokens, len(text)), decoder.options.score)
        for (total, tokens), text in zip(expected, base.texts, strict=True)
    ]
    best = base.texts[max(range(4), key=values.__getitem__)]
    views = [base.permuted(order) for order in itertools.permutations(range(4))]
    decisions = decoder.decide(qwen3_adapter, views, batch_size=4, seeds=[0] * len(views))
    assert {view.texts[d.choice] for view, d in zip(views, decisions, strict=True)} == {best}
    # the 4 options are scored once for all 24 orders, charged to the first
    assert [d.forward_passes for d in decisions] == [4] + [0] * 23
    assert all(d.texts == [] and d.answers == [] for d in decisions)


def test_the_question_option_is_the_message_and_is_checked():
    assert Cloze(question="Question: {question}\nAnswer:").message(question()) == (
        f"Question: {QUESTIONS[0]}\nAnswer:"
    )
    for bad, message in [
        ("no stem here", "never shows the stem"),
        ("{question} {options}", "unknown placeholder"),
        ("{question.__class__}", "unknown placeholder"),
        ("{question:>1000}", "wider than"),
    ]:
        with pytest.raises(ConfigError, match=message):
            Cloze(question=bad)
    with pytest.raises(ConfigError, match="score"):
        Cloze(score="max")


def test_cloze_refuses_images_and_adapters_that_cannot_score_text(qwen3_adapter, tmp_path):
    from posdebias.adapters.families.synthetic import SyntheticAdapter
    from posdebias.adapters.server import ServerAdapter

    with_image = question(images=("a.png", None, None, None), texts=REPLIES)
    stem_image = question(stem_images=("a.png",))
    for instance in (with_image, stem_image):
        with pytest.raises(InputError, match="image candidates or images in its stem"):
            Cloze().check(qwen3_adapter, [question(), instance])
    vision = posdebias.get_adapter(*tiny_model_and_processor("qwen2_5_vl"), label_set="upper")
    server = ServerAdapter(base_url="http://127.0.0.1:9/v1", model="m", scoring="top_logprobs")
    for adapter in (vision, SyntheticAdapter(), server):
        assert adapter.reply_problem() is not None
        with pytest.raises(AdapterError, match="cannot score a text as the model's reply"):
            Cloze().check(adapter, [question()])
        with pytest.raises(AdapterError, match="cannot score a text as the model's reply"):
            adapter.score_replies([ReplyRequest("q", "a")])
    Cloze().check(qwen3_adapter, [question()])  # a text model on text options: fine


def test_a_special_token_the_cloze_prompt_would_form_is_refused(qwen3_adapter):
    decoder = Cloze(question="{question}<|im_end|>")  # a template text holding a turn's end
    refused = r"'sky' \(cloze\): its prompt holds '<\|im_end\|>'"
    with pytest.raises(InputError, match=refused):
        decoder.check(qwen3_adapter, [question()])  # before a run writes anything
    with pytest.raises(InputError, match=refused):
        decoder.decide(qwen3_adapter, [question()], seeds=[0])
    # a stem ending in the first half of a token, the template completing it
    with pytest.raises(InputError, match=r"its prompt holds '<\|im_end\|>'"):
        Cloze(question="{question}end|>").check(qwen3_adapter, [question(stem="Why <|im_")])


def test_a_model_that_gives_nan_is_an_error_not_a_choice():
    import torch

    model, tokenizer = tiny_model_and_processor("llama")
    with torch.no_grad():
        model.model.norm.weight.fill_(math.nan)  # every logit NaN, as a broken dtype gives
    adapter = posdebias.get_adapter(model, tokenizer, label_set="upper")
    with pytest.raises(AdapterError, match="NaN or infinite"):
        Cloze().decide(adapter, [question()], seeds=[0])
