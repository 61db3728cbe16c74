"""Acc, RStd, Cons. and the confusion matrix over T candidate orders (docs/method.md, "Metrics").

Inputs are arrays of shape [I, T] (I instances, T orders):
``targets[i, t]`` the truth position in order t, ``choices[i, t]`` the chosen position,
``chosen[i, t]`` the identity (e.g. base index) of the chosen candidate.

* Acc: accuracy (%) of each order t over the I instances; reported as mean and sample std
  (ddof=1; 0 for T=1) over the T orders.
* recall_i: % of the (instance, order) pairs with truth at position i whose choice is i, pooled
  over orders. RStd: sample std (ddof=1) of the N recalls, in percentage points (the LAD
  authors' code); ``rstd_population`` is the population std (ddof=0), as PriDe's code (Zheng et
  al.) computes its RStd: sqrt((N-1)/N) times RStd, so compare figures of one kind only.
* Cons.: % of instances whose chosen CANDIDATE is the same under all T orders.
* confusion[i, j]: % of the pairs with truth at i that chose j (rows sum to 100).
* selection_rate[j]: % of all pairs that chose position j.
* no_answer: % of pairs without a valid answer (choice -1: a generated text that names no
  valid label). Such a pair is wrong, never consistent, and in no confusion or selection cell,
  so those rows sum to 100 minus the no-answer share.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from posdebias.errors import InputError

#: A percentage or a spread of percentages: 0 to 100 (a file saying otherwise is refused)
Percent = Annotated[float, Field(ge=0, le=100)]


class Metrics(BaseModel):
    """Position-bias metrics of one calibrator (percentages)."""

    model_config = ConfigDict(frozen=True)

    accuracy_mean: Percent
    accuracy_std: Percent
    accuracy_per_order: list[Percent]
    recall_per_position: list[Percent | None]
    rstd: Percent
    consistency: Percent
    confusion: list[list[Percent | None]]
    selection_rate: list[Percent]
    num_instances: int
    num_orders: int
    no_answer: Percent = 0.0
    #: RStd with ddof 0 (PriDe's code); ``rstd`` has ddof 1
    rstd_population: Percent = 0.0


def consistent(choices: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """[I]: whether an instance chose one candidate under all its orders (Cons.'s numerator;
    an order without an answer makes it inconsistent)."""
    return np.all(chosen == chosen[:, :1], axis=1) & np.all(choices >= 0, axis=1)


def compute_metrics(
    targets: np.ndarray, choices: np.ndarray, chosen: np.ndarray, n: int
) -> Metrics:
    """Metrics of one calibrator from [I, T] arrays (see the module docstring)."""
    targets = np.asarray(targets)
    choices = np.asarray(choices)
    chosen = np.asarray(chosen)
    if targets.ndim != 2 or targets.shape != choices.shape or targets.shape != chosen.shape:
        raise InputError(
            f"targets, choices and chosen must be [instances, orders] arrays of one shape, "
            f"got {targets.shape}, {choices.shape}, {chosen.shape}"
        )
    instances, orders = targets.shape
    if instances == 0 or orders == 0:
        raise InputError("metrics need at least one instance and one order")
    correct = targets == choices
    per_order = 100.0 * correct.mean(axis=0)
    accuracy_std = float(np.std(per_order, ddof=1)) if orders > 1 else 0.0

    confusion = np.full((n, n), np.nan)
    recall = np.full(n, np.nan)
    for i in range(n):
        rows = targets == i
        total = rows.sum()
        if total:
            answered = choices[rows]
            answered = answered[answered >= 0]
            confusion[i] = 100.0 * np.bincount(answered, minlength=n)[:n] / total
            recall[i] = confusion[i, i]
    seen = recall[~np.isnan(recall)]
    rstd = float(np.std(seen, ddof=1)) if seen.size > 1 else 0.0
    rstd_population = float(np.std(seen, ddof=0)) if seen.size > 1 else 0.0
    consistency = 100.0 * float(np.mean(consistent(choices, chosen)))
    answered = choices.ravel()[choices.ravel() >= 0]
    selection = 100.0 * np.bincount(answered, minlength=n)[:n] / choices.size

    def nan_to_none(values: np.ndarray) -> list:
        return [None if np.isnan(v) else float(v) for v in values]

    return Metrics(
        accuracy_mean=float(per_order.mean()),
        accuracy_std=accuracy_std,
        accuracy_per_order=per_order.tolist(),
        recall_per_position=nan_to_none(recall),
        rstd=rstd,
        consistency=consistency,
        confusion=[nan_to_none(row) for row in confusion],
        selection_rate=selection.tolist(),
        num_instances=instances,
        num_orders=orders,
        no_answer=100.0 * float(np.mean(choices < 0)),
        rstd_population=rstd_population,
    )
