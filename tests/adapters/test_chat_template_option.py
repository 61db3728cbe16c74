"""The chat_template option: a base model without a template of its own is refused by name, and
served as plain text (``raw``), from a file or from a template given inline."""

from __future__ import annotations

import numpy as np
import pytest

from posdebias.core.instance import Instance
from posdebias.errors import AdapterError, InputError
from posdebias.loading import get_adapter
from posdebias.testing.tiny.text import tiny_model

QUESTION = Instance(
    stem="Which of these is a fruit?",
    texts=("stone", "apple", "chair", "cloud"),
    target=1,
    id="q",
    task="multiple_choice",
)


@pytest.fixture(scope="module")
def base_model():
    """A tiny Llama whose tokenizer has no chat template: a base model."""
    model, tokenizer = tiny_model("llama")
    tokenizer.chat_template = None
    return model, tokenizer


def test_a_model_without_a_template_is_refused_naming_the_option(base_model):
    with pytest.raises(AdapterError, match="no chat template.*option chat_template") as refused:
        get_adapter(*base_model, label_set="upper")
    assert "--chat-template" not in str(refused.value)  # a flag is no Python argument
    assert "--chat-template raw for the prompt" in refused.value.message_for("cli")
    assert '"chat_template" in the adapter_options file' in refused.value.message_for("harness")


@pytest.mark.parametrize("adds_bos", [True, False])
def test_raw_poses_the_prompt_text_after_the_bos(adds_bos):
    """``raw`` writes the BOS exactly when the tokenizer itself would add one (lm-eval's prompt
    of a base model), never two and never one the model was not trained with."""
    model, tokenizer = tiny_model("llama")
    tokenizer.chat_template = None
    tokenizer.add_bos_token = adds_bos
    adapter = get_adapter(model, tokenizer, label_set="upper", chat_template="raw")
    text, _ = adapter.render_with_spans(QUESTION)
    bos = tokenizer.bos_token
    assert text.startswith(bos) is adds_bos and text.count(bos) == int(adds_bos)
    assert "Which of these is a fruit?" in text and "apple" in text
    assert "<|" not in text.replace(bos, "")  # no role markers
    assert adapter.describe()["chat_template_sha256"] is not None
    observation = adapter.observe_many([QUESTION])[0]
    assert np.isclose(np.logaddexp.reduce(observation.label_logprobs), 0.0, atol=1e-6)  # float32


def test_a_template_from_a_file_equals_the_same_template_inline(base_model, tmp_path):
    template = "{{ bos_token }}{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}A:"
    path = tmp_path / "template.jinja"
    path.write_text(template, encoding="utf-8")
    inline = get_adapter(*base_model, label_set="upper", chat_template=template)
    from_file = get_adapter(*base_model, label_set="upper", chat_template=str(path))
    assert inline.render_with_spans(QUESTION) == from_file.render_with_spans(QUESTION)
    assert inline.render_with_spans(QUESTION)[0].endswith("A:")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("no/such/file.jinja", "not a Jinja template .* not a file that exists"),
        ("RAW", "not a Jinja template"),
    ],
)
def test_a_value_that_is_no_template_is_refused(base_model, value, message):
    with pytest.raises(InputError, match=message):
        get_adapter(*base_model, label_set="upper", chat_template=value)


def test_a_file_without_jinja_is_refused(base_model, tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text("Answer the question.", encoding="utf-8")
    with pytest.raises(InputError, match="holds no Jinja template"):
        get_adapter(*base_model, label_set="upper", chat_template=str(path))
