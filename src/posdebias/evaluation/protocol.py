"""Evaluation protocols: our defaults, and a preset that reproduces the authors' public evaluation.

``protocol: default`` is the paper's text: each test instance gets its own T distinct random
orders, calibration instances are held out of the test set, images go to the processor at their
native size, the prompt is the model's, every language-model layer is a candidate, and labels are
scored on the raw logits.

``protocol: reference`` (:data:`REFERENCE`) changes exactly these things, and nothing else
(docs/method.md, "Reproducing the paper", one table "paper / authors' code / posdebias
default"):

1. one shared set of T distinct orders for every instance, the file order (identity) first;
2. every image resized to 336 x 336 (bicubic) before the processor (Hugging Face adapters), and
   at most 28 // N tiles per image where the processor tiles images (InternVL);
3. the query text of the prompt ends with a space (the query then ends ``"Answer: "``), in the
   scored prompt and in every decoder's prompt variant (the chain-of-thought prompt ends
   ``"Answer: <think>"`` under both protocols);
4. candidate layers 21..35 for the layer-selecting calibrators (:func:`reference_layer_range`
   says how this maps to other depths), chosen per query by attention mass (``layer_selection:
   mass``) with each span's mass summed over its tokens (``span_mass: sum``);
5. the M calibration instances are the first M of the evaluated file, and are also tested;
6. label scores, and every generated token of the decoder rows, read after the checkpoint's
   generation-config logits processors, so a repetition penalty (1.05 in Qwen2/2.5-VL
   checkpoints) lowers labels that occur in the prompt;
7. the rows' own choices of the authors' code (:data:`REFERENCE_DECODERS`,
   :data:`REFERENCE_CALIBRATORS`): the generated vanilla and the instruction row read at most 2
   new tokens and take the last number in 1..N (also inside a word); chain-of-thought takes the
   last number in 1..N, also inside a word; SoFA answers by generation, under the mask that also
   opens the later tokens of the same image; self-consistency samples with the checkpoint's
   generation-config sampling settings besides temperature 0.7 and top-k 40, and answers
   position 1 when no sample votes; permutation averaging uses min(16, N!) random permutations
   drawn afresh per instance.

A setting the user gives explicitly (an adapter option, a calibrator's or decoder's option)
wins over the preset. On a model shallower than 36 layers, a layer mapping that leaves out
layers whose attention is informative on the calibration set is reported in the diagnostics of
the calibrators it affects (:func:`warn_left_out_layers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from posdebias.core.observation import Observation
from posdebias.core.stages import EPSILON, PriorEstimator
from posdebias.evaluation.config import (
    CalibratorSpec,
    EvaluateConfig,
    current_option_name,
    orders_of,
)
from posdebias.registry import get_registry

#: The authors' candidate layers: 21..35 (inclusive) of their 36-layer models.
REFERENCE_LAYERS = (21, 36)
REFERENCE_DEPTH = 36


@dataclass(frozen=True)
class Protocol:
    """What a protocol changes relative to our defaults (all off = ``default``)."""

    name: str
    shared_orders: bool = False
    image_size: int | None = None
    query_trailing_space: bool = False
    reference_layers: bool = False
    calibration_from_test: bool = False
    logits_processors: Literal["none", "generation_config"] = "none"
    max_patches: str | None = None


DEFAULT = Protocol("default")
REFERENCE = Protocol(
    "reference",
    shared_orders=True,
    image_size=336,
    query_trailing_space=True,
    reference_layers=True,
    calibration_from_test=True,
    logits_processors="generation_config",
    max_patches="reference",
)
PROTOCOLS: dict[str, Protocol] = {"default": DEFAULT, "reference": REFERENCE}

#: Decoder options of the authors' code where they differ from our defaults (by decoder name).
REFERENCE_DECODERS: dict[str, dict[str, Any]] = {
    "generated": {"max_new_tokens": 2, "parse": "last_number"},
    # the authors answer the instruction prompt like their vanilla
    "instruction": {"max_new_tokens": 2, "parse": "last_number"},
    # their chain of thought takes the last digit run, also inside a word ("image2", "2nd")
    "chain_of_thought": {"parse": "last_number"},
    "sofa": {
        "answer": "generated",
        "within_candidate": True,
        "max_new_tokens": 2,
        "parse": "last_number",
    },
    # their generate inherits the checkpoint's sampling settings (top_p, ...) besides the
    # temperature and top-k it passes
    "self_consistency": {"fallback": "first", "sampling": "generation_config"},
}
#: Calibrator options of the authors' code where they differ from our defaults.
REFERENCE_CALIBRATORS: dict[str, dict[str, Any]] = {
    "permutation_average": {"permutations": "random", "draw": "per_instance"},
}


def get_protocol(name: str) -> Protocol:
    return PROTOCOLS[name]


def order_settings(config: EvaluateConfig, n: int) -> dict[str, Any]:
    """How a run of N candidates draws each test instance's orders: the ``orders``, ``seed``,
    ``shared`` and ``cyclic`` of :func:`~posdebias.evaluation.runner.instance_orders`."""
    return {
        "orders": orders_of(config, n),
        "seed": config.seed,
        "shared": get_protocol(config.protocol).shared_orders,
        "cyclic": config.order_kind == "cyclic",
    }


def reference_layer_range(num_layers: int) -> tuple[int, int]:
    """Candidate layers [start, stop) of the reference protocol for a model of this depth.

    Layers 21..35 as the authors' code uses them for every model: clipped to the last layer of
    a model with 22 to 35 layers (21..27 of a 28-layer model), exactly 21..35 of a 36-layer
    model, and 21..35 also for deeper ones. A model with 21 layers or fewer has none of them;
    there the same top fraction of the depth is used: ``round(21 / 36 * L)`` to the last layer
    (layers 2..3 of the 4-layer organism).
    """
    start, stop = REFERENCE_LAYERS
    if num_layers > start:
        return start, min(stop, num_layers)
    return round(start / REFERENCE_DEPTH * num_layers), num_layers


def adapter_defaults(protocol: Protocol) -> dict[str, Any]:
    """The Hugging Face adapter options the protocol proposes (image size, label scoring,
    tiles): the loader applies those the model's family takes, unless given explicitly."""
    proposed = {
        "image_size": protocol.image_size,
        "logits_processors": None
        if protocol.logits_processors == "none"
        else protocol.logits_processors,
        "max_patches": protocol.max_patches,
    }
    return {name: value for name, value in proposed.items() if value is not None}


