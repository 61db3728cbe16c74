"""attention_guided: the paper's method, conditional bias removal guided by attention.

Fit (docs/method.md, Calibration 1-4): Lobs, gamma, B and the static attention prior from the
symmetrised calibration set. Predict (Inference 1-5): select layers, purify attention, form the
visual posterior pi, subtract the expected bias b = E_pi[B[k, :]] from the label scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import Field

from posdebias._markers import register_hook
from posdebias.calibrators.base import Calibrator
from posdebias.calibrators.options import PosteriorOptions
from posdebias.core.observation import Evidence, Observation, Prediction, log_softmax
from posdebias.core.stages import BiasProfiler, PriorEstimator
from posdebias.core.state import CalibrationState


class AttentionGuidedOptions(PosteriorOptions):
    average: Literal["log", "prob"] = Field(
        default="log",
        description="bias profile from the mean of log-scores (reference code) or of "
        "probabilities (paper text)",
    )
    mixture: Literal["log", "prob"] = Field(
        default="log",
        description="b = pi @ B (log, reference code) or log(pi @ rownorm(exp B)) (prob, paper)",
    )
    attention_prior: bool = Field(
        default=True,
        description="divide by the static attention prior (false: the paper's ablation "
        "'dynamic selection without the attention prior', posterior from raw attention)",
    )
    fallback: bool = Field(
        default=True,
        description="when evidence selection finds no informative layer, correct with the "
        "answer's own static prior (PriDe) instead of a posterior from noise",
    )


class AttentionGuided(Calibrator):
    name = "attention_guided"
    Options = AttentionGuidedOptions
    options: AttentionGuidedOptions
    needs_attention = True
    needs_fit = True
    summary = "conditional bias matrix weighted by the attention posterior (the paper's method)"

    def _fit(self, observations: list[Observation]) -> dict[str, Any]:
        profile, gamma, bias = BiasProfiler(average=self.options.average).fit(observations)
        return {
            "observed_profile": profile.tolist(),
            "gamma": gamma,
            "bias_matrix": bias.tolist(),
            "logit_prior": PriorEstimator().logit_prior(observations).tolist(),
            **self.options.fit_attention(observations),
        }

    def _falls_back(self, state: CalibrationState) -> bool:
        """Whether predictions use the logit prior alone (no layer beat chance when fitted)."""
        choice = state.layer_choice
        return self.options.fallback and choice is not None and not choice.informative

    def state_reads(self, state: CalibrationState) -> tuple[str, ...]:
        if self._falls_back(state):
            return ("logit_prior",)
        return ("attention_prior", "bias_matrix", *self.options.layer_reads())

    def _predict(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
    ) -> Prediction:
        if self._falls_back(state):
            # no layer beat chance on the calibration set: the answer's own calibration
            prior = state.fitted("logit_prior")
            return Prediction(
                scores=log_softmax(observation.label_logprobs - prior),
                evidence=Evidence(expected_bias=prior),
            )
        layers = self.options.rows_for(observation, state)
        corrector = self.options.corrector(self.options.mixture)
        prior = state.fitted("attention_prior")
        if not self.options.attention_prior:
            prior = np.ones_like(prior)  # log 1 = 0: the posterior reads the raw attention
        purified = corrector.purified_log_attention(
            self.options.masses(observation, state), prior, layers
        )
        posterior = corrector.visual_posterior(purified)
        bias = corrector.expected_bias(posterior, state.fitted("bias_matrix"))
        return Prediction(
            scores=corrector.correct(observation.label_logprobs, bias),
            evidence=Evidence(posterior=posterior, expected_bias=bias, layers=tuple(layers)),
        )


posdebias_register_calibrators = register_hook(AttentionGuided)
