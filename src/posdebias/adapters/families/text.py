"""The text-only language model families: each is ``HFTextAdapter`` under its own name and
``model_types`` (data only), so they share one module and one hook implementation.
"""

from __future__ import annotations

from posdebias._markers import register_hook
from posdebias.adapters.hf.text import HFTextAdapter


class Qwen3Adapter(HFTextAdapter):
    """Qwen3 / Qwen3-MoE language models (``Qwen/Qwen3-8B``, ``Qwen/Qwen3-30B-A3B``): ChatML
    prompts, 1-D RoPE; dense and mixture-of-experts layers alike have softmax attention."""

    name = "qwen3"
    model_types = ("qwen3", "qwen3_moe")
    summary = "Qwen3 / Qwen3-MoE language models (text candidates)"


class LlamaAdapter(HFTextAdapter):
    """Llama 3 language models (``meta-llama/Llama-3.1-8B-Instruct``): header-token chat format,
    1-D RoPE, every layer global."""

    name = "llama"
    model_types = ("llama",)
    summary = "Llama 3 language models (text candidates)"


class Gemma3TextAdapter(HFTextAdapter):
    """Gemma 3 text language models (``google/gemma-3-1b-it``): sliding-window layers
    interleaved with global ones (``layer_types``); the probe reads the global layers, which see
    every candidate."""

    name = "gemma3_text"
    model_types = ("gemma3_text",)
    summary = "Gemma 3 text language models (text candidates; global layers read)"


class MistralAdapter(HFTextAdapter):
    """Mistral language models (``mistralai/Mistral-7B-Instruct-v0.3``): ``[INST]`` chat format;
    a config with a ``sliding_window`` makes every layer sliding (layers.py)."""

    name = "mistral"
    model_types = ("mistral",)
    summary = "Mistral language models (text candidates)"


class Phi3Adapter(HFTextAdapter):
    """Phi-3 / Phi-4-mini language models (``microsoft/Phi-3-mini-4k-instruct``, Phi-4-mini):
    ``<|user|>`` chat format, fused QKV projections (the attention interface sees q and k after
    RoPE as for any family)."""

    name = "phi3"
    model_types = ("phi3",)
    summary = "Phi-3 / Phi-4-mini language models (text candidates)"


class Olmo2Adapter(HFTextAdapter):
    """OLMo 2 language models (``allenai/OLMo-2-1124-7B-Instruct``): ``<|user|>`` chat format, QK
    norm, 1-D RoPE."""

    name = "olmo2"
    model_types = ("olmo2",)
    summary = "OLMo 2 language models (text candidates)"


# registration order is the order the registry lists them in
posdebias_register_adapters = register_hook(
    Qwen3Adapter, LlamaAdapter, Gemma3TextAdapter, MistralAdapter, Phi3Adapter, Olmo2Adapter
)
