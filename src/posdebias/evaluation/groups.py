"""Per-group results (docs/evaluation.md, "Groups"): MMLU's subjects, BLINK's sub-tasks,
MuirBench's tasks, a BEIR dataset, or any group a benchmark line names in ``meta.group``.

For every row and group: Acc, RStd and Cons. on the group's instances with 95% intervals, and
their macro average (the unweighted mean over groups, what lm-evaluation-harness reports for
a group of subtasks). The bootstrap is stratified and clustered: each group's instances are
resampled within the group (all orders of an instance together), each group with its own
seeded draws, so a small group is never left out of a resample and the macro average's
interval is the spread of the mean of the groups' resampled values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from posdebias.core.instance import Instance
from posdebias.evaluation.statistics import (
    HEADLINE,
    LEVEL,
    HeadlineIntervals,
    Outcomes,
    bootstrap_interval,
    headline_samples,
    resample_weights,
)

#: The benchmark metadata key naming an instance's group.
GROUP_KEY = "group"
#: The group of an instance whose benchmark line names none (when others do).
UNGROUPED = "(no group)"


class GroupStatistics(BaseModel):
    """The groups section of a results file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(default=GROUP_KEY, description="the benchmark metadata key of the group")
    instances: dict[str, int] = Field(description="group -> test instances (sorted by name)")
    rows: dict[str, dict[str, HeadlineIntervals]] = Field(description="row -> group -> measures")
    macro: dict[str, HeadlineIntervals] = Field(
        description="row -> unweighted mean over the groups"
    )


def group_of(instance: Instance) -> str | None:
    """The group a benchmark line names (``meta.group``), as text; None without one."""
    meta = instance.metadata.get("meta") or {}
    value = meta.get(GROUP_KEY) if isinstance(meta, Mapping) else None
    return None if value is None else str(value)


def group_statistics(
    outcomes: Mapping[str, Outcomes],
    instances: Sequence[Instance],
    n: int,
    *,
    resamples: int,
    seed: int,
) -> GroupStatistics | None:
    """Per-group and macro-averaged Acc, RStd and Cons. of every row (module docstring);
    None when no instance names a group."""
    named = [group_of(instance) for instance in instances]
    if all(group is None for group in named):
        return None
    labels = [UNGROUPED if group is None else group for group in named]
    groups = sorted(set(labels))
    members = {g: np.flatnonzero(np.array(labels) == g) for g in groups}
    weights = {
        g: resample_weights(len(members[g]), resamples, [seed, k]) for k, g in enumerate(groups)
    }
    rows: dict[str, dict[str, HeadlineIntervals]] = {}
    macro: dict[str, HeadlineIntervals] = {}
    for label, outcome in outcomes.items():
        found = {
            g: headline_samples(
                Outcomes(
                    targets=outcome.targets[members[g]],
                    choices=outcome.choices[members[g]],
                    chosen=outcome.chosen[members[g]],
                ),
                n,
                weights[g],
            )
            for g in groups
        }
        rows[label] = {
            g: HeadlineIntervals(
                **{
                    name: bootstrap_interval(*found[g][name], LEVEL, bounds)
                    for name, bounds in HEADLINE.items()
                }
            )
            for g in groups
        }
        macro[label] = HeadlineIntervals(
            **{
                name: bootstrap_interval(
                    float(np.mean([found[g][name][0] for g in groups])),
                    np.mean([found[g][name][1] for g in groups], axis=0),
                    LEVEL,
                    bounds,
                )
                for name, bounds in HEADLINE.items()
            }
        )
    return GroupStatistics(
        instances={g: int(members[g].size) for g in groups}, rows=rows, macro=macro
    )
