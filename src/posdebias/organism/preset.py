"""The bundled default run as a preset: the organism, its shapes benchmark, batch, threads.

Registered by the command line (``posdebias evaluate`` with no arguments); the evaluation layer
only sees a :class:`~posdebias.evaluation.preset.Preset`.
"""

from __future__ import annotations

from pathlib import Path

from posdebias.errors import InputError
from posdebias.evaluation.preset import Preset
from posdebias.organism import MODEL_NAME


def organism_benchmark(n: int, needed: int) -> Path:
    """The bundled shapes benchmark for N images, if it holds ``needed`` instances."""
    from posdebias.organism.benchmark import BENCHMARK_COUNT, bundled_benchmark

    if needed > BENCHMARK_COUNT:
        raise InputError(
            f"the bundled benchmark has {BENCHMARK_COUNT} instances, fewer than the {needed} "
            "asked for (--count plus --calibration-count); lower --count or build a larger one "
            "with `posdebias build --source shapes`"
        )
    return bundled_benchmark(n)


#: The organism on its bundled benchmark; one test instance's orders x N views per forward
#: batch (seconds, not minutes), and one CPU thread: the model is so small that a second thread
#: gains nothing, while on a busy 2-core machine two torch threads made the default run 17
#: times slower.
ORGANISM_PRESET = Preset(
    model=MODEL_NAME,
    benchmark=organism_benchmark,
    batch_size_per_view=True,
    threads=1,
)
