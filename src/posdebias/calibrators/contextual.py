"""contextual: contextual calibration (Zhao et al., ICML 2021, "Calibrate before use").

The label distribution the model gives a content-free input is its bias; contextual calibration
divides it out. With p_cf the mean label distribution over the content-free inputs,
W = diag(p_cf)^-1 and b = 0, the calibrated distribution of an input with label distribution p
is q = softmax(W p + b), i.e. q_j = softmax_j(p_j / p_cf[j]) (the paper's Eq. for
classification; argmax q = argmax p_j / p_cf[j]).

Content-free inputs are formed from the calibration instances with what any adapter observes:
each calibration instance in its N cyclic rotations (the symmetrised set), its stem text (the
caption, question or query) replaced by each content-free text (default ``"N/A"``, ``""`` and
``"[MASK]"``, the ensemble Zhao et al.'s released code averages; p_cf is the mean of their label
distributions),
its candidates (images, texts) and any stem images kept, no target. With no stem there is
nothing that singles out a candidate, so the label distribution is what the prompt and the
positions alone make the model say. The candidates are still shown: the label distribution of a
prompt needs its N candidates, and a candidate cannot be made content-free without showing
another input in its place (N identical "N/A" candidates would be one candidate N times). No
attention and no labels are needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from posdebias._markers import register_hook
from posdebias.calibrators.base import Calibrator, CalibratorOptions
from posdebias.core.instance import Instance
from posdebias.core.observation import Observation, Prediction, log_mean_exp, log_softmax
from posdebias.core.state import CalibrationState

CONTENT_FREE_ID = "#content-free:"

#: Zhao et al.'s content-free inputs, averaged (their released code; the paper's text names
#: "N/A" as the example).
ZHAO_CONTENT_FREE = ("N/A", "", "[MASK]")


class ContextualOptions(CalibratorOptions):
    texts: list[str] = Field(
        default_factory=lambda: list(ZHAO_CONTENT_FREE),
        description=(
            'content-free stems; p_cf averages over all of them (Zhao et al.\'s code: "N/A", '
            '"" and "[MASK]"; the empty string is allowed)'
        ),
    )

    @field_validator("texts")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("give at least one content-free text")
        blank = [text for text in value if text and not text.strip()]
        if blank:
            raise ValueError(
                f'content-free text {blank[0]!r} is only whitespace; use the empty string "" '
                "for an empty stem"
            )
        if len(set(value)) != len(value):
            raise ValueError("content-free texts repeat; give each once")
        return value


def content_free(instance: Instance, text: str) -> Instance:
    """``instance`` with its caption replaced by ``text`` (may be empty), its candidates as they
    are, no target (its own id, so its observation is cached apart from the instance's)."""
    return replace(
        instance,
        stem=text,
        target=None,
        id=f"{instance.id}{CONTENT_FREE_ID}{text}",
        content_free=True,
    )


#: exp() of more than this overflows float64.
_MAX_EXPONENT = 700.0


class Contextual(Calibrator):
    name = "contextual"
    Options = ContextualOptions
    options: ContextualOptions
    needs_fit = True
    needs_targets = False
    summary = "divide out the label distribution of content-free inputs (Zhao et al. 2021)"

    def fit_views(
        self,
        calibration: Sequence[Instance],
        test: Sequence[Instance] | None = None,
    ) -> list[Instance]:
        return [content_free(view, text) for text in self.options.texts for view in calibration]

    def state_reads(self, state: CalibrationState) -> tuple[str, ...]:
        return ("logit_prior",)

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
        prior = state.fitted("logit_prior")
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            # log softmax(W p) with W = diag(p_cf)^-1 (Zhao et al. 2021, b = 0)
            scores = log_softmax(np.exp(observation.label_logprobs) / np.exp(prior))
        if not np.all(np.isfinite(scores)):
            # a prior far below zero (exp underflows to 0): the same ratios p / p_cf, taken
            # in log space and capped where exp would overflow, so the scores stay finite
            ratios = np.exp(np.minimum(observation.label_logprobs - prior, _MAX_EXPONENT))
            scores = log_softmax(ratios)
        return Prediction(scores=scores)


posdebias_register_calibrators = register_hook(Contextual)
