"""vanilla: the model's own answer, argmax of the label scores."""

from __future__ import annotations

from collections.abc import Sequence

from posdebias._markers import register_hook
from posdebias.calibrators.base import Calibrator
from posdebias.core.observation import Observation, Prediction
from posdebias.core.state import CalibrationState


class Vanilla(Calibrator):
    name = "vanilla"
    summary = "argmax of the label log-probabilities (no correction)"

    def _predict(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
    ) -> Prediction:
        return Prediction(scores=observation.label_logprobs)


posdebias_register_calibrators = register_hook(Vanilla)
