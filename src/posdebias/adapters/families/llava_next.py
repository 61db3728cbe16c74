"""LLaVA-NeXT (LLaVA-1.6) and LLaVA-NeXT-Video: any-resolution tiles in ONE run of ``<image>``.

The processor expands each ``<image>`` into the base view's tokens, then the tiles' tokens with
one image-newline feature per row, all as ``<image>`` tokens in one contiguous run per image;
consecutive images' runs touch when nothing stands between them in the prompt. So the spans are
the runs split by the processor's own per-image counts (its replacement offsets), with no
markers; the language model uses 1-D positions (Llama / Mistral / Vicuna). The video variant
reads still images exactly the same way.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter


class LlavaNextAdapter(HFAdapter):
    """LLaVA-NeXT (``llava-hf/llava-v1.6-mistral-7b-hf`` and relatives), LLaVA-NeXT-Video."""

    name = "llava_next"
    model_types = ("llava_next", "llava_next_video")
    summary = "LLaVA-NeXT / LLaVA-NeXT-Video (any-resolution tiles, one run per image)"
    split_by_processor_counts = True


posdebias_register_adapters = register_hook(LlavaNextAdapter)
