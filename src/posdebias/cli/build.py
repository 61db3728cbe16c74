"""``posdebias build``: make a random or CLIP hard-negative benchmark from a dataset on disk."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import posdebias.defaults as defaults
from posdebias._inputs import check_whole_number
from posdebias.benchmarks.build import BuildReport, build_benchmark
from posdebias.benchmarks.config import DEFAULT_COUNT, SETTINGS, BuildConfig, build_config_from
from posdebias.benchmarks.files import BENCHMARK_FILE, MANIFEST_FILE
from posdebias.benchmarks.selection import DEFAULT_CAPTION_THRESHOLD
from posdebias.benchmarks.sources import SOURCE_KINDS
from posdebias.benchmarks.tasks import ALL_TASK_SOURCES, TASK_SOURCES, build_task_benchmark
from posdebias.cli import make_console
from posdebias.errors import BenchmarkError
from posdebias.evaluation.config import read_config_file

if TYPE_CHECKING:
    from rich.console import Console


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build",
        description="Build a multi-image retrieval benchmark: COUNT instances, each a caption "
        "and N images (its own and N-1 distractors). Writes OUT/benchmark.jsonl and "
        "OUT/manifest.json. Flags override the config file. See the Benchmarks page of the "
        "posdebias documentation.",
    )
    parser.add_argument("--config", type=Path, help="YAML, TOML or JSON build config file")
    parser.add_argument(
        "--source",
        choices=(*SOURCE_KINDS, *ALL_TASK_SOURCES),
        help="required unless in --config; mcq, mmlu, muirbench, blink, pairwise, mtbench and "
        "beir build the candidate tasks (see the Tasks page)",
    )
    parser.add_argument(
        "--task",
        choices=("retrieval", *TASK_SOURCES),
        help="task kind of the benchmark (default: the source's)",
    )
    parser.add_argument(
        "--data", type=Path, help="candidate tasks: the source file (or BEIR / MMLU folder)"
    )
    parser.add_argument("--split", help="beir: the qrels split (test)")
    parser.add_argument(
        "--root",
        type=Path,
        help="folder the image file names are relative to (shapes: generated into it)",
    )
    parser.add_argument(
        "--captions",
        type=Path,
        help="captions file: COCO captions_*.json, Flickr8k.token.txt / captions.txt, or the "
        "JSONL (default: looked for next to --root)",
    )
    parser.add_argument("--instances", type=Path, help="COCO instances_*.json (categories)")
    parser.add_argument("--setting", choices=SETTINGS, help="random or adversarial")
    parser.add_argument(
        "-N",
        dest="n",
        type=int,
        help=f"images per instance ({defaults.MIN_CANDIDATES}..{defaults.MAX_CANDIDATES}; "
        f"{defaults.CANDIDATES})",
    )
    parser.add_argument("--count", type=int, help=f"number of instances ({DEFAULT_COUNT})")
    parser.add_argument("--seed", type=int, help="seed of the draws (0)")
    parser.add_argument(
        "--clip-model",
        help="open_clip model name or path to an open_clip model-config JSON (default ViT-L-14)",
    )
    parser.add_argument(
        "--clip-pretrained",
        help="pretrained tag, local checkpoint file, or 'none' (random weights, tests only; "
        "default openai)",
    )
    parser.add_argument(
        "--pool-size", type=int, help="use the first K images of the source (default: all)"
    )
    parser.add_argument(
        "--caption-threshold",
        type=float,
        help="adversarial: drop images whose caption cosine with the query is >= this "
        f"({DEFAULT_CAPTION_THRESHOLD})",
    )
    parser.add_argument(
        "--drop-category-supersets",
        action="store_true",
        default=None,
        help="adversarial: also drop images containing all of the anchor's categories",
    )
    parser.add_argument("--cache-dir", type=Path, help="CLIP embedding cache folder")
    parser.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    parser.add_argument("--device", help="torch device for CLIP (default: cuda if available)")
    parser.add_argument("--batch-size", type=int, help="CLIP encoding batch size (64)")
    parser.add_argument(
        "--skip-missing-images",
        action="store_true",
        default=None,
        help="drop listed images that are not on disk instead of stopping",
    )
    parser.add_argument(
        "--shapes-images",
        type=int,
        help="shapes: images to generate (default pool size or 2xcount)",
    )
    parser.add_argument("--shapes-seed", type=int, help="shapes: generator seed (0)")
    parser.add_argument("--shapes-image-size", type=int, help="shapes: pixels (64)")
    parser.add_argument(
        "--shapes-space", type=Path, help="shapes: JSON file of a ShapeSpace (attribute space)"
    )
    parser.add_argument("--out", type=Path, help="output folder (required unless in --config)")
    parser.set_defaults(handler=run)


#: Flags of `posdebias build` that set nothing of a retrieval build's config (the command's
#: own, a candidate task's, and --no-cache, read as ``use_cache``); every other one does.
_NOT_SETTINGS = frozenset(
    {"command", "debug", "handler", "config", "task", "data", "split", "no_cache"}
)


def load_build_config(args: argparse.Namespace) -> BuildConfig:
    """The build config of a command line: the --config file, overridden by flags."""
    data = read_config_file(args.config) if args.config is not None else {}
    flags = {name: value for name, value in vars(args).items() if name not in _NOT_SETTINGS}
    flags["use_cache"] = False if args.no_cache else None
    return build_config_from(data, flags, str(args.config) if args.config else "build options")


def check_whole_numbers(*checks: tuple[str, int | None, int, int]) -> None:
    """Refuse a whole-number flag outside its range before anything is read or written."""
    for flag, value, low, high in checks:
        if value is not None:
            check_whole_number(flag, value, low, high, error=BenchmarkError)


def task_of(source: str | None) -> str | None:
    """The candidate task a source builds (None: a retrieval source)."""
    return next((task for task, sources in TASK_SOURCES.items() if source in sources), None)


def run_task(args: argparse.Namespace, task: str) -> int:
    """A candidate-task build: flags only (no --config), the source's own options."""
    if args.config is not None:
        raise BenchmarkError("--config builds retrieval benchmarks; give a task build as flags")
    if args.source is None or args.data is None or args.out is None:
        raise BenchmarkError(f"a {task} build needs --source, --data FILE and --out DIR")
    retrieval_only = [
        flag
        for flag, value in (
            ("--captions", args.captions),
            ("--instances", args.instances),
            ("--clip-model", args.clip_model),
            ("--pool-size", args.pool_size),
            ("--shapes-images", args.shapes_images),
        )
        if value is not None
    ]
    if retrieval_only:
        raise BenchmarkError(f"{', '.join(retrieval_only)} are for retrieval builds, not {task}")
    report = build_task_benchmark(
        task,
        args.source,
        args.data,
        args.out,
        root=args.root,
        n=args.n,
        count=args.count,
        seed=0 if args.seed is None else args.seed,
        setting=args.setting,
        split=args.split or "test",
    )
    console = make_console()
    m = report.manifest
    console.print(
        f"built {m.count} {task} instances, N={m.n}, from {m.source.kind} "
        f"({m.source.pool_size} read)"
    )
    for warning in report.warnings:
        console.print(f"warning: {warning}", style="yellow")
    console.print(f"wrote {report.out_dir / BENCHMARK_FILE} and {report.out_dir / MANIFEST_FILE}")
    return 0


