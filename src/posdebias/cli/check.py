"""``posdebias check``: is this adapter right on this model? The first thing to run on a new one.

Loads the model (float32 by default: the figures are float32 comparisons), runs every check of
:func:`posdebias.testing.check.check_adapter` and prints one row per check with its figure.
Exit 0 only when no check fails.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import posdebias.defaults as defaults
from posdebias._inputs import check_whole_number
from posdebias._text import safe_text
from posdebias._threads import apply_threads
from posdebias.benchmarks.files import Benchmark, load_benchmark
from posdebias.cli import listing_table, make_console
from posdebias.cli.evaluate import add_model_arguments
from posdebias.core.instance import TASK_KINDS
from posdebias.errors import InputError
from posdebias.evaluation.job import check_task
from posdebias.loading import bundled_task, load_adapter
from posdebias.registry import get_registry
from posdebias.testing.check import FAIL, PASS, check_adapter, check_instances


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check",
        description="Check that the adapter's spans, label scores and attention masses are "
        "right for this model: scores against the model's own forward, the probe against eager "
        "attention, batch size 1 against 2, image rotation. Run it first on a new model.",
    )
    add_model_arguments(parser, base_url=False)
    parser.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda when available)")
    parser.add_argument(
        "--dtype", default="float32", help="model dtype (default float32: the tolerances are)"
    )
    parser.add_argument(
        "-N",
        dest="n",
        type=int,
        help=f"candidates per instance ({defaults.CANDIDATES}; a pairwise judge's 2; a "
        "benchmark's own)",
    )
    parser.add_argument(
        "--label-set", dest="label_set", help="label set (default: the task's: digits, upper)"
    )
    parser.add_argument(
        "--task",
        choices=TASK_KINDS,
        help="task kind of the check's instances (default: the benchmark's, a bundled model's "
        "own, else retrieval; "
        "multiple_choice, pairwise_judge, rerank: text candidates, and images too on a "
        "vision-language model)",
    )
    parser.add_argument(
        "--image",
        dest="images",
        action="append",
        type=Path,
        metavar="PATH",
        help="an image to check with (repeatable, at least N; default: generated images)",
    )
    parser.add_argument(
        "--benchmark",
        type=Path,
        help="check on the first three instances of this benchmark (posdebias build) instead",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.n is not None:
        check_whole_number("-N", args.n, defaults.MIN_CANDIDATES, defaults.MAX_CANDIDATES)
    for image in args.images or ():
        if not image.is_file():
            raise InputError(f"image file {image} does not exist")
    benchmark = None if args.benchmark is None else load_benchmark(args.benchmark)
    if benchmark is not None:
        check_task(args.task, benchmark.task, args.benchmark)
        args.task = benchmark.task
    args.task = args.task or bundled_task(args.model) or "retrieval"  # as evaluate poses it
    args.n = _checked_n(args.n, args.task, benchmark)
    import transformers

    transformers.logging.set_verbosity_error()  # our rows say what matters
    model = args.model
    own_questions = None
    if model is None:  # the task's bundled default model (an organism)
        default = get_registry().default_model(args.task)
        if default is None:
            raise InputError(
                f"no bundled model poses {args.task}: name a model to check: --model ID_OR_PATH"
            )
        model = default.name
        if args.task != "retrieval" and default.benchmark is not None:
            # a bundled text model knows its own words only: check it on its own questions
            own_questions = default.benchmark
    if args.images and (benchmark is not None or own_questions is not None):
        raise InputError(
            "--image is for the check's own instances; "
            + (
                "--benchmark brings its own"
                if benchmark is not None
                else f"{model} is checked on its own questions (a bundled text model)"
            )
            + ": drop --image"
        )
    adapter = load_adapter(
        model,
        adapter=args.adapter,
        dtype=args.dtype,
        device=args.device,
        trust_remote_code=args.trust_remote_code,
        label_set=args.label_set,
        task=args.task,
        **({} if args.chat_template is None else {"chat_template": args.chat_template}),
    )
    if args.benchmark is None and args.task == "retrieval" and adapter.text_only:
        raise InputError(
            f"{model} is a text-only model: it has no retrieval prompt; check it with --task "
            "multiple_choice, pairwise_judge or rerank"
        )
    if args.benchmark is None and own_questions is not None:
        instances = load_benchmark(own_questions(args.n)).instances[:3]
    elif benchmark is not None:
        instances = benchmark.instances[:3]
        if len(instances) < 2:
            raise InputError(f"benchmark {args.benchmark} has fewer than 2 instances to check")
    else:
        instances = check_instances(
            args.n, images=args.images, task=args.task, with_images=not adapter.text_only
        )
    apply_threads()  # --threads (or the default) now that torch is loaded
    report = check_adapter(adapter, instances)
    console = make_console()
    table = listing_table(
        f"posdebias check: {report.model}, adapter {report.adapter!r}",
        ("check", "result", "figure", "likely cause"),
    )
    colours = {PASS: "green", FAIL: "red"}
    for result in report.results:
        # the result is styled (colour in a terminal), never written as markup: a pipe and a
        # terminal both read PASS / FAIL
        status = safe_text(result.status, colours.get(result.status, "yellow"))
        table.add_row(result.name, status, result.figure, result.cause)
    console.print(table)
    failed = report.failures
    if failed:
        names = ", ".join(result.name for result in failed)
        console.print(f"{len(failed)} check(s) failed: {names}", style="red")
        return 1
    console.print(f"all {len(report.results)} checks passed", style="green")
    return 0


def _checked_n(n: int | None, task: str, benchmark: Benchmark | None) -> int:
    """The N checked: ``-N``, else the benchmark's, a judge's 2 or the default; a ``-N`` the
    instances cannot have is refused (it was ignored)."""
    if benchmark is not None and benchmark.instances:
        own, where = benchmark.instances[0].n, "the benchmark's instances have"
    elif task == "pairwise_judge":
        own, where = 2, "a pairwise judge has"
    else:
        return defaults.CANDIDATES if n is None else n
    if n is not None and n != own:
        raise InputError(f"-N {n} cannot be checked: {where} {own} candidates; drop -N")
    return own
