"""A model folder shipped inside a package, registered by name through a plugin hook."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BundledModel:
    """A Hugging Face model folder that ships with a package and loads offline by ``name``.

    Attributes:
        name: the name it loads under (``load_adapter(name)``), like a hub id.
        path: the folder (``config.json``, weights, processor files).
        summary: one line for ``posdebias plugins``.
        default: run it when neither a model nor an adapter is named (one model at most per
            task).
        task: the task kind its benchmark poses (``posdebias evaluate --task KIND`` with no
            model runs the default bundled model of that task).
        benchmark: ``benchmark(n) -> folder`` of the benchmark it runs on when none is given.
        benchmark_size: instances in that benchmark (calibration and test together).
        batch_size: forward batch used when none is given.
        threads: torch CPU threads to run it with (None: the default for a shared machine).
    """

    name: str
    path: Path
    summary: str = ""
    default: bool = False
    benchmark: Callable[[int], Path] | None = None
    benchmark_size: int | None = None
    batch_size: int | None = None
    threads: int | None = None
    task: str = "retrieval"
