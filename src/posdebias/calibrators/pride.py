"""pride: subtract a static (position-only) prior estimated on the calibration set.

PriDe (Zheng et al., ICLR 2024) on the same budget as the paper's method: p_prior is the mean
label log-score over all M*N symmetrised observations (docs/method.md, Calibration step 5).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from posdebias._markers import hookimpl
from posdebias.calibrators.base import Calibrator
from posdebias.core.observation import Observation, Prediction, log_softmax
from posdebias.core.stages import PriorEstimator
from posdebias.core.state import CalibrationState


class PriDe(Calibrator):
    name = "pride"
    needs_fit = True
    summary = "subtract a static logit prior (PriDe)"

    def _fit(self, observations: list[Observation]) -> dict[str, Any]:
        return {"logit_prior": PriorEstimator().logit_prior(observations).tolist()}

    def _predict(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
    ) -> Prediction:
        return Prediction(
            scores=log_softmax(observation.label_logprobs - state.fitted("logit_prior"))
        )


@hookimpl
def posdebias_register_calibrators(register: Callable[[type[Calibrator]], None]) -> None:
    register(PriDe)
