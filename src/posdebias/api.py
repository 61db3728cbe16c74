"""The library API for application code: calibrate once, then rank the candidates of queries.

A :class:`Debiaser` holds a model adapter and one or several calibrators. Calibrators that need
no fit (vanilla, attention_readout, permutation_average) work at once; the others are fitted
with :meth:`Debiaser.calibrate` (with labelled instances, or unlabelled ones for label_free) or
loaded with :meth:`Debiaser.load`. Every query is observed ONCE per candidate order and that
observation feeds every calibrator; :meth:`Debiaser.rank_many` streams many queries through the
adapter's batches. In a service, :meth:`Debiaser.arank` answers from ``async`` code: the
forward runs off the event loop, and concurrent requests are micro-batched into one forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from posdebias._inputs import check_setting, excerpt, usable_path
from posdebias._threads import check_threads, torch_threads
from posdebias.adapters.base import Adapter
from posdebias.calibrators.base import Calibrator
from posdebias.core.instance import TASK_KINDS, ImageRef, Instance, image_key
from posdebias.core.observation import Evidence, Prediction, record_fields
from posdebias.core.state import CalibrationState, calibration_error
from posdebias.core.tasks import TEXT_TASKS
from posdebias.errors import Advice, CalibrationError, InputError, ObservationError, PluginError
from posdebias.evaluation.plugins import failure_message, third_party_origin
from posdebias.evaluation.runner import (
    ObservationCache,
    check_calibration_size,
    check_targets,
    fit_calibrators,
    observe_cached,
    predict_view,
    rotation_views,
)
from posdebias.evaluation.states import (
    StateRefusals,
    check_label,
    check_replaceable,
    check_state,
    fitted_for_other_n,
    load_states,
    prompt_hashes,
    row_label,
    save_states,
    state_file,
    state_key,
    state_metadata,
    two_states_error,
)
from posdebias.registry import get_registry

Query: TypeAlias = Instance | tuple[str, Sequence[ImageRef]]
"""What :meth:`Debiaser.rank_many` accepts per query: an :class:`Instance` of any task,
or a ``(caption, images)`` pair (a retrieval query)."""

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
        return replace(self, calibrator=calibrator)

    @property
    def prediction(self) -> Prediction:
        return self.predictions[self.calibrator]

    @property
    def choice(self) -> int:
        """0-based position of the chosen candidate (in ``images`` and ``texts``)."""
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
        """Candidate positions from best to worst."""
        return self.prediction.ranking

    @property
    def ranked_images(self) -> list[ImageRef | None]:
        """The caller's image references from best to worst."""
        return [self.images[k] for k in self.order]

    @property
    def probabilities(self) -> np.ndarray:
        """Calibrated probability of each candidate, in the order given."""
        return self.prediction.probabilities

    @property
    def scores(self) -> np.ndarray:
        """Calibrated log-scores, in the order given."""
        return self.prediction.scores

    @property
    def evidence(self) -> Evidence | None:
        """Why the candidate won (label probabilities, attention, posterior, expected bias), when
        asked for with ``explain=True``; per candidate position."""
        return self.prediction.evidence

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of plain Python types (what a web service returns).

        ``images`` are written as text: a path as its text, an in-memory image as its key
        (``<Image@7f...>``: JSON holds no pixels). ``choice``, ``order`` and ``probabilities``
        are the answer of ``calibrator``, for readers; ``predictions`` hold every calibrator's
        (:meth:`Prediction.to_dict`). :meth:`from_dict` reads it back.
        """
        return {
            "id": self.id,
            "query": self.query,
            "images": [None if image is None else image_key(image) for image in self.images],
            "texts": list(self.texts),
            "target": self.target,
            "calibrator": self.calibrator,
            "choice": self.choice,
            "order": self.order,
            "probabilities": self.probabilities.tolist(),
            "predictions": {
                label: prediction.to_dict() for label, prediction in self.predictions.items()
            },
        }

    @classmethod
    def from_dict(cls, payload: Any) -> Ranking:
        """The ranking :meth:`to_dict` wrote (images come back as the text it wrote);
        an ObservationError names what a damaged record lacks."""
        known = _RANKING_FIELDS | {"choice", "order", "probabilities"}  # derived, for readers
        payload = record_fields("ranking", payload, known, _RANKING_FIELDS)
        for name in ("images", "texts"):
            if not isinstance(payload[name], list):
                raise ObservationError(
                    f"ranking record: {name} must be a list, got {type(payload[name]).__name__}"
                )
        predictions = payload["predictions"]
        if not isinstance(predictions, dict) or payload["calibrator"] not in predictions:
            raise ObservationError(
                f"ranking record: calibrator {excerpt(payload['calibrator'])} has no entry in "
                "its predictions"
            )
        target = payload["target"]
        if target is not None and (isinstance(target, bool) or not isinstance(target, int)):
            raise ObservationError(f"ranking record: target must be an int, got {excerpt(target)}")
        ranking = cls(
            query=str(payload["query"]),
            images=tuple(payload["images"]),
            predictions={
                str(label): Prediction.from_dict(value) for label, value in predictions.items()
            },
            calibrator=str(payload["calibrator"]),
            id=str(payload["id"]),
            target=target,
            texts=tuple(payload["texts"]),
        )
        sizes = {len(ranking.scores), len(ranking.images)} | (
            {len(ranking.texts)} if ranking.texts else set()
        )
        if len(sizes) != 1:
            raise ObservationError(
                "ranking record: its images, texts and scores differ in length "
                f"({len(ranking.images)}, {len(ranking.texts)}, {len(ranking.scores)})"
            )
        return ranking


_RANKING_FIELDS = {"id", "query", "images", "texts", "target", "calibrator", "predictions"}


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
        ident = _query_id(caption, [image_key(image) for image in images])
        return Instance(stem=caption, images=tuple(images), target=None, id=ident)
    raise InputError(
        "each query must be an Instance (any task) or a (caption, images) pair (retrieval), "
        f"got {type(query).__name__}"
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

    ``threads``: torch CPU threads while it runs the model (None: a count the caller chose with
    ``--threads``, else half the CPUs or ``OMP_NUM_THREADS``; torch's own setting is restored
    after each call). ``max_batch`` and ``max_wait`` bound the micro-batches of :meth:`arank`:
    at most ``max_batch`` queries per forward, a query waiting at most ``max_wait`` seconds for
    others to join it.

    Thread safety: every ranking method may be called from several threads (and tasks) at
    once. Calibration states are replaced whole by :meth:`calibrate`, never changed in place,
    and each call reads them once, so a call running while another calibrates answers with the
    old calibration or the new one, never a mix.
    """

    def __init__(
        self,
        adapter: Adapter,
        calibrator: CalibratorSpec | Sequence[CalibratorSpec] | Mapping[str, CalibratorSpec] = (
            "attention_guided"
        ),
        *,
        batch_size: int = 1,
        threads: int | None = None,
        max_batch: int = 16,
        max_wait: float = 0.005,
        **options: Any,
    ) -> None:
        self.adapter = adapter
        self.batch_size = check_setting("batch_size", batch_size)
        self.threads = None if threads is None else check_threads(threads)
        self.max_batch = check_setting("batch_size", max_batch)
        if (
            isinstance(max_wait, bool)
            or not isinstance(max_wait, (int, float))
            or not 0 <= max_wait <= MAX_WAIT
        ):
            raise InputError(
                f"max_wait must be a number of seconds from 0 to {MAX_WAIT}, got "
                f"{excerpt(max_wait)}"
            )
        self.max_wait = float(max_wait)
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
        for label in specs:
            check_label(label)  # it names the state's file, as in a config
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
        # N -> label -> state; replaced whole, never changed in place (see thread safety)
        self._fitted: dict[int, dict[str, CalibrationState]] = {}
        # (N, label) -> (a state read from a file, that file): named when a query refuses it
        self._files: dict[tuple[int, str], tuple[CalibrationState, str]] = {}
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _MicroBatcher] = (
            weakref.WeakKeyDictionary()
        )
        self._batchers_lock = threading.Lock()
        #: whether loaded states fitted on another model are used on purpose (Debiaser.load)
        self.transfer = False

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
    def states(self) -> dict[str, CalibrationState]:
        """label -> state for the first N calibrated (:meth:`states_for` gives another N's)."""
        return next(iter(self._fitted.values()), {})

    @states.setter
    def states(self, states: Mapping[str, CalibrationState]) -> None:
        fitted: dict[int, dict[str, CalibrationState]] = {}
        for label, state in states.items():
            fitted.setdefault(state.n, {})[label] = state
        self._files = {}
        self._fitted = fitted

    @property
    def calibrated_n(self) -> list[int]:
        """The numbers of candidates N the debiaser holds fitted states for."""
        return sorted(self._fitted)

    def states_for(self, n: int) -> dict[str, CalibrationState]:
        """label -> state fitted for N = ``n`` (empty when none is)."""
        return dict(self._fitted.get(n, {}))

    @property
    def state(self) -> CalibrationState | None:
        """The first calibrator's state (None before calibration)."""
        return self.states.get(self.primary)

    def calibrate(self, instances: Sequence[Instance]) -> CalibrationState:
        """Fit every calibrator that needs it on the N cyclic rotations of ``instances``.

        Calibrators that fit from labels (attention_guided, attention_readout and
        purified_attention: their layers are chosen by how often they point at the target) need each
        instance's ``target``; label-free ones (label_free, pride, contextual, batch) use instances
        without targets too. ``pride`` with ``workflow: test`` is PriDe's own workflow: calibrate on
        the instances you will rank; a share ``alpha`` of them is then answered by permutation
        averaging and their prior debiases the rest. The rotations are observed once and shared;
        when no calibrator needs a fit nothing is observed. A fitted state serves one N (a bias
        matrix is N x N): instances of several N fit one state per N, and queries of each N are then
        answered. Returns the first calibrator's state for the first instance's N (all are in
        :meth:`states_for`).
        """

        instances = list(instances)
        if not instances:
            raise InputError("calibrate needs at least one instance")
        groups: dict[int, list[Instance]] = {}
        for instance in instances:
            groups.setdefault(instance.n, []).append(instance)
        for group in groups.values():
            check_calibration_size(len(group))
        fitting = {label: c for label, c in self.calibrators.items() if c.needs_fit}
        check_targets(fitting, instances)  # every N's instances, before any is fitted
        fitted: dict[int, dict[str, CalibrationState]] = {}
        with self._threads():
            for n, group in groups.items():
                task = group[0].task
                metadata = state_metadata(self.adapter, task, n)
                states = (
                    fit_calibrators(
                        self.adapter, fitting, group, batch_size=self.batch_size, metadata=metadata
                    )
                    if fitting
                    else {}
                )
                for label, calibrator in self.calibrators.items():
                    if label not in states:
                        states[label] = self._trivial_state(calibrator, n, task)
                fitted[n] = {label: states[label] for label in self.calibrators}
        for n, states in fitted.items():
            for label, state in states.items():
                warning = state.diagnostics.get("warning")
                if warning:
                    where = f" (N={n})" if len(fitted) > 1 else ""
                    warnings.warn(f"{label}{where}: {warning}", CalibrationWarning, stacklevel=2)
        self._files = {}
        self._fitted = fitted
        return fitted[instances[0].n][self.primary]

    def _trivial_state(self, calibrator: Calibrator, n: int, task: str) -> CalibrationState:
        """The state of a calibrator that needs no fit (no forward pass)."""
        return calibrator.fit(
            [],
            n=n,
            adapter=self.adapter.name,
            label_set=self.adapter.labels_for(n, task),
            **state_metadata(self.adapter, task, n),
        )

    def _fits_prompt(self, state: CalibrationState, task: str) -> bool:
        return state.prompt_hash in prompt_hashes(self.adapter, task, state.n)

    def _fitted_on(self, state: CalibrationState) -> str:
        """The task ``state`` was fitted on: the first whose prompt and labels it records
        (retrieval where none fits: the gate then names the mismatch)."""
        return next(
            (
                t
                for t in TASK_KINDS
                if self._fits_prompt(state, t)
                and state.label_set in (None, self.adapter.labels_for(state.n, t))
            ),
            "retrieval",
        )

    def fitted_task(self, n: int | None = None) -> str | None:
        """The task the held states (those for N = ``n``, if given) were fitted on: what a
        query is posed as unless it says (None without states, or when they were fitted on
        several tasks)."""
        tasks = {
            self._fitted_on(state)
            for states_n, by_label in self._fitted.items()
            if n in (None, states_n)
            for state in by_label.values()
        }
        return tasks.pop() if len(tasks) == 1 else None

    def _states(
        self, n: int, task: str, fitted: Mapping[int, Mapping[str, CalibrationState]]
    ) -> dict[str, CalibrationState]:
        """The state of every calibrator for a query of N = ``n`` on ``task``, checked by the
        one gate of every door (:func:`~posdebias.evaluation.states.check_state`); a calibrator
        fitted for other N only is refused, naming the N it was fitted for."""
        states = {}
        for label, calibrator in self.calibrators.items():
            state = fitted.get(n, {}).get(label)
            if not calibrator.needs_fit and (state is None or not self._fits_prompt(state, task)):
                state = self._trivial_state(calibrator, n, task)
            if state is None:
                fitted_for = [k for k, by_label in sorted(fitted.items()) if label in by_label]
                if not fitted_for:
                    raise CalibrationError(
                        f"calibrator {label!r} is not calibrated: call .calibrate(instances) "
                        "or Debiaser.load(path, adapter) first"
                    )
                raise fitted_for_other_n(label, fitted_for, n, "this query")
            fitted_on = self._fitted_on(state)
            if not self._fits_prompt(state, task) and self._fits_prompt(state, fitted_on):
                raise calibration_error(
                    f"calibrator {label!r} was fitted on {fitted_on} queries, and this one is "
                    f"posed as {task}: ",
                    Advice(
                        f"pose it as {fitted_on} (task={fitted_on!r}) or calibrate on {task} "
                        "queries",
                        f"pose it as {fitted_on} (--task {fitted_on}) or calibrate on {task} "
                        "queries",
                        f"calibrate on {task} queries (calibration=<a benchmark folder of "
                        f"{task} queries> in the model arguments)",
                    ),
                )
            read = self._files.get((n, label))
            source = read[1] if read is not None and read[0] is state else repr(label)
            states[label] = check_state(
                state, self.adapter, calibrator, n, task, transfer=self.transfer, source=source
            )
        return states

    def _threads(self) -> contextlib.AbstractContextManager[int]:
        return torch_threads(self.threads, user=self.threads is not None)

    # -- persistence -----------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Save the calibration: one JSON file for one calibrator and one N, else a directory
        holding ``<label>.json`` per calibrator (``<label>.n<N>.json`` when several N are
        calibrated). Returns the path written."""
        path, fitted = usable_path(path, "Debiaser.save"), self._fitted
        missing = [
            label for label in self.calibrators if not any(label in s for s in fitted.values())
        ]
        if missing:
            raise CalibrationError(
                f"calibrators {missing} are not calibrated: call .calibrate(instances) first"
            )
        if len(fitted) == 1 and len(self.calibrators) == 1:
            check_replaceable(Path(path))
            return next(iter(fitted.values()))[self.primary].save(path)
        save_states(
            {
                state_key(label, n, len(fitted) > 1): state
                for n, states in fitted.items()
                for label, state in states.items()
            },
            path,
        )  # together, never over a file that is not a state
        return Path(path)

    @classmethod
    def load(
        cls,
        path: str | Path,
        adapter: Adapter,
        *,
        batch_size: int = 1,
        transfer: bool = False,
        threads: int | None = None,
    ) -> Debiaser:
        """A debiaser from what :meth:`save` wrote (a file, or a directory of files in name
        order); refused if made with another adapter or prompt, or on another model unless
        ``transfer`` says that is intended."""
        refusals = StateRefusals()  # unreadable files and refused states, named together
        states = load_states(path := usable_path(path, "Debiaser.load"), refusals)
        registry = get_registry()
        calibrators: dict[str, Calibrator] = {}
        for stem, state in states.items():
            label = row_label(stem, state)
            if label not in calibrators:  # the same calibrator fitted for another N: checked
                try:
                    calibrators[label] = registry.create_calibrator(
                        state.calibrator, **state.options
                    )
                except InputError as exc:
                    where = state_file(Path(path), stem)
                    refusals.add(CalibrationError(f"calibration state {where}: {exc}"))
        if not calibrators:
            refusals.raise_any()
        debiaser = cls(adapter, calibrators, batch_size=batch_size, threads=threads)
        made = {k: v for k, v in states.items() if row_label(k, v) in calibrators}
        sources = {key: state_file(Path(path), key) for key in made}
        debiaser.use_states(made, transfer=transfer, refusals=refusals, sources=sources)
        return debiaser

    def use_states(
        self,
        states: Mapping[str, CalibrationState],
        *,
        transfer: bool = False,
        refusals: StateRefusals | None = None,
        sources: Mapping[str, str] | None = None,
    ) -> None:
        """Use saved ``states`` (by calibrator label, ``<label>.n<N>`` for one of several N),
        each checked by the one gate of every door
        (:func:`~posdebias.evaluation.states.check_state`) for the task whose prompt it was
        fitted on; each query is checked again for its own task and N when it is ranked.
        ``transfer``: states fitted on another model are used on purpose. ``refusals``: those
        found while the states were read (unreadable files), raised with these checks' own.
        ``sources``: where each state was read from (its file), named when it is refused."""
        refusals = refusals if refusals is not None else StateRefusals()
        fitted: dict[int, dict[str, CalibrationState]] = {}
        files: dict[tuple[int, str], tuple[CalibrationState, str]] = {}
        uses: dict[tuple[str, int], list[str]] = {}
        for stem, state in states.items():
            uses.setdefault((row_label(stem, state), state.n), []).append(stem)
        for (label, n), stems in uses.items():
            if len(stems) > 1:  # each door would pick its own
                refusals.add(two_states_error(label, n, stems))
        for stem, state in states.items():
            label = row_label(stem, state)
            if len(uses[label, state.n]) > 1:
                continue
            calibrator = self.calibrators.get(label)
            if calibrator is None:
                refusals.add(
                    CalibrationError(
                        f"a state is given for calibrator {label!r}, but this debiaser runs "
                        f"{list(self.calibrators)}"
                    )
                )
                continue
            with refusals.checking():
                check_state(
                    state,
                    self.adapter,
                    calibrator,
                    state.n,
                    self._fitted_on(state),
                    transfer=transfer,
                    source=(sources or {}).get(stem, repr(stem)),
                )
                fitted.setdefault(state.n, {})[label] = state
                if sources is not None and stem in sources:
                    files[state.n, label] = (state, sources[stem])
        refusals.raise_any()
        self._files = files
        self._fitted = fitted
        self.transfer = transfer

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
        posed as ``task``, else as the text task the states for their N were fitted on
        (:meth:`fitted_task`), else as ``multiple_choice``; both for images with a text.
        ``stem_images``: images of the question itself.
        """
        task = self._posed_as(task, texts)
        instance = _query_instance(query, images, texts, stem_images, task)
        return self._rank_chunk([instance], self.batch_size, [explain])[0]

    def _posed_as(self, task: str | None, texts: Sequence[str | None] | None) -> str | None:
        """A text query's task when it names none: the text task its N's states were fitted on."""
        if task is not None or texts is None:
            return task
        fitted = self.fitted_task(len(texts))
        return fitted if fitted in TEXT_TASKS else None

    def rank_many(
        self,
        queries: Iterable[Query],
        *,
        batch_size: int | None = None,
        explain: bool = False,
    ) -> Iterator[Ranking]:
        """Rankings of many queries, yielded in order as each batch is done.

        ``queries`` may be any iterable (a generator over a file is read lazily): each item a
        :class:`Instance` or a ``(caption, images)`` pair. ``batch_size`` queries
        (default: the debiaser's) are observed per adapter batch; calibrators that need the N
        rotations observe the batch's rotations together.
        """
        size = self.batch_size if batch_size is None else check_setting("batch_size", batch_size)
        iterator = iter(queries)
        while True:
            chunk = [_as_instance(query) for query in islice(iterator, size)]
            if not chunk:
                return
            yield from self._rank_chunk(chunk, size, [explain] * len(chunk))

    async def arank(
        self,
        query: str,
        images: Sequence[ImageRef | None] = (),
        *,
        texts: Sequence[str | None] | None = None,
        stem_images: Sequence[ImageRef] = (),
        task: str | None = None,
        explain: bool = False,
    ) -> Ranking:
        """:meth:`rank` for ``async`` code: the model runs in a worker thread, so the event loop
        keeps serving; the queries of concurrent calls are answered together, in one forward of
        up to ``max_batch`` queries (a query waits at most ``max_wait`` seconds for others).

        The answer is :meth:`rank`'s for the same query (equal up to float rounding: a batch's
        arithmetic may differ in the last bits). A bad query fails its own call only.
        """
        instance = _query_instance(query, images, texts, stem_images, self._posed_as(task, texts))
        return await self._submit(instance, explain)

    async def arank_many(self, queries: Iterable[Query], *, explain: bool = False) -> list[Ranking]:
        """:meth:`rank_many` for ``async`` code: every query through :meth:`arank`'s
        micro-batches (with those of concurrent calls), the rankings in the order given."""
        instances = [_as_instance(query) for query in queries]
        return list(await asyncio.gather(*(self._submit(i, explain) for i in instances)))

    async def _submit(self, instance: Instance, explain: bool) -> Ranking:
        fitted = self._fitted
        if instance.n not in fitted and any(c.needs_fit for c in self.calibrators.values()):
            self._states(instance.n, instance.task, fitted)  # no calibration: the caller's error
        loop = asyncio.get_running_loop()
        with self._batchers_lock:
            batcher = self._batchers.get(loop)
            if batcher is None:
                batcher = self._batchers[loop] = _MicroBatcher(
                    # max_batch read at each chunk: a caller may change it between calls
                    lambda chunk, explain: self._rank_chunk(chunk, self.max_batch, explain),
                    self.max_batch,
                    self.max_wait,
                )
        return await batcher.submit(instance, explain)

    def _rank_chunk(
        self, instances: list[Instance], batch_size: int, explain: Sequence[bool]
    ) -> list[Ranking]:
        fitted = self._fitted  # one snapshot for the whole call (see thread safety)
        uses = dict.fromkeys((i.n, i.task) for i in instances)
        states_by_use = {use: self._states(*use, fitted) for use in uses}
        # the query as given, plus the orders a calibrator needs (its permutations; the N
        # cyclic rotations for permutation_average by default), each observed once
        plans = [
            rotation_views(instance, self.calibrators, states_by_use[(instance.n, instance.task)])
            for instance in instances
        ]
        wanted = [
            view
            for instance, plan in zip(instances, plans, strict=True)
            for view in (instance, *(v for got in plan.values() if got for v in got[1]))
        ]
        # through the runner's plugin contract: a broken plugin adapter is named, not a crash
        with self._threads():
            observed = observe_cached(
                self.adapter, wanted, ObservationCache(), batch_size=batch_size
            )
        observations = {id(v): o for v, o in zip(wanted, observed, strict=True)}
        rankings = []
        for instance, plan, shown in zip(instances, plans, explain, strict=True):
            states = states_by_use[(instance.n, instance.task)]
            predictions = {}
            for label, calibrator in self.calibrators.items():
                try:
                    predictions[label], _ = predict_view(
                        calibrator,
                        states[label],
                        instance,
                        plan[label],
                        observations,
                        explain=shown,
                    )
                except Exception as exc:  # a plugin's calibrator: named, as evaluate names it
                    origin = third_party_origin("calibrator", calibrator)
                    if origin is None:
                        raise  # posdebias's own: a bug, reported as such
                    where = f"on query {instance.id!r}"
                    raise PluginError(
                        failure_message("calibrator", calibrator.name, origin, exc, where)
                    ) from exc
            rankings.append(
                Ranking(
                    query=instance.stem,
                    images=instance.images,
                    predictions=predictions,
                    calibrator=self.primary,
                    id=instance.id,
                    target=instance.target,
                    texts=instance.texts,
                )
            )
        return rankings


