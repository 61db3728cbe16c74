"""Old names that keep working for one minor release, with a :class:`DeprecationWarning`.

The compatibility policy (docs/compatibility.md): a module, class or function that moves or goes
keeps its old path for one minor release, and using the old path warns with the new one. Moved
modules are aliases (the old name IS the new module object, so monkeypatching either is the
same), made here from one table per package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

#: The release in which the deprecated names of 0.2 are removed.
REMOVED_IN = "0.3"


def warn_moved(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new``."""
    warnings.warn(
        f"{old} is deprecated and will be removed in posdebias {REMOVED_IN}; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import ``old`` module names as their new modules, warning once per name."""

    def __init__(self, moved: Mapping[str, str]) -> None:
        self.moved = dict(moved)

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = self.moved[spec.name]
        # the warning points at the import statement (warnings skips importlib's own frames)
        warn_moved(f"module {spec.name}", new, stacklevel=3)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        return None  # the new module is already executed


def alias_modules(moved: Mapping[str, str]) -> None:
    """Make every ``old`` module name of ``moved`` import ``moved[old]`` (with a warning)."""
    sys.meta_path.append(_MovedModules(moved))


def moved_attributes(namespace: dict[str, Any], moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (``namespace`` is the module's ``globals()``) for names that
    moved out of it: ``moved[name]`` is the module now holding ``name``. The first use of an
    old name warns and returns the object (then kept in ``namespace``)."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warn_moved(f"{package}.{name}", f"{moved[name]}.{name}")
        value = getattr(importlib.import_module(moved[name]), name)
        namespace[name] = value
        return value

    return __getattr__
