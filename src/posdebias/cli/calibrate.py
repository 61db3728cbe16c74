"""``posdebias calibrate``: fit calibrators on M instances x N rotations, save their states."""

from __future__ import annotations

import argparse
from pathlib import Path

import posdebias.defaults as defaults
from posdebias._rundir import RunFolder
from posdebias.cli import make_console
from posdebias.cli.evaluate import (
    add_model_arguments,
    add_task_argument,
    config_flags,
    print_fit_warning,
    with_model_options,
)
from posdebias.errors import InputError, OutputError
from posdebias.evaluation.config import DEFAULT_CALIBRATORS, load_config
from posdebias.evaluation.job import calibrate, prepare
from posdebias.evaluation.preset import resolve_preset
from posdebias.evaluation.states import is_state_file, save_states, states_folder
from posdebias.registry import get_registry


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        description="Fit calibrators on M calibration instances (held out of --benchmark by "
        "--seed, the same split `evaluate` uses) via their N cyclic rotations.",
    )
    parser.add_argument("--config", type=Path, help="YAML, TOML or JSON config file")
    add_model_arguments(parser)
    parser.add_argument("--benchmark", type=Path, help="benchmark directory (posdebias build)")
    add_task_argument(parser)
    parser.add_argument(
        "--count",
        type=int,
        dest="calibration_count",
        help=f"calibration instances M ({defaults.CALIBRATION_COUNT})",
    )
    parser.add_argument(
        "--calibrators", help="comma-separated names (default: the config's, or those that fit)"
    )
    parser.add_argument("-N", dest="n", type=int, help="candidates per instance (simulated model)")
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

    flags = config_flags(args, exclude={"out"})
    config = load_config(args.config, **flags)
    if args.calibrators is None and "calibrators" not in config.model_fields_set:
        # neither flag nor config names calibrators: those that fit (the config's are kept
        # as given, options included)
        registry = get_registry()
        fitting = [n for n in DEFAULT_CALIBRATORS if registry.calibrator_class(n).needs_fit]
        config = load_config(args.config, **{**flags, "calibrators": fitting})
    config = with_model_options(config, args)
    single_file = args.out.suffix == ".json"
    if single_file and len(config.calibrators) != 1:
        raise InputError(
            f"--out {args.out} is one file but {len(config.calibrators)} calibrators were asked "
            "for; give a directory, or one calibrator"
        )
    folder = None if single_file else states_folder(args.out)
    _check_out(args.out, folder)  # before any work
    resolved = resolve_preset(config)
    with resolved.threads(), prepare(resolved) as prepared:
        if folder is not None:
            folder.create()
            folder.lock()
        try:
            states = calibrate(prepared).states
            if folder is None:
                ((label, state),) = states.items()
                _check_out(args.out, folder)  # again: it may have appeared meanwhile
                paths = {label: state.save(args.out)}
            else:
                paths = dict(zip(states, save_states(states, args.out), strict=True))
        finally:
            if folder is not None:
                folder.unlock()
    console = make_console()
    for label, state in states.items():
        console.print(
            f"{label}: {paths[label]} (N={state.n}, {state.num_observations} observations)"
        )
        print_fit_warning(label, state.diagnostics)
    return 0


def _check_out(out: Path, folder: RunFolder | None) -> None:
    """Refuse an ``--out`` we would write over something of the user's in: a link, a file
    that is not a calibration state, a folder that is not one of states."""
    if folder is not None:
        folder.check()
        foreign = [path for path in sorted(out.glob("*.json")) if not is_state_file(path)]
    elif out.is_symlink():
        raise OutputError(f"--out {out} is a symbolic link; give a plain file path")
    else:
        foreign = [out] if out.exists() and not is_state_file(out) else []
    if foreign:
        raise OutputError(
            f"{foreign[0]} exists and is not a calibration state; posdebias does not replace "
            "files it did not make: move it or choose another --out"
        )
