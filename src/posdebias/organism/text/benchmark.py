"""The text organism's bundled benchmark: questions it was not trained on, built on demand.

``posdebias evaluate --task multiple_choice`` with no model needs a benchmark folder. Instead of
shipping one, its questions are drawn from fixed seeds (:func:`draw_questions`, seeds other than
the training's) into a questions file in the ``mcq`` layout, and the benchmark is built from it
by the same code as ``posdebias build --source mcq``, into a cache folder, once; later runs
reuse it. The test questions share the training questions' distribution (categories and words),
as any test set does.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from posdebias._rundir import CacheFolder
from posdebias.benchmarks.tasks import build_task_benchmark
from posdebias.organism.benchmark import benchmark_cache, cached_benchmark
from posdebias.organism.text.world import draw_questions

#: Questions in the bundled benchmark (calibration is held out of them by seed).
BENCHMARK_COUNT = 500
#: Seed of the question draws (the training draws from the training seed, 0 by default).
BENCHMARK_SEED = 20260
#: The question files the benchmarks are built from, one per N.
_QUESTIONS = re.compile(r"questions-n\d+\.jsonl\Z")
#: Bump when anything above or the world changes, so stale caches are never reused.
VERSION = 1


def bundled_text_benchmark(n: int = 4, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder of the bundled text multiple-choice benchmark with ``n`` options a question.

    Built on first use (a fraction of a second) under ``cache_dir`` (default
    :func:`cache_root`), then reused; a folder that does not load is rebuilt. Returns a folder
    that :func:`posdebias.benchmarks.files.load_benchmark` reads.
    """
    folder = benchmark_cache(cache_dir) / f"text-organism-v{VERSION}"

    def build(out: Path) -> None:
        questions = draw_questions(np.random.default_rng([BENCHMARK_SEED, n]), BENCHMARK_COUNT, n)
        lines = (
            json.dumps(q.record(f"text-{n}-{k}"), sort_keys=True) for k, q in enumerate(questions)
        )
        source = CacheFolder(
            folder / "questions",
            own=_QUESTIONS,
            kind="posdebias cache of the bundled questions",
            flag="cache folder (POSDEBIAS_CACHE_DIR)",
        )
        data = source.store(
            f"questions-n{n}.jsonl", "".join(line + "\n" for line in lines).encode()
        )
        build_task_benchmark("multiple_choice", "mcq", data, out, n=n)

    return cached_benchmark(folder / f"n{n}", build)
