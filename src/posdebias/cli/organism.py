"""``posdebias organism train`` / ``train-text``: reproduce a bundled model organism from a seed."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import posdebias.defaults as defaults
from posdebias._inputs import check_whole_number
from posdebias._threads import check_threads
from posdebias.organism.text.train import TextTrainingPlan, train_text_organism
from posdebias.organism.train import TrainingPlan, train_organism


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "organism",
        description="The bundled default model: a tiny LLaVA whose answer is position-biased and "
        "whose attention is informative but pulled toward one position (the Model organism page "
        "of the documentation).",
    )
    actions = parser.add_subparsers(dest="organism_command", metavar="ACTION", required=True)
    train = actions.add_parser(
        "train",
        help="train the organism and write a loadable model folder",
        description="Train the organism from a seed on in-memory shapes data (about 20 minutes "
        "on one busy CPU core); write weights, config, tokenizer, processor and prompt to --out.",
    )
    _add_training_flags(train)
    train.add_argument(
        "--steps",
        type=int,
        nargs=4,
        metavar=("ALIGN", "RETRIEVAL", "CONFOUND", "BIAS"),
        help="steps of the four stages (default 1500 2000 600 1000; 1 to 1,000,000 each)",
    )
    train.add_argument("--batch-size", type=int, dest="batch_size", help="examples per step (64)")
    train.set_defaults(handler=run)
    text = actions.add_parser(
        "train-text",
        help="train the text organism (multiple choice) and write a loadable model folder",
        description="Train the text organism from a seed on in-memory questions (about 10 "
        "minutes on one busy CPU core); write weights, config and tokenizer to --out.",
    )
    _add_training_flags(text)
    text.add_argument(
        "--steps",
        type=int,
        nargs=3,
        metavar=("ALIGN", "ANSWER", "BIAS"),
        help="steps of the three stages (default 300 800 600; 1 to 1,000,000 each)",
    )
    text.add_argument("--batch-size", type=int, dest="batch_size", help="examples per step (32)")
    text.set_defaults(handler=run_text)


def _add_training_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="output model folder")
    parser.add_argument(
        "--seed", type=int, default=0, help="training seed (0: shipped weights; 0 to 4,294,967,295)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1; at most the CPUs of this machine)",
    )
    parser.add_argument(
        "--dtype", choices=("float32", "float16"), default="float32", help="saved weights dtype"
    )


PlanT = TypeVar("PlanT")


def _plan(plan: PlanT, args: argparse.Namespace, stages: tuple[str, ...]) -> PlanT:
    """``plan`` with the flags' settings, each checked first (``stages``: the plan's step
    fields that ``--steps`` gives, in order)."""
    check_whole_number("--seed", args.seed, 0, defaults.MAX_SEED)
    check_threads(args.threads, "--threads")  # 1 to the CPUs this process may use
    settings = {"seed": args.seed, "threads": args.threads}
    for stage, steps in zip(stages, args.steps or (), strict=False):
        check_whole_number("--steps", steps, 1, MAX_STEPS)
        settings[stage] = steps
    if args.batch_size is not None:
        check_whole_number("--batch-size", args.batch_size, 2, defaults.MAX_BATCH_SIZE)
        settings["batch_size"] = args.batch_size
    return replace(plan, **settings)  # type: ignore[type-var]


#: Most steps of one training stage (the recipes use 300 to 2,000).
MAX_STEPS = 1_000_000


def run(args: argparse.Namespace) -> int:
    stages = ("alignment_steps", "retrieval_steps", "confound_steps", "bias_steps")
    train_organism(args.out, _plan(TrainingPlan(), args, stages), dtype=args.dtype)
    return 0


def run_text(args: argparse.Namespace) -> int:
    stages = ("alignment_steps", "answer_steps", "bias_steps")
    train_text_organism(args.out, _plan(TextTrainingPlan(), args, stages), dtype=args.dtype)
    return 0
