"""The decoder interface: methods that run the model their own way and decide an answer.

Calibrators turn one shared observation into a prediction and never call the model. The paper's
generated baselines (vanilla generation, instruction prompt, chain-of-thought, self-consistency)
and SoFA need their own model calls (free text, another prompt, another attention mask), so they
are decoders: ``decide(adapter, views)`` returns one :class:`Decision` per candidate order,
with the texts it generated and what it cost. The runner stores every decision in the run
directory, so ``--resume`` never generates twice, and puts decoder rows in the same table as
the calibrators. Third parties add decoders with the ``posdebias_register_decoders`` hook.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from posdebias.adapters.base import Adapter
from posdebias.core.instance import Instance
from posdebias.errors import options_error


class DecoderOptions(BaseModel):
    """Base of every decoder's options model: unknown options are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


@dataclass
class Decision:
    """A decoder's answer for one candidate order.

    Attributes:
        choice: the chosen position (0-based) in that order, or None when no valid answer was
            produced (counts as wrong; reported as a parse failure).
        texts: the generated texts (empty for a scored answer).
        answers: the position parsed from each text (None where nothing parsed).
        forward_passes, generated_tokens, seconds: what this order cost.
    """

    choice: int | None
    texts: list[str] = field(default_factory=list)
    answers: list[int | None] = field(default_factory=list)
    forward_passes: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> Decision:
        return cls(**payload)


class Decoder(ABC):
    """Base class of decoders; plugins subclass it and register the class.

    Class attributes:
        name: the registry name (``--decoders NAME``).
        Options: a :class:`DecoderOptions` subclass; its fields are the options.
        order_independent: whether the choice cannot depend on the candidates' order.
    """

    name: ClassVar[str]
    Options: ClassVar[type[DecoderOptions]] = DecoderOptions
    summary: ClassVar[str] = ""
    #: Whether the choice is the same candidate under every order by construction (cloze
    #: scores each option without the others): the row's Cons. and RStd then measure nothing
    #: about position, and the tables say so instead of showing them.
    order_independent: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        try:
            self.options = self.Options(**options)
        except ValidationError as exc:
            raise options_error(exc, f"decoder {self.name!r}", self.Options.model_fields) from None

    def digest(self) -> str:
        """Identifies the decoder and its options (stored decisions are reused only for it)."""
        canonical = json.dumps(
            {"decoder": self.name, "options": self.options.model_dump(mode="json")},
            sort_keys=True,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def check(self, adapter: Adapter, instances: Sequence[Instance]) -> None:
        """Raise a :class:`~posdebias.errors.PosdebiasError` if this decoder cannot run with
        ``adapter`` on ``instances`` (the test instances); the runner calls it before a run
        writes anything. Nothing to check by default."""
        return None

    @abstractmethod
    def decide(
        self,
        adapter: Adapter,
        views: Sequence[Instance],
        *,
        batch_size: int = 1,
        seeds: Sequence[int],
    ) -> list[Decision]:
        """One decision per view (a candidate order of a test instance); ``seeds[i]`` seeds
        view i's sampling so that results depend on neither batch size nor resumption."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"
