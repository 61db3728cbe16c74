"""vanilla: the model's own answer, argmax of the label scores."""

from __future__ import annotations

from collections.abc import Callable

from posdebias._markers import hookimpl
from posdebias.calibrators.base import Calibrator
from posdebias.core.observation import Prediction


class Vanilla(Calibrator):
    name = "vanilla"
    summary = "argmax of the label log-probabilities (no correction)"

    def _predict(self, observation, state, rotations) -> Prediction:
        return Prediction(scores=observation.label_logprobs)


@hookimpl
def posdebias_register_calibrators(register: Callable[[type[Calibrator]], None]) -> None:
    register(Vanilla)
