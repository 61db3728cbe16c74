"""Presets: a named model with the settings it runs best with, resolved once at config time.

The bundled default run (``posdebias evaluate`` with no arguments) is one preset: the organism
model, its shapes benchmark, one forward batch per test instance and one CPU thread. The preset
is handed down by the layer that knows the model (the command line registers the organism's);
no phase of a run tests a model by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from posdebias.evaluation.config import EvaluateConfig


@dataclass(frozen=True)
class Preset:
    """What a named model brings along when a config leaves it open.

    Attributes:
        model: the model id the preset is for; it is the model of a config naming neither a
            model nor an adapter.
        benchmark: ``(n, instances_needed) -> folder`` of the benchmark used when the config
            names none (may build it on first use; raises an InputError when it cannot serve).
        batch_size_per_view: when true and no batch size is given, one forward batch holds a
            test instance's views: orders x N.
        threads: torch CPU threads for the run (None: torch's own setting).
    """

    model: str
    benchmark: Callable[[int, int], Path] | None = None
    batch_size_per_view: bool = False
    threads: int | None = None


@dataclass(frozen=True)
class ResolvedConfig:
    """A config with a preset applied: what every phase of a run reads."""

    config: EvaluateConfig
    preset: Preset | None = None

    def benchmark_factory(self) -> Callable[[int, int], Path] | None:
        return None if self.preset is None else self.preset.benchmark

    @contextlib.contextmanager
    def threads(self) -> Iterator[None]:
        """Run with the preset's torch thread count (the caller's setting is restored after)."""
        if self.preset is None or self.preset.threads is None:
            yield
            return
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(self.preset.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)


def resolve_preset(config: EvaluateConfig, preset: Preset | None) -> ResolvedConfig:
    """Apply ``preset`` where the config leaves a setting open.

    The preset applies when the config names neither a model nor an adapter (then its model is
    the config's model) or names the preset's model. A batch size the user gave is kept: results
    do not depend on it, and the run records the one it used.
    """
    if preset is None:
        return ResolvedConfig(config)
    update: dict[str, object] = {}
    if config.model is None and config.adapter.name is None:
        update["model"] = preset.model
    elif config.model != preset.model:
        return ResolvedConfig(config)
    if preset.batch_size_per_view and "batch_size" not in config.model_fields_set:
        update["batch_size"] = config.orders * config.n
    resolved = config.model_copy(update=update)
    return ResolvedConfig(resolved, preset)
