"""The bundled model organism: a tiny real LLaVA with a biased answer and confounded attention.

It lets ``posdebias evaluate`` run the real pipeline (processor, chat template, LLaVA adapter,
attention probe, calibrators) offline in about a minute. See ``model/README.md`` (the model card),
:mod:`posdebias.organism.train` (how it is made) and the organism page of the docs.

The organism is a built-in plugin: it registers its model folder (and the benchmark it runs on by
default) through the ``posdebias_register_models`` hook, so ``load_adapter("posdebias/organism")``
loads the folder with ``from_pretrained``, the same path as any hub checkpoint, and nothing below
the command line knows the organism exists.
"""

from __future__ import annotations

from pathlib import Path

from posdebias._markers import register_hook
from posdebias.organism.benchmark import BENCHMARK_COUNT, bundled_benchmark
from posdebias.registry.bundled import BundledModel

__all__ = ["BATCH_SIZE", "MODEL_DIR", "MODEL_NAME", "bundled_benchmark"]

#: The name under which the bundled model loads (like a hub id; never looked up online).
MODEL_NAME = "posdebias/organism"

#: The bundled model folder (package data).
MODEL_DIR = Path(__file__).resolve().parent / "model"

#: Forward batch of the default run: one test instance's T x N views (5 orders x 4 rotations)
#: in one pass, so the default run takes seconds, not minutes.
BATCH_SIZE = 20

#: It is so small that a second torch thread gains nothing, while on a busy 2-core machine two
#: threads made the default run 17 times slower (4 min instead of 15 s).
THREADS = 1

ORGANISM = BundledModel(
    name=MODEL_NAME,
    path=MODEL_DIR,
    summary="tiny LLaVA whose answer is position-biased and whose attention has a positional sink",
    default=True,
    benchmark=bundled_benchmark,
    benchmark_size=BENCHMARK_COUNT,
    batch_size=BATCH_SIZE,
    threads=THREADS,
)


posdebias_register_models = register_hook(ORGANISM)
