"""What the command line runs when a config leaves the model open: the bundled organism.

The evaluation layer knows no model by name; the command line hands it this preset.
"""

from __future__ import annotations

from posdebias.evaluation.config import EvaluateConfig
from posdebias.evaluation.preset import Preset, ResolvedConfig, resolve_preset


def default_preset() -> Preset:
    """The organism preset (its model, bundled benchmark, batch size and threads)."""
    from posdebias.organism.preset import ORGANISM_PRESET

    return ORGANISM_PRESET


def resolve(config: EvaluateConfig) -> ResolvedConfig:
    """``config`` with the command line's default preset applied."""
    return resolve_preset(config, default_preset())
