"""Gemma 3: sliding-window and global layers, image tokens bidirectional within each image.

Each image becomes ``\\n\\n<start_of_image>`` + ``<image_soft_token>`` x 256 +
``<end_of_image>\\n\\n``; the span is the soft-token run widened by the two markers. The
processor's placeholder (``processor.image_token``) is ``<start_of_image>``, not the token the
model replaces, so the adapter takes the image token from the model config.

The language model alternates five ``sliding_attention`` layers (a 1,024-token window in the
checkpoints) with one ``full_attention`` layer. Every layer is softmax attention, so the probe
reads all of them, each with its own mask as the model builds it: causal + padding, AND the
window for the sliding layers, OR bidirectional blocks over each image's tokens (from the
processor's ``token_type_ids``). The last prompt token is text, so for its own row the image
blocks change nothing directly; they change the image tokens' hidden states, which the probe
sees through the keys. A sliding layer's window may not reach the first images of a long
prompt: their mass there is zero by construction, which is why layer selection keeps to the
global layers by default (docs/method.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.spans import SpanTokens
from posdebias.adapters.tiny import build_tokenizer, text_config, tiny_vision
from posdebias.errors import InputError


class Gemma3Adapter(HFAdapter):
    """Gemma 3 (``google/gemma-3-4b-it`` and relatives)."""

    name = "gemma3"
    model_types = ("gemma3",)
    summary = "Gemma 3 (sliding-window + global layers, bidirectional image blocks)"

    def _image_token(self) -> str:
        # The processor's image_token is the placeholder <start_of_image>; the tokens that
        # carry the image are the soft tokens the model config names.
        token = self.tokenizer.convert_ids_to_tokens(int(self.model.config.image_token_id))
        return str(token)

    def span_tokens(self) -> SpanTokens:
        config = self.model.config
        return SpanTokens(
            image=int(config.image_token_id),
            start=int(config.boi_token_index),
            end=int(config.eoi_token_index),
        )

    @classmethod
    def tiny_model(cls, model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
        """A tiny random-weight model and processor of this family, for tests (the tiny BPE
        vocabulary only)."""
        if real_vocabulary:
            raise InputError(f"no real-vocabulary tiny model for {model_type!r}")
        return _tiny_model()


_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<start_of_image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

TINY_SLIDING_WINDOW = 52
"""The tiny model's window: shorter than a 3-image prompt (about 70 tokens), long enough to
reach the last image, so the tests exercise windows that see some images and not others."""


def _tiny_model() -> tuple[Any, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.gemma3 import Gemma3ImageProcessor, Gemma3Processor

    tokenizer = build_tokenizer(
        [
            "<bos>",
            "<eos>",
            "<pad>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ],
        chat_template=_TEMPLATE,
        eos_token="<end_of_turn>",
        pad_token="<pad>",
        bos_token="<bos>",
        named_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    # 28 px images, 14 px patches: 2 x 2 patches pooled to mm_tokens_per_image = 4 soft tokens.
    size, tokens = 28, 4
    image_processor = Gemma3ImageProcessor(size={"height": size, "width": size})
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=tokens,
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    # 12 layers in the checkpoints' 5 local : 1 global pattern: layers 5 and 11 are global.
    text = {
        "model_type": "gemma3_text",
        **text_config(len(tokenizer), num_hidden_layers=12, head_dim=16),
        "query_pre_attn_scalar": 16,
        "sliding_window": TINY_SLIDING_WINDOW,
        "sliding_window_pattern": 6,
        "bos_token_id": ids("<bos>"),
        "eos_token_id": ids("<end_of_turn>"),
        "pad_token_id": ids("<pad>"),
    }
    config = AutoConfig.for_model(
        "gemma3",
        text_config=text,
        vision_config={
            "model_type": "siglip_vision_model",
            **tiny_vision(image_size=size),
            "vision_use_head": False,
        },
        mm_tokens_per_image=tokens,
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
    )
    model = AutoModelForImageTextToText.from_config(config)
    projector = model.model.multi_modal_projector.mm_input_projection_weight
    with torch.no_grad():  # initialised to zeros: every image would embed the same
        projector.normal_(0.0, 0.2)
    return model, processor


@hookimpl
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    register(Gemma3Adapter)
