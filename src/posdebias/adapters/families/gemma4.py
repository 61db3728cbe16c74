"""Gemma 4: sliding-window and global layers, KV-shared layers, bidirectional image blocks.

Each image becomes ``<|image>`` + ``<|image|>`` x n + ``<image|>``: the image is resized to fit
the processor's soft-token budget (``max_soft_tokens``, 280 in the checkpoints), so n follows its
size and aspect ratio; the span is the run with its two markers. The processor's image token is
the token the model replaces (expanded in place, with replacement offsets).

The language model alternates sliding-window layers with global layers (``layer_types``; the
global ones with their own head size and partial RoPE over 1-D token indices). Every layer is
softmax attention, so the probe reads all of them, each with the model's own mask: causal and
padding, the window for the sliding layers, and bidirectional blocks over each image's tokens
(the processor's ``mm_token_type_ids``) when the config says
``use_bidirectional_attention: vision``.

KV sharing (Gemma 4 E2B / E4B, ``num_kv_shared_layers``): the last layers compute no keys and
values; each reuses those of the last non-shared layer of its kind (sliding or global), which
the model hands from layer to layer within every forward, the prompt pass and each cached label
step alike, and which come from the cache that the label steps rewind. A shared layer computes
its own queries, so its attention row is its own, over the shared keys. With ``logits_to_keep``
(the adapter keeps the last position's logits only) those layers compute the last token's query
alone, because no later layer reads the other rows; that row is exactly what the probe reads.
SoFA's opened blocks change nothing there: the rows they open are image rows, which a shared
layer's output never passes on. So the adapter needs nothing of its own but the markers.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf import HFAdapter, SpanTokens


class Gemma4Adapter(HFAdapter):
    """Gemma 4 (``google/gemma-4-E2B-it``, ``google/gemma-4-E4B-it`` and relatives)."""

    name = "gemma4"
    model_types = ("gemma4",)
    summary = "Gemma 4 (sliding-window + global layers, KV-shared layers, image blocks)"

    def span_tokens(self) -> SpanTokens:
        return SpanTokens.named(self.model.config, "image_token_id", "boi_token_id", "eoi_token_id")


posdebias_register_adapters = register_hook(Gemma4Adapter)
