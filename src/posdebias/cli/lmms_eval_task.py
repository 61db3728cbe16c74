"""``posdebias lmms-eval-task``: a benchmark's rotated lmms-eval tasks, one per calibrator
(``posdebias lm-eval-task`` is the same command for lm-evaluation-harness)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posdebias.cli import make_console
from posdebias.integrations.harness import parse_names
from posdebias.integrations.lmms_eval_tasks import (
    Harness,
    rotated_tasks_command,
    write_rotated_tasks,
)

#: How each harness runs the written tasks with posdebias (in the command's description).
RUN_COMMANDS: dict[str, str] = {
    "lmms-eval": "lmms-eval --model posdebias",
    "lm-eval": "posdebias lm-eval --model posdebias",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    add_task_parser(subparsers, "lmms-eval")


def add_task_parser(subparsers: argparse._SubParsersAction, harness: Harness) -> None:
    """The ``posdebias HARNESS-task`` command of one harness."""
    run_command = RUN_COMMANDS[harness]
    parser = subparsers.add_parser(
        f"{harness}-task",
        description=f"Write {harness} task YAML files for a benchmark: every item in its cyclic "
        "rotations, scored with Acc, RStd, Cons. and CircularEval; one task per calibrator "
        f"and a group NAME that runs them all in one {harness} run (`{run_command} --tasks "
        "NAME --include_path OUT`).",
    )
    parser.add_argument("--benchmark", type=Path, required=True, help="benchmark folder")
    parser.add_argument("--out", type=Path, required=True, help="folder for the task files")
    parser.add_argument("--name", required=True, help="the group's task name (letters, _)")
    parser.add_argument(
        "--calibrators",
        default="vanilla,attention_guided",
        help="comma-separated calibrators, one task each (vanilla,attention_guided)",
    )
    parser.add_argument(
        "--output-type",
        choices=("generate_until", "multiple_choice"),
        default="generate_until",
        help="generate_until (the answer's label) or multiple_choice (label log-likelihoods)",
    )
    parser.add_argument("--rotations", type=int, help="rotations per item (default: all N)")
    parser.add_argument("--count", type=int, help="test items (default: all)")
    parser.add_argument(
        "--calibration-count",
        type=int,
        default=0,
        help="items held out by --seed as the task's calibration split (calibration=task), "
        "the same items `posdebias evaluate` holds out",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split (0)")
    parser.add_argument(
        "--label-set",
        help="labels the answers use: digits, upper, ... (default: the task's, upper for "
        "multiple choice, digits for retrieval)",
    )
    parser.set_defaults(handler=run, harness=harness)


def run(args: argparse.Namespace) -> int:
    shared = {  # what the tasks are written with and the command must pass again
        "name": args.name,
        "calibrators": parse_names(args.calibrators),
        "calibration_count": args.calibration_count,
        "label_set": args.label_set,
        "harness": args.harness,
    }
    paths = write_rotated_tasks(
        args.benchmark,
        args.out,
        output_type=args.output_type,
        rotations=args.rotations,
        count=args.count,
        seed=args.seed,
        **shared,
    )
    console = make_console()
    for path in paths:
        console.print(str(path))
    command = rotated_tasks_command(args.benchmark, args.out, **shared)
    console.print(f"run: {command}", soft_wrap=True)  # one line: a command to copy
    return 0
