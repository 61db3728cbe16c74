"""Uncertainty and paired tests for the position-bias metrics (see docs/evaluation.md).

Inputs are the [I, T] arrays of :mod:`posdebias.evaluation.metrics` (I instances, T orders).

* **Instance bootstrap**: resample the I instances with replacement (all T orders of an
  instance travel together, so the correlation between the orders of one instance is kept) and
  recompute each metric. The 95% interval is the median-bias-corrected percentile interval
  (:func:`bootstrap_interval`): the 2.5th and 97.5th percentiles of the resampled values, moved
  by the bootstrap's median bias so that the interval always holds its own estimate (RStd, a
  standard deviation of noisy recalls, is biased upwards in every resample; a plain percentile
  interval could exclude it). The resample draws come from ``numpy.random.default_rng(seed)``
  and are the same for every row of a run, so two rows' intervals and their paired difference
  come from the same resampled instance sets.
* **Paired comparison** of a row against a baseline row on the same decisions: the difference
  of their accuracies with its paired bootstrap interval, and an exact McNemar test (a two-sided
  exact binomial test with p = 1/2 on the discordant decisions).
* **Position views**: accuracy by the truth's position, the choice distribution by position,
  the flip rate and CircularEval's all-rotations-correct score.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import comb
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from posdebias._inputs import check_whole_number
from posdebias.defaults import MAX_RESAMPLES, MIN_RESAMPLES, RESAMPLES
from posdebias.errors import InputError
from posdebias.evaluation.metrics import consistent
from posdebias.evaluation.runner import InstanceRecord

LEVEL = 0.95
#: How every interval of a results file is computed (:func:`bootstrap_interval`).
INTERVAL_METHOD = "median_bias_corrected_percentile"
#: The range of a percentage and of a difference of two percentages.
PERCENT = (0.0, 100.0)
SPREAD = (0.0, float("inf"))
DIFFERENCE = (-100.0, 100.0)


class Interval(BaseModel):
    """A point estimate and its 95% bootstrap interval (percent or percentage points)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float = Field(ge=-100, le=100, description="the estimate on all instances (%, points)")
    low: float = Field(ge=-100, le=100, description="lower end of the 95% interval (<= value)")
    high: float = Field(ge=-100, le=100, description="upper end of the 95% interval (>= value)")


class BootstrapSettings(BaseModel):
    """How the intervals were computed (enough to recompute them byte for byte)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    resamples: int = Field(description="bootstrap resamples of the test instances")
    seed: int = Field(description="seed of numpy.random.default_rng drawing the resamples")
    level: float = Field(default=LEVEL, description="coverage of each interval")
    method: str = Field(
        default=INTERVAL_METHOD,
        description="median_bias_corrected_percentile: percentiles moved by median(resampled) "
        "- estimate, clipped to the metric's range; 'percentile' in older files",
    )
    unit: str = Field(default="instance", description="what is resampled (all its orders kept)")


class HeadlineIntervals(BaseModel):
    """A row's headline measures with their intervals (on all instances, or on one group)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    accuracy: Interval = Field(description="Acc, the mean accuracy over the T orders")
    rstd: Interval = Field(description="RStd, std of the recall per truth position (pp)")
    consistency: Interval = Field(description="Cons., % instances with one candidate in all orders")


class RowStatistics(HeadlineIntervals):
    """Intervals of one row's metrics and its position views (all percentages)."""

    accuracy_by_position: list[Interval | None] = Field(
        description="accuracy (recall) per truth position; None where the truth never sat"
    )
    choice_by_position: list[Interval] = Field(
        description="% of all decisions choosing each position, whatever the truth"
    )
    flip_rate: Interval | None = Field(
        description="% of (instance, order pair) whose chosen candidate differs; None for T=1"
    )
    circular: Interval | None = Field(
        description="CircularEval: % instances right in all N cyclic rotations; None unless "
        "the orders of every instance are exactly the N rotations of one order"
    )


