"""The bundled default benchmark: shapes images the organism was not trained on, built on demand.

``posdebias evaluate`` with no arguments needs real image files. Instead of shipping them, the
benchmark is generated deterministically (fixed seeds, the organism's shape space) with the
same code as ``posdebias build --source shapes`` into a cache folder, once; later runs reuse it.
The seeds differ from the training seed, so the test images are not training images (they share
the caption distribution, as any test set does).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from posdebias._io import cache_root
from posdebias.benchmarks.build import build_benchmark
from posdebias.benchmarks.config import BuildConfig, ShapesSource
from posdebias.benchmarks.files import MANIFEST_FILE, load_benchmark
from posdebias.errors import BenchmarkError, OutputError
from posdebias.organism.build import IMAGE_SIZE, shape_space

#: Instances in the bundled benchmark (calibration is held out of them by seed).
BENCHMARK_COUNT = 500
#: Distinct images in its pool (each anchor is used once, so at least BENCHMARK_COUNT).
POOL_IMAGES = 1000
#: Seeds of the pool images and of the instance draws (the organism trains on seed 0 images).
SHAPES_SEED = 7
BENCHMARK_SEED = 0
#: Bump when anything above or the generator changes, so stale caches are never reused.
VERSION = 1


def bundled_benchmark(n: int = 4, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder of the bundled shapes benchmark with ``n`` images per instance.

    Built on first use (about a second) under ``cache_dir`` (default :func:`cache_root`), then
    reused; a folder that does not load is rebuilt. Returns a folder that
    :func:`posdebias.benchmarks.load_benchmark` reads.
    """

    folder = benchmark_cache(cache_dir) / f"organism-shapes-v{VERSION}"

    def build(out: Path) -> None:
        build_benchmark(
            BuildConfig(
                source=ShapesSource(
                    root=folder / "pool",
                    images=POOL_IMAGES,
                    seed=SHAPES_SEED,
                    image_size=IMAGE_SIZE,
                    space=shape_space(),
                ),
                out=out,
                setting="random",
                n=n,
                count=BENCHMARK_COUNT,
                seed=BENCHMARK_SEED,
            )
        )

    return cached_benchmark(folder / f"random-n{n}", build)


def benchmark_cache(cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where both organisms' benchmarks are cached: ``cache_dir`` (or the cache root)/benchmarks."""
    return (Path(cache_dir) if cache_dir is not None else cache_root()) / "benchmarks"


def cached_benchmark(out: Path, build: Callable[[Path], None]) -> Path:
    """``out`` if it holds a benchmark that loads, else ``build(out)`` first (a damaged or
    moved folder is rebuilt); the cache folder above it is created on the way."""
    if (out / MANIFEST_FILE).is_file():
        try:
            load_benchmark(out)
            return out
        except BenchmarkError:
            pass  # damaged or moved: rebuild below
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"cannot create the benchmark cache {out.parent}: {exc.strerror}; set "
            "POSDEBIAS_CACHE_DIR to a writable folder"
        ) from exc
    build(out)
    return out
