"""A task template with ``chat_template: false``: the prompt is the template's text as is (the
prompts of lm-evaluation-harness), tokenised as a plain text is, spans and labels checked."""

from __future__ import annotations

import pytest

import posdebias
from posdebias import Instance
from posdebias.adapters.hf.adapter import tokenizer_prefix
from posdebias.adapters.server import ServerAdapter
from posdebias.core.tasks import TaskTemplate, task_template
from posdebias.errors import AdapterError, InputError
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
    "chat_template": False,
}
QUESTION = Instance(
    query="What is the capital of France?",
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
    return posdebias.get_adapter(model, tokenizer, **options), tokenizer


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_the_raw_prompt_is_the_text_as_a_harness_tokenises_it(family):
    """Every text family: the prompt is the template's text after whatever the tokenizer
    writes before a text (a BOS), so its tokens are the plain text's with special tokens, as
    lm-eval's `hf` model encodes a context; no chat-turn marker is added."""
    adapter, tokenizer = raw_adapter(family)
    rendered = adapter.render(QUESTION)
    prefix = tokenizer_prefix(tokenizer, adapter.prompt_special_tokens)
    assert rendered == prefix + EXPECTED
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


def test_the_digest_of_a_chat_prompt_is_unchanged_and_a_raw_one_differs():
    """States saved before the field existed still fit (the chat digest leaves it out); a raw
    prompt is another prompt (another hash)."""
    import hashlib
    import json

    template = task_template("multiple_choice")
    fields = {k: v for k, v in template.model_dump(mode="json").items() if k != "chat_template"}
    before = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    assert template.digest() == before
    raw = template.model_copy(update={"chat_template": False})
    assert raw.digest() != before
    with pytest.raises(ValueError, match="chat_template"):
        TaskTemplate.model_validate({**template.model_dump(), "chat_template": "no"})


def test_a_raw_prompt_with_images_is_refused(image_files):
    model, processor = tiny_model_and_processor("qwen2_5_vl")
    adapter = posdebias.get_adapter(model, processor, label_set="upper", task_prompt=MMLU)
    text_only = Instance(query="q?", texts=("a", "b"), id="t", task="multiple_choice")
    assert adapter.render(text_only).endswith("q?\nA. a\nB. b\nAnswer:")
    with_images = Instance(
        query="Which?",
        images=tuple(image_files[:2]),
        texts=("a", "b"),
        id="i",
        task="multiple_choice",
    )
    with pytest.raises(AdapterError, match="chat_template: false.*holds text only"):
        adapter.render(with_images)


def test_a_server_refuses_a_raw_prompt():
    with pytest.raises(InputError, match="chat_template: false"):
        ServerAdapter(base_url="http://127.0.0.1:9/v1", model="m", task_prompt=MMLU)
    # a chat prompt's fields are still taken
    ServerAdapter(base_url="http://127.0.0.1:9/v1", model="m", task_prompt={"query": "Say:"})
