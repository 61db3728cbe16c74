"""The LLaVA layout: each image becomes a run of ``<image>`` tokens.

LLaVA (1.5 and relatives), and LLaVA-NeXT and LLaVA-OneVision, which differ from the shared
machinery only in data and so share this module and its hook.

For LLaVA, runs of adjacent images touch, so they are split with the processor's replacement
counts. The processor must know the vision tower's ``patch_size`` (saved in
``processor_config.json`` of the ``llava-hf`` checkpoints) to expand ``<image>`` to the right
number of tokens. Pixtral-12B in the ``llava`` format (a Pixtral vision tower and processor) lays
each image out in rows closed by break tokens instead; its spans come from
:func:`posdebias.adapters.families.mistral3.pixtral_spans`.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.families.mistral3 import pixtral_spans, pixtral_tokens
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.spans import ImageSpan
from posdebias.errors import AdapterError


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


class LlavaNextAdapter(HFAdapter):
    """LLaVA-NeXT (``llava-hf/llava-v1.6-mistral-7b-hf`` and relatives), LLaVA-NeXT-Video:
    any-resolution tiles in ONE run of ``<image>``.

    The processor expands each ``<image>`` into the base view's tokens, then the tiles' tokens
    with one image-newline feature per row, all as ``<image>`` tokens in one contiguous run per
    image; consecutive images' runs touch when nothing stands between them in the prompt. So the
    spans are the runs split by the processor's own per-image counts (its replacement offsets),
    with no markers; the language model uses 1-D positions (Llama / Mistral / Vicuna). The video
    variant reads still images exactly the same way.
    """

    name = "llava_next"
    model_types = ("llava_next", "llava_next_video")
    summary = "LLaVA-NeXT / LLaVA-NeXT-Video (any-resolution tiles, one run per image)"
    split_by_processor_counts = True


class LlavaOnevisionAdapter(HFAdapter):
    """LLaVA-OneVision (``llava-hf/llava-onevision-qwen2-7b-ov-hf`` and relatives): every
    image's tokens are ``<image>``, with no start or end markers.

    In multi-image mode (images passed nested, one list per prompt, as :class:`HFAdapter` does; a
    flat list silently switches the processor to single-image "anyres" tiling) each image becomes
    ``num_image_tokens`` patch tokens plus one image-newline token, and consecutive images form ONE
    contiguous run. The run is split per image with the processor's own replacement counts; each
    span includes its image-newline token.
    """

    name = "llava_onevision"
    model_types = ("llava_onevision",)
    summary = "LLaVA-OneVision (multi-image mode, one contiguous run split per image)"
    split_by_processor_counts = True


# registration order is the order the registry lists them in
posdebias_register_adapters = register_hook(LlavaAdapter, LlavaNextAdapter, LlavaOnevisionAdapter)
