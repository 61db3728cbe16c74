"""Every default that more than one place needs, written once.

The method's hyperparameters (K layers, temperature tau), the bounds on N, the calibrators a run
evaluates when none are named and the forward batch size: options models, CLI flags, config
files and the pure stages all read them from here, so they cannot drift apart.
"""

from __future__ import annotations

from typing import Literal

#: Fewest and most candidate images per instance (N); 26 is the size of the letter label sets.
MIN_CANDIDATES = 2
MAX_CANDIDATES = 26

#: N when no benchmark fixes it (the paper's main setting).
CANDIDATES = 4

#: K: layers with the most image attention used per instance (inference step 1).
TOP_K = 2

#: How a candidate's attention mass is read by the layer-selecting calibrators: ``mean`` per
#: token, ``sum`` over its tokens (the paper), or ``evidence``: whichever of the two lets the
#: chosen layers point at the truth more often on the calibration set. Measured on two real
#: models and two question sets (docs/real-models.md): neither fixed reading wins everywhere
#: (the sum lifts Gemma 3's capitals, the mean SmolLM2's countries), the evidence takes each.
SPAN_MASS: Literal["evidence", "sum", "mean"] = "evidence"

#: M, calibration instances when none are given. The paper calibrates on 5; on real models
#: the layer choice needs more evidence than 5 questions give (docs/real-models.md: Gemma 3
#: 270M's informative layer is found in most draws of 20 questions, rarely of 5), so the
#: default is 20. ``protocol: reference`` keeps the paper's 5.
CALIBRATION_COUNT = 20
REFERENCE_CALIBRATION_COUNT = 5

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

# -- bounds: the range of every number a user gives --------------------------------------------
# Flags, config files, calibrator / decoder / adapter options and saved files are checked
# against these before any work: a typo such as 1e9 is refused in a second instead of running
# for days, growing memory until the kernel kills the process, or crashing a library.
# `posdebias plugins --options` shows each option's range; the errors page lists them all.

#: Seeds: whole numbers that numpy and torch both take.
MAX_SEED = 2**32 - 1

#: Test instances of a run; instances and pool images of a built benchmark (a benchmark file
#: of this many lines is a few hundred MB).
MAX_INSTANCES = 1_000_000

#: Calibration instances M (each observed in its N rotations; the paper uses 5). A sweep over
#: calibration sizes holds out its largest M, so this bound also bounds that study.
MAX_CALIBRATION = 10_000

#: Candidate orders T per test instance (the paper shows 5) unless fewer exist
#: (:func:`posdebias.core.tasks.default_orders`).
ORDERS = 5
MAX_ORDERS = 1_000

#: Forward batch size (and CLIP's encoding batch size).
MAX_BATCH_SIZE = 4_096

#: Model layers: K of the top-K selection, layer indices, strides (models have at most ~100).
MAX_LAYERS = 1_024

#: tau, the visual posterior's temperature: at 1,000 an image whose purified attention is 1%
#: above another's already takes over 99.99% of their joint mass (the default is 5).
MAX_TAU = 1_000.0

#: New tokens a decoder generates per text, and sampled chains per order (self-consistency).
MAX_NEW_TOKENS = 32_768
MAX_SAMPLES = 1_000

#: GPUs of one data-parallel process's model replica.
MAX_GPUS_PER_PROCESS = 1_024

#: Images a shapes build generates (drawing them takes minutes at this size; the bundled
#: benchmark uses 500).
MAX_SHAPES_IMAGES = 100_000

#: Image side in pixels (a resize before the processor, a generated shapes image).
MAX_IMAGE_SIZE = 4_096

#: The range of each whole-number setting of a run, by its config key: config files, flags and
#: the Python API (``Debiaser``, ``rank_many``, the runner, ``run_evaluation``) refuse the same
#: values (the Python API through :func:`posdebias._inputs.check_setting`).
RANGES: dict[str, tuple[int, int]] = {
    "count": (1, MAX_INSTANCES),
    "calibration_count": (1, MAX_CALIBRATION),
    "orders": (1, MAX_ORDERS),
    "seed": (0, MAX_SEED),
    "batch_size": (1, MAX_BATCH_SIZE),
}