class PairedComparison(BaseModel):
    """One row against a baseline row on the same instances and orders."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    row: str
    baseline: str
    difference: Interval = Field(description="Acc(row) - Acc(baseline), percentage points")
    decisions: int = Field(description="paired (instance, order) decisions")
    instances: int = Field(description="instances they come from")
    row_only: int = Field(description="decisions the row got right and the baseline wrong")
    baseline_only: int = Field(description="decisions the baseline got right and the row wrong")
    p_value: float = Field(ge=0, le=1, description="exact McNemar test (two-sided, p = 1/2)")


class RunStatistics(BaseModel):
    """The statistics section of a results file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: BootstrapSettings
    rows: dict[str, RowStatistics]
    baselines: list[str] = Field(description="rows every other row is compared with")
    comparisons: list[PairedComparison] = Field(default_factory=list)


@dataclass(frozen=True)
class Outcomes:
    """The per-decision outcome of one row: the [I, T] arrays metrics are computed from
    (truth position, chosen position or -1, chosen candidate's identity)."""

    targets: np.ndarray
    choices: np.ndarray
    chosen: np.ndarray


def check_resamples(resamples: int) -> int:
    """``resamples`` if it is in the accepted range, else an InputError naming the range."""
    return check_whole_number("bootstrap resamples", resamples, MIN_RESAMPLES, MAX_RESAMPLES)


def resample_weights(instances: int, resamples: int, seed: int | list[int]) -> np.ndarray:
    """[B, I] multiplicities: how often each instance appears in each bootstrap resample
    (``seed``: an int, or a list such as ``[seed, group]`` for a stratum of its own)."""
    check_resamples(resamples)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, instances, size=(resamples, instances))
    weights = np.zeros((resamples, instances), dtype=np.int64)
    np.add.at(weights, (np.arange(resamples)[:, None], draws), 1)
    return weights


def bootstrap_interval(
    value: float,
    samples: np.ndarray,
    level: float = LEVEL,
    bounds: tuple[float, float] = (-float("inf"), float("inf")),
) -> Interval:
    """The 95% interval of the estimate ``value`` from its bootstrap ``samples``: the
    percentile interval moved by the median bias, ``[q_lo - d, q_hi - d]`` with
    ``d = median(samples) - value``, then clipped to ``bounds`` (the metric's range).

    Why: a statistic that is biased in resamples (RStd, the spread of N noisy recalls) has a
    percentile interval that can miss its own estimate; moving the percentiles by the median
    bias (the location form of Efron's bias correction, which measures bias by where the
    estimate falls among the resamples) keeps the interval's width and shape and always holds
    the estimate, since ``q_lo <= median <= q_hi``. For an unbiased statistic (an accuracy)
    ``d`` is close to 0 and the interval is the percentile interval.
    """
    tail = 100.0 * (1.0 - level) / 2.0
    low, middle, high = np.percentile(samples, [tail, 50.0, 100.0 - tail])
    shift = float(middle) - float(value)
    low, high = float(low) - shift, float(high) - shift
    floor, ceiling = bounds
    low = min(max(low, floor), float(value))  # exact: no rounding may push value outside
    high = max(min(high, ceiling), float(value))
    return Interval(value=float(value), low=low, high=high)


def instance_mean(
    values: np.ndarray, weights: np.ndarray, scale: float = 100.0
) -> tuple[float, np.ndarray]:
    """The mean of per-instance ``values`` ([I]) times ``scale``, and its [B] values on the
    resamples ``weights`` ([B, I]): the estimate and samples of any mean over instances."""
    return scale * values.mean(), scale * (weights @ values) / values.shape[0]


def mcnemar_exact(row_only: int, baseline_only: int) -> float:
    """Two-sided exact McNemar p-value: P(X <= min(b, c)) doubled (capped at 1) for
    X ~ Binomial(b + c, 1/2), computed in exact rational arithmetic; 1 with no discordant pair."""
    if row_only < 0 or baseline_only < 0:
        raise InputError(f"discordant counts must be >= 0, got {row_only} and {baseline_only}")
    total = row_only + baseline_only
    if total == 0:
        return 1.0
    tail = sum(comb(total, k) for k in range(min(row_only, baseline_only) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**total)))


