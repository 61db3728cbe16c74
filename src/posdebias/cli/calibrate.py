"""``posdebias calibrate``: fit calibrators on M instances x N rotations, save their states."""

from __future__ import annotations

import argparse
from pathlib import Path

from posdebias.cli import make_console
from posdebias.cli.evaluate import add_model_arguments
from posdebias.errors import InputError
from posdebias.evaluation.config import DEFAULT_CALIBRATORS, load_config
from posdebias.evaluation.job import (
    build_adapter,
    build_calibrators,
    load_instances,
    resolve_states,
)
from posdebias.evaluation.runner import ObservationCache
from posdebias.registry import get_registry


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="fit calibrators and save their calibration states",
        description="Fit calibrators on M calibration instances (held out of --benchmark by "
        "--seed, the same split `evaluate` uses) via their N cyclic rotations.",
    )
    parser.add_argument("--config", type=Path, help="YAML, TOML or JSON config file")
    add_model_arguments(parser)
    parser.add_argument("--benchmark", type=Path, help="benchmark directory (posdebias build)")
    parser.add_argument(
        "--count", type=int, dest="calibration_count", help="calibration instances M (5)"
    )
    parser.add_argument("--calibrators", help="comma-separated names (default: those that fit)")
    parser.add_argument("-N", dest="n", type=int, help="images per instance (simulated model)")
    parser.add_argument("--seed", type=int, help="seed of the held-out split")
    parser.add_argument("--batch-size", type=int, dest="batch_size", help="forward batch size")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="a .json file (one calibrator) or a directory (<label>.json each)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:

    calibrators = args.calibrators
    if calibrators is None:
        registry = get_registry()
        calibrators = [n for n in DEFAULT_CALIBRATORS if registry.calibrator_class(n).needs_fit]
    config = load_config(
        args.config,
        adapter=args.adapter,
        model=args.model,
        benchmark=args.benchmark,
        calibration_count=args.calibration_count,
        calibrators=calibrators,
        n=args.n,
        seed=args.seed,
        batch_size=args.batch_size,
    )
    built = build_calibrators(config)
    single_file = args.out.suffix == ".json"
    if single_file and len(built) != 1:
        raise InputError(
            f"--out {args.out} is one file but {len(built)} calibrators were asked for; give a "
            "directory, or one calibrator"
        )
    adapter = build_adapter(config)
    source = load_instances(config, adapter)
    n = source.calibration[0].n
    states = resolve_states(config, adapter, built, source.calibration, n, ObservationCache())
    console = make_console()
    for label, state in states.items():
        path = state.save(args.out if single_file else args.out / f"{label}.json")
        console.print(f"{label}: {path} (N={state.n}, {state.num_observations} observations)")
        if state.diagnostics.get("warning"):
            make_console(stderr=True).print(
                f"warning: {label}: {state.diagnostics['warning']}", markup=False
            )
    return 0
