"""vanilla: the model's own answer, argmax of the label scores."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from posdebias._markers import hookimpl
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


@hookimpl
def posdebias_register_calibrators(register: Callable[[type[Calibrator]], None]) -> None:
    register(Vanilla)
