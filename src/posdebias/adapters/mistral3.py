"""Mistral 3 (Mistral-Small-3.1 / 3.2) and Pixtral-style image rows.

The Pixtral processor replaces each image by its rows of patch tokens, each row closed by a
break token and the last one by the end token:

    [IMG] x w [IMG_BREAK]  [IMG] x w [IMG_BREAK]  ...  [IMG] x w [IMG_END]

so one image is h runs of ``[IMG]`` and the default span finder (one run per image) would see
h runs per image. The span of an image is the whole block, from its first ``[IMG]`` to its
``[IMG_END]``, break tokens included (they are the image's layout, placed by the processor).
The number of rows and columns follows each image's own size and aspect ratio. The language
model is Mistral with 1-D RoPE (the 2-D RoPE is inside the vision tower), so positions count
from each row's first real token.

The same layout comes with the ``llava`` checkpoints of Pixtral-12B (a LLaVA model with a
Pixtral vision tower and processor); :class:`~posdebias.adapters.llava.LlavaAdapter` uses
:func:`pixtral_spans` when its processor has break tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.spans import ImageSpan, SpanTokens, find_closed_spans
from posdebias.adapters.tiny import build_tokenizer, text_config
from posdebias.errors import AdapterError, InputError


def pixtral_tokens(adapter: HFAdapter) -> tuple[int, int, int]:
    """(image, break, end) token ids of a Pixtral-style processor."""
    processor = adapter.processor
    ids = []
    for attribute in ("image_token", "image_break_token", "image_end_token"):
        token = getattr(processor, attribute, None)
        token_id = adapter.tokenizer.convert_tokens_to_ids(token) if token else None
        if token_id is None or token_id == adapter.tokenizer.unk_token_id:
            raise AdapterError(
                f"{type(processor).__name__}.{attribute} ({token!r}) is not a token of this "
                "tokenizer; a Pixtral-style processor needs image, break and end tokens"
            )
        ids.append(int(token_id))
    return ids[0], ids[1], ids[2]


def pixtral_spans(adapter: HFAdapter, input_ids: list[int], num_images: int) -> list[ImageSpan]:
    """Each image's block of ``[IMG]`` rows, breaks and its ``[IMG_END]``."""
    image, brk, end = pixtral_tokens(adapter)
    return find_closed_spans(
        input_ids, {image, brk, end}, end, num_images, "rows of [IMG] closed by [IMG_END]"
    )


class Mistral3Adapter(HFAdapter):
    """Mistral 3 (``mistralai/Mistral-Small-3.1-24B-Instruct-2503`` and relatives)."""

    name = "mistral3"
    model_types = ("mistral3",)
    summary = "Mistral 3 (Pixtral rows: [IMG] x w + [IMG_BREAK] per row, [IMG_END] last)"

    def span_tokens(self) -> SpanTokens:
        image, _, end = pixtral_tokens(self)
        return SpanTokens(image=image, end=end)

    def image_token_ids(self) -> set[int]:
        return set(pixtral_tokens(self))

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        return pixtral_spans(self, input_ids, num_images)

    @classmethod
    def tiny_model(cls, model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
        """A tiny random-weight model and processor of this family, for tests (toy vocabulary
        only)."""
        if real_vocabulary:
            raise InputError(
                "no real-vocabulary tiny model for Mistral 3 yet (toy vocabulary only)"
            )
        return _tiny_model(model_type)


# Mistral's chat template, reduced to what the prompt uses.
_TEMPLATE = (
    "<s>{% for message in messages %}{% if message['role'] == 'user' %}[INST]"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}[IMG]"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "[/INST]{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}"
)


def tiny_pixtral_parts(size: int = 64) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """(tokenizer, processor, text config, vision config) of a tiny Pixtral-style model.

    16 px patches merged 2 x 2 (Mistral 3; 32 px per token), images resized to at most
    ``size`` px on the longest edge: a 64 x 64 image is 2 rows of 2 tokens.
    """
    from transformers.models.pixtral import PixtralImageProcessor, PixtralProcessor

    tokenizer = build_tokenizer(
        ["<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"],
        chat_template=_TEMPLATE,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        named_tokens={"image_token": "[IMG]"},
    )
    processor = PixtralProcessor(
        image_processor=PixtralImageProcessor(
            size={"longest_edge": size}, patch_size={"height": 32, "width": 32}
        ),
        tokenizer=tokenizer,
        patch_size=16,
        spatial_merge_size=2,
        chat_template=_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    text = text_config(
        len(tokenizer),
        model_type="mistral",
        head_dim=16,
        sliding_window=None,
        eos_token_id=ids("</s>"),
        bos_token_id=ids("<s>"),
        pad_token_id=ids("<pad>"),
    )
    vision = {
        "model_type": "pixtral",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "head_dim": 16,
        "image_size": size,
        "patch_size": 16,
    }
    return tokenizer, processor, text, vision


def _tiny_model(family: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText

    tokenizer, processor, text, vision = tiny_pixtral_parts()
    config = AutoConfig.for_model(
        family,
        text_config=text,
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2,
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )
    return AutoModelForImageTextToText.from_config(config), processor


@hookimpl
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    register(Mistral3Adapter)


def tiny_llava_pixtral() -> tuple[Any, Any]:
    """A tiny Pixtral-12B-style ``llava`` model (Pixtral vision tower and processor), for tests."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    tokenizer, processor, text, vision = tiny_pixtral_parts()
    processor.spatial_merge_size = 1  # Pixtral-12B: no patch merging, 16 px per token
    processor.image_processor.patch_size = {"height": 16, "width": 16}
    processor.image_processor.size = {"longest_edge": 48}
    config = AutoConfig.for_model(
        "llava",
        text_config=text,
        vision_config={**vision, "image_size": 48},
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config)
    model.set_attn_implementation("sdpa")
    return model.eval(), processor
