"""SoFA (Tian et al., CVPR 2025) as a row: the usual answer under the SoFA attention mask.

``answer: scored`` takes the argmax of the restricted label scores (one forward pass, like the
scored vanilla row); ``answer: generated`` generates greedily and parses the index (like the
paper's vanilla; the authors' choice). ``within_candidate: true`` also opens the later tokens of
the same candidate (the authors' mask; read from ``within_image`` too, its name before text
candidates). The mask itself is posdebias.adapters.attention.sofa.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import AliasChoices, Field, model_validator

import posdebias.defaults as defaults
from posdebias._markers import register_hook
from posdebias.adapters.attention.sofa import SofaSettings, sofa_attention
from posdebias.adapters.base import Adapter
from posdebias.core.instance import Instance
from posdebias.decoders.base import Decision
from posdebias.decoders.generated import Generated, GeneratedOptions
from posdebias.errors import AdapterError


class SofaOptions(GeneratedOptions):
    answer: Literal["scored", "generated"] = Field(
        default="scored", description="read the label scores, or generate and parse the answer"
    )
    sigma: float = Field(default=0.5, gt=0, le=1, description="weight of the opened entries")
    layer_stride: int = Field(
        default=2, ge=1, le=defaults.MAX_LAYERS, description="every k-th language-model layer"
    )
    first_layer: int = Field(
        default=0, ge=0, le=defaults.MAX_LAYERS, description="the first layer SoFA changes"
    )
    within_candidate: bool = Field(
        default=False,
        validation_alias=AliasChoices("within_candidate", "within_image"),
        description="also open the later tokens of the same candidate (the authors' code)",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and {"within_image", "within_candidate"} <= set(data):
            raise ValueError("within_image is the former name of within_candidate: give one")
        return data


def require_effect(run: Any, adapter: Adapter) -> None:
    """Refuse to report a SoFA row whose mask never took effect (e.g. an adapter whose
    attention does not go through the posdebias attention function)."""
    if not run.changed_layers:
        raise AdapterError(
            f"adapter {adapter.name!r} ran without the SoFA mask taking effect; SoFA needs a "
            "Hugging Face adapter whose language model uses the posdebias attention function"
        )


class Sofa(Generated):
    name = "sofa"
    Options = SofaOptions
    options: SofaOptions
    summary = "candidate blocks see later candidates (log sigma mask) in every second layer"

    def sofa_settings(self) -> SofaSettings:
        return SofaSettings(
            sigma=self.options.sigma,
            layer_stride=self.options.layer_stride,
            first_layer=self.options.first_layer,
            within_candidate=self.options.within_candidate,
        )

    def decide(
        self,
        adapter: Adapter,
        views: Sequence[Instance],
        *,
        batch_size: int = 1,
        seeds: Sequence[int],
    ) -> list[Decision]:
        if self.options.answer == "generated":
            # the generation path opens its own SoFA block; this outer one only checks it
            with sofa_attention(self.sofa_settings()) as run:
                decisions = super().decide(adapter, views, batch_size=batch_size, seeds=seeds)
            require_effect(run, adapter)
            return decisions

        started = time.perf_counter()
        with sofa_attention(self.sofa_settings()) as run:
            observations = adapter.observe_many(list(views), batch_size=batch_size)
        require_effect(run, adapter)
        share = (time.perf_counter() - started) / max(len(views), 1)
        return [
            Decision(
                choice=int(np.argmax(observation.label_logprobs)),
                forward_passes=1,
                seconds=share,
            )
            for observation in observations
        ]


posdebias_register_decoders = register_hook(Sofa)
