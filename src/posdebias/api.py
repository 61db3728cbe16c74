"""The library API for application code: calibrate once, then rank images for captions.

A :class:`Debiaser` holds a model adapter and one or several calibrators. Calibrators that need
no fit (vanilla, attention_readout, permutation_average) work at once; the others are fitted
with :meth:`Debiaser.calibrate` (with labelled instances, or unlabelled ones for label_free) or
loaded with :meth:`Debiaser.load`. Every query is observed ONCE per candidate order and that
observation feeds every calibrator; :meth:`Debiaser.rank_many` streams many queries through the
adapter's batches.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from posdebias._inputs import check_setting
from posdebias.adapters.base import Adapter
from posdebias.calibrators.base import Calibrator
from posdebias.core.instance import ImageRef, Instance, RetrievalInstance, image_key
from posdebias.core.observation import Evidence, Prediction
from posdebias.core.state import CalibrationState
from posdebias.errors import CalibrationError, InputError
from posdebias.evaluation.job import load_states
from posdebias.evaluation.runner import (
    ObservationCache,
    check_calibration_size,
    fit_calibrators,
    observe_cached,
)
from posdebias.registry import get_registry

Query: TypeAlias = Instance | tuple[str, Sequence[ImageRef]]
"""What :meth:`Debiaser.rank_many` accepts per query: an :class:`Instance` of any task (a
:class:`RetrievalInstance` among them), or a ``(caption, images)`` pair."""

CalibratorSpec: TypeAlias = str | Calibrator


class CalibrationWarning(UserWarning):
    """A calibration was fitted but its data told it something the caller should know (for
    example: the attention is uninformative, so label_free fell back to a static prior)."""


@dataclass(frozen=True, eq=False)
class Ranking:
    """The answer for one query: every calibrator's prediction from the same forward pass.

    The properties give the answer of ``calibrator`` (the debiaser's first calibrator unless
    chosen with :meth:`of`); positions refer to the candidates as the caller gave them.

    Attributes:
        query: the caption (the stem: a question, a query).
        images: the candidate image references, in the order given (None for a text-only
            candidate).
        predictions: per calibrator label, its :class:`Prediction` (with ``evidence`` when the
            ranking was asked with ``explain=True``).
        calibrator: the label whose answer the properties below give.
        id: the query's identifier (the instance id, or a hash of caption and images).
        target: the true position where the query was an :class:`Instance` with one.
        texts: the candidates' texts, in the order given (None for an image-only candidate).
    """

    query: str
    images: tuple[ImageRef | None, ...]
    predictions: Mapping[str, Prediction]
    calibrator: str
    id: str
    target: int | None = None
    texts: tuple[str | None, ...] = ()

    @property
    def calibrators(self) -> list[str]:
        """Labels of every calibrator that answered."""
        return list(self.predictions)

    def of(self, calibrator: str) -> Ranking:
        """The same ranking seen through another calibrator's answer."""
        if calibrator not in self.predictions:
            raise InputError(
                f"no prediction of calibrator {calibrator!r}; this ranking has {self.calibrators}"
            )
        return Ranking(
            self.query,
            self.images,
            self.predictions,
            calibrator,
            self.id,
            self.target,
            self.texts,
        )

    @property
    def prediction(self) -> Prediction:
        return self.predictions[self.calibrator]

    @property
    def choice(self) -> int:
        """0-based position of the chosen image in ``images``."""
        return self.prediction.choice

    @property
    def best(self) -> ImageRef | None:
        """The chosen image (the caller's reference; None for a text-only candidate)."""
        return self.images[self.choice]

    @property
    def best_text(self) -> str | None:
        """The chosen candidate's text (None for an image-only candidate)."""
        return self.texts[self.choice] if self.texts else None

    @property
    def ranked_texts(self) -> list[str | None]:
        """The candidates' texts from best to worst (a reranked passage list)."""
        return [self.texts[k] for k in self.order] if self.texts else []

    @property
    def order(self) -> list[int]:
        """Positions in ``images`` from best to worst."""
        return self.prediction.ranking

    @property
    def ranked_images(self) -> list[ImageRef | None]:
        """The caller's image references from best to worst."""
        return [self.images[k] for k in self.order]

    @property
    def probabilities(self) -> np.ndarray:
        """Calibrated probability of each image, in the order of ``images``."""
        return self.prediction.probabilities

    @property
    def scores(self) -> np.ndarray:
        """Calibrated log-scores, in the order of ``images``."""
        return self.prediction.scores

    @property
    def evidence(self) -> Evidence | None:
        """Why the image won (label probabilities, attention, posterior, expected bias), when
        asked for with ``explain=True``; per position of ``images``."""
        return self.prediction.evidence


