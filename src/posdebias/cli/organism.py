"""``posdebias organism train``: reproduce the bundled model organism from a seed."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from posdebias.errors import InputError
from posdebias.organism.train import TrainingPlan, train_organism


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "organism",
        description="The bundled default model: a tiny LLaVA whose attention finds the right "
        "image while its answer is position-biased (the Model organism page of the documentation).",
    )
    actions = parser.add_subparsers(dest="organism_command", metavar="ACTION", required=True)
    train = actions.add_parser(
        "train",
        help="train the organism and write a loadable model folder",
        description="Train the organism from a seed on in-memory shapes data (about 20 minutes "
        "on one busy CPU core); write weights, config, tokenizer, processor and prompt to --out.",
    )
    train.add_argument("--out", type=Path, required=True, help="output model folder")
    train.add_argument("--seed", type=int, default=0, help="training seed (0: shipped weights)")
    train.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    train.add_argument(
        "--dtype", choices=("float32", "float16"), default="float32", help="saved weights dtype"
    )
    train.add_argument(
        "--steps",
        type=int,
        nargs=3,
        metavar=("ALIGN", "RETRIEVAL", "BIAS"),
        help="steps of the three stages (default 1500 2000 1500)",
    )
    train.add_argument("--batch-size", type=int, dest="batch_size", help="examples per step (64)")
    train.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:

    if not 0 <= args.seed < 2**32:
        raise InputError(f"--seed must be a whole number from 0 to {2**32 - 1}, got {args.seed}")
    if args.threads < 1:
        raise InputError(f"--threads must be at least 1, got {args.threads}")
    plan = replace(TrainingPlan(), seed=args.seed, threads=args.threads)
    if args.steps is not None:
        if min(args.steps) < 1:
            raise InputError(f"--steps must all be at least 1, got {args.steps}")
        align, retrieval, bias = args.steps
        plan = replace(plan, alignment_steps=align, retrieval_steps=retrieval, bias_steps=bias)
    if args.batch_size is not None:
        if args.batch_size < 2:
            raise InputError(f"--batch-size must be at least 2, got {args.batch_size}")
        plan = replace(plan, batch_size=args.batch_size)
    train_organism(args.out, plan, dtype=args.dtype)
    return 0