#: The longest a query of :meth:`Debiaser.arank` may be held for others to join its batch (s).
MAX_WAIT = 1.0


@dataclass
class _Request:
    instance: Instance
    explain: bool
    future: asyncio.Future[Ranking]
    arrived: float


@dataclass
class _MicroBatcher:
    """The queries of one event loop's concurrent :meth:`Debiaser.arank` calls, answered in
    forward batches by a worker thread, one batch at a time.

    A batch closes when it holds ``max_batch`` queries or its first query has waited
    ``max_wait`` seconds; while the model runs one batch the next one fills (a busy service
    batches more, an idle one answers at once after ``max_wait``). A batch that fails is
    answered query by query, so one bad query fails only its own call.
    """

    run: Callable[[list[Instance], list[bool]], list[Ranking]]
    max_batch: int
    max_wait: float
    pending: list[_Request] = field(default_factory=list)
    full: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def submit(self, instance: Instance, explain: bool) -> Ranking:
        loop = asyncio.get_running_loop()
        request = _Request(instance, explain, loop.create_future(), loop.time())
        self.pending.append(request)
        if len(self.pending) >= self.max_batch:
            self.full.set()
        if self.task is None or self.task.done():
            self.task = loop.create_task(self._drain())
        return await request.future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        batch: list[_Request] = []
        try:
            while self.pending:
                left = self.pending[0].arrived + self.max_wait - loop.time()
                if len(self.pending) < self.max_batch and left > 0:
                    self.full.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.full.wait(), left)
                batch = self.pending[: self.max_batch]
                del self.pending[: self.max_batch]
                await self._answer([r for r in batch if not r.future.done()])
                batch = []
        except BaseException:  # cancelled with the loop: no caller waits forever
            for request in [*batch, *self.pending]:
                request.future.cancel()
            self.pending.clear()
            raise

    async def _answer(self, batch: list[_Request]) -> None:
        if not batch:
            return
        try:
            rankings = await asyncio.to_thread(
                self.run, [r.instance for r in batch], [r.explain for r in batch]
            )
        except Exception as exc:
            if len(batch) == 1:
                if not batch[0].future.done():
                    batch[0].future.set_exception(exc)
                return
            for request in batch:  # alone: the bad query fails only itself
                await self._answer([request])
            return
        for request, ranking in zip(batch, rankings, strict=True):
            if not request.future.done():
                request.future.set_result(ranking)


