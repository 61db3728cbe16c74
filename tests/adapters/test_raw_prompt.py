"""The adapter option ``chat_template: raw`` with a task template in lm-evaluation-harness's
layout: the prompt is the template's text as is (lm-eval's MMLU prompt), tokenised as lm-eval
tokenises a context, spans and labels checked."""

from __future__ import annotations

import pytest

import posdebias
from posdebias import Instance
from posdebias.testing import TEXT_FAMILIES, check_adapter, tiny_model_and_processor
from posdebias.testing.check import PASS

#: lm-eval's MMLU prompt (lm_eval/tasks/mmlu/default), zero-shot
MMLU = {
    "instruction": "The following are multiple choice questions (with answers) about maps.\n\n",
    "stem": "{question}\n",
    "candidate": "{label}. {text}",
    "candidate_separator": "\n",
    "query": "\nAnswer:",
    "separator": "",
}
QUESTION = Instance(
    stem="What is the capital of France?",
    texts=("Rome", "Paris", "Madrid", "Berlin"),
    target=1,
    id="q",
    task="multiple_choice",
)
EXPECTED = (
    "The following are multiple choice questions (with answers) about maps.\n\n"
    "What is the capital of France?\nA. Rome\nB. Paris\nC. Madrid\nD. Berlin\nAnswer:"
)


def raw_adapter(family: str, **options):
    model, tokenizer = tiny_model_and_processor(family)
    options = {"label_set": "upper", "answer_prefix": " ", "task_prompt": MMLU, **options}
    options.setdefault("chat_template", "raw")
    return posdebias.get_adapter(model, tokenizer, **options), tokenizer


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_the_raw_prompt_is_the_text_as_a_harness_tokenises_it(family):
    """Every text family: the prompt is the template's text after whatever the tokenizer
    writes before a text (a BOS), so its tokens are the plain text's with special tokens, as
    lm-eval's `hf` model encodes a context; no chat-turn marker is added."""
    adapter, tokenizer = raw_adapter(family)
    rendered = adapter.render(QUESTION)
    assert rendered.endswith(EXPECTED) and len(rendered) - len(EXPECTED) <= len("<|begin_of_text|>")
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert ids == tokenizer(EXPECTED, add_special_tokens=True)["input_ids"]
    chat = posdebias.get_adapter(*tiny_model_and_processor(family), label_set="upper")
    assert chat.render(QUESTION) != rendered and EXPECTED not in chat.render(QUESTION)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_a_raw_prompt_passes_every_check(family):
    """Spans, label tokens (' A' after 'Answer:') and scores against the model's own forward."""
    adapter, _ = raw_adapter(family)
    report = check_adapter(adapter, task="multiple_choice")
    assert all(result.status == PASS for result in report.results), report.summary()


def test_the_label_is_scored_after_the_answer_prefix_as_a_continuation(qwen3_raw):
    """' B' after 'Answer:', tokenised in context as lm-eval splits context and continuation."""
    adapter, tokenizer = qwen3_raw
    rendered = adapter.render(QUESTION)
    base = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    full = tokenizer(rendered + " B", add_special_tokens=False)["input_ids"]
    assert adapter.label_tokens(rendered, "B") == full[len(base) :]
    assert len(full) > len(base) and full[: len(base)] == base


@pytest.fixture(scope="module")
def qwen3_raw():
    return raw_adapter("qwen3")
