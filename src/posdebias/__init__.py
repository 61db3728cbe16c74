"""posdebias: measure and remove position bias of (multimodal) LLMs wherever a prompt lists N
candidates (images, options, judged answers, passages) and asks for one label.

The public API is re-exported here; see docs/ for the guide.
"""

from __future__ import annotations

from typing import Any

from posdebias._version import __version__
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
    RetrievalInstance,
    cyclic_rotations,
    symmetrized_calibration_set,
)
from posdebias.errors import PosdebiasError
from posdebias.evaluation.metrics import Metrics, compute_metrics
from posdebias.loading import get_adapter, load_adapter
from posdebias.registry import get_registry, hookimpl


def get_calibrator(name: str, **options: Any) -> Calibrator:
    """A calibrator by registry name; unknown names and options give a clear error."""
    return get_registry().create_calibrator(name, **options)


__all__ = [
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
    "RetrievalInstance",
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
