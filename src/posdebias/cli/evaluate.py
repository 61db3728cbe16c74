"""``posdebias evaluate``: calibrate, evaluate T orders per instance, print the paper's table."""

from __future__ import annotations

import argparse
from pathlib import Path

from posdebias.cli import make_console
from posdebias.evaluation.config import load_config
from posdebias.evaluation.job import run_evaluation, write_results
from posdebias.evaluation.table import print_results_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="evaluate calibrators (no arguments: the bundled default run)",
        description="Fit calibrators on the symmetrised calibration set and evaluate them over "
        "T candidate orders per test instance. Flags override the config file.",
    )
    parser.add_argument("--config", type=Path, help="YAML, TOML or JSON config file")
    parser.add_argument("--adapter", help="adapter name (see `posdebias plugins`)")
    parser.add_argument("--model", help="Hugging Face model id or local path")
    parser.add_argument("--calibrators", help="comma-separated calibrator names")
    parser.add_argument("--orders", type=int, help="candidate orders T per instance")
    parser.add_argument("--count", type=int, help="number of test instances")
    parser.add_argument("-N", dest="n", type=int, help="images per instance (simulated model)")
    parser.add_argument("--seed", type=int, help="random seed")
    parser.add_argument("--batch-size", type=int, dest="batch_size", help="forward batch size")
    parser.add_argument("--out", type=Path, help="write results.json into this directory")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(
        args.config,
        adapter=args.adapter,
        model=args.model,
        calibrators=args.calibrators,
        orders=args.orders,
        count=args.count,
        n=args.n,
        seed=args.seed,
        batch_size=args.batch_size,
        out=args.out,
    )
    console = make_console()
    results = run_evaluation(config)
    title = (
        f"{results.adapter.get('model_id') or results.adapter['adapter']}: "
        f"N={results.n}, {results.num_instances} instances x {results.orders} orders"
    )
    print_results_table(results.metrics(), title=title, console=console)
    if config.out is not None:
        path = write_results(results, config.out)
        console.print(f"results written to {path}")
    return 0