def _as_instance(query: Any) -> Instance:
    if isinstance(query, Instance):
        return query
    if isinstance(query, tuple) and len(query) == 2 and isinstance(query[0], str):
        caption, images = query
        if isinstance(images, (str, Path)) or not isinstance(images, Sequence):
            raise InputError(
                f"the images of query {caption!r} must be a list of image references, got "
                f"{type(images).__name__}"
            )
        keys = "\x1f".join(image_key(image) for image in images)
        ident = "query-" + hashlib.sha1(f"{caption}\x1e{keys}".encode()).hexdigest()[:12]
        return RetrievalInstance(query=caption, images=tuple(images), target=None, id=ident)
    raise InputError(
        "each query must be an Instance (RetrievalInstance) or a (caption, images) pair, got "
        f"{type(query).__name__}"
    )


class Debiaser:
    """A model adapter plus one or several calibrators, calibrated once, reused for every query.

    >>> debiaser = Debiaser(adapter)                    # attention_guided by default
    >>> debiaser.calibrate(calibration_instances)       # 5 labelled instances x N rotations
    >>> debiaser.rank("a red circle", ["a.png", "b.png", "c.png", "d.png"]).best
    'c.png'

    ``calibrator`` is a registry name or a :class:`Calibrator` (``**options`` go to a named
    one), a list of them, or a mapping from labels to them. With several, the first is the one
    whose answer :class:`Ranking`'s properties give; :meth:`Ranking.of` gives the others.
    """

    def __init__(
        self,
        adapter: Adapter,
        calibrator: CalibratorSpec | Sequence[CalibratorSpec] | Mapping[str, CalibratorSpec] = (
            "attention_guided"
        ),
        *,
        batch_size: int = 1,
        **options: Any,
    ) -> None:
        self.adapter = adapter
        self.batch_size = check_setting("batch_size", batch_size)
        if isinstance(calibrator, (str, Calibrator)):
            specs: dict[str, CalibratorSpec] = {_label(calibrator): calibrator}
        elif isinstance(calibrator, Mapping):
            specs = dict(calibrator)
        else:
            specs = {}
            for spec in calibrator:
                label = _label(spec)
                if label in specs:
                    raise InputError(
                        f"calibrator {label!r} is given twice; pass a mapping "
                        "{label: calibrator} to hold two of the same kind"
                    )
                specs[label] = spec
        if not specs:
            raise InputError("a Debiaser needs at least one calibrator")
        if options and (len(specs) != 1 or not isinstance(next(iter(specs.values())), str)):
            raise InputError(
                f"options {sorted(options)} apply to one calibrator given by name; with several, "
                "pass calibrators built with posdebias.get_calibrator(name, **options)"
            )
        registry = get_registry()
        self.calibrators: dict[str, Calibrator] = {
            label: spec
            if isinstance(spec, Calibrator)
            else registry.create_calibrator(spec, **options)
            for label, spec in specs.items()
        }
        self.states: dict[str, CalibrationState] = {}

    # -- the calibrators -------------------------------------------------------------------

    @property
    def calibrator(self) -> Calibrator:
        """The first calibrator (whose answer :class:`Ranking`'s properties give)."""
        return next(iter(self.calibrators.values()))

    @property
    def primary(self) -> str:
        """Label of the first calibrator."""
        return next(iter(self.calibrators))

    @property
    def state(self) -> CalibrationState | None:
        """The first calibrator's state (None before calibration)."""
        return self.states.get(self.primary)

    def calibrate(self, instances: Sequence[RetrievalInstance]) -> CalibrationState:
        """Fit every calibrator that needs it on the N cyclic rotations of ``instances``.

        Calibrators that fit from labels (attention_guided) need each instance's ``target``;
        label-free ones (label_free, purified_attention, pride, contextual, batch) use instances
        without targets too. ``pride`` with ``workflow: test`` is PriDe's own workflow: calibrate
        on the instances you will rank; a share ``alpha`` of them is then answered by
        permutation averaging and their prior debiases the rest. The rotations are observed
        once and shared; when no calibrator needs a fit nothing is observed. Returns the first
        calibrator's state (all are in ``states``).
        """

        instances = list(instances)
        if not instances:
            raise InputError("calibrate needs at least one instance")
        check_calibration_size(len(instances))
        fitting = {label: c for label, c in self.calibrators.items() if c.needs_fit}
        labelled = [label for label, c in fitting.items() if c.needs_targets]
        unknown = [instance.id for instance in instances if instance.target is None]
        if labelled and unknown:
            raise InputError(
                f"calibrators {labelled} fit from labelled instances, but instances "
                f"{unknown[:3]} have no target; give each instance its target, or calibrate "
                "without labels with Debiaser(adapter, 'label_free')"
            )
        described = self.adapter.describe()
        metadata = {k: described.get(k) for k in ("model_id", "prompt_hash")}
        states = (
            fit_calibrators(
                self.adapter, fitting, instances, batch_size=self.batch_size, metadata=metadata
            )
            if fitting
            else {}
        )
        n = instances[0].n
        for label, calibrator in self.calibrators.items():
            if label not in states:
                states[label] = self._trivial_state(calibrator, n, metadata)
            warning = states[label].diagnostics.get("warning")
            if warning:
                warnings.warn(f"{label}: {warning}", CalibrationWarning, stacklevel=2)
        self.states = states
        return states[self.primary]

    def _trivial_state(
        self, calibrator: Calibrator, n: int, metadata: Mapping[str, Any] | None = None
    ) -> CalibrationState:
        """The state of a calibrator that needs no fit (no forward pass)."""
        if metadata is None:
            described = self.adapter.describe()
            metadata = {k: described.get(k) for k in ("model_id", "prompt_hash")}
        return calibrator.fit(
            [],
            n=n,
            adapter=self.adapter.name,
            label_set=self.adapter.labels_for(n),
            **metadata,
        )

    def _state(self, label: str, n: int) -> CalibrationState:
        state = self.states.get(label)
        calibrator = self.calibrators[label]
        if not calibrator.needs_fit and (state is None or state.n != n):
            return self._trivial_state(calibrator, n)
        if state is None:
            raise CalibrationError(
                f"calibrator {label!r} is not calibrated: call .calibrate(instances) or "
                "Debiaser.load(path, adapter) first"
            )
        return state

    # -- persistence -----------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Save the calibration: one JSON file for one calibrator, else a directory holding
        ``<label>.json`` per calibrator. Returns the path written."""
        missing = [label for label in self.calibrators if label not in self.states]
        if missing:
            raise CalibrationError(
                f"calibrators {missing} are not calibrated: call .calibrate(instances) first"
            )
        if len(self.states) == 1:
            return self.states[self.primary].save(path)
        folder = Path(path)
        for label, state in self.states.items():
            state.save(folder / f"{label}.json")
        return folder

    @classmethod
    def load(
        cls,
        path: str | Path,
        adapter: Adapter,
        *,
        batch_size: int = 1,
        transfer: bool = False,
    ) -> Debiaser:
        """A debiaser from what :meth:`save` wrote (a file, or a directory of files in name
        order); refused if made with another adapter or prompt, or on another model unless
        ``transfer`` says that is intended."""
        states = load_states(Path(path))
        described = adapter.describe()
        registry = get_registry()
        calibrators = {}
        for label, state in states.items():
            state.check_compatible(
                adapter=adapter.name,
                prompt_hash=described.get("prompt_hash"),
                model_id=None if transfer else described.get("model_id"),
            )
            calibrators[label] = registry.create_calibrator(state.calibrator, **state.options)
        debiaser = cls(adapter, calibrators, batch_size=batch_size)
        debiaser.states = dict(states)
        return debiaser

    # -- ranking ---------------------------------------------------------------------------

    def rank(
        self,
        query: str,
        images: Sequence[ImageRef | None] = (),
        *,
        texts: Sequence[str | None] | None = None,
        stem_images: Sequence[ImageRef] = (),
        task: str | None = None,
        explain: bool = False,
    ) -> Ranking:
        """Rank the candidates for ``query`` with every calibrator (one forward pass per order).

        Image candidates: ``images``. Text candidates (options, answers, passages): ``texts``,
        posed as ``multiple_choice`` unless ``task`` names another kind; both for images with a
        text. ``stem_images``: images of the question itself.
        """
        if texts is None and not stem_images and task in (None, "retrieval"):
            instance = _as_instance((query, images))
        else:
            texts = tuple(texts or ())
            keys = "\x1f".join(
                [image_key(image) for image in (*stem_images, *images) if image is not None]
                + [text or "" for text in texts]
            )
            ident = "query-" + hashlib.sha1(f"{query}\x1e{keys}".encode()).hexdigest()[:12]
            instance = Instance(
                query=query,
                images=tuple(images),
                texts=texts,
                stem_images=tuple(stem_images),
                id=ident,
                task=task or "multiple_choice",
            )
        return self._rank_chunk([instance], self.batch_size, explain)[0]

    def rank_many(
        self,
        queries: Iterable[Query],
        *,
        batch_size: int | None = None,
        explain: bool = False,
    ) -> Iterator[Ranking]:
        """Rankings of many queries, yielded in order as each batch is done.

        ``queries`` may be any iterable (a generator over a file is read lazily): each item a
        :class:`RetrievalInstance` or a ``(caption, images)`` pair. ``batch_size`` queries
        (default: the debiaser's) are observed per adapter batch; calibrators that need the N
        rotations observe the batch's rotations together.
        """
        size = self.batch_size if batch_size is None else check_setting("batch_size", batch_size)
        iterator = iter(queries)
        while True:
            chunk = [_as_instance(query) for query in islice(iterator, size)]
            if not chunk:
                return
            yield from self._rank_chunk(chunk, size, explain)

    def _rank_chunk(
        self, instances: list[RetrievalInstance], batch_size: int, explain: bool
    ) -> list[Ranking]:
        needs_attention = any(c.needs_attention for c in self.calibrators.values())
        states_by_n: dict[int, dict[str, CalibrationState]] = {}
        for instance in instances:
            n = instance.n
            if n in states_by_n:
                continue
            states = {label: self._state(label, n) for label in self.calibrators}
            for state in states.values():
                state.check_compatible(
                    n=n,
                    layers=self.adapter.attention_layers if needs_attention else None,
                    label_set=self.adapter.labels_for(n),
                )
            states_by_n[n] = states
        # every view once: the query as given, plus the orders a calibrator needs (its
        # permutations; the N cyclic rotations for permutation_average by default)
        views: list[RetrievalInstance] = []
        index: dict[tuple[str, tuple[str, ...]], int] = {}

        def view_index(view: RetrievalInstance) -> int:
            key = (view.id, view.image_ids)
            if key not in index:
                index[key] = len(views)
                views.append(view)
            return index[key]

        # per query and calibrator: the orders it predicts from (None: the query alone)
        orders_of = [
            {
                label: calibrator.orders_for(instance, states_by_n[instance.n][label])
                for label, calibrator in self.calibrators.items()
            }
            for instance in instances
        ]
        wanted = [
            (
                view_index(instance),
                {
                    label: [view_index(instance.permuted(order)) for order in group]
                    for label, group in orders.items()
                    if group is not None
                },
            )
            for instance, orders in zip(instances, orders_of, strict=True)
        ]
        # through the runner's plugin contract: a broken plugin adapter is named, not a crash
        observed = observe_cached(self.adapter, views, ObservationCache(), batch_size=batch_size)
        rankings = []
        for instance, (own, others), orders in zip(instances, wanted, orders_of, strict=True):
            states = states_by_n[instance.n]
            predictions = {
                label: calibrator.predict(
                    observed[own],
                    states[label],
                    rotations=[observed[i] for i in others[label]] if label in others else None,
                    orders=orders[label],
                    explain=explain,
                )
                for label, calibrator in self.calibrators.items()
            }
            rankings.append(
                Ranking(
                    query=instance.query,
                    images=instance.images,
                    predictions=predictions,
                    calibrator=self.primary,
                    id=instance.id,
                    target=instance.target,
                    texts=instance.texts,
                )
            )
        return rankings


def _label(spec: CalibratorSpec) -> str:
    if isinstance(spec, Calibrator):
        return spec.name
    if isinstance(spec, str):
        return spec
    raise InputError(
        f"a calibrator must be a registry name or a Calibrator, got {type(spec).__name__}"
    )
