"""pluggy-based registry of adapters, calibrators and bundled models (entry-point group
``posdebias``)."""

from posdebias.registry.bundled import BundledModel
from posdebias.registry.hookspecs import hookimpl
from posdebias.registry.manager import (
    BUILTIN_PLUGINS,
    ENTRY_POINT_GROUP,
    PluginInfo,
    Registry,
    get_calibrator,
    get_registry,
    reset_registry,
)

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "BundledModel",
    "PluginInfo",
    "Registry",
    "get_calibrator",
    "get_registry",
    "hookimpl",
    "reset_registry",
]
