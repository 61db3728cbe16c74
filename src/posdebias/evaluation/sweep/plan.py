"""What a study evaluates: its points, planned and checked before any model is loaded."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from posdebias._inputs import MAX_FILE_MAGNITUDE, UsablePath
from posdebias.benchmarks.files import load_benchmark
from posdebias.core.instance import candidate_noun
from posdebias.errors import InputError, validation_problems
from posdebias.evaluation.config import CalibratorSpec, EvaluateConfig, orders_of
from posdebias.registry import get_registry

STUDIES = ("n", "calibration_size", "top_k", "tau", "transfer")

#: Values a study sweeps when the config gives none.
DEFAULT_VALUES: dict[str, list[float]] = {
    "n": [float(n) for n in range(2, 13)],
    "calibration_size": [float(m) for m in range(1, 21)],
    "top_k": [1.0, 2.0, 3.0, 4.0],
    "tau": [0.5, 1.0, 2.0, 5.0, 10.0, 20.0],
}


class SweepSpec(BaseModel):
    """The ``sweep`` section of a config file (everything else is an evaluation config)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

    # bounded like every decimal read from a file: 1e308 named a point by its 309 digits
    values: list[Annotated[float, Field(ge=-MAX_FILE_MAGNITUDE, le=MAX_FILE_MAGNITUDE)]] | None = (
        Field(
            default=None,
            max_length=1_000,
            description="N, |Dcal|, K or tau values (default per study)",
        )
    )
    benchmarks: list[UsablePath] | None = Field(
        default=None,
        max_length=32,
        description="transfer: the benchmarks to pair (every ordered pair)",
    )


@dataclass
class Point:
    """One setting of a study: what it evaluates and how it is labelled."""

    index: int
    value: float | str
    label: str
    config: EvaluateConfig
    calibration_benchmark: str = ""
    benchmark: str = ""


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)


def _calibrators_with_option(specs: list[CalibratorSpec], option: str) -> list[CalibratorSpec]:

    registry = get_registry()
    chosen = [
        spec
        for spec in specs
        if option in getattr(registry.calibrator_class(spec.name).Options, "model_fields", {})
    ]
    if not chosen:
        names = ", ".join(spec.name for spec in specs)
        raise InputError(
            f"the {option} study needs a calibrator with the option {option!r} (e.g. "
            f"attention_guided); the config has: {names}"
        )
    return chosen


def plan_points(study: str, config: EvaluateConfig, spec: SweepSpec) -> list[Point]:
    """The points of a study, in the order they run (checked before any model is loaded)."""
    if study not in STUDIES:
        raise InputError(f"unknown study {study!r}; choose one of: {', '.join(STUDIES)}")
    if config.baseline is not None:  # it would be recorded and never used
        raise InputError(
            "a study reports each row with its intervals, not paired comparisons with a "
            "baseline: drop baseline, or run `posdebias evaluate` with a point's settings"
        )
    values = spec.values if spec.values is not None else DEFAULT_VALUES.get(study, [])
    if (
        study == "calibration_size"
        and "calibration_count" in config.model_fields_set
        and values
        and config.calibration_count != max(values)
    ):
        raise InputError(
            f"the calibration_size study calibrates each point on its value's count of one "
            f"held-out pool of {_number(max(values))}, not {config.calibration_count}: drop "
            "--calibration-count (or calibration_count in the config)"
        )
    decided = {"n": ("n",), "transfer": ("benchmark", "calibration_benchmark")}.get(study, ())
    given = [
        name
        for name in decided
        if name in config.model_fields_set and getattr(config, name) is not None
    ]
    if given:  # they would be replaced by the study's own, silently
        raise InputError(
            f"the {study} study sets {' and '.join(given)} of each point itself: drop "
            f"{' and '.join(given)} from the command line or the config"
        )
    if study == "transfer":
        return _transfer_points(config, spec)
    if spec.benchmarks is not None:
        raise InputError(f"'benchmarks' is for the transfer study, not {study!r}")
    if not values:
        raise InputError(f"the {study} study needs at least one value")
    if len(set(values)) != len(values):
        raise InputError(f"the {study} study's values repeat: {values}")
    points = []
    for index, value in enumerate(values):
        if study in ("n", "calibration_size", "top_k") and (value != int(value) or value < 1):
            raise InputError(f"{study} values must be whole numbers >= 1, got {value}")
        update: dict[str, Any]
        if study == "n":
            n = int(value)
            if n < 2:
                raise InputError(f"n values must be at least 2, got {n}")
            update = {"n": n, "orders": min(orders_of(config, n), math.factorial(n))}
            if config.benchmark is not None:
                pattern = str(config.benchmark)
                if "{n}" not in pattern:
                    raise InputError(
                        "the n study needs one benchmark per N: give benchmark as a pattern "
                        "with {n}, e.g. runs/coco-random-n{n}"
                    )
                update["benchmark"] = Path(pattern.replace("{n}", str(n)))
        elif study == "calibration_size":
            # one held-out pool of the largest M: nested calibration sets, one test set
            update = {"calibration_count": int(max(values))}
        else:
            option = study
            chosen = {s.key for s in _calibrators_with_option(config.calibrators, option)}
            update = {
                "calibrators": [
                    s.model_copy(update={"options": {**s.options, option: _number(value)}})
                    if s.key in chosen
                    else s
                    for s in config.calibrators
                ]
            }
        label = f"{study}={_number(value)}"
        own = {"calibration_count": int(value)} if study == "calibration_size" else update
        _checked(config.model_copy(update=own), f"the {study} study's value {label}")
        points.append(Point(index, _number(value), label, config.model_copy(update=update)))
    return points


