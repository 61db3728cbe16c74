"""Data types and pipeline stages; no model, no I/O beyond JSON states."""

from posdebias.core.answers import AnswerParser
from posdebias.core.instance import (
    TASK_KINDS,
    Candidate,
    Instance,
    random_orders,
    rotation_order,
)
from posdebias.core.labels import LABEL_SETS, LabelSet, get_label_set
from posdebias.core.layers import LAYER_KINDS, LayerSet
from posdebias.core.observation import Evidence, Observation, Prediction
from posdebias.core.stages import BiasProfiler, Corrector, LayerSelector, PriorEstimator
from posdebias.core.state import CalibrationState
from posdebias.core.symmetry import cyclic_rotations, symmetrized_calibration_set

__all__ = [
    "LABEL_SETS",
    "LAYER_KINDS",
    "TASK_KINDS",
    "AnswerParser",
    "BiasProfiler",
    "CalibrationState",
    "Candidate",
    "Corrector",
    "Evidence",
    "Instance",
    "LabelSet",
    "LayerSelector",
    "LayerSet",
    "Observation",
    "Prediction",
    "PriorEstimator",
    "cyclic_rotations",
    "get_label_set",
    "random_orders",
    "rotation_order",
    "symmetrized_calibration_set",
]
