"""Every default that more than one place needs, written once.

The method's hyperparameters (K layers, temperature tau), the bounds on N, the calibrators a run
evaluates when none are named and the forward batch size: options models, CLI flags, config
files and the pure stages all read them from here, so they cannot drift apart.
"""

from __future__ import annotations

#: Fewest and most candidate images per instance (N); 26 is the size of the letter label sets.
MIN_CANDIDATES = 2
MAX_CANDIDATES = 26

#: N when no benchmark fixes it (the paper's main setting).
CANDIDATES = 4

#: K: layers with the most image attention used per instance (inference step 1).
TOP_K = 2

#: tau: temperature of the visual posterior pi = softmax(tau * log pi~) (inference step 3).
TAU = 5.0

#: The calibrators a run evaluates when none are named (every built-in, the method last but one).
CALIBRATORS: tuple[str, ...] = (
    "vanilla",
    "pride",
    "attention_readout",
    "purified_attention",
    "attention_guided",
    "permutation_average",
)

#: Forward batch size when none is given (a bundled model may bring its own).
BATCH_SIZE = 1

#: Bootstrap resamples of the test instances behind every 95% interval, and the accepted range
#: (below 100 each 2.5% tail holds fewer than 3 values; above 100,000 the intervals take longer
#: than a default run's model).
RESAMPLES = 1000
MIN_RESAMPLES = 100
MAX_RESAMPLES = 100_000
