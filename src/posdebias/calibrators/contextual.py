"""contextual: contextual calibration (Zhao et al., ICML 2021, "Calibrate before use").

The label distribution the model gives a content-free input is its bias; contextual calibration
divides it out. With p_cf the mean label distribution over the content-free inputs,
W = diag(p_cf)^-1 and b = 0, the calibrated distribution of an input with label distribution p
is q = softmax(W p + b), i.e. q_j = softmax_j(p_j / p_cf[j]) (the paper's Eq. for
classification; argmax q = argmax p_j / p_cf[j]).

Content-free inputs are formed from the calibration instances with what any adapter observes:
each calibration instance in its N cyclic rotations (the symmetrised set), its stem text (the
caption, question or query) replaced by each content-free text (default ``N/A``, the paper's),
its candidates (images, texts) and any stem images kept, no target. With no stem there is
nothing that singles out a candidate, so the label distribution is what the prompt and the
positions alone make the model say. The candidates are still shown: the label distribution of a
prompt needs its N candidates, and a candidate cannot be made content-free without showing
another input in its place (N identical "N/A" candidates would be one candidate N times). No
attention and no labels are needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from posdebias._markers import hookimpl
from posdebias.calibrators.base import Calibrator, CalibratorOptions
from posdebias.core.instance import RetrievalInstance
from posdebias.core.observation import Observation, Prediction, log_mean_exp, log_softmax
from posdebias.core.state import CalibrationState

CONTENT_FREE_ID = "#content-free:"


class ContextualOptions(CalibratorOptions):
    texts: list[str] = Field(
        default_factory=lambda: ["N/A"],
        description="content-free captions; p_cf averages over all of them (Zhao et al.: N/A)",
    )

    @field_validator("texts")
    @classmethod
    def _not_empty(cls, value: list[str]) -> list[str]:
        if not value or any(not text.strip() for text in value):
            raise ValueError("give at least one content-free text, none of them blank")
        return value


def content_free(instance: RetrievalInstance, text: str) -> RetrievalInstance:
    """``instance`` with its caption replaced by ``text``, its candidates as they are, no
    target (its own id, so its observation is cached apart from the instance's)."""
    return replace(instance, query=text, target=None, id=f"{instance.id}{CONTENT_FREE_ID}{text}")


def contextual_scores(probabilities: np.ndarray, content_free_mean: np.ndarray) -> np.ndarray:
    """log softmax(W p) with W = diag(p_cf)^-1 (Zhao et al. 2021, b = 0)."""
    return log_softmax(probabilities / content_free_mean)


class Contextual(Calibrator):
    name = "contextual"
    Options = ContextualOptions
    options: ContextualOptions
    needs_fit = True
    needs_targets = False
    summary = "divide out the label distribution of content-free inputs (Zhao et al. 2021)"

    def fit_views(
        self,
        calibration: Sequence[RetrievalInstance],
        test: Sequence[RetrievalInstance] | None = None,
    ) -> list[RetrievalInstance]:
        return [content_free(view, text) for text in self.options.texts for view in calibration]

    def _fit(self, observations: list[Observation]) -> dict[str, Any]:
        scores = np.stack([obs.label_logprobs for obs in observations])
        return {
            "logit_prior": log_mean_exp(scores, axis=0).tolist(),  # log p_cf
            "diagnostics": {"content_free_views": len(observations)},
        }

    def _predict(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
    ) -> Prediction:
        mean = np.exp(state.fitted("logit_prior"))
        return Prediction(scores=contextual_scores(np.exp(observation.label_logprobs), mean))


@hookimpl
def posdebias_register_calibrators(register: Callable[[type[Calibrator]], None]) -> None:
    register(Contextual)
