"""pluggy-based registry of adapters and calibrators (entry-point group ``posdebias``)."""

from posdebias.registry.hookspecs import hookimpl
from posdebias.registry.manager import (
    ENTRY_POINT_GROUP,
    PluginInfo,
    Registry,
    get_registry,
    reset_registry,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "Registry",
    "get_registry",
    "hookimpl",
    "reset_registry",
]
