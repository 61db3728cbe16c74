"""The plugin manager behind a typed facade: the rest of the code asks the :class:`Registry`.

Built-ins are ordinary plugins: each built-in calibrator or bundled model is one module with its
own hook implementation (``register_hook``), listed by module name in :data:`BUILTIN_PLUGINS`; so
is each family, unless it differs from a sibling only in data and shares its module. Third-party
plugins come from the entry-point group ``posdebias``. Hooks are called through pluggy as
historic hooks: the registry makes each call once, and pluggy replays it for every plugin while
that plugin is registered, so what a plugin registers is attributed to it and a plugin that
fails is skipped alone.

A plugin that fails to import, raises in a hook, implements an unknown hook or registers
something invalid is skipped with a :class:`~posdebias.errors.PosdebiasPluginWarning` that names
it; the other plugins keep working. Environment variables:

* ``POSDEBIAS_LOAD_PLUGINS``: comma-separated entry-point names; only these third-party plugins
  load (set it empty to load none).
* ``POSDEBIAS_BLOCK_PLUGINS``: comma-separated entry-point names never to load.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import pluggy

from posdebias._version import __version__
from posdebias.adapters.base import Adapter
from posdebias.calibrators.base import Calibrator
from posdebias.decoders.base import Decoder
from posdebias.errors import PluginError, PosdebiasPluginWarning, UnknownNameError
from posdebias.registry import hookspecs
from posdebias.registry.bundled import BundledModel
from posdebias.registry.hookspecs import PROJECT_NAME

ENTRY_POINT_GROUP = "posdebias"
PLUGIN_GUIDE = "the Plugins page of the posdebias documentation"

#: The built-in plugins, by module name: each module registers itself through the hooks.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "posdebias.adapters.families.synthetic",
    "posdebias.adapters.families.qwen2_vl",
    "posdebias.adapters.families.idefics3",
    "posdebias.adapters.families.mistral3",
    "posdebias.adapters.families.glm4v",
    "posdebias.adapters.families.gemma3",
    "posdebias.adapters.families.llama4",
    "posdebias.adapters.families.internvl",
    "posdebias.adapters.families.llava",
    "posdebias.adapters.families.lfm2_vl",
    "posdebias.adapters.families.molmo2",
    "posdebias.adapters.families.kimi_k25",
    "posdebias.adapters.families.aya_vision",
    "posdebias.adapters.families.idefics2",
    "posdebias.adapters.families.gemma4",
    "posdebias.adapters.families.mllama",
    "posdebias.adapters.families.ovis2",
    "posdebias.adapters.families.cohere2_vision",
    "posdebias.adapters.families.paligemma",
    "posdebias.adapters.families.phi4_multimodal",
    "posdebias.adapters.families.qwen2_5_omni",
    "posdebias.adapters.families.text",
    "posdebias.adapters.server",
    "posdebias.adapters.families.generic",  # last: the fallback when no family claims a model_type
    "posdebias.calibrators.vanilla",
    "posdebias.calibrators.pride",
    "posdebias.calibrators.attention_readout",
    "posdebias.calibrators.purified_attention",
    "posdebias.calibrators.attention_guided",
    "posdebias.calibrators.permutation_average",
    "posdebias.calibrators.permutation_self_consistency",
    "posdebias.calibrators.label_free",
    "posdebias.calibrators.contextual",
    "posdebias.calibrators.batch",
    "posdebias.decoders.generated",
    "posdebias.decoders.sofa",
    "posdebias.decoders.cloze",
    "posdebias.organism",
    "posdebias.organism.text",
)

T = TypeVar("T")


@dataclass
class PluginInfo:
    """Where a plugin came from and what it registered."""

    name: str
    distribution: str | None = None
    version: str | None = None
    adapters: list[str] = field(default_factory=list)
    calibrators: list[str] = field(default_factory=list)
    decoders: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    error: str | None = None

    def describe(self) -> str:
        """``plugin 'NAME' (distribution DIST VERSION)``, for messages."""
        if self.distribution is None:
            return f"plugin {self.name!r}"
        return f"plugin {self.name!r} (distribution {self.distribution} {self.version or '?'})"


@dataclass(frozen=True)
class Registered(Generic[T]):
    """A registered thing and the plugin that provided it."""

    value: T
    plugin: str


#: The class a plugin's adapters, calibrators and decoders subclass (a bundled model is checked
#: by :func:`_check_model`).
_BASES: dict[str, type] = {"adapter": Adapter, "calibrator": Calibrator, "decoder": Decoder}


def adapter_priority(cls: type) -> int:
    """An adapter's claim strength on its model_types (``Adapter.priority``, default 0)."""
    value = getattr(cls, "priority", 0)
    return value if isinstance(value, int) else 0


def _names_from_env(variable: str) -> set[str] | None:
    value = os.environ.get(variable)
    if value is None:
        return None
    return {part.strip() for part in value.split(",") if part.strip()}


