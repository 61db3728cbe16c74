"""The tiny random-weight test models of the built-in families, one module per family.

Each module holds ``MODEL_TYPES`` (the ``config.model_type`` values it builds) and
``tiny_model(model_type, *, real_vocabulary=False) -> (model, processor)``. :data:`BUILDERS`
maps every model type to its builder; :func:`posdebias.testing.tiny_model_and_processor` is the
public entry point (a plugin adapter's own ``Adapter.tiny_model`` is asked first).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

#: ``(model_type, *, real_vocabulary=False) -> (model, processor)``.
Builder = Callable[..., tuple[Any, Any]]


def _builders() -> dict[str, Builder]:
    """Every module of this package that builds models (it has ``MODEL_TYPES``), found, not
    listed: the families are listed once, in the registry's built-in plugins."""
    builders: dict[str, Builder] = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        types = getattr(module, "MODEL_TYPES", None)
        if types is not None:
            builders.update(dict.fromkeys(types, module.tiny_model))
    return builders


#: ``config.model_type`` -> the builder of its tiny model.
BUILDERS: dict[str, Builder] = _builders()

__all__ = ["BUILDERS", "Builder"]
