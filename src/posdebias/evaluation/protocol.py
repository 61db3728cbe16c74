"""Evaluation protocols: our defaults, and a preset that reproduces the authors' public evaluation.

``protocol: default`` is the paper's text: each test instance gets its own T distinct random
orders, calibration instances are held out of the test set, images go to the processor at their
native size, the prompt is the model's, every language-model layer is a candidate, and labels are
scored on the raw logits.

``protocol: reference`` (:data:`REFERENCE`) changes exactly these six things, and nothing else
(docs/method.md, "Reproducing the paper"):

1. one shared set of T distinct orders for every instance, the file order (identity) first;
2. every image resized to 336 x 336 (bicubic) before the processor (Hugging Face adapters);
3. the query text of the prompt ends with a space (METHOD.md's query then ends ``"Answer: "``);
4. candidate layers 21..35 for the layer-selecting calibrators (:func:`reference_layer_range`
   says how this maps to other depths);
5. the M calibration instances are the first M of the evaluated file, and are also tested;
6. label scores read after the checkpoint's generation-config logits processors (greedy), so a
   repetition penalty (1.05 in Qwen2/2.5-VL checkpoints) lowers labels that occur in the prompt.

A setting the user gives explicitly (an adapter option or a calibrator's ``layer_range``) wins
over the preset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from posdebias.adapters.hf.prompt import PromptTemplate
from posdebias.evaluation.config import CalibratorSpec
from posdebias.registry import get_registry

ProtocolName = Literal["default", "reference"]

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


DEFAULT = Protocol("default")
REFERENCE = Protocol(
    "reference",
    shared_orders=True,
    image_size=336,
    query_trailing_space=True,
    reference_layers=True,
    calibration_from_test=True,
    logits_processors="generation_config",
)
PROTOCOLS: dict[str, Protocol] = {"default": DEFAULT, "reference": REFERENCE}


def get_protocol(name: str) -> Protocol:
    return PROTOCOLS[name]


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


def adapter_options(protocol: Protocol, options: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face adapter options with the protocol's image size and label scoring added
    (explicit options win)."""
    merged = dict(options)
    if protocol.image_size is not None:
        merged.setdefault("image_size", protocol.image_size)
    if protocol.logits_processors != "none":
        merged.setdefault("logits_processors", protocol.logits_processors)
    return merged


def apply_prompt(protocol: Protocol, adapter: Any) -> None:
    """Give the adapter's prompt its trailing space (adapters with a prompt template only),
    before anything is rendered."""

    prompt = getattr(adapter, "prompt", None)
    if not protocol.query_trailing_space or not isinstance(prompt, PromptTemplate):
        return
    if not prompt.query.endswith(" "):
        adapter.prompt = prompt.model_copy(update={"query": prompt.query + " "})


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
        if "layer_range" in fields and "layer_range" not in spec.options:
            spec = spec.model_copy(update={"options": {**spec.options, "layer_range": layers}})
        updated.append(spec)
    return updated
