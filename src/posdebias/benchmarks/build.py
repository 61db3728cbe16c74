"""Building a benchmark: source pool -> anchors -> distractors -> ``benchmark.jsonl`` + manifest.

The order of random draws is fixed and documented, so a seed means the same benchmark on every
machine: one ``numpy.random.default_rng(seed)`` draws the ``count`` anchors (without
replacement) from the pool; then, per anchor in order, the caption index, the random distractors
(random setting only) and the candidate order that places the anchor among its distractors.

The pool is the first ``pool_size`` images of the source in its deterministic order (not a
seeded sample), so builds with another seed, N or count reuse the cached CLIP embeddings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

import posdebias.defaults as defaults
from posdebias._inputs import check_whole_number
from posdebias._io import StagedFolder
from posdebias._version import __version__
from posdebias.benchmarks.clip import (
    DEFAULT_CLIP_MODEL,
    DEFAULT_CLIP_PRETRAINED,
    RANDOM_WEIGHTS_WARNING,
    EmbeddingCache,
    default_cache_dir,
    image_cache_items,
    load_clip,
)
from posdebias.benchmarks.config import (
    DEFAULT_COUNT,
    SETTINGS,
    AdversarialOptions,
    BuildConfig,
    ShapesSource,
)
from posdebias.benchmarks.files import (
    MAX_N,
    MIN_N,
    AnnotationFile,
    BenchmarkManifest,
    ClipInfo,
    FilterInfo,
    InstanceRecord,
    Setting,
    SourceInfo,
    sha256_file,
    write_benchmark,
)
from posdebias.benchmarks.selection import (
    HardNegatives,
    category_keep_mask,
    max_caption_similarity,
    random_distractors,
    select_hard_negatives,
)
from posdebias.benchmarks.shapes import (
    ShapeSpace,
    existing_dataset_info,
    stage_shapes_dataset,
)
from posdebias.benchmarks.sources import SOURCE_KINDS, PoolImage, SourcePool, read_source
from posdebias.errors import BenchmarkError

__all__ = ["DEFAULT_COUNT", "SETTINGS", "BuildConfig", "BuildReport", "build_benchmark"]
_DIGITS = 6  # similarities are rounded so the file does not carry float noise


@dataclass
class BuildReport:
    """What a build did: where it wrote, how long each step took, what the cache did (a
    task build from a source file has no steps timed and no cache)."""

    out_dir: Path
    manifest: BenchmarkManifest
    seconds: dict[str, float] = field(default_factory=dict)
    cache_hits: list[str] = field(default_factory=list)
    cache_misses: list[str] = field(default_factory=list)
    shapes_reused: bool | None = None
    warnings: list[str] = field(default_factory=list)


class _Steps:
    """Rich progress bars when a console is given; silent otherwise (library use, tests): a
    disabled progress displays nothing. Shown while ``progress`` is entered."""

    def __init__(self, console: Console | None) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=False,
            disable=console is None,
        )

    @contextmanager
    def task(self, description: str, total: int) -> Iterator[Any]:
        task_id = self.progress.add_task(description, total=total)
        yield lambda advance: self.progress.advance(task_id, advance)
        self.progress.update(task_id, completed=total)


def _check_options(config: BuildConfig) -> None:
    """Every option checked before anything is read or written (a config changed after it was
    validated too)."""
    spec, setting, n, pool_size = config.source, config.setting, config.n, config.pool_size
    clip = config.adversarial or AdversarialOptions()
    if spec.kind not in SOURCE_KINDS:
        raise BenchmarkError(f"unknown source {spec.kind!r}; choose one of {list(SOURCE_KINDS)}")
    if setting not in SETTINGS:
        raise BenchmarkError(f"unknown setting {setting!r}; choose one of {list(SETTINGS)}")
    if not MIN_N <= n <= MAX_N:
        raise BenchmarkError(f"-N {n} is out of range; N must be {MIN_N}..{MAX_N}")
    check_whole_number("--count", config.count, 1, defaults.MAX_INSTANCES, error=BenchmarkError)
    if pool_size is not None and pool_size < n:
        raise BenchmarkError(f"--pool-size {pool_size} is smaller than N={n}")
    if not -1.0 < clip.caption_threshold <= 1.0:
        raise BenchmarkError(f"caption threshold {clip.caption_threshold} must be in (-1, 1]")
    for flag, value, low, high in (
        ("--seed", config.seed, 0, defaults.MAX_SEED),
        ("--shapes-seed", spec.seed if isinstance(spec, ShapesSource) else 0, 0, defaults.MAX_SEED),
        ("--batch-size", clip.batch_size, 1, defaults.MAX_BATCH_SIZE),
    ):
        check_whole_number(flag, value, low, high, error=BenchmarkError)


def build_benchmark(config: BuildConfig, *, console: Console | None = None) -> BuildReport:
    """Build a benchmark folder (``benchmark.jsonl`` + ``manifest.json``) at ``config.out``.

    Everything is validated and computed before anything is written, and the two files appear
    together or not at all, so a failed build leaves no output. A shapes source is first
    generated into its root. See the CLI (``posdebias build --help``) and docs/benchmarks.md.
    """
    spec, n, count, pool_size = config.source, config.n, config.count, config.pool_size
    _check_options(config)
    shapes_images = 0
    if isinstance(spec, ShapesSource):
        shapes_images = spec.images or pool_size or max(2 * count, n)
    if shapes_images > defaults.MAX_SHAPES_IMAGES:
        raise BenchmarkError(
            f"this shapes build would generate {shapes_images:,} images (--pool-size, or 2 x "
            f"--count), over the limit of {defaults.MAX_SHAPES_IMAGES:,}: lower --count, or "
            "give --shapes-images"
        )
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    shapes_info = shapes_reused = None
    staged = None
    if isinstance(spec, ShapesSource):
        # written beside the shared root and swapped in only once the build succeeds: a build
        # that fails (CLIP refused, a full disk) leaves the root other benchmarks use as it was
        staged = stage_shapes_dataset(
            spec.root,
            shapes_images,
            seed=spec.seed,
            space=spec.space or ShapeSpace(),
            image_size=spec.image_size,
        )
        shapes_info = existing_dataset_info(staged.folder)
        shapes_reused = not staged.staged
        seconds["generate shapes"] = time.perf_counter() - started
    try:
        report = _build(config, staged, shapes_info, shapes_reused, seconds, started, console)
    except BaseException:
        if staged is not None:
            staged.rollback()
        raise
    finally:
        if staged is not None:
            staged.discard()
    return report


def _build(
    config: BuildConfig,
    staged: StagedFolder | None,
    shapes_info: dict[str, Any] | None,
    shapes_reused: bool | None,
    seconds: dict[str, float],
    started: float,
    console: Console | None,
) -> BuildReport:
    spec = config.source
    source, root, out = spec.kind, spec.root, config.out
    setting, n, count, seed = config.setting, config.n, config.count, config.seed
    pool_size = config.pool_size
    clip = config.adversarial or AdversarialOptions()
    caption_threshold = clip.caption_threshold
    warnings_out: list[str] = []
    mark = time.perf_counter()
    source_pool = read_source(
        source,
        staged.folder if staged is not None else root,
        spec.captions_file(),
        spec.instances_file(),
        skip_missing=spec.skip_missing_images,
    )
    read_root, final_root = source_pool.root, source_pool.root
    if staged is not None and staged.staged:  # read from the staging folder; they live at root
        final_root = Path(root).resolve()

    def final(path: Path) -> Path:
        return final_root / path.relative_to(read_root) if path.is_relative_to(read_root) else path

    pool = _take_pool(source_pool, pool_size, n, count)
    seconds["read source"] = time.perf_counter() - mark

    index = clip_info = filters = cache = None
    steps = _Steps(console)
    with steps.progress:
        if setting == "adversarial":
            model_name = clip.clip_model or DEFAULT_CLIP_MODEL
            weights = clip.clip_pretrained or DEFAULT_CLIP_PRETRAINED
            mark = time.perf_counter()
            encoder = load_clip(model_name, weights, device=clip.device, batch_size=clip.batch_size)
            seconds["load CLIP"] = time.perf_counter() - mark
            if encoder.identity.get("random_weights"):
                warnings_out.append(RANDOM_WEIGHTS_WARNING)
            clip_info = ClipInfo(
                model=model_name,
                pretrained=weights,
                identity=encoder.identity,
                random_weights=bool(encoder.identity.get("random_weights")),
            )
            cache = EmbeddingCache(
                (clip.cache_dir or default_cache_dir()) if clip.use_cache else None
            )
            mark = time.perf_counter()
            index = _HardNegativeIndex.encode(
                source_pool.root,
                pool,
                encoder,
                cache,
                steps,
                caption_threshold=caption_threshold,
                drop_supersets=clip.drop_category_supersets,
                use_categories=source_pool.has_categories,
            )
            seconds["embeddings"] = time.perf_counter() - mark
            filters = _filter_info(source, index, caption_threshold)
            if filters.category_filter_skipped:
                warnings_out.append(f"category filter skipped: {filters.category_skip_reason}")

        mark = time.perf_counter()
        records, survivors = _select(pool, setting, n, count, seed, index, steps)
        seconds["select distractors"] = time.perf_counter() - mark

    counts: dict[str, int | float] = {"instances": count, "pool": len(pool)}
    if survivors:
        counts["min_candidates_after_filters"] = int(min(survivors))
        counts["mean_candidates_after_filters"] = round(float(np.mean(survivors)), 2)
    manifest = BenchmarkManifest(
        package_version=__version__,
        root=str(final_root),
        source=SourceInfo(
            kind=source,
            annotation_files=[
                AnnotationFile(path=str(final(path)), sha256=sha256_file(path))
                for path in source_pool.annotation_files
            ],
            images_in_source=len(source_pool.images) + len(source_pool.skipped_missing),
            skipped_missing_images=len(source_pool.skipped_missing),
            pool_size=len(pool),
            has_categories=source_pool.has_categories,
            shapes=_shapes_summary(shapes_info),
        ),
        setting=setting,
        n=n,
        count=count,
        seed=seed,
        clip=clip_info,
        filters=filters,
        counts=counts,
    )
    mark = time.perf_counter()
    if staged is not None:
        staged.commit(keep_old=True)  # undone by the caller if the benchmark cannot be written
    manifest = write_benchmark(out, records, manifest)
    seconds["write"] = time.perf_counter() - mark
    seconds["total"] = time.perf_counter() - started
    return BuildReport(
        out_dir=Path(out),
        manifest=manifest,
        seconds=seconds,
        cache_hits=list(cache.hits) if cache else [],
        cache_misses=list(cache.misses) if cache else [],
        shapes_reused=shapes_reused,
        warnings=warnings_out,
    )


def _take_pool(
    source_pool: SourcePool, pool_size: int | None, n: int, count: int
) -> tuple[PoolImage, ...]:
    """The first ``pool_size`` images of the source, checked against N and the count."""
    pool = source_pool.images
    if pool_size is not None:
        if pool_size > len(pool):
            raise BenchmarkError(
                f"--pool-size {pool_size} is larger than the {len(pool)} usable images of the "
                "source; lower it or omit it to use them all"
            )
        pool = pool[:pool_size]
    if len(pool) < n:
        raise BenchmarkError(f"the pool has {len(pool)} images, fewer than N={n}")
    if count > len(pool):
        raise BenchmarkError(
            f"--count {count} is larger than the pool of {len(pool)} images (each image is the "
            "anchor of at most one instance); lower --count or use a larger pool"
        )
    return pool


@dataclass
class _HardNegativeIndex:
    """A pool's CLIP embeddings and categories: what the adversarial setting selects from."""

    pool: tuple[PoolImage, ...]
    image_embeddings: np.ndarray  # [P, D]
    caption_embeddings: np.ndarray  # [C, D], the captions of pool image p at offsets[p]:[p+1]
    caption_offsets: np.ndarray  # [P + 1]
    category_sets: list[frozenset[str]] | None
    caption_threshold: float
    drop_supersets: bool

    @classmethod
    def encode(
        cls,
        root: Path,
        pool: tuple[PoolImage, ...],
        encoder: Any,
        cache: Any,
        steps: _Steps,
        *,
        caption_threshold: float,
        drop_supersets: bool,
        use_categories: bool,
    ) -> _HardNegativeIndex:

        paths = [image.path for image in pool]
        texts = [caption for image in pool for caption in image.captions]

        def encode_images() -> np.ndarray:
            with steps.task("encoding images (CLIP)", len(paths)) as advance:
                return encoder.encode_images([root / path for path in paths], advance)

        def encode_texts() -> np.ndarray:
            with steps.task("encoding captions (CLIP)", len(texts)) as advance:
                return encoder.encode_texts(texts, advance)

        identity = encoder.identity
        items = image_cache_items(root, paths)
        return cls(
            pool=pool,
            image_embeddings=cache.get_or_compute("images", identity, items, encode_images),
            caption_embeddings=cache.get_or_compute("texts", identity, texts, encode_texts),
            caption_offsets=np.cumsum([0] + [len(image.captions) for image in pool]),
            category_sets=(
                [frozenset(image.categories or ()) for image in pool] if use_categories else None
            ),
            caption_threshold=caption_threshold,
            drop_supersets=drop_supersets,
        )

    def choose(self, anchor: int, caption_index: int, k: int) -> tuple[HardNegatives, np.ndarray]:
        """The hard negatives of ``anchor`` and the caption similarity of every pool image."""
        keep = None
        if self.category_sets is not None:
            keep = category_keep_mask(
                self.category_sets, anchor, drop_supersets=self.drop_supersets
            )
        query = self.caption_embeddings[self.caption_offsets[anchor] + caption_index]
        caption_similarity = max_caption_similarity(
            query, self.caption_embeddings, self.caption_offsets
        )
        image = self.pool[anchor]
        chosen = select_hard_negatives(
            self.image_embeddings,
            anchor,
            caption_similarity,
            k,
            category_keep=keep,
            caption_threshold=self.caption_threshold,
            anchor_name=f"{image.image_id} ({image.path})",
        )
        return chosen, caption_similarity


