"""Ranking measures of every row that ranks all N candidates (docs/evaluation.md, "Ranking").

Each calibrator's prediction is a full ranking of the candidates; the run records it for every
order (``InstanceRecord.rankings``). Against the candidates' relevance grades (graded where the
benchmark gives them, else 1 for the right candidate and 0 for the others) each ranking has

* nDCG@k (Järvelin & Kekäläinen, 2002), linear gain as trec_eval and BEIR compute it:
  ``DCG@k = sum_{r <= k} grade(r) / log2(r + 1)``, divided by the DCG@k of the candidates in
  the ideal order (so a perfect reranking of the N candidates scores 100);
* MRR: ``1 / rank`` of the first candidate with a positive grade;
* Recall@k: the share of the candidates with a positive grade that are in the top k.

All are percentages, averaged over the T orders of an instance and then over instances; their
95% intervals come from the same instance bootstrap as accuracy (the same resamples, so a row's
intervals and its paired differences agree). Each row is compared with each baseline on nDCG@10
and MRR: the paired difference with its bootstrap interval, and a two-sided paired
randomisation test (random sign flips of the per-instance differences, seeded; Smucker, Allan
& Carterette, CIKM 2007), the test IR uses where McNemar's needs right/wrong outcomes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from posdebias._inputs import file_decimal_number
from posdebias.core.instance import Instance
from posdebias.errors import InputError
from posdebias.evaluation.runner import InstanceRecord
from posdebias.evaluation.statistics import (
    DIFFERENCE,
    LEVEL,
    PERCENT,
    Interval,
    bootstrap_interval,
    instance_mean,
    resample_weights,
)

#: The cut-offs k of nDCG@k and Recall@k (those below N; nDCG@10 always, BEIR's headline).
CUTOFFS = (1, 3, 5, 10)
#: The measures every row is compared with each baseline on.
COMPARED = ("nDCG@10", "MRR")
#: The benchmark metadata key holding the candidates' grades (file order, comma separated).
RELEVANCE_KEY = "relevance"
RANDOMISATION_TEST = "paired randomisation test (sign flips of per-instance differences)"


class RankingComparison(BaseModel):
    """One row against a baseline on one ranking measure, on the same instances and orders."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    row: str
    baseline: str
    measure: str
    difference: Interval = Field(description="measure(row) - measure(baseline), points")
    p_value: float = Field(ge=0, le=1, description="two-sided paired randomisation test")


class RankingStatistics(BaseModel):
    """The ranking section of a results file: each row's measures with 95% intervals."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    graded: bool = Field(description="whether the benchmark gave graded relevance")
    cutoffs: list[int] = Field(description="k of nDCG@k (and of Recall@k where k < N)")
    rows: dict[str, dict[str, Interval]] = Field(description="row -> measure -> interval (%)")
    comparisons: list[RankingComparison] = Field(default_factory=list)
    test: str = RANDOMISATION_TEST


def relevance_grades(instance: Instance) -> np.ndarray:
    """[N] grades of the candidates in the file order: the benchmark's ``relevance`` (graded,
    e.g. BEIR's qrels scores), else 1 for the right candidate and 0 for the others."""
    meta = instance.metadata.get("meta") or {}
    given = meta.get(RELEVANCE_KEY) if isinstance(meta, Mapping) else None
    if given is None:
        grades = np.zeros(instance.n)
        if instance.target is not None:
            grades[instance.target] = 1.0
        return grades
    where = f"instance {instance.id[:60]!r}: meta.{RELEVANCE_KEY} {str(given)[:60]!r}"
    try:  # the one reader of decimals in files: nan, inf, 1e308 (a sum overflows), 1_0 refused
        grades = np.array([file_decimal_number(v, "grade") for v in str(given).split(",")])
    except InputError as exc:
        raise InputError(f"{where} is not comma-separated numbers ({exc}); give one finite "
                         "grade per candidate in file order, e.g. '2,0,1,0'") from None  # fmt: skip
    if grades.size != instance.n or not np.all(np.isfinite(grades)):
        raise InputError(f"{where} must hold {instance.n} finite grades, one per candidate")
    grades = np.maximum(grades, 0.0)  # a judged-irrelevant passage (-1, 0) gains nothing
    if instance.target is not None and grades[instance.target] < grades.max():
        raise InputError(
            f"{where}: the right candidate ({instance.target + 1}) must have the highest grade"
        )
    if grades.max() <= 0:
        raise InputError(f"{where}: no candidate has a positive grade")
    return grades


