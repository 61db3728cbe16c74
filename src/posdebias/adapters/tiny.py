"""Shared pieces of the tiny random-weight test models each adapter module builds.

Nothing here touches the network: tokenizers are BPE models trained in milliseconds on a fixed
corpus (digits split one per token, so labels such as "10" are multi-token as in Qwen), image
processors and configs are constructed directly. Each family's builder lives next to its adapter
(``Adapter.tiny_model``); :mod:`posdebias.testing` is the public entry point.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CORPUS = (
    "Given 4 images indexed from 1 to 4, identify the image that best matches the provided "
    "caption. Respond with the index number only and nothing else.",
    "Caption: a photo of a red square on a blue background. Answer:",
    "user assistant system USER ASSISTANT image label",
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z I II III IV V VI VII VIII IX X",
)

# ChatML-style template shared by the Qwen-like families; ``image`` is what one image renders to.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}IMAGE"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: {% else %}"
    "ASSISTANT: {% endif %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] != 'user' %}</s>{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def build_tokenizer(
    special_tokens: Sequence[str],
    *,
    chat_template: str,
    eos_token: str,
    pad_token: str,
    bos_token: str | None = None,
    named_tokens: dict[str, str] | None = None,
) -> Any:
    """A small BPE ``PreTrainedTokenizerFast`` with the family's special tokens.

    ``named_tokens`` become tokenizer attributes (``tokenizer.image_token`` and its ``_id``), as
    the real checkpoints' ``extra_special_tokens`` do.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    specials = ["<unk>", *dict.fromkeys(special_tokens)]
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=[chr(code) for code in range(32, 127)],
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token=eos_token,
        pad_token=pad_token,
        bos_token=bos_token,
        extra_special_tokens=named_tokens or {},
        chat_template=chat_template,
    )


def text_config(vocab_size: int, **extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention, as the real checkpoints
        "max_position_embeddings": 4096,
        "initializer_range": 0.2,  # larger than real init: peaked attention, varied scores
        **extra,
    }


def tiny_vision(**extra: Any) -> dict[str, Any]:
    return {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "patch_size": 14,
        **extra,
    }
