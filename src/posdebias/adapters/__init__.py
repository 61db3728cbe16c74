"""The adapter contract: :class:`Adapter`, its options and the generation types it returns.

Below it, by kind: :mod:`posdebias.adapters.hf` (the shared Hugging Face machinery, the surface
a family plugin imports), :mod:`posdebias.adapters.attention` (what is registered with
transformers' attention interface) and :mod:`posdebias.adapters.families` (one module per
built-in family). The Hugging Face adapters import torch and transformers only when a model is
loaded, so listing them (``posdebias plugins``) stays fast.
"""

from posdebias.adapters.base import (
    Adapter,
    AdapterOptions,
    Generation,
    GenerationSettings,
    SofaSettings,
)

__all__ = ["Adapter", "AdapterOptions", "Generation", "GenerationSettings", "SofaSettings"]
