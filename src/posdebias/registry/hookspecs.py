"""Hook specifications: the plugin contract of posdebias.

A plugin is a module (or object) exposed through the entry-point group ``posdebias`` that
implements one or both hooks with the public marker :data:`posdebias.hookimpl`::

    from posdebias import hookimpl

    @hookimpl
    def posdebias_register_calibrators(register):
        register(MyCalibrator)

Hooks receive a ``register`` callback instead of returning lists, so a plugin can register zero,
one or many classes and the host decides how to store them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT_NAME = "posdebias"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def posdebias_register_adapters(register: Callable[[type[Any]], None]) -> None:
    """Register model adapters.

    Called once, when the registry first loads plugins. ``register(cls)`` takes a subclass of
    :class:`posdebias.Adapter` with a unique ``name`` and the ``model_types`` (Hugging Face
    ``config.model_type`` values) it handles. Returns nothing.
    """


@hookspec
def posdebias_register_calibrators(register: Callable[[type[Any]], None]) -> None:
    """Register calibrators.

    Called once, when the registry first loads plugins. ``register(cls)`` takes a subclass of
    :class:`posdebias.Calibrator` with a unique ``name`` and a pydantic ``Options`` model.
    Returns nothing.
    """


@hookspec
def posdebias_register_decoders(register: Callable[[type[Any]], None]) -> None:
    """Register decoders: methods that call the model themselves (generated answers, SoFA).

    Called once, when the registry first loads plugins. ``register(cls)`` takes a subclass of
    :class:`posdebias.decoders.Decoder` with a unique ``name`` and a pydantic ``Options``
    model; its rows sit next to the calibrators' (``--decoders NAME``). Returns nothing.
    """
