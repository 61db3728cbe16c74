"""pride: PriDe (Zheng et al., ICLR 2024, "Large Language Models Are Not Robust Multiple Choice
Selectors"): remove a static prior over the option positions.

PriDe models the observed label distribution as a prior over positions times a debiased
distribution over the contents. Averaging the log-probabilities of an instance over its N
cyclic permutations cancels the contents (each visits every position once), so the prior is the
mean label log-score over those observations: p_prior[j] = mean of s_j(x) (up to a constant, no
argmax changes); a prediction is argmax (s - p_prior). The fit reads no target: PriDe is
label-free.

Two workflows (option ``workflow``):

* ``calibration`` (default; docs/method.md, Calibration step 5): the prior is estimated on the
  run's calibration set in its N cyclic rotations, the same budget as the paper's method, and
  every test item is answered by s - p_prior.
* ``test`` (PriDe's own): a fraction ``alpha`` (default 0.05, the paper's) of the TEST items,
  ceil(alpha x K) of K chosen by ``seed``, is answered by permutation-based debiasing (the mean
  over the N cyclic permutations of the log-scores, mapped back to the options: N forward passes
  each); their observations give the prior, which debiases the other items (one pass each).
  Accuracy counts every item, the estimation items included, as the paper does. In ``posdebias
  evaluate`` the test items are the run's test instances, each in its T orders; with
  ``Debiaser.calibrate(instances)`` they are the instances given (then rank those).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

import posdebias.defaults as defaults
from posdebias._markers import register_hook
from posdebias.calibrators.base import CalibratorOptions, OrderedCalibrator
from posdebias.calibrators.permutation_average import averaged_scores, scores_by_candidate
from posdebias.core.instance import Instance
from posdebias.core.observation import Observation, Prediction, log_softmax
from posdebias.core.stages import PriorEstimator
from posdebias.core.state import CalibrationState
from posdebias.core.symmetry import cyclic_rotations


class PriDeOptions(CalibratorOptions):
    workflow: Literal["calibration", "test"] = Field(
        default="calibration",
        description="estimate the prior on the calibration set (calibration), or on a fraction "
        "alpha of the test items answered by permutation averaging (test: PriDe's own)",
    )
    alpha: float = Field(
        default=0.05, gt=0, le=1, description="share of the test items that estimate the prior"
    )
    seed: int = Field(
        default=0, ge=0, le=defaults.MAX_SEED, description="seed of the estimation items' choice"
    )

    @model_validator(mode="after")
    def _test_only(self) -> PriDeOptions:
        defaults = type(self).model_fields
        given = [
            name for name in ("alpha", "seed") if getattr(self, name) != defaults[name].default
        ]
        if self.workflow == "calibration" and given:
            raise ValueError(
                f"{' and '.join(given)} choose(s) the estimation items of workflow: test; set "
                "workflow: test, or drop them"
            )
        return self


class PriDeFitted(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: the test items answered by permutation averaging (workflow: test)
    estimation_ids: list[str] = Field(default_factory=list)


def estimation_ids(ids: Sequence[str], alpha: float, seed: int) -> list[str]:
    """The ceil(alpha x K) of the K distinct ``ids`` PriDe estimates its prior on, chosen by
    ``seed`` (a hash of seed and id, so neither the order nor the shard matters)."""
    distinct = list(dict.fromkeys(ids))
    count = max(1, math.ceil(alpha * len(distinct) - 1e-9))

    def rank(item: str) -> bytes:
        return hashlib.sha256(f"{seed}\x1f{item}".encode("utf-8", "surrogatepass")).digest()

    return sorted(distinct, key=rank)[:count]


class PriDe(OrderedCalibrator):
    name = "pride"
    Options = PriDeOptions
    options: PriDeOptions
    Fitted = PriDeFitted
    needs_fit = True
    needs_targets = False
    summary = "subtract a static logit prior (PriDe)"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._chosen: tuple[list[str], int] | None = None

    def fit_views(
        self,
        calibration: Sequence[Instance],
        test: Sequence[Instance] | None = None,
    ) -> list[Instance] | None:
        if self.options.workflow == "calibration":
            return None
        if test is None:  # Debiaser.calibrate: the instances given, as shown (rotation 0)
            first: dict[str, Instance] = {}
            for view in calibration:
                first.setdefault(view.id, view)
            test = list(first.values())
        chosen = estimation_ids([view.id for view in test], self.options.alpha, self.options.seed)
        self._chosen = (chosen, len({view.id for view in test}))
        keep = set(chosen)
        return [rotated for view in test if view.id in keep for rotated in cyclic_rotations(view)]

    def state_reads(self, state: CalibrationState) -> tuple[str, ...]:
        # not estimation_ids: a state fitted without the test set (the API) has none
        return ("logit_prior",)

    def _fit(self, observations: list[Observation]) -> dict[str, Any]:
        fitted: dict[str, Any] = {
            "logit_prior": PriorEstimator().logit_prior(observations).tolist()
        }
        if self.options.workflow == "test" and self._chosen is not None:
            chosen, total = self._chosen
            self._chosen = None
            fitted["estimation_ids"] = chosen
            fitted["diagnostics"] = {
                "estimation_items": len(chosen),
                "test_items": total,
                "estimation_views": len(observations),
            }
        return fitted

    def passes_with(self, n: int, state: CalibrationState) -> float:
        """1 per item, N for the share of estimation items (workflow: test)."""
        total = state.diagnostics.get("test_items")
        if self.options.workflow != "test" or not total:
            return 1
        share = len(self.fitted(state).estimation_ids) / float(total)
        return 1.0 + share * (n - 1)

    def orders_for(self, view: Instance, state: CalibrationState) -> list[np.ndarray] | None:
        """The N cyclic permutations for an estimation item (workflow: test), else none."""
        if self.options.workflow == "test" and view.id in self.fitted(state).estimation_ids:
            return self.permutations(view.n)
        return None

    def _predict_in_orders(
        self,
        observation: Observation,
        state: CalibrationState,
        rotations: Sequence[Observation] | None,
        orders: Sequence[np.ndarray] | None,
    ) -> Prediction:
        if rotations is not None:  # an estimation item: permutation-based debiasing
            orders = self.permutations(observation.n) if orders is None else orders
            return Prediction(scores=averaged_scores(scores_by_candidate(rotations, orders)))
        return Prediction(
            scores=log_softmax(observation.label_logprobs - state.fitted("logit_prior"))
        )


posdebias_register_calibrators = register_hook(PriDe)
