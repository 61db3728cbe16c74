"""Hook specifications: the plugin contract of posdebias.

A plugin is a module (or object) exposed through the entry-point group ``posdebias`` that
implements one or more hooks with the public marker :data:`posdebias.hookimpl`::

    from posdebias import hookimpl

    @hookimpl
    def posdebias_register_calibrators(register):
        register(MyCalibrator)

Hooks receive a ``register`` callback instead of returning lists, so a plugin can register zero,
one or many things and the host decides how to store them. The hooks are pluggy "historic"
hooks: the registry calls each once, and pluggy replays the call for every plugin as it is
registered, passing only the arguments an implementation takes; so a hook may gain arguments
later without breaking older plugins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

from posdebias._markers import PROJECT_NAME, hookimpl

if TYPE_CHECKING:
    from posdebias.adapters.base import Adapter
    from posdebias.calibrators.base import Calibrator
    from posdebias.decoders.base import Decoder
    from posdebias.registry.bundled import BundledModel

hookspec = pluggy.HookspecMarker(PROJECT_NAME)

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]


@hookspec(historic=True)
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    """Register model adapters.

    Called once per plugin, when the registry loads it. ``register(cls)`` takes a concrete
    subclass of :class:`posdebias.Adapter` with a unique ``name`` and the ``model_types``
    (Hugging Face ``config.model_type`` values) it handles. Returns nothing.
    """


@hookspec(historic=True)
def posdebias_register_calibrators(register: Callable[[type[Calibrator]], None]) -> None:
    """Register calibrators.

    Called once per plugin, when the registry loads it. ``register(cls)`` takes a concrete
    subclass of :class:`posdebias.Calibrator` with a unique ``name`` and a pydantic ``Options``
    model. Returns nothing.
    """


@hookspec(historic=True)
def posdebias_register_decoders(register: Callable[[type[Decoder]], None]) -> None:
    """Register decoders: methods that call the model themselves (generated answers, SoFA).

    Called once per plugin, when the registry loads it. ``register(cls)`` takes a concrete
    subclass of :class:`posdebias.decoders.Decoder` with a unique ``name`` and a pydantic
    ``Options`` model; its rows sit next to the calibrators' (``--decoders NAME``). Returns
    nothing.
    """


@hookspec(historic=True)
def posdebias_register_models(register: Callable[[BundledModel], None]) -> None:
    """Register model folders shipped inside a package (loadable offline by name).

    Called once per plugin, when the registry loads it. ``register(model)`` takes a
    :class:`posdebias.registry.BundledModel`: the name it loads under (like a hub id, never
    looked up online), its folder, and optionally the benchmark it runs on by default.
    Returns nothing.
    """
