"""The adapter interface: one model family in, :class:`Observation` objects out.

An adapter knows how to prompt its model, where each image's tokens are, how to score the labels
and how to capture the attention row. Nothing downstream touches the model.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from posdebias.core.instance import RetrievalInstance
from posdebias.core.labels import get_label_set
from posdebias.core.layers import LayerSet
from posdebias.core.observation import Observation
from posdebias.errors import AdapterError, ConfigError, InputError, validation_message

if TYPE_CHECKING:
    from posdebias.adapters.generation import Generation, GenerationSettings


class AdapterOptions(BaseModel):
    """Base of adapter option models: unknown options are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Adapter(ABC):
    """Base class of adapters; plugins subclass it and register the class.

    Class attributes:
        name: registry name (``posdebias evaluate --adapter NAME``).
        model_types: Hugging Face ``config.model_type`` values this adapter handles.
        Options: options accepted by :meth:`create` (build the adapter by name from a config).
        provides_attention: whether observations carry ``attention``.
        priority: claim strength on ``model_types``. A model resolves to the adapter with the
            highest priority among those listing its ``model_type``; at equal priority the
            first registered wins (built-ins register first) and the later one is warned about.
            Built-ins have 0: a plugin takes a built-in family over only deliberately, with a
            priority of 1 or more (or per run with ``--adapter NAME``).
    """

    name: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]] = ()
    Options: ClassVar[type[AdapterOptions]] = AdapterOptions
    provides_attention: ClassVar[bool] = True
    summary: ClassVar[str] = ""
    priority: ClassVar[int] = 0

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> AdapterOptions:
        try:
            return cls.Options(**options)
        except ValidationError as exc:
            allowed = ", ".join(cls.Options.model_fields) or "none"
            raise ConfigError(
                validation_message(exc, f"adapter {cls.name!r}") + f"; options: {allowed}"
            ) from None

    @classmethod
    def create(cls, **options: Any) -> Adapter:
        """Build the adapter from options alone (``--adapter NAME``)."""
        raise InputError(
            f"adapter {cls.name!r} needs a model: pass --model ID_OR_PATH "
            "(or posdebias.load_adapter / get_adapter in Python)"
        )

    @classmethod
    def tiny_model(
        cls, model_type: str, *, real_vocabulary: bool = False
    ) -> tuple[Any, Any] | None:
        """A tiny random-weight ``(model, processor)`` of ``model_type`` for tests, built offline
        in code, or None when the adapter has none (:mod:`posdebias.testing` calls it).

        ``real_vocabulary``: the family's real tokenizer and chat template (embeddings tied to
        keep the model small); an adapter without one raises :class:`InputError`."""
        return None

    @property
    @abstractmethod
    def num_layers(self) -> int | None:
        """Language-model layers L in the observations' attention (None without attention)."""

    @property
    def attention_layers(self) -> LayerSet | None:
        """The model layers (indices and kinds) of the observations' attention rows; by default
        every layer 0..L-1, global (a dense model)."""
        num_layers = self.num_layers
        return None if num_layers is None else LayerSet.dense(num_layers)

    @property
    def labels(self) -> list[str] | None:
        """The label strings in use for the current N, when fixed by the adapter."""
        return None

    @abstractmethod
    def observe_many(
        self, instances: Sequence[RetrievalInstance], *, batch_size: int = 1
    ) -> list[Observation]:
        """One observation per instance, in order; results must not depend on ``batch_size``."""

    def verify(self, instance: RetrievalInstance) -> None:
        """Raise :class:`~posdebias.errors.AdapterError` if this adapter would compute wrong
        numbers for its model (checked on ``instance``); the runner calls it before a run
        writes anything. Adapters without a model to compare against need nothing here."""
        return None

    def observe(self, instance: RetrievalInstance) -> Observation:
        """The observation of a single instance (one forward pass)."""
        return self.observe_many([instance])[0]

    def labels_for(self, n: int) -> list[str]:
        """The N label strings this adapter prompts with."""

        return get_label_set(getattr(self, "label_set", "digits")).labels(n)

    def generate_many(
        self,
        instances: Sequence[RetrievalInstance],
        settings: GenerationSettings,
        *,
        batch_size: int = 1,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Generated texts per instance (posdebias.adapters.generation); ``seeds[i]`` seeds the
        samples of instance i, so results do not depend on the batch size."""
        raise AdapterError(
            f"adapter {self.name!r} cannot generate text; the generated baselines need an "
            "adapter that implements generate_many (the Hugging Face adapters do)"
        )

    def describe(self, n: int | None = None) -> dict[str, Any]:
        """Metadata recorded in calibration states and reports (adapter, model id, ...).

        A pure function of the adapter and N (the labels prompted for N candidates, where the
        adapter has them): the run's ``run.json`` and ``results.json`` agree whether or not a
        forward pass has run.
        """
        return {"adapter": self.name, "model_id": None, "prompt_hash": None}


def describe_adapter(adapter: Adapter, n: int | None = None) -> dict[str, Any]:
    """``adapter.describe(n)``, also for a plugin adapter whose ``describe`` takes no N."""
    try:
        takes_n = len(inspect.signature(adapter.describe).parameters) > 0
    except (TypeError, ValueError):
        takes_n = True
    return adapter.describe(n) if takes_n else adapter.describe()
