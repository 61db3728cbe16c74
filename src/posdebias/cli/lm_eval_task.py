"""``posdebias lm-eval-task``: a benchmark's rotated lm-eval tasks, one per calibrator."""

from __future__ import annotations

import argparse

from posdebias.cli.lmms_eval_task import add_task_parser


def register(subparsers: argparse._SubParsersAction) -> None:
    add_task_parser(subparsers, "lm-eval")