def _pooled(
    weights: np.ndarray, hits: np.ndarray, counts: np.ndarray, full_hits: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Ratios hits / counts on all instances and per resample (NaN where a count is 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        value = 100.0 * full_hits.sum(axis=0) / counts.sum(axis=0)
        samples = 100.0 * (weights @ hits) / (weights @ counts)
    return value, samples


def _rstd(recall: np.ndarray) -> np.ndarray:
    """Sample std (ddof 1) over the positions seen (not NaN); 0 with fewer than two."""
    recall = np.atleast_2d(recall)
    seen = ~np.isnan(recall)
    count = seen.sum(axis=1)
    filled = np.where(seen, recall, 0.0)
    mean = filled.sum(axis=1) / np.maximum(count, 1)
    squares = np.where(seen, (recall - mean[:, None]) ** 2, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        std = np.sqrt(squares / (count - 1))
    return np.where(count > 1, std, 0.0)


def cyclic_orders(orders: np.ndarray) -> bool:
    """Whether every instance's T orders are exactly the N cyclic rotations of one order."""
    orders = np.asarray(orders)
    if orders.ndim != 3 or orders.shape[1] != orders.shape[2]:
        return False
    return all(
        {tuple(order) for order in instance.tolist()}
        == {tuple(np.roll(instance[0], shift).tolist()) for shift in range(len(instance))}
        for instance in orders
    )


#: The headline measures (the paper's table) and the range each lives in.
HEADLINE = {"accuracy": PERCENT, "rstd": SPREAD, "consistency": PERCENT}


def headline_samples(
    outcome: Outcomes, n: int, weights: np.ndarray
) -> dict[str, tuple[Any, np.ndarray]]:
    """Acc, RStd and Cons. of one row: (the estimate, its [B] bootstrap values) each, on the
    resamples ``weights`` ([B, I]); and the recalls by position with theirs ("recall")."""
    targets, choices, chosen = outcome.targets, outcome.choices, outcome.chosen
    correct = targets == choices
    per_instance = correct.mean(axis=1)  # Acc = mean over orders = mean over instances of this
    positions = np.arange(n)
    counts = (targets[:, :, None] == positions).sum(axis=1).astype(float)  # [I, N]
    hits = ((targets[:, :, None] == positions) & correct[:, :, None]).sum(axis=1).astype(float)
    recall, recall_samples = _pooled(weights, hits, counts, hits)
    return {
        "accuracy": instance_mean(per_instance, weights),
        "consistency": instance_mean(consistent(choices, chosen).astype(float), weights),
        "rstd": (float(_rstd(recall)[0]), _rstd(recall_samples)),
        "recall": (recall, recall_samples),
    }


def row_statistics(
    outcome: Outcomes, n: int, weights: np.ndarray, circular: bool, level: float = LEVEL
) -> RowStatistics:
    """Bootstrap intervals of one row's metrics on the resamples ``weights`` ([B, I])."""
    targets, choices, chosen = outcome.targets, outcome.choices, outcome.chosen
    orders = targets.shape[1]
    correct = targets == choices
    found = headline_samples(outcome, n, weights)
    accuracy, rstd, consistency = (
        bootstrap_interval(*found[name], level, bounds) for name, bounds in HEADLINE.items()
    )
    positions = np.arange(n)
    recall, recall_samples = found["recall"]
    by_position: list[Interval | None] = []
    for position in range(n):
        column = recall_samples[:, position]
        if np.isnan(recall[position]):
            by_position.append(None)
            continue
        # a resample without the position carries no recall for it: left out of its interval
        kept = column[~np.isnan(column)]
        by_position.append(bootstrap_interval(recall[position], kept, level, PERCENT))
    picked = (choices[:, :, None] == positions).sum(axis=1).astype(float)  # [I, N]
    total = np.full_like(picked, float(orders))
    chosen_share, chosen_samples = _pooled(weights, picked, total, picked)
    choice = [
        bootstrap_interval(chosen_share[p], chosen_samples[:, p], level, PERCENT) for p in range(n)
    ]
    flip: Interval | None = None
    if orders > 1:
        first, second = np.triu_indices(orders, k=1)
        answered = (choices[:, first] >= 0) & (choices[:, second] >= 0)
        changed = (chosen[:, first] != chosen[:, second]) | ~answered
        flip = bootstrap_interval(*instance_mean(changed.mean(axis=1), weights), level, PERCENT)
    rotations: Interval | None = None
    if circular:
        all_right = correct.all(axis=1).astype(float)
        rotations = bootstrap_interval(*instance_mean(all_right, weights), level, PERCENT)
    return RowStatistics(
        accuracy=accuracy,
        rstd=rstd,
        consistency=consistency,
        accuracy_by_position=by_position,
        choice_by_position=choice,
        flip_rate=flip,
        circular=rotations,
    )


def paired_comparison(
    row: str,
    baseline: str,
    correct_row: np.ndarray,
    correct_baseline: np.ndarray,
    weights: np.ndarray,
    level: float = LEVEL,
) -> PairedComparison:
    """``row`` against ``baseline`` on the same [I, T] decisions (True = right); the
    difference's interval uses the same resampled instances for both sides (paired)."""
    if correct_row.shape != correct_baseline.shape:
        raise InputError(
            f"paired outcomes differ in shape: {correct_row.shape} and {correct_baseline.shape}"
        )
    instances, orders = correct_row.shape
    gap = correct_row.astype(float).mean(axis=1) - correct_baseline.astype(float).mean(axis=1)
    difference = bootstrap_interval(*instance_mean(gap, weights), level, DIFFERENCE)
    row_only = int(np.sum(correct_row & ~correct_baseline))
    baseline_only = int(np.sum(~correct_row & correct_baseline))
    return PairedComparison(
        row=row,
        baseline=baseline,
        difference=difference,
        decisions=instances * orders,
        instances=instances,
        row_only=row_only,
        baseline_only=baseline_only,
        p_value=mcnemar_exact(row_only, baseline_only),
    )


def run_statistics(
    outcomes: Mapping[str, Outcomes],
    n: int,
    *,
    orders: np.ndarray | None = None,
    baselines: list[str] | None = None,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> RunStatistics:
    """Intervals of every row and each row's paired comparison with each baseline present.

    ``orders`` ([I, T, N], the permutation shown in each order) decides whether CircularEval
    applies; ``baselines`` default to ``["vanilla"]`` (a baseline not among the rows is
    skipped, so a run without vanilla simply has no comparisons).
    """
    if not outcomes:
        raise InputError("no rows to compute statistics for")
    first = next(iter(outcomes.values()))
    instances = first.targets.shape[0]
    if instances == 0:
        raise InputError("statistics need at least one instance")
    weights = resample_weights(instances, resamples, seed)
    circular = orders is not None and cyclic_orders(orders)
    rows = {
        label: row_statistics(outcome, n, weights, circular) for label, outcome in outcomes.items()
    }
    wanted = ["vanilla"] if baselines is None else baselines
    chosen_baselines = [b for b in wanted if b in outcomes]
    comparisons = [
        paired_comparison(
            label,
            baseline,
            outcome.targets == outcome.choices,
            outcomes[baseline].targets == outcomes[baseline].choices,
            weights,
        )
        for baseline in chosen_baselines
        for label, outcome in outcomes.items()
        if label != baseline
    ]
    return RunStatistics(
        bootstrap=BootstrapSettings(resamples=resamples, seed=seed),
        rows=rows,
        baselines=chosen_baselines,
        comparisons=comparisons,
    )


def record_outcomes(
    records: Sequence[InstanceRecord], labels: Iterable[str]
) -> tuple[dict[str, Outcomes], np.ndarray]:
    """Each row's [I, T] outcomes and the [I, T, N] orders shown, from instance records."""
    targets = np.array([record.targets for record in records])
    outcomes = {
        label: Outcomes(
            targets=targets,
            choices=np.array([record.choices[label] for record in records]),
            chosen=np.array([record.chosen[label] for record in records]),
        )
        for label in labels
    }
    return outcomes, np.array([record.orders for record in records])
