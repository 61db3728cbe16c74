"""The plugin manager behind a typed facade: the rest of the code never calls ``pm.hook``.

Plugins come from the entry-point group ``posdebias``. A plugin that fails to import, raises in
a hook, implements an unknown hook or registers something invalid is skipped with a warning that
names it; the other plugins keep working. Environment variables:

* ``POSDEBIAS_LOAD_PLUGINS``: comma-separated entry-point names; only these third-party plugins
  load (set it empty to load none).
* ``POSDEBIAS_BLOCK_PLUGINS``: comma-separated entry-point names never to load.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from posdebias.errors import PluginError, UnknownNameError
from posdebias.registry import hookspecs
from posdebias.registry.hookspecs import PROJECT_NAME

ENTRY_POINT_GROUP = "posdebias"
BUILTIN_PLUGIN = "posdebias.builtins"
PLUGIN_GUIDE = "docs/plugins.md"


@dataclass
class PluginInfo:
    """Where a plugin came from and what it registered."""

    name: str
    distribution: str | None = None
    version: str | None = None
    adapters: list[str] = field(default_factory=list)
    calibrators: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class Registered:
    """A registered class and the plugin that provided it."""

    cls: type
    plugin: str


def adapter_priority(cls: type) -> int:
    """An adapter's claim strength on its model_types (``Adapter.priority``, default 0)."""
    value = getattr(cls, "priority", 0)
    return value if isinstance(value, int) else 0


def _names_from_env(variable: str) -> set[str] | None:
    value = os.environ.get(variable)
    if value is None:
        return None
    return {part.strip() for part in value.split(",") if part.strip()}


