"""LLaVA (1.5 and relatives): each image becomes a run of ``<image>`` tokens.

Runs of adjacent images touch, so they are split with the processor's replacement counts. The
processor must know the vision tower's ``patch_size`` (saved in ``processor_config.json`` of the
``llava-hf`` checkpoints) to expand ``<image>`` to the right number of tokens. Pixtral-12B in
the ``llava`` format (a Pixtral vision tower and processor) lays each image out in rows closed by
break tokens instead; its spans come from :func:`posdebias.adapters.mistral3.pixtral_spans`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.mistral3 import pixtral_spans, pixtral_tokens
from posdebias.adapters.spans import ImageSpan
from posdebias.adapters.tiny import LLAVA_TEMPLATE, build_tokenizer, text_config, tiny_vision
from posdebias.errors import AdapterError, InputError


class LlavaAdapter(HFAdapter):
    """LLaVA (``llava-hf/llava-1.5-7b-hf`` and relatives)."""

    name = "llava"
    model_types = ("llava",)
    summary = "LLaVA (runs of <image> tokens)"
    split_by_processor_counts = True

    def _image_token(self) -> str:
        if getattr(self.processor, "patch_size", None) is None:
            raise AdapterError(
                "the LLaVA processor has no patch_size, so it cannot expand <image> into the "
                "vision tower's tokens; set processor.patch_size (e.g. 14) and save it"
            )
        return super()._image_token()

    def _pixtral(self) -> bool:
        return getattr(self.processor, "image_break_token", None) is not None

    def image_token_ids(self) -> set[int]:
        if self._pixtral():
            return set(pixtral_tokens(self))
        return super().image_token_ids()

    def image_spans(
        self, input_ids: list[int], num_images: int, replacements: list[str] | None
    ) -> list[ImageSpan]:
        if self._pixtral():
            return pixtral_spans(self, input_ids, num_images)
        return super().image_spans(input_ids, num_images, replacements)

    @classmethod
    def tiny_model(cls, model_type: str, *, real_vocabulary: bool = False) -> tuple[Any, Any]:
        """A tiny random-weight model and processor of this family, for tests (toy vocabulary
        only: LLaVA-1.5's Llama vocabulary is not available offline)."""
        if real_vocabulary:
            raise InputError("no real-vocabulary tiny model for LLaVA-1.5 (Llama vocabulary)")
        return _tiny_model(model_type)


def _tiny_model(family: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText, CLIPImageProcessor
    from transformers.models.llava import LlavaProcessor

    tokenizer = build_tokenizer(
        ["<s>", "</s>", "<pad>", "<image>"],
        chat_template=LLAVA_TEMPLATE,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        named_tokens={"image_token": "<image>"},
    )
    size = 28  # 2 x 2 patches of 14 (+ CLS, dropped by the "default" feature strategy)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    config = AutoConfig.for_model(
        family,
        text_config={
            "model_type": "llama",
            **text_config(len(tokenizer), eos_token_id=ids("</s>"), bos_token_id=ids("<s>")),
            "pad_token_id": ids("<pad>"),
        },
        vision_config={
            "model_type": "clip_vision_model",
            **tiny_vision(image_size=size, projection_dim=32),
        },
        image_token_index=ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    return AutoModelForImageTextToText.from_config(config), processor


@hookimpl
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    register(LlavaAdapter)
