"""``posdebias evaluate``: calibrate, evaluate T orders per instance, print the paper's table."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

from rich.console import Console

import posdebias.defaults as defaults
from posdebias._io import DirectoryLock
from posdebias.cli import make_console
from posdebias.core.instance import TASK_KINDS
from posdebias.errors import InputError
from posdebias.evaluation.config import EvaluateConfig, load_config
from posdebias.evaluation.diagnosis import run_notes
from posdebias.evaluation.job import run_evaluation
from posdebias.evaluation.progress import RunProgress
from posdebias.evaluation.report import write_report
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.table import judge_table, print_results_table


def add_row_arguments(parser: argparse.ArgumentParser) -> None:
    """--calibrators / --decoders: the rows of a results table (evaluate and sweep)."""
    parser.add_argument("--calibrators", help="comma-separated calibrator names")
    parser.add_argument(
        "--decoders",
        help="comma-separated decoder names: generated, instruction, chain_of_thought, "
        "self_consistency, sofa, cloze, cloze_mean (rows that run the model themselves; none "
        "by default)",
    )


def add_ci_argument(parser: argparse.ArgumentParser) -> None:
    """--ci: the printed table also shows the 95% intervals (report.md always does)."""
    parser.add_argument(
        "--ci",
        action="store_true",
        help="print the 95%% bootstrap intervals in the table (report.md always has them)",
    )


def add_model_arguments(parser: argparse.ArgumentParser, *, base_url: bool = True) -> None:
    """--model / --adapter / --chat-template / --threads / --trust-remote-code, shared by every
    command that runs a model; --base-url too where these become adapter options
    (:func:`with_model_options`; ``check`` passes them itself: ``base_url=False``)."""
    parser.add_argument(
        "--model", help="Hugging Face model id, local model folder or GGUF file (a language model)"
    )
    parser.add_argument("--adapter", help="adapter name (see `posdebias plugins`)")
    parser.add_argument(
        "--chat-template",
        dest="chat_template",
        help="chat template for a model without one: a Jinja template, a file holding one, or "
        "'raw' (the prompt's text as it is); adapter option chat_template",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: the bundled model's, else half the CPUs or "
        "OMP_NUM_THREADS; 1 to the CPUs of this machine)",
    )
    parser.add_argument(
        "--trust-remote-code",
        dest="trust_remote_code",
        action="store_true",
        help="allow the model's own Python code from its repository (runs that code)",
    )
    if base_url:
        parser.add_argument(
            "--base-url",
            dest="base_url",
            help="API root of an OpenAI-compatible server (with --adapter openai), e.g. "
            "http://127.0.0.1:8000/v1",
        )


def add_task_argument(parser: argparse.ArgumentParser) -> None:
    """--task: the task a run poses (evaluate, calibrate, sweep)."""
    parser.add_argument(
        "--task",
        choices=TASK_KINDS,
        help="task kind (retrieval, multiple_choice, pairwise_judge, rerank); checked against "
        "the benchmark's manifest; without a benchmark, the task's bundled model and questions",
    )


def add_run_arguments(parser: argparse.ArgumentParser, *, comparisons: bool = True) -> None:
    """The flags of every command that evaluates a config's instances (evaluate and each point
    of a sweep): task, orders, instances, seed, protocol, batching and the statistics (a study
    makes no paired comparisons: ``comparisons=False``). One declaration, so the two commands
    cannot offer different settings."""
    add_task_argument(parser)
    parser.add_argument(
        "--orders",
        type=int,
        help="candidate orders T per instance (5, or every order where fewer exist: a pair's two)",
    )
    parser.add_argument(
        "--order-kind",
        choices=("random", "cyclic"),
        dest="order_kind",
        help="random orders (default), or the first T cyclic rotations (CircularEval)",
    )
    parser.add_argument("--count", type=int, help="number of test instances")
    parser.add_argument(
        "--calibration-count",
        type=int,
        dest="calibration_count",
        help=f"calibration instances M ({defaults.CALIBRATION_COUNT}; "
        f"{defaults.REFERENCE_CALIBRATION_COUNT} under --protocol reference)",
    )
    parser.add_argument("--seed", type=int, help="random seed")
    parser.add_argument(
        "--protocol",
        choices=("default", "reference"),
        help="default, or reference: the authors' evaluation (see the method page)",
    )
    parser.add_argument("--batch-size", type=int, dest="batch_size", help="forward batch size")
    parser.add_argument(
        "--resamples",
        type=int,
        help="bootstrap resamples of the test instances for the 95%% intervals (1000; 100 to "
        "100000)",
    )
    if comparisons:
        parser.add_argument(
            "--baseline",
            help="a row every other row is also compared with, besides vanilla (paired "
            "bootstrap and exact McNemar test)",
        )


#: Flags of `posdebias evaluate` that set no field of the config (the rest are checked against
#: :class:`EvaluateConfig` by the tests, so a flag and its field cannot drift apart).
RUN_FLAGS = frozenset(
    {"command", "debug", "handler", "config", "resume", "ci", "base_url", "trust_remote_code"}
    | {"chat_template", "threads"}
)


def config_flags(args: argparse.Namespace, *, exclude: Collection[str] = ()) -> dict[str, Any]:
    """The flags of a command that set a field of the run's config, by the field's name (the
    config model is their one declaration); ``exclude``: flags of that name meaning something
    else to the command (``--out`` of calibrate is where the states go)."""
    fields = EvaluateConfig.model_fields
    return {k: v for k, v in vars(args).items() if k in fields and k not in exclude}


def print_results(
    results: EvaluationResults, console: Console, *, ci: bool, title: str | None = None
) -> None:
    """A run's table (with its 95% intervals if ``ci``) and notes, as evaluate and report
    print them."""
    print_results_table(
        results.metrics(),
        title=title,
        console=console,
        generated=results.generated_rows(),
        statistics=results.statistics if ci else None,
        order_independent=results.order_independent_rows(),
    )
    for note in run_notes(results):
        console.print(note, markup=False)


def print_fit_warning(label: str, diagnostics: dict[str, Any]) -> None:
    """The warning a calibrator's fit left in its ``diagnostics``, if any, on stderr (evaluate
    and calibrate)."""
    if diagnostics.get("warning"):
        make_console(stderr=True).print(f"warning: {label}: {diagnostics['warning']}")


def with_model_options(config: EvaluateConfig, args: argparse.Namespace) -> EvaluateConfig:
    """``config`` with the model flags that are adapter options (--chat-template,
    --trust-remote-code, --base-url) merged into ``adapter.options``."""
    flags = {
        "chat_template": args.chat_template,
        "trust_remote_code": True if args.trust_remote_code else None,
        "base_url": args.base_url,
    }
    given = {key: value for key, value in flags.items() if value is not None}
    if not given:
        return config
    options = {**config.adapter.options, **given}
    return config.model_copy(
        update={"adapter": config.adapter.model_copy(update={"options": options})}
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        description="Fit calibrators on the symmetrised calibration set and evaluate them over "
        "T candidate orders per test instance. Flags override the config file.",
    )
    parser.add_argument("--config", type=Path, help="YAML, TOML or JSON config file")
    add_model_arguments(parser)
    add_run_arguments(parser)
    parser.add_argument("--benchmark", type=Path, help="benchmark directory (posdebias build)")
    parser.add_argument("--calibration", type=Path, help="saved calibration state file or dir")
    parser.add_argument(
        "--calibration-benchmark",
        type=Path,
        dest="calibration_benchmark",
        help="calibrate on M instances of this benchmark (by --seed); the test is as without it",
    )
    parser.add_argument(
        "--calibration-transfer",
        action="store_true",
        default=None,
        dest="calibration_transfer",
        help="use --calibration states fitted on another model (recorded in results.json)",
    )
    add_row_arguments(parser)
    parser.add_argument(
        "-N",
        dest="n",
        type=int,
        help="candidates per instance (simulated model or bundled benchmark)",
    )
    add_ci_argument(parser)
    parser.add_argument(
        "--gpus-per-process",
        type=int,
        dest="gpus_per_process",
        help="with accelerate launch: GPUs of each process's model replica (data x model "
        "parallel; device_map over its own group)",
    )
    parser.add_argument("--out", type=Path, help="run directory: logs, results.json, figures")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run in --out (same configuration)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:

    config = load_config(args.config, **config_flags(args))
    config = with_model_options(config, args)
    if args.resume and config.out is None:
        raise InputError("--resume needs --out DIR (the run directory to continue)")
    console = make_console()
    try:
        with RunProgress(console) as progress:  # the run says how many (on_start)
            results = run_evaluation(
                config, resume=args.resume, on_record=progress.update, on_start=progress.start
            )
    except KeyboardInterrupt:
        if config.out is not None:
            make_console(stderr=True).print(
                f"interrupted: progress is saved in {config.out}; continue with the same "
                "command plus --resume"
            )
        raise
    if results is None:  # a non-zero rank of a data-parallel run
        return 0
    title = (
        f"{results.adapter.model_id or results.adapter.adapter}: N={results.n}, "
        f"{results.num_instances} instances x {results.orders} orders"
    )
    print_results(results, console, ci=args.ci, title=title)
    if results.judge:
        console.print(judge_table(results.judge))
    for label, result in results.calibrators.items():
        print_fit_warning(label, result.diagnostics)
    if config.out is not None:
        with DirectoryLock(config.out):
            report = write_report(results, config.out)
        console.print(f"results: {config.out / 'results.json'}  report: {report}")
    for message in results.failed.values():  # plugin failures: named, the rest was kept
        print(f"error: {message}", file=sys.stderr)
    return 1 if results.failed else 0