def apply_specs(
    protocol: Protocol, config: EvaluateConfig, num_layers: int | None
) -> EvaluateConfig:
    """The config with the protocol's calibrator and decoder options filled in where the user
    set none (:func:`calibrator_specs`, :data:`REFERENCE_DECODERS`,
    :data:`REFERENCE_CALIBRATORS`)."""
    if protocol.name == "default":
        return config
    registry = get_registry()
    calibrators = _with_defaults(
        calibrator_specs(protocol, config.calibrators, num_layers),
        REFERENCE_CALIBRATORS,
        registry.calibrator_class,
    )
    decoders = _with_defaults(list(config.decoders), REFERENCE_DECODERS, registry.decoder_class)
    return config.model_copy(update={"calibrators": calibrators, "decoders": decoders})


def _with_defaults(
    specs: list[CalibratorSpec],
    defaults: dict[str, dict[str, Any]],
    row_class: Callable[[str], Any],
) -> list[CalibratorSpec]:
    """``specs`` with the ``defaults`` of their options that the user gave under no name (an
    option given by its former name is given)."""
    updated = []
    for spec in specs:
        proposed = defaults.get(spec.name, {})
        options = row_class(spec.name).Options if proposed else None
        given = {current_option_name(options, key) for key in spec.options} if options else ()
        extra = {k: v for k, v in proposed.items() if k not in given}
        if extra:
            spec = spec.model_copy(update={"options": {**extra, **spec.options}})
        updated.append(spec)
    return updated


