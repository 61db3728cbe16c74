"""Paired comparison of two run directories (``posdebias report --compare RUN_A RUN_B``).

Two runs (two models, or one model before and after a change) are compared row by row (the
row labels both hold) on what they share: the test instances in both, and within each such
instance the candidate orders both showed (the same permutation). Only those decisions enter:
each run's accuracy on them, the difference B - A with its paired instance-bootstrap interval
(the shared instances resampled, each with all its shared orders) and an exact McNemar test on
the decisions exactly one run got right. Runs that share no instance, no order or no row are
refused: there is nothing paired to say about them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from posdebias.adapters.families.synthetic import synthetic_instances
from posdebias.benchmarks.files import load_benchmark
from posdebias.core.instance import Instance
from posdebias.defaults import RESAMPLES
from posdebias.errors import InputError
from posdebias.evaluation.protocol import order_settings
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.runner import InstanceRecord, check_logged_truth, observation_key
from posdebias.evaluation.statistics import (
    DIFFERENCE,
    LEVEL,
    PERCENT,
    BootstrapSettings,
    Interval,
    bootstrap_interval,
    mcnemar_exact,
    resample_weights,
)
from posdebias.evaluation.store import RunDirectory


class RowComparison(BaseModel):
    """One row label of both runs on their shared decisions."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    row: str
    accuracy_a: Interval = Field(description="run A's accuracy on the shared decisions (%)")
    accuracy_b: Interval = Field(description="run B's accuracy on the shared decisions (%)")
    difference: Interval = Field(description="B - A, percentage points, paired interval")
    a_only: int = Field(description="shared decisions only run A got right")
    b_only: int = Field(description="shared decisions only run B got right")
    p_value: float = Field(description="exact McNemar test (two-sided binomial, p = 1/2)")


