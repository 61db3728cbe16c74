"""posdebias: measure and remove position bias of (multimodal) LLMs wherever a prompt lists N
candidates (images, options, judged answers, passages) and asks for one label.

The public API is re-exported here; see docs/ for the guide. Each name is imported on first use,
so ``import posdebias`` (and ``posdebias --help``) loads neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from posdebias._version import PLUGIN_API_VERSION, __version__

if TYPE_CHECKING:
    from posdebias.adapters.base import Adapter, AdapterOptions
    from posdebias.api import CalibrationWarning, Debiaser, Query, Ranking
    from posdebias.calibrators.base import Calibrator, CalibratorOptions
    from posdebias.core import (
        CalibrationState,
        Candidate,
        Evidence,
        Instance,
        LayerSet,
        Observation,
        Prediction,
        cyclic_rotations,
        symmetrized_calibration_set,
    )
    from posdebias.errors import PosdebiasError
    from posdebias.evaluation.metrics import Metrics, compute_metrics
    from posdebias.loading import get_adapter, load_adapter
    from posdebias.registry import get_calibrator, get_registry, hookimpl

#: Each public name and the module that defines it.
_HOMES = {
    "Adapter": "posdebias.adapters.base",
    "AdapterOptions": "posdebias.adapters.base",
    "CalibrationWarning": "posdebias.api",
    "Debiaser": "posdebias.api",
    "Query": "posdebias.api",
    "Ranking": "posdebias.api",
    "Calibrator": "posdebias.calibrators.base",
    "CalibratorOptions": "posdebias.calibrators.base",
    "CalibrationState": "posdebias.core",
    "Candidate": "posdebias.core",
    "Evidence": "posdebias.core",
    "Instance": "posdebias.core",
    "LayerSet": "posdebias.core",
    "Observation": "posdebias.core",
    "Prediction": "posdebias.core",
    "cyclic_rotations": "posdebias.core",
    "symmetrized_calibration_set": "posdebias.core",
    "PosdebiasError": "posdebias.errors",
    "Metrics": "posdebias.evaluation.metrics",
    "compute_metrics": "posdebias.evaluation.metrics",
    "get_adapter": "posdebias.loading",
    "load_adapter": "posdebias.loading",
    "get_calibrator": "posdebias.registry",
    "get_registry": "posdebias.registry",
    "hookimpl": "posdebias.registry",
}

__all__ = [
    "PLUGIN_API_VERSION",
    "Adapter",
    "AdapterOptions",
    "CalibrationState",
    "CalibrationWarning",
    "Calibrator",
    "CalibratorOptions",
    "Candidate",
    "Debiaser",
    "Evidence",
    "Instance",
    "LayerSet",
    "Metrics",
    "Observation",
    "PosdebiasError",
    "Prediction",
    "Query",
    "Ranking",
    "__version__",
    "compute_metrics",
    "cyclic_rotations",
    "get_adapter",
    "get_calibrator",
    "get_registry",
    "hookimpl",
    "load_adapter",
    "symmetrized_calibration_set",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'posdebias' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