def _filter_info(source: str, index: _HardNegativeIndex, threshold: float) -> FilterInfo:
    if index.category_sets is not None:
        mode: Literal["equal", "equal_or_superset"] = (
            "equal_or_superset" if index.drop_supersets else "equal"
        )
        return FilterInfo(category=mode, category_filter_skipped=False, caption_threshold=threshold)
    reason = (
        "Flickr8k has no object categories"
        if source == "flickr8k"
        else f"the {source} source has no categories for every image (no instances file?)"
    )
    return FilterInfo(
        category="skipped",
        category_filter_skipped=True,
        category_skip_reason=reason,
        caption_threshold=threshold,
    )


def _select(
    pool: tuple[PoolImage, ...],
    setting: Setting,
    n: int,
    count: int,
    seed: int,
    index: _HardNegativeIndex | None,
    steps: _Steps,
) -> tuple[list[InstanceRecord], list[int]]:
    """The instance records, in the documented draw order (see the module docstring)."""
    rng = np.random.default_rng(seed)
    anchors = [int(a) for a in rng.choice(len(pool), size=count, replace=False)]
    records: list[InstanceRecord] = []
    survivors: list[int] = []
    with steps.task("selecting distractors", count) as advance:
        for number, anchor in enumerate(anchors):
            image = pool[anchor]
            caption_index = int(rng.integers(len(image.captions)))
            if index is None:
                distractors = random_distractors(rng, len(pool), anchor, n - 1)
            else:
                chosen, caption_similarity = index.choose(anchor, caption_index, n - 1)
                distractors = chosen.indices
                survivors.append(chosen.counts["after_caption_filter"])
            order = rng.permutation(n)
            shown = np.concatenate([[anchor], distractors])[order]
            similarities = caption_similarities = None
            if index is not None:
                similarities = _rounded(
                    index.image_embeddings[shown] @ index.image_embeddings[anchor]
                )
                caption_similarities = _rounded(caption_similarity[shown])
            records.append(
                InstanceRecord(
                    id=f"{setting}-{number:05d}",
                    query=image.captions[caption_index],
                    images=[pool[i].path for i in shown],
                    target=int(np.flatnonzero(order == 0)[0]),
                    anchor_image_id=image.image_id,
                    setting=setting,
                    caption_index=caption_index,
                    similarities=similarities,
                    caption_similarities=caption_similarities,
                )
            )
            advance(1)
    return records, survivors


def _rounded(values: np.ndarray) -> list[float]:
    return [round(float(value), _DIGITS) for value in values]


def _shapes_summary(info: dict[str, Any] | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {key: info[key] for key in ("count", "seed", "image_size", "space")}
