"""batch: batch calibration (Zhou et al., ICLR 2024, "Batch Calibration").

The contextual bias is estimated from the test inputs themselves: p_bc[j] = the mean over the
batch of the label distributions p_i(j), divided out in log space: the calibrated score of
label j is s_j - log p_bc[j] (renormalised; the prediction is argmax_j p(j | x) / p_bc[j]).

Which batch: in ``posdebias evaluate`` and ``posdebias sweep``, the WHOLE test set of the run,
every test instance in each of its T candidate orders (the views every row scores), observed
before any instance is evaluated. So the estimate, and every prediction, depends on neither the
forward batch size, nor the data-parallel shard, nor resumption, and is stored in the
calibration state like any fit. Given no test set (``Debiaser.calibrate``, ``posdebias
calibrate``), the batch is the
instances you calibrate on, each in its N cyclic rotations: calibrate it on (unlabelled)
instances like those you rank. No labels and no attention are needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from posdebias._markers import hookimpl
from posdebias.calibrators.base import Calibrator
from posdebias.core.instance import RetrievalInstance
from posdebias.core.observation import Observation, Prediction, log_mean_exp, log_softmax
from posdebias.core.state import CalibrationState


def batch_prior(label_logprobs: np.ndarray) -> np.ndarray:
    """log p_bc: the log of the mean label distribution over the batch ([B, N] -> [N])."""
    return log_mean_exp(label_logprobs, axis=0)


class Batch(Calibrator):
    name = "batch"
    needs_fit = True
    needs_targets = False
    summary = "divide out the mean label distribution of the test set (Zhou et al. 2024)"

    def fit_views(
        self,
        calibration: Sequence[RetrievalInstance],
        test: Sequence[RetrievalInstance] | None = None,
    ) -> list[RetrievalInstance] | None:
        return None if test is None else list(test)

    def _fit(self, observations: list[Observation]) -> dict[str, Any]:
        scores = np.stack([obs.label_logprobs for obs in observations])
        return {
            "logit_prior": batch_prior(scores).tolist(),
            "diagnostics": {"batch_views": len(observations)},
        }

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
    register(Batch)
