"""``posdebias sweep STUDY``: one of the paper's experiments, as a resumable run directory."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from posdebias.cli import make_console
from posdebias.cli.evaluate import (
    add_model_arguments,
    add_row_arguments,
    add_run_arguments,
    config_flags,
    with_model_options,
)
from posdebias.errors import InputError
from posdebias.evaluation.config import config_error, config_from_data, read_config_file
from posdebias.evaluation.sweep import STUDIES, Point, SweepSpec, run_sweep

#: The n study's defaults when neither the command line nor the config sets them: the scaling
#: table of docs/experiments.md (100 instances x 3 orders at each N).
N_STUDY_DEFAULTS = {"count": 100, "orders": 3}


#: The flags of `posdebias evaluate` a sweep does not take, and why (the rest are shared
#: through :func:`add_run_arguments`; the tests hold the two commands to this list).
STUDY_DECIDES = {
    "calibration": "every point fits its own calibrators (the calibration_size study varies them)",
    "calibration_transfer": "goes with --calibration",
    "calibration_benchmark": "the transfer study calibrates on each of --benchmarks; another "
    "study may set it in its config file",
    "n": "the n study varies N; another study takes N from its benchmark or config file",
    "ci": "a study prints no results table (results.csv and report.md hold the intervals)",
    "baseline": "a study reports each row with its intervals, not paired comparisons (run "
    "`posdebias evaluate` with a point's settings for those)",
    "gpus_per_process": "data-parallel runs (accelerate launch) are evaluate runs",
}


def register(subparsers: argparse._SubParsersAction) -> None:

    parser = subparsers.add_parser(
        "sweep",
        description="Evaluate every point of a study on one model with one observation cache "
        "and write results.csv, figure.png and report.md to --out (see the Experiments page). "
        "Flags override the config file; its 'sweep' section holds values / benchmarks.",
    )
    parser.add_argument("study", choices=STUDIES, help="the study to run")
    parser.add_argument("--config", type=Path, help="YAML, TOML or JSON config file")
    add_model_arguments(parser)
    add_run_arguments(parser, comparisons=False)
    parser.add_argument(
        "--benchmark", help="benchmark directory; for the n study a pattern with {n}"
    )
    parser.add_argument(
        "--benchmarks", type=Path, nargs="+", help="transfer: the benchmarks to pair"
    )
    parser.add_argument("--values", help="comma-separated N, |Dcal|, K or tau values")
    add_row_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="the study's run directory")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted study")
    parser.set_defaults(handler=run)


def _values(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(part) for part in text.split(",")]  # an empty value is refused
    except ValueError:
        raise InputError(f"--values must be comma-separated numbers, got {text!r}") from None


def run(args: argparse.Namespace) -> int:

    data = read_config_file(args.config) if args.config is not None else {}
    section = data.pop("sweep", None) or {}
    if not isinstance(section, dict):
        raise InputError(f"{args.config}: 'sweep' must be a mapping (values, benchmarks)")
    if args.values is not None:
        section["values"] = _values(args.values)
    if args.benchmarks is not None:
        section["benchmarks"] = args.benchmarks
    try:
        spec = SweepSpec.model_validate(section)
    except ValidationError as exc:
        raise config_error(exc, f"{args.config or 'command line'}: sweep") from None
    overrides = config_flags(args, exclude={"out"})  # --out: the study's own directory
    if args.study == "n":
        for key, value in N_STUDY_DEFAULTS.items():
            if overrides.get(key) is None and key not in data:
                overrides[key] = value
    config = config_from_data(
        data,
        str(args.config) if args.config else "configuration",
        **overrides,
    )
    config = with_model_options(config, args)
    console = make_console()

    def progress(point: Point, payload: dict[str, Any]) -> None:
        best = max(payload["rows"], key=lambda row: row["accuracy"])
        console.print(
            f"{point.label}: done ({len(payload['keys'])} observations; best "
            f"{best['calibrator']} {best['accuracy']:.2f})"
        )

    result = run_sweep(args.study, config, spec, args.out, resume=args.resume, on_point=progress)
    console.print(
        f"{len(result.rows)} rows in {result.out / 'results.csv'}; "
        + ("" if result.figure is None else f"figure {result.figure}; ")
        + f"report {result.report} ({result.seconds:.0f} s)"
    )
    return 0