def _check_class(cls: object, base: type, kind: str) -> str:
    """The registry name of ``cls``; raises PluginError when it cannot be registered."""
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PluginError(f"register() got {cls!r}, not a subclass of {base.__name__}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise PluginError(f"{cls.__name__} has no string class attribute 'name'")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise PluginError(
            f"{kind} {name!r} ({cls.__name__}) is abstract: it does not implement {missing}; "
            f"register a concrete subclass of {base.__name__}"
        )
    return name


def _check_model(model: object) -> str:
    if not isinstance(model, BundledModel):
        raise PluginError(f"register() got {model!r}, not a posdebias BundledModel")
    if not (Path(model.path) / "config.json").is_file():
        raise PluginError(f"bundled model {model.name!r}: {model.path} has no config.json")
    return model.name


class Registry:
    """Adapters, calibrators and bundled models from the built-in and installed plugins."""

    def __init__(self, *, load_entry_points: bool = True) -> None:
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._plugins: dict[str, PluginInfo] = {}
        self._adapters: dict[str, Registered[type[Adapter]]] = {}
        self._calibrators: dict[str, Registered[type[Calibrator]]] = {}
        self._decoders: dict[str, Registered[type[Decoder]]] = {}
        self._models: dict[str, Registered[BundledModel]] = {}
        #: each kind's table, for the queries that take the kind by name
        self._tables: dict[str, dict[str, Registered[Any]]] = {
            "adapter": self._adapters,
            "calibrator": self._calibrators,
            "decoder": self._decoders,
            "model": self._models,
        }
        #: what the plugin being registered provides, by kind, kept until it registered without
        #: error
        self._staging: dict[str, list[tuple[str, Any]]] | None = None
        hook = self._pm.hook
        for kind in _BASES:  # posdebias_register_adapters, _calibrators, _decoders
            callback = functools.partial(self._register, kind)
            getattr(hook, f"posdebias_register_{kind}s").call_historic(
                kwargs={"register": callback}
            )
        hook.posdebias_register_models.call_historic(kwargs={"register": self._register_model})
        for module in BUILTIN_PLUGINS:
            self.add_plugin(
                importlib.import_module(module),
                name=module,
                distribution="posdebias",
                version=__version__,
            )
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
            distribution, version = (dist.name, dist.version) if dist else (None, None)
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
        warnings.warn(
            f"posdebias {PluginInfo(name, distribution, version).describe()} skipped: {why}",
            PosdebiasPluginWarning,
            stacklevel=3,
        )

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
        staging = self._staging = {kind: [] for kind in self._tables}
        try:
            self._pm.register(plugin, name=name)  # pluggy replays the hook calls for it here
        except pluggy.PluginValidationError as exc:
            self._fail(name, f"invalid hook implementation: {exc}", distribution, version)
            return info
        except Exception as exc:
            if self._pm.get_plugin(name) is not None:
                self._pm.unregister(name=name)
            self._fail(name, f"{type(exc).__name__}: {exc}", distribution, version)
            return info
        finally:
            self._staging = None
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self._pm.unregister(name=name)
            self._fail(name, f"implements an unknown hook: {exc}", distribution, version)
            return info
        for kind, staged in staging.items():
            self._store(kind, staged, info)
        return info

    # The ``register`` callbacks the hooks receive (their documented parameters: ``cls``, and
    # ``model`` for bundled models): they stage what the plugin being registered provides; it is
    # stored only if the whole plugin registers cleanly.

    def _staged(self, kind: str) -> list[tuple[str, Any]]:
        if self._staging is None:
            raise PluginError("register() may only be called from within a posdebias hook")
        return self._staging[kind]

    def _register(self, kind: str, cls: type) -> None:
        self._staged(kind).append((_check_class(cls, _BASES[kind], kind), cls))

    def _register_model(self, model: BundledModel) -> None:
        self._staged("model").append((_check_model(model), model))

    def _store(self, kind: str, staged: list[tuple[str, Any]], info: PluginInfo) -> None:
        table, names = self._tables[kind], getattr(info, f"{kind}s")
        for name, value in staged:
            if name in table:
                warnings.warn(
                    f"posdebias plugin {info.name!r}: {kind} {name!r} is already provided by "
                    f"{table[name].plugin!r}; keeping that one",
                    PosdebiasPluginWarning,
                    stacklevel=4,
                )
                continue
            if kind == "adapter":
                self._warn_shared_model_types(info.name, value)
            table[name] = Registered(value, info.name)
            names.append(name)

    def _warn_shared_model_types(self, plugin: str, cls: type[Adapter]) -> None:
        """Two providers claiming one model_type at the same priority: say which one wins."""
        priority = adapter_priority(cls)
        for model_type in cls.model_types:
            for entry in self._adapters.values():
                if (
                    model_type in entry.value.model_types
                    and adapter_priority(entry.value) == priority
                ):
                    warnings.warn(
                        f"posdebias plugin {plugin!r}: adapter {cls.name!r} claims model_type "
                        f"{model_type!r}, already claimed by adapter {entry.value.name!r} "
                        f"(plugin {entry.plugin!r}) at the same priority {priority}; "
                        f"{entry.value.name!r} keeps it. To take over, give {cls.name!r} a "
                        f"higher `priority`, or choose it per run with --adapter {cls.name}",
                        PosdebiasPluginWarning,
                        stacklevel=5,
                    )

    # -- queries -----------------------------------------------------------------------------

    def plugins(self) -> list[PluginInfo]:
        return list(self._plugins.values())

    def plugin(self, name: str) -> PluginInfo:
        """The :class:`PluginInfo` of a loaded plugin by name."""
        return self._plugins[name]

    def plugin_of(self, kind: str, cls: type) -> PluginInfo | None:
        """The plugin that registered ``cls`` as an adapter, calibrator or decoder, or None."""
        plugins = (self._plugins[e.plugin] for e in self._tables[kind].values() if e.value is cls)
        return next(plugins, None)

    def calibrator_names(self) -> list[str]:
        return list(self._calibrators)

    def decoder_names(self) -> list[str]:
        return list(self._decoders)

    def decoder_class(self, name: str) -> type[Decoder]:
        return self._lookup(self._decoders, name, "decoder").value

    def create_decoder(self, name: str, **options: Any) -> Decoder:
        return self.decoder_class(name)(**options)

    def adapter_names(self) -> list[str]:
        return list(self._adapters)

    def calibrator_class(self, name: str) -> type[Calibrator]:
        return self._lookup(self._calibrators, name, "calibrator").value

    def adapter_class(self, name: str) -> type[Adapter]:
        return self._lookup(self._adapters, name, "adapter").value

    def provider(self, kind: str, name: str) -> str:
        """The name of the plugin that registered the adapter/calibrator/model ``name``."""
        return self._lookup(self._tables[kind], name, kind).plugin

    @staticmethod
    def _lookup(table: dict[str, Registered[T]], name: str, kind: str) -> Registered[T]:
        try:
            return table[name]
        except KeyError:
            known = ", ".join(sorted(table)) or "none"
            raise UnknownNameError(
                f"unknown {kind} {name!r}; known {kind}s: {known}. Third-party {kind}s come "
                f"from plugins (see {PLUGIN_GUIDE}; `posdebias plugins` lists what is installed)"
            ) from None

    def adapter_for_model_type(self, model_type: str) -> type[Adapter] | None:
        """The adapter class ``model_type`` resolves to, or None when none claims it.

        Precedence: the highest ``priority`` among the adapters that list ``model_type``; at
        equal priority the first registered (built-ins register before any plugin).
        """
        claims = self.model_type_claims().get(model_type)
        return claims[0].value if claims else None

    def model_type_claims(self) -> dict[str, list[Registered[type[Adapter]]]]:
        """Every claimed model_type -> its claimants, the one it resolves to first."""
        claims: dict[str, list[Registered[type[Adapter]]]] = {}
        for entry in self._adapters.values():
            for model_type in entry.value.model_types:
                claims.setdefault(model_type, []).append(entry)
        for entries in claims.values():
            entries.sort(key=lambda entry: -adapter_priority(entry.value))  # stable: order kept
        return dict(sorted(claims.items()))

    def create_calibrator(self, name: str, **options: Any) -> Calibrator:
        return self.calibrator_class(name)(**options)

    def create_adapter(self, name: str, **options: Any) -> Adapter:
        """An adapter built from options alone (``Adapter.create``); models load through
        :func:`posdebias.loading.load_adapter`."""
        return self.adapter_class(name).create(**options)

    # -- bundled models ----------------------------------------------------------------------

    def bundled_models(self) -> list[BundledModel]:
        return [entry.value for entry in self._models.values()]

    def bundled_model(self, name: str) -> BundledModel | None:
        """The bundled model registered under ``name``, or None."""
        entry = self._models.get(name)
        return entry.value if entry else None

    def default_model(self, task: str = "retrieval") -> BundledModel | None:
        """The bundled model that runs when neither a model nor an adapter is named, for
        ``task`` (each task has at most one default)."""
        return next(
            (model for model in self.bundled_models() if model.default and model.task == task),
            None,
        )


_registry: Registry | None = None
_lock = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = Registry()
        return _registry


def get_calibrator(name: str, **options: Any) -> Calibrator:
    """A calibrator by registry name; unknown names and options give a clear error."""
    return get_registry().create_calibrator(name, **options)


def reset_registry() -> None:
    """Forget the process-wide registry (tests; after installing a plugin)."""
    global _registry
    with _lock:
        _registry = None
