"""LLaVA-OneVision: every image's tokens are ``<image>``, with no start or end markers.

In multi-image mode (images passed nested, one list per prompt, as :class:`HFAdapter` does; a
flat list silently switches the processor to single-image "anyres" tiling) each image becomes
``num_image_tokens`` patch tokens plus one image-newline token, and consecutive images form ONE
contiguous run. The run is split per image with the processor's own replacement counts; each
span includes its image-newline token.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter


class LlavaOnevisionAdapter(HFAdapter):
    """LLaVA-OneVision (``llava-hf/llava-onevision-qwen2-7b-ov-hf`` and relatives)."""

    name = "llava_onevision"
    model_types = ("llava_onevision",)
    summary = "LLaVA-OneVision (multi-image mode, one contiguous run split per image)"
    split_by_processor_counts = True


posdebias_register_adapters = register_hook(LlavaOnevisionAdapter)
