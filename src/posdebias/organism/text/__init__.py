"""The bundled text organism: a tiny real Llama whose attention finds the right option and whose
answer is position-biased, on text multiple-choice questions.

It is the default model of ``posdebias evaluate --task multiple_choice`` (no other arguments):
the real pipeline for text candidates (the default multiple-choice template, the chat template,
the ``llama`` adapter, text spans from the tokenizer's offsets, the attention probe, every
calibrator) offline in well under a minute. See ``model/README.md`` (the model card) and
:mod:`posdebias.organism.text.train` (how it is made).

Like the image organism it is a built-in plugin: it registers its model folder and its
benchmark through the ``posdebias_register_models`` hook, with ``task="multiple_choice"``.
"""

from __future__ import annotations

from pathlib import Path

from posdebias._markers import register_hook
from posdebias.organism.text.benchmark import BENCHMARK_COUNT, bundled_text_benchmark
from posdebias.registry.bundled import BundledModel

__all__ = ["MODEL_DIR", "MODEL_NAME", "bundled_text_benchmark"]

#: The name under which the text organism loads (like a hub id; never looked up online).
MODEL_NAME = "posdebias/text-organism"

#: The bundled model folder (package data).
MODEL_DIR = Path(__file__).resolve().parent / "model"

TEXT_ORGANISM = BundledModel(
    name=MODEL_NAME,
    path=MODEL_DIR,
    summary="tiny Llama whose attention finds the right option while its answer is biased",
    default=True,
    task="multiple_choice",
    benchmark=bundled_text_benchmark,
    benchmark_size=BENCHMARK_COUNT,
    batch_size=20,  # one test instance's views (5 orders x 4 rotations) in one forward
    threads=1,  # tiny: a second thread gains nothing and slows a busy machine down
)


posdebias_register_models = register_hook(TEXT_ORGANISM)
