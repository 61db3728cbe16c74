"""Gemma 3 text language models (``google/gemma-3-1b-it``): sliding-window layers interleaved with
global ones (``layer_types``); the probe reads the global layers, which see every candidate.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf.text import HFTextAdapter


class Gemma3TextAdapter(HFTextAdapter):
    """Gemma 3 text language models."""

    name = "gemma3_text"
    model_types = ("gemma3_text",)
    summary = "Gemma 3 text language models (text candidates; global layers read)"


posdebias_register_adapters = register_hook(Gemma3TextAdapter)
