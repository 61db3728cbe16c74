"""Model adapters: each turns one model family into observations."""

from posdebias.adapters.base import Adapter, AdapterOptions
from posdebias.adapters.synthetic import SyntheticAdapter

BUILTIN_ADAPTERS: tuple[type[Adapter], ...] = (SyntheticAdapter,)

__all__ = ["BUILTIN_ADAPTERS", "Adapter", "AdapterOptions", "SyntheticAdapter"]
