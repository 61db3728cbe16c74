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

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.spans import SpanTokens


class Gemma3Adapter(HFAdapter):
    """Gemma 3 (``google/gemma-3-4b-it`` and relatives)."""

    name = "gemma3"
    model_types = ("gemma3",)
    summary = "Gemma 3 (sliding-window + global layers, bidirectional image blocks)"
    image_token_key = "image_token_id"  # the soft token; the processor's is <start_of_image>

    def span_tokens(self) -> SpanTokens:
        return SpanTokens.named(
            self.model.config, "image_token_id", "boi_token_index", "eoi_token_index"
        )


posdebias_register_adapters = register_hook(Gemma3Adapter)