def _query_instance(
    query: str,
    images: Sequence[ImageRef | None],
    texts: Sequence[str | None] | None,
    stem_images: Sequence[ImageRef],
    task: str | None,
) -> Instance:
    """The instance of a :meth:`Debiaser.rank` call's arguments (its id hashes them)."""
    if texts is None and not stem_images and task in (None, "retrieval"):
        return _as_instance((query, images))
    if isinstance(texts, str):  # tuple("abcd") would pose four one-letter candidates
        raise InputError(
            f"the texts of query {excerpt(query)} must be a list of candidate texts, got one "
            "string; pass texts=[...]"
        )
    texts = tuple(texts or ())
    keys = [image_key(image) for image in (*stem_images, *images) if image is not None]
    return Instance(
        stem=query,
        images=tuple(images),
        texts=texts,
        stem_images=tuple(stem_images),
        id=_query_id(query, keys + [text or "" for text in texts]),
        task=task or "multiple_choice",
    )


def _query_id(query: str, keys: list[str]) -> str:
    """The id of a query given without one: a hash of its text and its candidates' keys."""
    joined = "\x1f".join(keys)
    return "query-" + hashlib.sha1(f"{query}\x1e{joined}".encode()).hexdigest()[:12]


def _label(spec: CalibratorSpec) -> str:
    if isinstance(spec, Calibrator):
        return spec.name
    if isinstance(spec, str):
        return spec
    raise InputError(
        f"a calibrator must be a registry name or a Calibrator, got {type(spec).__name__}"
    )