class Registry:
    """Adapters and calibrators from the built-in plugin and every installed plugin."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._plugins: dict[str, PluginInfo] = {}
        self._adapters: dict[str, Registered] = {}
        self._calibrators: dict[str, Registered] = {}
        from posdebias.registry import builtins

        self.add_plugin(builtins, name=BUILTIN_PLUGIN, distribution="posdebias")
        if load_entry_points:
            self._load_entry_points()

    # -- loading -----------------------------------------------------------------------------

    def _load_entry_points(self) -> None:
        allowed = _names_from_env("POSDEBIAS_LOAD_PLUGINS")
        blocked = _names_from_env("POSDEBIAS_BLOCK_PLUGINS") or set()
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if entry_point.name in blocked or (
                allowed is not None and entry_point.name not in allowed
            ):
                continue
            dist = getattr(entry_point, "dist", None)
            distribution = dist.name if dist else None
            version = dist.version if dist else None
            try:
                plugin = entry_point.load()
            except Exception as exc:  # a broken plugin must not break the tool
                self._fail(
                    entry_point.name,
                    f"failed to import: {type(exc).__name__}: {exc}",
                    distribution,
                    version,
                )
                continue
            self.add_plugin(
                plugin, name=entry_point.name, distribution=distribution, version=version
            )

    def _fail(
        self, name: str, why: str, distribution: str | None = None, version: str | None = None
    ) -> None:
        info = self._plugins.setdefault(name, PluginInfo(name, distribution, version))
        info.error = why
        warnings.warn(f"posdebias plugin {name!r} skipped: {why}", RuntimeWarning, stacklevel=3)

    def add_plugin(
        self,
        plugin: object,
        *,
        name: str,
        distribution: str | None = None,
        version: str | None = None,
    ) -> PluginInfo:
        """Register a plugin object (a module or any object with hook implementations).

        Used for entry points and, in tests or notebooks, for in-process plugins.
        """
        if name in self._plugins and self._plugins[name].error is None:
            raise PluginError(f"a plugin named {name!r} is already registered")
        info = PluginInfo(name, distribution, version)
        self._plugins[name] = info
        try:
            self._pm.register(plugin, name=name)
        except Exception as exc:
            self._fail(name, f"invalid hook implementation: {exc}", distribution, version)
            return info
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self._pm.unregister(name=name)
            self._fail(name, f"implements an unknown hook: {exc}", distribution, version)
            return info
        self._collect(name, info)
        return info

    def _collect(self, name: str, info: PluginInfo) -> None:
        from posdebias.adapters.base import Adapter
        from posdebias.calibrators.base import Calibrator

        staged: dict[str, list[tuple[str, type]]] = {"adapter": [], "calibrator": []}

        def registrar(kind: str, base: type) -> Callable[[type], None]:
            def register(cls: type) -> None:
                if not (isinstance(cls, type) and issubclass(cls, base)):
                    raise PluginError(f"register() got {cls!r}, not a subclass of {base.__name__}")
                cls_name = getattr(cls, "name", None)
                if not isinstance(cls_name, str) or not cls_name:
                    raise PluginError(f"{cls.__name__} has no string class attribute 'name'")
                staged[kind].append((cls_name, cls))

            return register

        plugin = self._pm.get_plugin(name)
        hooks = (
            ("posdebias_register_adapters", registrar("adapter", Adapter)),
            ("posdebias_register_calibrators", registrar("calibrator", Calibrator)),
        )
        try:
            for hook_name, register in hooks:
                for impl in getattr(self._pm.hook, hook_name).get_hookimpls():
                    if impl.plugin is plugin:
                        impl.function(**({"register": register} if impl.argnames else {}))
        except Exception as exc:
            self._pm.unregister(name=name)
            self._fail(name, f"{type(exc).__name__}: {exc}", info.distribution, info.version)
            return
        for kind, table, names in (
            ("adapter", self._adapters, info.adapters),
            ("calibrator", self._calibrators, info.calibrators),
        ):
            for cls_name, cls in staged[kind]:
                if cls_name in table:
                    warnings.warn(
                        f"posdebias plugin {name!r}: {kind} {cls_name!r} is already provided by "
                        f"{table[cls_name].plugin!r}; keeping that one",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                    continue
                if kind == "adapter":
                    self._warn_shared_model_types(name, cls)
                table[cls_name] = Registered(cls, name)
                names.append(cls_name)

    def _warn_shared_model_types(self, plugin: str, cls: type) -> None:
        """Two providers claiming one model_type at the same priority: say which one wins."""
        priority = adapter_priority(cls)
        for model_type in getattr(cls, "model_types", ()):
            for entry in self._adapters.values():
                if model_type in entry.cls.model_types and adapter_priority(entry.cls) == priority:
                    warnings.warn(
                        f"posdebias plugin {plugin!r}: adapter {cls.name!r} claims model_type "
                        f"{model_type!r}, already claimed by adapter {entry.cls.name!r} "
                        f"(plugin {entry.plugin!r}) at the same priority {priority}; "
                        f"{entry.cls.name!r} keeps it. To take over, give {cls.name!r} a higher "
                        f"`priority`, or choose it per run with --adapter {cls.name}",
                        RuntimeWarning,
                        stacklevel=4,
                    )

    # -- queries -----------------------------------------------------------------------------

    def plugins(self) -> list[PluginInfo]:
        return list(self._plugins.values())

    def calibrator_names(self) -> list[str]:
        return list(self._calibrators)

    def adapter_names(self) -> list[str]:
        return list(self._adapters)

    def calibrator_class(self, name: str) -> type:
        return self._lookup(self._calibrators, name, "calibrator").cls

    def adapter_class(self, name: str) -> type:
        return self._lookup(self._adapters, name, "adapter").cls

    def provider(self, kind: str, name: str) -> str:
        table = self._adapters if kind == "adapter" else self._calibrators
        return self._lookup(table, name, kind).plugin

    @staticmethod
    def _lookup(table: dict[str, Registered], name: str, kind: str) -> Registered:
        try:
            return table[name]
        except KeyError:
            known = ", ".join(sorted(table)) or "none"
            raise UnknownNameError(
                f"unknown {kind} {name!r}; known {kind}s: {known}. Third-party {kind}s come "
                f"from plugins (see {PLUGIN_GUIDE}; `posdebias plugins` lists what is installed)"
            ) from None

    def adapter_for_model_type(self, model_type: str) -> type | None:
        """The adapter class ``model_type`` resolves to, or None when none claims it.

        Precedence: the highest ``priority`` among the adapters that list ``model_type``; at
        equal priority the first registered (built-ins register before any plugin).
        """
        claims = self.model_type_claims().get(model_type)
        return claims[0].cls if claims else None

    def model_type_claims(self) -> dict[str, list[Registered]]:
        """Every claimed model_type -> its claimants, the one it resolves to first."""
        claims: dict[str, list[Registered]] = {}
        for entry in self._adapters.values():
            for model_type in getattr(entry.cls, "model_types", ()):
                claims.setdefault(model_type, []).append(entry)
        for entries in claims.values():
            entries.sort(key=lambda entry: -adapter_priority(entry.cls))  # stable: order kept
        return dict(sorted(claims.items()))

    def create_calibrator(self, name: str, **options: Any) -> Any:
        return self.calibrator_class(name)(**options)

    def create_adapter(self, name: str, **options: Any) -> Any:
        return self.adapter_class(name).create(**options)


_registry: Registry | None = None
_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = Registry()
        return _registry


def reset_registry() -> None:
    """Forget the process-wide registry (tests; after installing a plugin)."""
    global _registry
    with _lock:
        _registry = None