def run(args: argparse.Namespace) -> int:
    source_task = task_of(args.source)
    task = args.task or source_task or "retrieval"
    if source_task not in (None, task):
        raise BenchmarkError(f"--source {args.source} builds {source_task}, not {task}")
    if task != "retrieval":
        return run_task(args, task)
    if args.data is not None:
        raise BenchmarkError("--data is for candidate-task sources; retrieval reads --captions")
    check_whole_numbers(
        ("--seed", args.seed, 0, defaults.MAX_SEED),
        ("--shapes-seed", args.shapes_seed, 0, defaults.MAX_SEED),
        ("--batch-size", args.batch_size, 1, defaults.MAX_BATCH_SIZE),
        ("--count", args.count, 1, defaults.MAX_INSTANCES),
        ("--pool-size", args.pool_size, 1, defaults.MAX_INSTANCES),
        ("--shapes-images", args.shapes_images, 1, defaults.MAX_SHAPES_IMAGES),
        ("--shapes-image-size", args.shapes_image_size, 8, defaults.MAX_IMAGE_SIZE),
    )
    config = load_build_config(args)
    console = make_console(stderr=True)
    clip = config.adversarial
    if clip is not None and (clip.clip_pretrained or "").lower() == "none":
        console.print(
            "WARNING: --clip-pretrained none gives a CLIP model with RANDOM weights; "
            "the hard negatives are arbitrary. Only for tests.",
            style="bold red",
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # shown above, in red
        report = build_benchmark(config, console=console)
    print_summary(report, make_console())
    return 0


def print_summary(report: BuildReport, console: Console) -> None:  # markup off: user paths
    """What was built, from what, how long it took and what the cache did."""
    m = report.manifest
    console.print(
        f"built {m.count} {m.setting} instances, N={m.n}, seed={m.seed}, "
        f"from {m.source.kind} ({m.source.pool_size} pool images of "
        f"{m.source.images_in_source} in the source)"
    )
    if report.shapes_reused is not None:
        state = "reused" if report.shapes_reused else "generated"
        console.print(f"shapes dataset {state} in {m.root}")
    if m.source.skipped_missing_images:
        console.print(f"{m.source.skipped_missing_images} missing images skipped", style="yellow")
    if m.clip is not None and m.filters is not None:
        console.print(f"CLIP {m.clip.model} / {m.clip.pretrained}")
        category = (
            f"skipped ({m.filters.category_skip_reason})"
            if m.filters.category_filter_skipped
            else m.filters.category
        )
        console.print(
            f"filters: category {category}; caption similarity < {m.filters.caption_threshold}; "
            f"candidates left per anchor: min {m.counts.get('min_candidates_after_filters')}, "
            f"mean {m.counts.get('mean_candidates_after_filters')}"
        )
        if report.cache_hits or report.cache_misses:
            console.print(
                f"embedding cache: hits {report.cache_hits or '-'}, "
                f"computed {report.cache_misses or '-'}"
            )
    for warning in report.warnings:
        console.print(f"warning: {warning}", style="yellow")
    timing = ", ".join(f"{step} {seconds:.1f}s" for step, seconds in report.seconds.items())
    console.print(f"time: {timing}")
    console.print(f"wrote {report.out_dir / BENCHMARK_FILE} and {report.out_dir / MANIFEST_FILE}")
