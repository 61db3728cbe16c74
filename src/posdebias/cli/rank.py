"""``posdebias rank``: the calibrated distribution over the candidates of one query (images for
a caption, or the options, answers or passages of a text task)."""

from __future__ import annotations

import argparse
from os.path import isfile
from pathlib import Path

from posdebias._inputs import excerpt, load_yaml
from posdebias.api import Debiaser
from posdebias.cli import check_path_text, listing_table, make_console
from posdebias.cli.evaluate import add_model_arguments, with_model_options
from posdebias.core.instance import TASK_KINDS, candidate_noun
from posdebias.errors import InputError
from posdebias.evaluation.config import load_config
from posdebias.evaluation.job import build_adapter
from posdebias.evaluation.preset import resolve_preset


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("rank")
    parser.add_argument("--calibration", type=Path, required=True, help="calibration state")
    add_model_arguments(parser)
    parser.add_argument(
        "--adapter-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="adapter option (repeatable; values parsed as YAML)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="also show the evidence: the model's own label probabilities, the attention "
        "readout, the attention posterior and the bias removed",
    )
    parser.add_argument(
        "--calibration-transfer",
        action="store_true",
        help="use a calibration state fitted on another model (a transfer study)",
    )
    parser.add_argument(
        "--task",
        choices=TASK_KINDS,
        help="the task the candidates are posed as (default: the one the calibration state "
        "was fitted on)",
    )
    parser.add_argument("query", help="the caption, question or query")
    parser.add_argument(
        "candidates",
        nargs="+",
        metavar="CANDIDATE",
        help="the candidates in the order shown: image files (retrieval) or texts",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.task == "retrieval":  # image files: refused before the model loads
        for k, candidate in enumerate(args.candidates, 1):
            check_path_text(candidate, f"candidate {k}")
    options = {}
    for item in args.adapter_option:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise InputError(
                f"--adapter-option {excerpt(item)} must look like KEY=VALUE with KEY an option "
                "name (e.g. label_set=upper)"
            )
        options[key] = load_yaml(value, f"--adapter-option {key}")
    config = load_config(None, model=args.model, adapter={"name": args.adapter, "options": options})
    config = with_model_options(config, args)
    debiaser = Debiaser.load(
        args.calibration,
        build_adapter(resolve_preset(config).config),
        transfer=args.calibration_transfer,
    )
    # the task of the states for this N, else of all the states (their N is then refused)
    task = args.task or debiaser.fitted_task(len(args.candidates)) or debiaser.fitted_task()
    if task is None:
        fitted = sorted({debiaser.fitted_task(n) or "several tasks" for n in debiaser.calibrated_n})
        raise InputError(
            f"the calibration states were fitted on {' and '.join(fitted)}: say which task "
            f"the {len(args.candidates)} candidates are posed as with --task"
        )
    if task == "retrieval":
        for k, candidate in enumerate(args.candidates, 1):
            check_path_text(candidate, f"candidate {k}")
        ranking = debiaser.rank(args.query, args.candidates, explain=args.explain)
    else:
        _warn_of_files(args.candidates, task)
        ranking = debiaser.rank(args.query, texts=args.candidates, task=task, explain=args.explain)
    evidence = ranking.evidence
    extra = []
    if evidence is not None:
        extra = [
            (title, values)
            for title, values in (
                ("model", evidence.label_probabilities),
                ("attention", evidence.attention_readout),
                ("posterior", evidence.posterior),
                ("bias removed", evidence.expected_bias),
            )
            if values is not None
        ]
    noun = candidate_noun(task, plural=False)
    table = listing_table(
        f"{ranking.calibrator}: {args.query!r}",
        ("position", noun, "probability", *(title for title, _ in extra), ""),
    )
    for position, (candidate, probability) in enumerate(
        zip(args.candidates, ranking.probabilities, strict=True)
    ):
        mark = "<- chosen" if position == ranking.choice else ""
        cells = [
            f"{values[position]:+.4f}" if title == "bias removed" else f"{values[position]:.4f}"
            for title, values in extra
        ]
        table.add_row(str(position + 1), candidate, f"{probability:.4f}", *cells, mark)
    make_console().print(table)
    return 0


def _warn_of_files(candidates: list[str], task: str) -> None:
    """A text task poses each argument as its own text: say so where one names a file (images
    or a passage file were perhaps meant), since its path is then what is ranked."""
    files = [f"{k} ({excerpt(text)})" for k, text in enumerate(candidates, 1) if isfile(text)]
    if files:  # isfile: False also for a text no file system can hold
        many = len(files) > 1
        make_console(stderr=True).print(
            f"warning: {candidate_noun(task, plural=many)} {', '.join(files)} "
            f"{'name files' if many else 'names a file'}, but {task} poses every argument as "
            "its own text: the path is ranked, not the file (to rank images, use a calibration "
            "state fitted on retrieval)",
            style="yellow",
        )