def _checked(config: EvaluateConfig, what: str) -> None:
    """Validate ``config`` again, its calibrators' options included (``model_copy`` does not
    validate): a value out of its range is refused before any point runs."""
    registry = get_registry()
    try:
        EvaluateConfig.model_validate(config.model_dump())
        for spec in config.calibrators:
            registry.calibrator_class(spec.name).Options.model_validate(spec.options)
    except ValidationError as exc:
        raise InputError(f"{what}: " + "; ".join(validation_problems(exc))) from None


def _transfer_points(config: EvaluateConfig, spec: SweepSpec) -> list[Point]:

    if spec.values is not None:
        raise InputError("the transfer study takes 'benchmarks', not 'values'")
    if not spec.benchmarks or len(spec.benchmarks) < 2:
        raise InputError(
            "the transfer study needs at least two benchmarks: --benchmarks A B (or "
            "sweep.benchmarks in the config)"
        )
    loaded = [load_benchmark(path) for path in spec.benchmarks]
    if len({b.fingerprint for b in loaded}) < len(loaded):
        named = ", ".join(map(str, spec.benchmarks))
        raise InputError(f"the transfer study's benchmarks repeat (the same content): {named}")
    tasks = {str(path): b.task for path, b in zip(spec.benchmarks, loaded, strict=True)}
    if len(set(tasks.values())) > 1:
        listed = ", ".join(f"{path} ({task})" for path, task in tasks.items())
        raise InputError(
            f"transfer needs benchmarks of one task: a calibration fitted on one task's prompt "
            f"does not apply to another's. Got {listed}"
        )
    posed = next(iter(tasks.values()))
    if config.task is not None and config.task != posed:
        raise InputError(
            f"--task {config.task}, but the benchmarks pose {posed}; give {config.task} "
            "benchmarks or drop --task"
        )
    sizes = {
        str(path): {inst.n for inst in b.instances}
        for path, b in zip(spec.benchmarks, loaded, strict=True)
    }
    for path, found in sizes.items():
        if len(found) != 1:
            raise InputError(f"benchmark {path} mixes N = {sorted(found)}; use one N per benchmark")
    distinct = {next(iter(found)) for found in sizes.values()}
    if len(distinct) > 1:
        noun = candidate_noun(loaded[0].instances[0].task if loaded[0].instances else None)
        listed = ", ".join(f"{path} (N={next(iter(found))})" for path, found in sizes.items())
        raise InputError(
            f"transfer needs benchmarks with the same number of {noun} per instance: a "
            f"calibration fitted at one N does not apply at another. Got {listed}"
        )
    names = _short_names(spec.benchmarks)
    points: list[Point] = []
    for a, source in enumerate(spec.benchmarks):
        for b, target in enumerate(spec.benchmarks):
            update = {"benchmark": Path(target), "calibration_benchmark": Path(source)}
            points.append(
                Point(
                    len(points),
                    f"{names[a]}->{names[b]}",
                    f"{names[a]} -> {names[b]}",
                    config.model_copy(update=update),
                    calibration_benchmark=names[a],
                    benchmark=names[b],
                )
            )
    return points


def _short_names(paths: Sequence[Path]) -> list[str]:
    """The shortest trailing parts of the paths that tell them apart (``coco/random-n4``)."""
    parts = [Path(path).resolve().parts for path in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(path) for path in paths]