def calibrator_specs(
    protocol: Protocol, specs: list[CalibratorSpec], num_layers: int | None
) -> list[CalibratorSpec]:
    """Calibrator specs with the reference ``layer_range`` for every calibrator that selects
    layers and has none set (unchanged for an adapter without layers)."""
    if not protocol.reference_layers or num_layers is None:
        return specs
    registry = get_registry()
    layers = list(reference_layer_range(num_layers))
    updated = []
    for spec in specs:
        fields = registry.calibrator_class(spec.name).Options.model_fields
        # the authors' selection: per instance by attention mass, summed over each span, over
        # layers 21..35
        reference = {"layer_range": layers, "layer_selection": "mass", "span_mass": "sum"}
        missing = {k: v for k, v in reference.items() if k in fields and k not in spec.options}
        if missing:
            spec = spec.model_copy(update={"options": {**spec.options, **missing}})
        updated.append(spec)
    return updated


#: A layer counts as informative when its own attention readout beats chance by this much.
INFORMATIVE_MARGIN = 0.25
#: ... and the best candidate layer kept by the mapping by this much.
LEFT_OUT_MARGIN = 0.10


def layer_readout_accuracy(observations: Sequence[Observation]) -> np.ndarray:
    """Per attention row: the share of labelled observations whose purified attention of that
    row alone (log a^(l) - log a_prior^(l)) peaks on the truth (Inference 2 with one layer)."""
    labelled = [obs for obs in observations if obs.target is not None and obs.attention is not None]
    if not labelled:
        return np.zeros(0)
    prior = PriorEstimator().attention_prior(labelled)
    attention = np.stack([obs.attention_matrix for obs in labelled])  # [O, L, N]
    purified = np.log(attention + EPSILON) - np.log(prior + EPSILON)[None]
    targets = np.array([obs.target for obs in labelled])
    return (purified.argmax(axis=-1) == targets[:, None]).mean(axis=0)


def warn_left_out_layers(
    protocol: Protocol,
    observations: Sequence[Observation],
    num_layers: int | None,
    states: dict[str, Any],
    specs: Sequence[CalibratorSpec],
) -> dict[str, Any]:
    """``states`` with a warning in the diagnostics of every calibrator that selects among the
    mapped layers when the reference protocol's layer mapping leaves out layers the model's own
    attention shows to be informative on the labelled calibration set (readout at least
    :data:`INFORMATIVE_MARGIN` above chance and :data:`LEFT_OUT_MARGIN` above every layer
    inside the range), so results.json, the report and the command line carry it (``states``
    as they are when nothing is left out, or the protocol maps no layers)."""
    if not protocol.reference_layers or num_layers is None or num_layers >= REFERENCE_DEPTH:
        return states
    start, stop = reference_layer_range(num_layers)
    accuracy = layer_readout_accuracy(observations)
    if accuracy.size == 0:
        return states
    layers = observations[0].layers
    indices = layers.indices if layers is not None else range(accuracy.size)
    readout = dict(zip(indices, accuracy.tolist(), strict=True))  # model layer -> its readout
    inside = [value for layer, value in readout.items() if start <= layer < stop]
    chance = 1.0 / observations[0].n
    left = [
        layer
        for layer, value in readout.items()
        if not start <= layer < stop
        and value >= chance + INFORMATIVE_MARGIN
        and value >= max(inside, default=0.0) + LEFT_OUT_MARGIN
    ]
    if not left:
        return states
    shown = ", ".join(f"{layer} ({100 * readout[layer]:.0f}%)" for layer in left)
    kept = ", ".join(f"{100 * value:.0f}%" for value in inside) or "none"
    message = (
        f"protocol reference maps this {num_layers}-layer model's candidate layers to "
        f"{start}..{stop - 1}, leaving out layer(s) {shown} whose attention alone finds the "
        f"truth on the calibration set far more often than the layers kept "
        f"({kept}); the layer-selecting calibrators will be weaker "
        f"than on all layers. Set layer_range: [0, {num_layers}] on them (or use protocol "
        "default) to keep every layer."
    )
    updated = dict(states)
    for spec in specs:
        if list(spec.options.get("layer_range") or []) != [start, stop] or spec.key not in states:
            continue
        state = states[spec.key]
        diagnostics = dict(state.diagnostics)
        earlier = diagnostics.get("warning")
        diagnostics["warning"] = f"{earlier} {message}" if earlier else message
        diagnostics["layers_left_out"] = left
        updated[spec.key] = state.model_copy(update={"diagnostics": diagnostics})
    return updated
