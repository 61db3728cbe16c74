"""Built-in calibrators, one module each; every module registers its class through the plugin hook
(see :data:`posdebias.registry.BUILTIN_PLUGINS`)."""

from posdebias.calibrators.attention_guided import AttentionGuided
from posdebias.calibrators.attention_readout import AttentionReadout
from posdebias.calibrators.base import Calibrator, CalibratorOptions
from posdebias.calibrators.batch import Batch
from posdebias.calibrators.contextual import Contextual
from posdebias.calibrators.label_free import LabelFree
from posdebias.calibrators.permutation_average import PermutationAverage
from posdebias.calibrators.permutation_self_consistency import PermutationSelfConsistency
from posdebias.calibrators.pride import PriDe
from posdebias.calibrators.purified_attention import PurifiedAttention
from posdebias.calibrators.vanilla import Vanilla

__all__ = [
    "AttentionGuided",
    "AttentionReadout",
    "Batch",
    "Calibrator",
    "CalibratorOptions",
    "Contextual",
    "LabelFree",
    "PermutationAverage",
    "PermutationSelfConsistency",
    "PriDe",
    "PurifiedAttention",
    "Vanilla",
]
