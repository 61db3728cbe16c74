"""Presets: a named model with the settings it runs best with, resolved once at config time.

The bundled default run (``posdebias evaluate`` with no arguments) is one preset: the model a
plugin registered as the default bundled model (the organism, for posdebias itself), its
benchmark, its forward batch and its CPU threads. :func:`resolve_preset` turns the registry's
:class:`~posdebias.registry.BundledModel` into a :class:`Preset` once; no phase of a run tests a
model by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from posdebias._inputs import excerpt
from posdebias._threads import torch_threads
from posdebias.benchmarks.files import benchmark_task
from posdebias.errors import ConfigError, InputError
from posdebias.evaluation.config import EvaluateConfig
from posdebias.registry import BundledModel, get_registry


@dataclass(frozen=True)
class Preset:
    """What a named model brings along when a config leaves it open.

    Attributes:
        model: the model id the preset is for; it is the model of a config naming neither a
            model nor an adapter.
        benchmark: ``(n, instances_needed) -> folder`` of the benchmark used when the config
            names none (may build it on first use; raises an InputError when it cannot serve).
        batch_size: forward batch when no batch size is given (None: the config's default).
        threads: torch CPU threads for the run (None: the default for a shared machine).
    """

    model: str
    benchmark: Callable[[int, int], Path] | None = None
    batch_size: int | None = None
    threads: int | None = None

    @classmethod
    def from_bundled(cls, bundled: BundledModel) -> Preset:
        """The preset of a bundled model registered by a plugin."""
        benchmark = None
        if bundled.benchmark is not None:
            make, size = bundled.benchmark, bundled.benchmark_size

            def benchmark(n: int, needed: int) -> Path:
                if size is not None and needed > size:
                    raise InputError(
                        f"the bundled benchmark has {size} instances, fewer than the {needed} "
                        "asked for (--count plus --calibration-count); lower --count or build "
                        "a larger one with `posdebias build --source shapes`"
                    )
                return make(n)

        return cls(
            model=bundled.name,
            benchmark=benchmark,
            batch_size=bundled.batch_size,
            threads=bundled.threads,
        )


@dataclass(frozen=True)
class ResolvedConfig:
    """A config with a preset applied: what every phase of a run reads."""

    config: EvaluateConfig
    preset: Preset | None = None

    def benchmark_factory(self) -> Callable[[int, int], Path] | None:
        return None if self.preset is None else self.preset.benchmark

    @contextlib.contextmanager
    def threads(self) -> Iterator[int]:
        """Run with the preset's torch thread count (none: the default for a shared machine,
        :func:`posdebias._threads.default_threads`); a count the user chose (``--threads``)
        holds over both, and torch's setting is restored after."""
        with torch_threads(None if self.preset is None else self.preset.threads) as count:
            yield count


def registry_preset(config: EvaluateConfig) -> Preset | None:
    """The preset of the bundled model the config runs: the registry's default model when the
    config names neither a model nor an adapter, the bundled model it names, else None."""
    registry = get_registry()
    model = named_model(config)
    if model is None and config.adapter.name is None:  # the model of the task asked or posed
        posed = None if config.benchmark is None else benchmark_task(config.benchmark)
        bundled = registry.default_model(config.task or posed or "retrieval")
    else:
        bundled = registry.bundled_model(model) if model is not None else None
    return None if bundled is None else Preset.from_bundled(bundled)


def named_model(config: EvaluateConfig) -> str | None:
    """The model the config names: ``model`` (``--model``) or its adapter's option ``model``
    (a config file may name it there); two different models are refused."""
    named = config.adapter.options.get("model")
    if named is not None and not isinstance(named, str):
        raise ConfigError(
            f"adapter option model: a model id or path (text), not {type(named).__name__}"
        )
    if config.model is not None and named is not None and named != config.model:
        raise InputError(
            f"two models given: --model {excerpt(config.model)} and the adapter option "
            f"model={excerpt(named)}; give one"
        )
    return config.model if config.model is not None else named


def resolve_preset(config: EvaluateConfig, preset: Preset | None = None) -> ResolvedConfig:
    """Apply ``preset`` (default: :func:`registry_preset`) where the config leaves a setting
    open.

    The preset applies when the config names neither a model nor an adapter (then its model is
    the config's model) or names the preset's model. A batch size the user gave is kept: results
    do not depend on it, and the run records the one it used.
    """
    if preset is None:
        preset = registry_preset(config)
    if preset is None:
        return ResolvedConfig(config)
    update: dict[str, object] = {}
    model = named_model(config)
    if model is None and config.adapter.name is None:
        update["model"] = preset.model
    elif model != preset.model:
        return ResolvedConfig(config)
    if "batch_size" not in config.model_fields_set and preset.batch_size is not None:
        update["batch_size"] = preset.batch_size
    resolved = config.model_copy(update=update)
    return ResolvedConfig(resolved, preset)
