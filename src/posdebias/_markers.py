"""The pluggy project name, the public ``hookimpl`` marker and :func:`register_hook`.

They live at the bottom of the package so that every built-in adapter, calibrator and bundled
model module can mark its own hook implementations without importing the registry above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT_NAME = "posdebias"

#: Marks a plugin's hook implementations (public as ``posdebias.hookimpl``).
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


def register_hook(*plugins: Any) -> Callable[[Callable[[Any], None]], None]:
    """A hook implementation that registers ``plugins``: what a built-in module assigns to
    the hook it implements (``posdebias_register_adapters = register_hook(MyAdapter)``), so
    that each built-in stays a plugin of its own without writing the hook out."""

    @hookimpl
    def register_all(register: Callable[[Any], None]) -> None:
        for plugin in plugins:
            register(plugin)

    return register_all