class RunComparison(BaseModel):
    """What ``report --compare`` prints."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_a: str
    run_b: str
    n: int
    instances: int = Field(description="test instances both runs evaluated")
    decisions: int = Field(description="(instance, order) pairs both showed alike")
    bootstrap: BootstrapSettings
    rows: list[RowComparison]


@dataclass(frozen=True)
class _Run:
    root: Path
    results: EvaluationResults
    records: dict[str, InstanceRecord]
    contents: dict[str, tuple[str, int | None]]  # id -> (what the model was shown, the truth)


def _open(root: Path) -> _Run:
    results = EvaluationResults.load(root / "results.json")
    directory = RunDirectory(root)
    if not directory.logs("records"):
        raise InputError(
            f"{root} holds results.json but no records.jsonl: a comparison pairs the "
            "per-instance decisions a run directory of `posdebias evaluate --out DIR` keeps"
        )
    records = directory.read_records()
    settings = results.settings
    instances = _test_instances(root, results)
    check_logged_truth(
        records,
        instances,
        **order_settings(settings, results.n),
        fix=f"evaluate again into a new --out (its results.json in {root} came from the same log)",
    )
    contents = {inst.id: (observation_key(inst), inst.target) for inst in instances}
    return _Run(root, results, {i: records[i] for i in results.test_ids if i in records}, contents)


def _test_instances(root: Path, results: EvaluationResults) -> list[Instance]:
    """The run's test instances with their truth: from the benchmark it names (checked to be
    the one it ran on), or the simulated model's, drawn again from the run's settings."""
    source, settings = results.source, results.settings
    if source.source == "synthetic":
        instances = synthetic_instances(settings.count, settings.n, settings.seed, "test")
    elif source.benchmark is not None:
        try:
            benchmark = load_benchmark(source.benchmark, check_images=False)
        except InputError as exc:
            raise InputError(
                f"{root} was evaluated on the benchmark {source.benchmark}, which cannot be read "
                f"now ({str(exc).splitlines()[0]}); a comparison checks each run's records "
                "against its benchmark: run it from where the runs were made, or put the "
                "benchmark back"
            ) from None
        if benchmark.fingerprint != source.benchmark_sha256:
            raise InputError(
                f"the benchmark {source.benchmark} changed since {root} was evaluated on it "
                "(sha256 mismatch); compare runs of the benchmark as it is, or evaluate again"
            )
        instances = benchmark.instances
    else:
        raise InputError(f"{root}/results.json names no benchmark to check its records against")
    wanted = set(results.test_ids)
    return [instance for instance in instances if instance.id in wanted]


def compare_runs(
    run_a: str | Path, run_b: str | Path, *, resamples: int = RESAMPLES, seed: int = 0
) -> RunComparison:
    """Row by row paired comparison of two run directories on their shared decisions."""
    a, b = _open(Path(run_a)), _open(Path(run_b))
    if a.results.n != b.results.n:
        raise InputError(
            f"{a.root} has N = {a.results.n} candidates and {b.root} N = {b.results.n}; a paired "
            "comparison needs runs over the same instances"
        )
    shared = [i for i in a.records if i in b.records]
    if differ := [i for i in shared if a.contents.get(i) != b.contents.get(i)]:
        raise InputError(
            f"{a.root} and {b.root} hold {len(differ)} other instances under the same ids (e.g. "
            f"{differ[0]!r}: question, candidates or answer): they ran on different benchmarks,"
            " so nothing pairs. Compare runs of one benchmark"
        )
    if not shared:
        raise InputError(
            f"{a.root} and {b.root} share no test instance (compared by instance id): there is "
            "nothing to pair. Compare runs on the same benchmark"
        )
    pairs: list[tuple[str, int, int]] = []  # (instance, order index in A, in B)
    for instance in shared:
        shown_b = {tuple(order): t for t, order in enumerate(b.records[instance].orders)}
        for t, order in enumerate(a.records[instance].orders):
            if tuple(order) in shown_b:
                pairs.append((instance, t, shown_b[tuple(order)]))
    if not pairs:
        raise InputError(
            f"{a.root} and {b.root} share {len(shared)} instances but no candidate order of "
            "them: use the same --seed (orders are drawn from it) to compare"
        )
    labels = [label for label in a.results.calibrators if label in b.results.calibrators]
    if not labels:
        raise InputError(
            f"{a.root} and {b.root} share no row label (A: {list(a.results.calibrators)}, "
            f"B: {list(b.results.calibrators)})"
        )
    instances = list(dict.fromkeys(instance for instance, _, _ in pairs))
    index = {instance: k for k, instance in enumerate(instances)}
    owner = np.array([index[instance] for instance, _, _ in pairs])
    counts = np.bincount(owner, minlength=len(instances)).astype(float)
    weights = resample_weights(len(instances), resamples, seed)
    totals = weights @ counts
    rows = []
    for label in labels:
        right_a = _correct(a, label, [(i, t) for i, t, _ in pairs])
        right_b = _correct(b, label, [(i, t) for i, _, t in pairs])
        per_a = np.bincount(owner, weights=right_a, minlength=len(instances))
        per_b = np.bincount(owner, weights=right_b, minlength=len(instances))

        def interval(per: np.ndarray, bounds: tuple[float, float] = PERCENT) -> Interval:
            return bootstrap_interval(
                100.0 * per.sum() / counts.sum(), 100.0 * (weights @ per) / totals, LEVEL, bounds
            )

        a_only = int(np.sum((right_a == 1) & (right_b == 0)))
        b_only = int(np.sum((right_a == 0) & (right_b == 1)))
        rows.append(
            RowComparison(
                row=label,
                accuracy_a=interval(per_a),
                accuracy_b=interval(per_b),
                difference=interval(per_b - per_a, DIFFERENCE),
                a_only=a_only,
                b_only=b_only,
                p_value=mcnemar_exact(a_only, b_only),
            )
        )
    return RunComparison(
        run_a=str(a.root),
        run_b=str(b.root),
        n=a.results.n,
        instances=len(instances),
        decisions=len(pairs),
        bootstrap=BootstrapSettings(resamples=resamples, seed=seed),
        rows=rows,
    )


def _correct(run: _Run, label: str, decisions: list[tuple[str, int]]) -> np.ndarray:
    """1.0 where ``label`` chose the truth in (instance, order), else 0.0."""
    out = np.empty(len(decisions))
    for k, (instance, t) in enumerate(decisions):
        record = run.records[instance]
        if label not in record.choices:
            raise InputError(
                f"{run.root}: the record of instance {instance!r} holds no choice of {label!r} "
                "(the run was changed after its results were written); re-run it with --resume"
            )
        out[k] = float(record.choices[label][t] == record.targets[t])
    return out
