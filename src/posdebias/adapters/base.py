"""The adapter interface: one model family in, :class:`Observation` objects out.

An adapter knows how to prompt its model, where each image's tokens are, how to score the labels
and how to capture the attention row. Nothing downstream touches the model.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from posdebias.core.instance import Instance
from posdebias.core.labels import get_label_set
from posdebias.core.layers import LayerSet
from posdebias.core.observation import Observation, log_softmax
from posdebias.core.tasks import TaskTemplate, task_label_set
from posdebias.errors import (
    AdapterError,
    ConfigError,
    InputError,
    options_error,
)


@dataclass(frozen=True)
class SofaSettings:
    """Which layers SoFA changes and the interpolation weight of the opened entries."""

    sigma: float = 0.5
    layer_stride: int = 2
    first_layer: int = 0
    #: also open the masked entries inside each candidate (the authors' code)
    within_candidate: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.sigma <= 1:
            raise ConfigError(f"SoFA sigma must be in (0, 1], got {self.sigma}")
        if self.layer_stride < 1 or self.first_layer < 0:
            raise ConfigError(
                f"SoFA layer_stride must be >= 1 and first_layer >= 0, got "
                f"{self.layer_stride} and {self.first_layer}"
            )

    def applies_to(self, layer: int) -> bool:
        return layer >= self.first_layer and (layer - self.first_layer) % self.layer_stride == 0


@dataclass(frozen=True)
class GenerationSettings:
    """How :meth:`Adapter.generate_many` generates (greedy or sampled, seeded per instance).

    Attributes:
        max_new_tokens: at most this many new tokens per sample.
        do_sample: sample (temperature, top_k) instead of greedy argmax.
        num_samples: texts per instance, sharing one prefill.
        stop: stop strings; the text ends before the first one.
        stop_at_eos: stop at end-of-sequence tokens (False: always max_new_tokens, benchmarks).
        prompt_variant: plain, instruction or cot (None: the adapter's own prompt).
        sofa: run the prompt pass under SoFA (:class:`SofaSettings`).
        share_prefix: decode samples over one copy of the prompt's keys and values (False:
            repeat the cache per sample, the plain way; same distribution, more cost).
        sampling_config: ``own``: sample with ``temperature`` and ``top_k`` only;
            ``generation_config``: also every other sampling setting of the checkpoint's
            generation config (top_p, min_p, typical_p, ...), as ``generate(do_sample=True,
            temperature=..., top_k=...)`` inherits them (Hugging Face adapters).
    """

    max_new_tokens: int = 8
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    num_samples: int = 1
    stop: tuple[str, ...] = ()
    stop_at_eos: bool = True
    prompt_variant: str | None = None
    sofa: SofaSettings | None = None
    share_prefix: bool = True
    sampling_config: Literal["own", "generation_config"] = "own"

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.num_samples < 1:
            raise ConfigError(f"num_samples must be at least 1, got {self.num_samples}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be above 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"top_k must be at least 1, got {self.top_k}")
        if self.sampling_config not in ("own", "generation_config"):
            raise ConfigError(
                f"sampling_config must be own or generation_config, got {self.sampling_config!r}"
            )
        if self.num_samples > 1 and not self.do_sample:
            raise ConfigError("num_samples > 1 needs do_sample (greedy samples are identical)")


@dataclass
class Generation:
    """The texts generated for one instance and what they cost.

    ``forward_passes`` counts model calls that computed a token of this instance (the prefill
    plus every decoding step until its last sample stopped); ``seconds`` is its share of the
    batch's wall time.
    """

    texts: list[str]
    generated_tokens: int
    forward_passes: int
    prompt_tokens: int
    seconds: float = 0.0
    token_counts: list[int] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class ReplyRequest:
    """One text to score as the model's whole reply to one user message (cloze scoring).

    Attributes:
        message: the user's message (the question alone: no options, no labels).
        reply: the text scored as the assistant's answer to it.
        source: the instance it comes from (named in errors).
    """

    message: str
    reply: str
    source: str = ""


@dataclass(frozen=True)
class ReplyScore:
    """log P(reply | message) over the full vocabulary, with the reply's length.

    Attributes:
        logprob: the sum of the log-probabilities of the reply's tokens, each given the
            message (as the chat template poses it) and the reply's earlier tokens.
        tokens: how many tokens the reply is (the per-token mean divides by it).
        characters: how many characters the reply is (lm-evaluation-harness's acc_norm).
    """

    logprob: float
    tokens: int
    characters: int


def split_tie(scores: np.ndarray, n: int) -> tuple[np.ndarray, float | None]:
    """An instance's N answers' log-probabilities and a judge's tie label's: with N + 1
    scores the tie is the last and the answers are renormalised without it; else (scores, None)."""
    if scores.shape[-1] == n:
        return scores, None
    return log_softmax(scores[:n]), float(scores[n])


def sample_seed(seed: int, sample: int) -> int:
    """The generator seed of one sample of one instance."""
    return int(np.random.SeedSequence([seed & 0xFFFFFFFF, sample]).generate_state(1)[0])


#: An adapter option naming a label set (``digits``, ``upper``, ...), refused unless known;
#: None: each task's own.
LabelSetName = Annotated[
    str | None, AfterValidator(lambda name: None if name is None else get_label_set(name).name)
]


class AdapterOptions(BaseModel):
    """Base of adapter option models: unknown options are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Adapter(ABC):
    """Base class of adapters; plugins subclass it and register the class.

    Class attributes:
        name: registry name (``posdebias evaluate --adapter NAME``).
        model_types: Hugging Face ``config.model_type`` values this adapter handles.
        Options: options accepted by :meth:`create` (build the adapter by name from a config).
        provides_attention: whether observations carry ``attention``.
        label_set: the name of the label set the adapter prompts with (``digits``, ``upper``,
            ...; an instance attribute where the options choose it), or None: each task's own
            (:func:`~posdebias.core.tasks.task_label_set`: letters for multiple choice and
            judged answers, digits for retrieval and passages).
        priority: claim strength on ``model_types``. A model resolves to the adapter with the
            highest priority among those listing its ``model_type``; at equal priority the
            first registered wins (built-ins register first) and the later one is warned about.
            Built-ins have 0: a plugin takes a built-in family over only deliberately, with a
            priority of 1 or more (or per run with ``--adapter NAME``).
        image_options: the options that act on images only: the records of a run that shows
            no image leave them out (:func:`describe_adapter`).
    """

    name: ClassVar[str]
    model_types: ClassVar[tuple[str, ...]] = ()
    Options: ClassVar[type[AdapterOptions]] = AdapterOptions
    provides_attention: ClassVar[bool] = True
    image_options: ClassVar[tuple[str, ...]] = ()
    label_set: str | None = None
    summary: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    #: N and task of the instances observed last (what :attr:`labels` names), None before
    _last_n: int | None = None
    _last_task: str | None = None

    @classmethod
    def option_names(cls) -> list[str]:
        """The options this adapter takes, as its errors list them (all of its options
        model's; a family may leave out those it would not use, and refuse them)."""
        return list(cls.Options.model_fields)

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> AdapterOptions:
        try:
            return cls.Options(**options)
        except ValidationError as exc:
            raise options_error(exc, f"adapter {cls.name!r}", cls.option_names()) from None

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
        """The label strings of the N and task observed last (None before any observation)."""
        return None if self._last_n is None else self.labels_for(self._last_n, self._last_task)

    @abstractmethod
    def observe_many(
        self, instances: Sequence[Instance], *, batch_size: int = 1
    ) -> list[Observation]:
        """One observation per instance, in order; results must not depend on ``batch_size``."""

    def verify(self, instance: Instance) -> None:
        """Raise :class:`~posdebias.errors.AdapterError` if this adapter would compute wrong
        numbers for its model (checked on ``instance``); the runner calls it before a run
        writes anything. Adapters without a model to compare against need nothing here."""
        return None

    def check_instances(self, instances: Sequence[Instance]) -> None:
        """Raise :class:`~posdebias.errors.InputError` if an instance holds text this adapter's
        model would not read as text (its special tokens); the runner calls it on every
        instance of a run before the run writes anything. Adapters that pose no text to a
        tokenizer they know need nothing here (posing an instance checks it again)."""
        return None

    def observe(self, instance: Instance) -> Observation:
        """The observation of a single instance (one forward pass)."""
        return self.observe_many([instance])[0]

    def label_set_for(self, task: str | None = None) -> str:
        """The name of the label set this adapter prompts ``task`` with (default: retrieval):
        its ``label_set`` option, else the task's own (one rule for every adapter)."""
        return task_label_set(task or "retrieval", self.label_set)

    def labels_for(self, n: int, task: str | None = None) -> list[str]:
        """The N label strings this adapter prompts ``task`` with (default: retrieval)."""

        return get_label_set(self.label_set_for(task)).labels(n)

    def generate_many(
        self,
        instances: Sequence[Instance],
        settings: GenerationSettings,
        *,
        batch_size: int = 1,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Generated texts per instance (:class:`GenerationSettings`); ``seeds[i]`` seeds the
        samples of instance i, so results do not depend on the batch size."""
        raise AdapterError(
            f"adapter {self.name!r} cannot generate text; the generated baselines need an "
            "adapter that implements generate_many (the Hugging Face adapters do)"
        )

    def reply_problem(self) -> str | None:
        """Why this adapter cannot score a text as the model's reply (:meth:`score_replies`),
        or None (it can); checked before a run that needs it writes anything."""
        return (
            f"adapter {self.name!r} cannot score a text as the model's reply; cloze scoring "
            "needs an adapter that implements score_replies (the Hugging Face text-model "
            "adapters do)"
        )

    def check_replies(self, requests: Sequence[ReplyRequest]) -> None:
        """Raise :class:`~posdebias.errors.InputError` if a request would be misread (its joined
        text forms one of the model's special tokens); called before a run writes anything.
        Nothing to check by default."""
        return None

    def score_replies(
        self, requests: Sequence[ReplyRequest], *, batch_size: int = 1
    ) -> list[ReplyScore]:
        """log P(reply | message) of each request (:class:`ReplyRequest`), in order, over the
        full vocabulary; results must not depend on ``batch_size``."""
        raise AdapterError(self.reply_problem() or f"adapter {self.name!r} scores no replies")

    def describe(self, n: int | None = None) -> dict[str, Any]:
        """Metadata recorded in calibration states and reports (adapter, model id, ...).

        A pure function of the adapter and N (the labels prompted for N candidates, where the
        adapter has them): the run's ``run.json`` and ``results.json`` agree whether or not a
        forward pass has run.
        """
        return {"adapter": self.name, "model_id": None, "prompt_hash": None}


def describe_adapter(
    adapter: Adapter, n: int | None = None, task: str | None = None, *, images: bool = True
) -> dict[str, Any]:
    """``adapter.describe(n)``, also for a plugin adapter whose ``describe`` takes no N; with
    ``task``, the prompt it records is that task's template (``describe`` records the
    retrieval one), so a text run's files name the prompt it posed; without ``images`` (a run
    that shows none), its image options are left out."""
    try:
        takes_n = len(inspect.signature(adapter.describe).parameters) > 0
    except (TypeError, ValueError):
        takes_n = True
    described = adapter.describe(n) if takes_n else adapter.describe()
    templates = getattr(adapter, "task_templates", None)
    template = templates.get(task) if isinstance(templates, dict) and task else None
    if isinstance(template, TaskTemplate) and "prompt" in described:
        described = {**described, "prompt": template.recorded(), "prompt_hash": template.digest()}
    unused = () if images else getattr(adapter, "image_options", ())
    return {k: v for k, v in described.items() if k not in unused}
