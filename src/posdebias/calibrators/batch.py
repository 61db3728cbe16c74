"""batch: batch calibration (Zhou et al., ICLR 2024, "Batch Calibration").

The contextual bias is estimated from the test inputs themselves and removed from every
prediction. Zhou et al. (their Eqs. 1-2): the bias of label j is the batch mean of the model's
score for j, p^(y_j | C) = (1/M) sum_i p(y_j | x_i, C), and the calibrated prediction is
argmax_j [p(y_j | x_i, C) - p^(y_j | C)], each score shifted by its batch mean, the scores
being log-probabilities.

``average: log`` (default, the paper's): b_j = mean over the batch of s_j = log p(j | x), and
the calibrated score is s_j - b_j. ``average: prob`` (earlier posdebias versions): b_j =
log of the batch mean of the probabilities p(j | x), i.e. the mean label distribution divided
out. Both are renormalised with a log-softmax (no argmax changes).

Which batch: in ``posdebias evaluate`` and ``posdebias sweep``, the WHOLE test set of the run,
every test instance in each of its T candidate orders (the views every row scores), observed
before any instance is evaluated. So the estimate, and every prediction, depends on neither the
forward batch size, nor the data-parallel shard, nor resumption, and is stored in the
calibration state like any fit. Given no test set (``Debiaser.calibrate``, ``posdebias
calibrate``), the batch is the instances you calibrate on, each in its N cyclic rotations:
calibrate it on (unlabelled) instances like those you rank. No labels and no attention are
needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

from posdebias._markers import register_hook
from posdebias.calibrators.base import Calibrator, CalibratorOptions
from posdebias.core.instance import Instance
from posdebias.core.observation import Observation, Prediction, log_mean_exp, log_softmax
from posdebias.core.state import CalibrationState


class BatchOptions(CalibratorOptions):
    average: Literal["log", "prob"] = Field(
        default="log",
        description="the batch mean of the log-scores, subtracted (log: Zhou et al.'s Eqs. 1-2) "
        "or of the probabilities, divided out (prob)",
    )


class Batch(Calibrator):
    name = "batch"
    Options = BatchOptions
    options: BatchOptions
    needs_fit = True
    needs_targets = False
    summary = "subtract the mean label log-score of the test set (Zhou et al. 2024)"

    def fit_views(
        self,
        calibration: Sequence[Instance],
        test: Sequence[Instance] | None = None,
    ) -> list[Instance] | None:
        return None if test is None else list(test)

    def state_reads(self, state: CalibrationState) -> tuple[str, ...]:
        return ("logit_prior",)

    def _fit(self, observations: list[Observation]) -> dict[str, Any]:
        scores = np.stack([obs.label_logprobs for obs in observations])
        if self.options.average == "log":  # the bias b: the mean log-score (the paper's)
            prior = scores.mean(axis=0)
        else:  # or the log of the mean label distribution
            prior = log_mean_exp(scores, axis=0)
        return {
            "logit_prior": prior.tolist(),
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


posdebias_register_calibrators = register_hook(Batch)