def check_relevance(instances: Sequence[Instance]) -> None:
    """Read every instance's grades: a bad one is an InputError before any forward pass."""
    for instance in instances:
        relevance_grades(instance)


def cutoffs_for(n: int) -> list[int]:
    """The k of nDCG@k: those of :data:`CUTOFFS` below N, and 10."""
    return sorted({k for k in CUTOFFS if k < n} | {10})


def ranking_values(rankings: np.ndarray, grades: np.ndarray) -> dict[str, np.ndarray]:
    """Measure -> [I, T] values (%) of ``rankings`` ([I, T, N] candidates best first, as
    file positions) against ``grades`` ([I, N])."""
    n = rankings.shape[2]
    gains = np.take_along_axis(grades[:, None, :], rankings, axis=2)  # [I, T, N] in rank order
    discount = 1.0 / np.log2(np.arange(n) + 2.0)
    ideal = -np.sort(-grades, axis=1)  # [I, N]
    relevant = gains > 0
    total = relevant.sum(axis=2)
    values: dict[str, np.ndarray] = {}
    for k in cutoffs_for(n):
        top = min(k, n)
        dcg = (gains[:, :, :top] * discount[:top]).sum(axis=2)
        idcg = (ideal[:, :top] * discount[:top]).sum(axis=1)
        values[f"nDCG@{k}"] = 100.0 * dcg / idcg[:, None]
    first = np.argmax(relevant, axis=2)
    values["MRR"] = 100.0 / (first + 1.0)
    for k in cutoffs_for(n):
        if k < n:
            values[f"Recall@{k}"] = 100.0 * relevant[:, :, :k].sum(axis=2) / total
    return values


def randomisation_p(differences: np.ndarray, resamples: int, seed: int) -> float:
    """Two-sided paired randomisation test of a zero mean difference: the share of random
    sign flips of the per-instance ``differences`` whose mean is at least as far from 0, with
    the observed assignment counted ((1 + hits) / (1 + resamples))."""
    observed = abs(float(differences.mean()))
    if not np.any(differences):
        return 1.0
    rng = np.random.default_rng([seed, 1])
    signs = rng.integers(0, 2, size=(resamples, differences.size)) * 2 - 1
    flipped = np.abs(signs @ differences) / differences.size
    hits = int(np.sum(flipped >= observed - 1e-12 * max(1.0, observed)))
    return (1 + hits) / (1 + resamples)


def ranking_statistics(
    records: Sequence[InstanceRecord],
    instances: Sequence[Instance],
    labels: Sequence[str],
    *,
    baselines: Sequence[str] = (),
    resamples: int,
    seed: int,
) -> RankingStatistics | None:
    """The ranking section of the rows whose every record holds a ranking (None if no row
    does, or N = 2, where a ranking is its choice); the same resamples as the accuracy's."""
    if not records or len(records[0].orders[0]) < 3:
        return None
    ranked = [label for label in labels if all(label in r.rankings for r in records)]
    if not ranked:
        return None
    grades = np.stack([relevance_grades(instance) for instance in instances])
    weights = resample_weights(len(records), resamples, seed)
    per_instance: dict[str, dict[str, np.ndarray]] = {}
    rows: dict[str, dict[str, Interval]] = {}
    for label in ranked:
        rankings = np.array([record.rankings[label] for record in records], dtype=np.int64)
        values = {k: v.mean(axis=1) for k, v in ranking_values(rankings, grades).items()}
        per_instance[label] = values
        rows[label] = {
            measure: bootstrap_interval(*instance_mean(x, weights, 1.0), LEVEL, PERCENT)
            for measure, x in values.items()
        }
    comparisons = [
        RankingComparison(
            row=label,
            baseline=baseline,
            measure=measure,
            difference=bootstrap_interval(*instance_mean(gap, weights, 1.0), LEVEL, DIFFERENCE),
            p_value=randomisation_p(gap, resamples, seed),
        )
        for baseline in baselines
        if baseline in per_instance
        for label in ranked
        if label != baseline
        for measure in COMPARED
        for gap in [per_instance[label][measure] - per_instance[baseline][measure]]
    ]
    graded = any(RELEVANCE_KEY in (instance.metadata.get("meta") or {}) for instance in instances)
    return RankingStatistics(
        graded=graded,
        cutoffs=cutoffs_for(int(grades.shape[1])),
        rows=rows,
        comparisons=comparisons,
    )


__all__ = [
    "RankingComparison",
    "RankingStatistics",
    "check_relevance",
    "ranking_statistics",
    "ranking_values",
    "relevance_grades",
]
