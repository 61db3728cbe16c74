"""The adapter contract: :class:`Adapter`, its options and the generation types it returns.

Below it, by kind: :mod:`posdebias.adapters.hf` (the shared Hugging Face machinery, the surface
a family plugin imports), :mod:`posdebias.adapters.attention` (what is registered with
transformers' attention interface) and :mod:`posdebias.adapters.families` (one module per
built-in family). The Hugging Face adapters import torch and transformers only when a model is
loaded, so listing them (``posdebias plugins``) stays fast.
"""

from posdebias._deprecation import alias_modules, moved_attributes
from posdebias.adapters.base import (
    Adapter,
    AdapterOptions,
    Generation,
    GenerationSettings,
    SofaSettings,
)

__all__ = ["Adapter", "AdapterOptions", "Generation", "GenerationSettings", "SofaSettings"]

_FAMILIES = "posdebias.adapters.families"
_FAMILY_CLASSES = {
    "Gemma3Adapter": "gemma3",
    "GenericAdapter": "generic",
    "Glm4vAdapter": "glm4v",
    "Idefics3Adapter": "idefics3",
    "InternVLAdapter": "internvl",
    "Llama4Adapter": "llama4",
    "LlavaAdapter": "llava",
    "LlavaOnevisionAdapter": "llava_onevision",
    "Mistral3Adapter": "mistral3",
    "Qwen2VLAdapter": "qwen2_vl",
    "Qwen3VLAdapter": "qwen3_vl",
    "Qwen3_5Adapter": "qwen3_5",
    "SyntheticAdapter": "synthetic",
}

# Deprecated in 0.2, removed in 0.3: the pre-0.2 flat layout of this package.
__getattr__ = moved_attributes(
    globals(),
    {
        "HFAdapter": "posdebias.adapters.hf",
        "HFAdapterOptions": "posdebias.adapters.hf",
        **{name: f"{_FAMILIES}.{module}" for name, module in _FAMILY_CLASSES.items()},
    },
)
alias_modules(
    {
        **{f"{__name__}.{module}": f"{_FAMILIES}.{module}" for module in _FAMILY_CLASSES.values()},
        **{
            f"{__name__}.{module}": f"{__name__}.hf.{module}"
            for module in ("spans", "scoring", "prompt", "generation", "verify", "cache", "layers")
        },
        **{
            f"{__name__}.{module}": f"{__name__}.attention.{module}"
            for module in ("sofa", "shared_prefix")
        },
        f"{__name__}.probe": f"{__name__}.attention",  # the probe's function moved there
        f"{__name__}.check": "posdebias.testing.check",
        f"{__name__}.tiny": "posdebias.testing.tiny.common",
    }
)
