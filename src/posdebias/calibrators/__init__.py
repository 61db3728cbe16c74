"""Built-in calibrators (METHOD.md, "Calibrators"); each is registered through the plugin hook."""

from posdebias.calibrators.attention_guided import AttentionGuided
from posdebias.calibrators.attention_readout import AttentionReadout
from posdebias.calibrators.base import Calibrator, CalibratorOptions
from posdebias.calibrators.label_free import LabelFree
from posdebias.calibrators.permutation_average import PermutationAverage
from posdebias.calibrators.pride import PriDe
from posdebias.calibrators.purified_attention import PurifiedAttention
from posdebias.calibrators.vanilla import Vanilla

BUILTIN_CALIBRATORS: tuple[type[Calibrator], ...] = (
    Vanilla,
    PriDe,
    AttentionReadout,
    PurifiedAttention,
    AttentionGuided,
    PermutationAverage,
    LabelFree,
)

__all__ = [
    "BUILTIN_CALIBRATORS",
    "AttentionGuided",
    "AttentionReadout",
    "Calibrator",
    "CalibratorOptions",
    "LabelFree",
    "PermutationAverage",
    "PriDe",
    "PurifiedAttention",
    "Vanilla",
]
