"""The bundled model organism: a tiny real LLaVA whose attention is right and whose answer is not.

It lets ``posdebias evaluate`` run the real pipeline (processor, chat template, LLaVA adapter,
attention probe, calibrators) offline in about a minute. See ``model/README.md`` (the model
card), :mod:`posdebias.organism.train` (how it is made) and docs/organism.md.

``load_adapter("posdebias/organism")`` loads the bundled folder with ``from_pretrained``, the
same path as any hub checkpoint.
"""

from __future__ import annotations

from pathlib import Path

#: The name under which the bundled model loads (like a hub id; never looked up online).
MODEL_NAME = "posdebias/organism"

#: The bundled model folder (package data).
MODEL_DIR = Path(__file__).resolve().parent / "model"

BUNDLED_MODELS: dict[str, Path] = {MODEL_NAME: MODEL_DIR}


def bundled_model_path(name: str) -> Path | None:
    """The folder of a bundled model by name, or None if ``name`` is not bundled."""
    return BUNDLED_MODELS.get(name)
