"""The evaluation runner: connects an adapter (observations) with calibrators (predictions).

For every test instance it draws T seeded candidate orders, computes each needed observation
ONCE (the T orders, plus the N cyclic rotations of each order when a calibrator needs them) and
feeds the same observations to every calibrator. Calibrators never see the model; the adapter
never sees a calibrator.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

import numpy as np

import posdebias.defaults as defaults
from posdebias._inputs import check_setting, excerpt, file_identity
from posdebias._io import JsonlAppender, read_jsonl_records
from posdebias._threads import apply_threads
from posdebias.adapters.base import Adapter
from posdebias.benchmarks.files import sha256_file
from posdebias.calibrators.base import Calibrator
from posdebias.core.instance import (
    ImageRef,
    Instance,
    candidate_noun,
    image_key,
    random_orders,
    rotation_order,
)
from posdebias.core.observation import Observation, Prediction, tie_broken, tie_label_wins
from posdebias.core.state import CalibrationState
from posdebias.core.symmetry import symmetrized_calibration_set
from posdebias.errors import InputError, ObservationError, PluginError, PosdebiasError, ResumeError
from posdebias.evaluation.logcheck import (
    check_observation_row,
    check_record_row,
    chosen_key,
    corrupt,
    truth_problem,
)
from posdebias.evaluation.metrics import Metrics, compute_metrics
from posdebias.evaluation.plugins import failure_message, third_party_origin, warn_plugin
from posdebias.registry import get_registry

#: sha256 of files already read, by :func:`file_identity`, so a path alias or a moved folder
#: finds it without resolving the path (``realpath`` took 14% of an N = 12 run: a run asks
#: for each image's digest once per order and rotation).
_DIGESTS: dict[tuple[int, ...], str] = {}
_MAX_DIGESTS = 1 << 16


def _file_digest(path: str) -> str | None:
    """sha256 of an image file's bytes (memoised by the file's identity), None if no file."""
    identity = file_identity(path)
    if identity is None:
        return None
    digest = _DIGESTS.get(identity)
    if digest is None:
        if len(_DIGESTS) >= _MAX_DIGESTS:
            _DIGESTS.clear()
        digest = _DIGESTS[identity] = sha256_file(Path(path))
    return digest


def image_identity(image: ImageRef) -> str:
    """What an image contributes to a forward pass: its file's content hash when it is a
    file (a path alias or a moved folder gives the same identity, another file with the same
    name does not), else its reference text or object identity."""
    if isinstance(image, (str, Path)):
        digest = _file_digest(str(image))
        if digest is not None:
            return f"sha256:{digest}"
    return image_key(image)


def observation_key(instance: Instance) -> str:
    """Cache key of an (instance, candidate order): every input of its forward pass.

    The id, the caption and the images' content in the order shown (a retrieval instance: the
    key of earlier versions); for another task also the task, the stem's images and each
    candidate's text. What is fixed for a whole run (model, prompt template, label set) is the
    run's identity (``run.json``).
    """
    if instance.task == "retrieval":
        parts = [instance.stem, *(image_identity(image) for image in instance.images)]
    else:
        parts = [
            instance.task,
            instance.stem,
            *(image_identity(image) for image in instance.stem_images),
            "\x1e",
            *(
                f"{'' if image is None else image_identity(image)}\x1d{text or ''}"
                for image, text in zip(instance.images, instance.texts, strict=True)
            ),
        ]
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{instance.id}#{digest[:32]}"


def stable_seed(seed: int, instance_id: str) -> list[int]:
    """A seed sequence for one instance that does not depend on its index or shard."""
    digest = hashlib.sha256(instance_id.encode()).digest()
    return [seed, int.from_bytes(digest[:4], "little")]


def instance_orders(
    instance: Instance,
    count: int,
    seed: int,
    *,
    shared: bool = False,
    cyclic: bool = False,
) -> list[np.ndarray]:
    """The T distinct candidate orders of a test instance (a function of seed and instance id
    only); ``shared``: one set for every instance of this N, the identity first (the authors'
    protocol); ``cyclic``: the first T cyclic rotations of the file order (rotation r shows
    position ``(i + r) % N`` at i), the orders of rotated harness tasks and CircularEval."""
    if cyclic:
        if count > instance.n:
            raise InputError(
                f"{count} cyclic orders requested, but {instance.n} candidates have only "
                f"{instance.n} rotations; use orders {instance.n} or fewer"
            )
        return [rotation_order(instance.n, shift) for shift in range(count)]
    if shared:
        return random_orders(instance.n, count, [seed, instance.n], identity_first=True)
    return random_orders(instance.n, count, stable_seed(seed, instance.id))


class _Loggable(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


Value = TypeVar("Value", bound=_Loggable)


class LoggedStore(Generic[Value]):
    """Values by key, each new one appended to a JSONL log (``{"key": key, FIELD:
    value.to_dict()}``) when one is given, so that a resumed run reads them back (:meth:`load`)."""

    field: ClassVar[str]

    def __init__(self, log: JsonlAppender | None = None) -> None:
        self._store: dict[str, Value] = {}
        self._log = log

    def load(self, paths: Sequence[Path]) -> Self:
        """Read earlier logs (all ranks) into this store; returns it."""
        for path in paths:
            for number, row in enumerate(read_jsonl_records(path), start=1):
                try:
                    self._store[row["key"]] = self.read(row)
                except ResumeError as exc:  # named where it stands, as every run log is
                    raise ResumeError(f"{path}: record {number}: {exc}") from None
        return self

    @abstractmethod
    def read(self, row: Any) -> Value:
        """The value of one log record, or a ResumeError (:func:`corrupt`) when this version
        did not write it (an edited or damaged log)."""

    def get(self, key: str) -> Value | None:
        return self._store.get(key)

    def put(self, key: str, value: Value) -> None:
        self._store[key] = value
        if self._log is not None:
            self._log.append({"key": key, self.field: value.to_dict()})

    def __len__(self) -> int:
        return len(self._store)


class ObservationCache(LoggedStore[Observation]):
    """Observations by :func:`observation_key` (logged in a run directory).

    It also keeps the run's one measure of a forward pass's cost: the seconds and the number
    of the passes :func:`observe_cached` ran in this process (observations read from a log or
    reused from the cache cost nothing and are not counted).
    """

    field = "observation"

    def __init__(self, log: JsonlAppender | None = None) -> None:
        super().__init__(log)
        self.pass_seconds = 0.0
        self.passes = 0

    def read(self, row: Any) -> Observation:
        check_observation_row(row)
        try:
            return Observation.from_dict(row["observation"])
        except ObservationError as exc:  # written by no version of ours: an edited log
            raise corrupt(str(exc)) from None

    def seconds_per_pass(self) -> float | None:
        """Mean wall seconds of one forward pass run in this process; None before any."""
        return self.pass_seconds / self.passes if self.passes else None


def observe_cached(
    adapter: Adapter,
    instances: Sequence[Instance],
    cache: ObservationCache,
    *,
    batch_size: int = 1,
) -> list[Observation]:
    """Observations of ``instances``, running the model only for keys not in ``cache`` (their
    seconds are added to the cache's cost of a pass)."""
    keys = [observation_key(instance) for instance in instances]
    missing: dict[str, Instance] = {}
    for key, instance in zip(keys, instances, strict=True):
        if cache.get(key) is None and key not in missing:
            missing[key] = instance
    if missing:
        started = time.perf_counter()
        observed = _observe(adapter, list(missing.values()), batch_size)
        cache.pass_seconds += time.perf_counter() - started
        cache.passes += len(missing)
        for key, observation in zip(missing, observed, strict=True):
            cache.put(key, observation)
    # the key ignores the target, so one cached observation serves a labelled and an
    # unlabelled request: each gets the target of the instance it asked for
    return [
        _with_target(cache.get(key), instance.target)  # type: ignore[arg-type]
        for key, instance in zip(keys, instances, strict=True)
    ]


#: Per calibrator, the candidate orders of a view it predicts from and their views (None: the
#: view alone), as :func:`rotation_views` plans them.
RotationViews = dict[str, tuple[Sequence[np.ndarray], list[Instance]] | None]


def rotation_views(
    view: Instance,
    calibrators: Mapping[str, Calibrator],
    states: Mapping[str, CalibrationState],
) -> RotationViews:
    """What each calibrator reads besides ``view`` (its :meth:`~Calibrator.orders_for`): the
    one plan of an evaluation and of :meth:`~posdebias.Debiaser.rank`."""
    planned: RotationViews = {}
    for label, calibrator in calibrators.items():
        group = calibrator.orders_for(view, states[label])
        planned[label] = None if group is None else (group, [view.permuted(o) for o in group])
    return planned


def predict_view(
    calibrator: Calibrator,
    state: CalibrationState,
    view: Instance,
    planned: tuple[Sequence[np.ndarray], list[Instance]] | None,
    observed: Mapping[int, Observation],
    *,
    explain: bool = False,
) -> tuple[Prediction, list[Observation] | None]:
    """``calibrator``'s tie-broken prediction for ``view`` from the observations (by view
    object, ``observed[id(v)]``) of ``view`` and of its planned rotations, which it returns."""
    group = None if planned is None else [observed[id(v)] for v in planned[1]]
    prediction = calibrator.predict(
        observed[id(view)],
        state,
        rotations=group,
        orders=None if planned is None else planned[0],
        explain=explain,
    )
    return tie_broken(prediction, view.candidate_ids), group


def _with_target(observation: Observation, target: int | None) -> Observation:
    if observation.target == target:
        return observation
    return dataclasses.replace(observation, target=target)  # layers and spans kept


def _observe(adapter: Adapter, instances: list[Instance], batch_size: int) -> list[Observation]:
    """``adapter.observe_many``; a plugin adapter's own failure becomes a PluginError naming it
    (our errors, with their messages for the user, pass through)."""
    apply_threads()  # in this thread: the count of the enclosing torch_threads scope
    try:
        observed = adapter.observe_many(instances, batch_size=batch_size)
    except PosdebiasError:
        raise
    except Exception as exc:
        origin = third_party_origin("adapter", adapter)
        if origin is None:
            raise
        where = f"observing instance {instances[0].id!r}"
        raise PluginError(failure_message("adapter", adapter.name, origin, exc, where)) from exc
    origin = third_party_origin("adapter", adapter) or "posdebias"
    if len(observed) != len(instances):
        raise PluginError(
            f"adapter {adapter.name!r} from {origin} returned {len(observed)} observations for "
            f"{len(instances)} instances; observe_many must return one per instance, in order"
        )
    for instance, observation in zip(instances, observed, strict=True):
        if not isinstance(observation, Observation) or observation.n != instance.n:
            got = (
                f"{observation.n} label scores"
                if isinstance(observation, Observation)
                else f"a {type(observation).__name__}"
            )
            raise PluginError(
                f"adapter {adapter.name!r} from {origin} returned {got} for instance "
                f"{instance.id[:60]!r} with {instance.n} {candidate_noun(instance.task)}; "
                "observe_many must return one Observation over the N candidates per instance"
            )
    return list(observed)


def scored_views(
    instances: Sequence[Instance],
    orders: int,
    seed: int,
    *,
    shared: bool = False,
    cyclic: bool = False,
) -> list[Instance]:
    """Every test instance in each of its T orders (:func:`instance_orders`): what the run
    scores, and what batch calibration averages over."""
    return [
        instance.permuted(order)
        for instance in instances
        for order in instance_orders(instance, orders, seed, shared=shared, cyclic=cyclic)
    ]


def check_calibration_size(count: int) -> None:
    """Refuse more calibration instances than a run may hold out (``calibration_count``'s
    range): each is observed in its N rotations."""
    _, most = defaults.RANGES["calibration_count"]
    if count > most:
        raise InputError(
            f"calibration takes at most {most:,} instances (the range of calibration_count), "
            f"got {count:,}"
        )


def _with_instances(
    observations: Sequence[Observation], instances: Sequence[Instance]
) -> list[Observation]:
    """The symmetrised calibration set's observations (instance-major, N rotations each), each
    told which instance its view shows: the layer choice counts instances, not orders, as
    evidence. Instances are told apart by id, or by their place where ids repeat or are empty
    (an API caller's instances need no ids)."""
    ids = [instance.id for instance in instances]
    if not all(ids) or len(set(ids)) < len(ids):
        ids = [f"{k}:{instance_id}" for k, instance_id in enumerate(ids)]
    per_instance = len(observations) // max(1, len(instances))
    return [
        dataclasses.replace(observation, instance_id=ids[k // per_instance])
        for k, observation in enumerate(observations)
    ]


def check_targets(calibrators: Mapping[str, Calibrator], instances: Sequence[Instance]) -> None:
    """Refuse calibration instances without a target when a calibrator fits from labels
    (before any forward pass), naming the registered calibrators that fit without them."""
    labelled = [label for label, c in calibrators.items() if c.needs_fit and c.needs_targets]
    unknown = [instance.id for instance in instances if instance.target is None]
    if labelled and unknown:
        registry = get_registry()
        classes = {name: registry.calibrator_class(name) for name in registry.calibrator_names()}
        free = [name for name, c in classes.items() if c.needs_fit and not c.needs_targets]
        raise InputError(
            f"calibration instances {unknown[:3]} have no target, but {labelled} fit from "
            "labelled instances; give the targets, or calibrate a calibrator that fits "
            f"without them ({', '.join(free)}) on them"
        )


def fit_calibrators(
    adapter: Adapter,
    calibrators: Mapping[str, Calibrator],
    calibration_instances: Sequence[Instance],
    *,
    batch_size: int = 1,
    cache: ObservationCache | None = None,
    metadata: Mapping[str, Any] | None = None,
    test_views: Sequence[Instance] | None = None,
) -> dict[str, CalibrationState]:
    """Fit every calibrator on the symmetrised calibration set (observed once, shared), or on
    the views its :meth:`~posdebias.calibrators.base.Calibrator.fit_views` asks for
    (``test_views``: every test instance in each of its orders, when the caller knows them).

    The calibration set is observed only when a calibrator fits on it: a calibrator that needs
    no fit (vanilla, permutation_average) costs no forward pass and no second here.
    """
    check_setting("batch_size", batch_size)
    check_calibration_size(len(calibration_instances))
    symmetrized = symmetrized_calibration_set(calibration_instances)
    n = symmetrized[0].n if symmetrized else None
    if any(c.needs_fit for c in calibrators.values()) and not symmetrized:
        raise InputError("calibration needs at least one instance")
    check_targets(calibrators, calibration_instances)
    observations: list[Observation] = []
    cache = cache if cache is not None else ObservationCache()
    wanted = {
        label: calibrator.fit_views(symmetrized, test_views)
        for label, calibrator in calibrators.items()
        if calibrator.needs_fit
    }
    if symmetrized and any(views is None for views in wanted.values()):
        observations = _with_instances(
            observe_cached(adapter, symmetrized, cache, batch_size=batch_size),
            calibration_instances,
        )
    own = {
        label: observe_cached(adapter, views, cache, batch_size=batch_size)
        for label, views in wanted.items()
        if views is not None
    }
    info = {
        "adapter": adapter.name,
        "calibration_ids": [instance.id for instance in calibration_instances],
        **(metadata or {}),
    }
    if n is not None:
        info.setdefault("label_set", adapter.labels_for(n, symmetrized[0].task))
    states = {}
    for label, calibrator in calibrators.items():
        used = own.get(label, observations) if calibrator.needs_fit else []
        try:
            states[label] = calibrator.fit(used, n=n, **info)
        except Exception as exc:
            origin = third_party_origin("calibrator", calibrator)
            if origin is None:
                raise
            message = failure_message("calibrator", calibrator.name, origin, exc, "in fit")
            raise PluginError(message) from exc
    return states


@dataclass
class InstanceRecord:
    """The outcome of one test instance under its T orders, for every calibrator.

    ``orders[t]`` is the permutation shown in order t; ``targets[t]`` the truth position there;
    ``choices[label][t]`` the chosen position and ``chosen[label][t]`` the chosen candidate as
    its position in the base (file) order (``chosen_images`` in logs of 0.2).
    ``rankings[label][t]`` is a calibrator's whole ranking in order t, candidates as base
    positions, best first (decoders answer one label and have none; records of older versions
    neither). ``fingerprints[label]`` identifies the calibrator that chose (class, options, fitted
    state), so a resumed run never reuses a choice of a calibrator that has changed since.
    ``ties[label][t]``: whether a pairwise judge's verdict in order t is its tie label (only
    in runs whose judge template has one, ``task_prompt.tie_label``; docs/evaluation.md).
    """

    instance_id: str
    orders: list[list[int]]
    targets: list[int]
    choices: dict[str, list[int]] = field(default_factory=dict)
    chosen: dict[str, list[int]] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)
    rankings: dict[str, list[list[int]]] = field(default_factory=dict)
    ties: dict[str, list[bool]] = field(default_factory=dict)
    #: where a record read from a log came from (``FILE:LINE``), for messages
    logged_at: str = field(default="", compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "orders": self.orders,
            "targets": self.targets,
            "choices": self.choices,
            "chosen": self.chosen,
            "fingerprints": self.fingerprints,
            **({"rankings": self.rankings} if self.rankings else {}),
            **({"ties": self.ties} if self.ties else {}),
        }

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any], *, logged_at: str = "") -> InstanceRecord:
        check_record_row(payload)  # a tampered log is a clear error, not a wrong metric
        return cls(
            instance_id=str(payload["instance_id"]),
            orders=payload["orders"],
            targets=payload["targets"],
            choices=dict(payload["choices"]),
            chosen=dict(payload[chosen_key(payload)]),
            fingerprints=dict(payload.get("fingerprints") or {}),
            rankings=dict(payload.get("rankings") or {}),
            ties=dict(payload.get("ties") or {}),
            logged_at=logged_at,
        )

    def complete_for(self, fingerprints: Mapping[str, str]) -> bool:
        """Whether this record holds a choice of every calibrator as it is now."""
        return all(
            label in self.choices and self.fingerprints.get(label) == fingerprint
            for label, fingerprint in fingerprints.items()
        )


def check_logged_truth(
    records: Mapping[str, InstanceRecord],
    instances: Sequence[Instance],
    *,
    orders: int,
    seed: int,
    shared: bool = False,
    cyclic: bool = False,
    fix: str,
) -> None:
    """Refuse a logged record that disagrees with its instance: shown in other candidate orders
    than the run draws (:func:`instance_orders`), or with targets other than the benchmark's
    truth in those orders. ``fix`` ends the message (what to do)."""
    for instance in instances:
        record = records.get(instance.id)
        if record is None or instance.target is None:
            continue
        drawn = instance_orders(instance, orders, seed, shared=shared, cyclic=cyclic)
        expected = [order.tolist() for order in drawn]
        problem = truth_problem(record.orders, record.targets, instance.target, expected)
        if problem is not None:
            raise ResumeError(
                f"{record.logged_at or 'a run log'}: the record of instance "
                f"{excerpt(instance.id, 40)} {problem}; the log was edited or belongs to another "
                f"benchmark: {fix}"
            )


@dataclass
class CostAccount:
    """Per calibrator: the forward passes its decisions use and the seconds of its own
    arithmetic (``predict``), over the instances it decided."""

    forward_passes: int = 0
    seconds: float = 0.0
    instances: int = 0

    def seconds_per_instance(self, seconds_per_pass: float) -> float:
        """Seconds per test instance (all orders), one cost model in every run: ``passes x
        seconds_per_pass + the calibrator's own seconds``, with the run's mean cost of a pass,
        however many of the passes were cached or shared with another row."""
        count = max(self.instances, 1)
        return self.forward_passes / count * seconds_per_pass + self.seconds / count


class Evaluator:
    """Runs test instances through the adapter once and through every calibrator."""

    def __init__(
        self,
        adapter: Adapter,
        calibrators: Mapping[str, Calibrator],
        states: Mapping[str, CalibrationState],
        *,
        orders: int = 5,
        seed: int = 0,
        batch_size: int = 1,
        cache: ObservationCache | None = None,
        shared: bool = False,
        cyclic: bool = False,
    ) -> None:
        check_setting("orders", orders)
        check_setting("seed", seed)
        check_setting("batch_size", batch_size)
        missing = [label for label in calibrators if label not in states]
        if missing:
            raise InputError(f"no calibration state for {missing}; fit or load one first")
        self.adapter = adapter
        self.calibrators = dict(calibrators)
        self.states = dict(states)
        self.orders = orders
        self.seed = seed
        self.shared = shared
        self.cyclic = cyclic
        self.batch_size = batch_size
        self.cache = cache if cache is not None else ObservationCache()
        self.costs = {label: CostAccount() for label in self.calibrators}
        #: label -> message, for third-party calibrators that raised (dropped from the run)
        self.failures: dict[str, str] = {}

    def evaluate_instance(self, instance: Instance) -> InstanceRecord:
        if instance.target is None:
            raise InputError(f"test instance {instance.id!r} has no target")
        orders = instance_orders(
            instance, self.orders, self.seed, shared=self.shared, cyclic=self.cyclic
        )
        shown = [instance.permuted(order) for order in orders]
        plans = [rotation_views(view, self.calibrators, self.states) for view in shown]
        rotated = [got[1] for label in self.calibrators for plan in plans if (got := plan[label])]
        wanted = shown + [v for views in rotated for v in views]  # by calibrator, as always
        # by view object (each is alive in `wanted` until the end): a view's observation_key
        # stats its image files, and the views are looked up once per calibrator
        observed = observe_cached(self.adapter, wanted, self.cache, batch_size=self.batch_size)
        observations = {id(v): o for v, o in zip(wanted, observed, strict=True)}
        record = InstanceRecord(
            instance_id=instance.id,
            orders=[order.tolist() for order in orders],
            targets=[view.target for view in shown],  # type: ignore[misc]
        )
        for label, calibrator in list(self.calibrators.items()):
            state = self.states[label]
            choices, images, rankings = [], [], []
            ties: list[bool] = []
            cost = self.costs[label]
            try:
                for t, view in enumerate(shown):
                    started = time.perf_counter()
                    prediction, group = predict_view(
                        calibrator, state, view, plans[t][label], observations
                    )
                    cost.seconds += time.perf_counter() - started
                    cost.forward_passes += 1 if group is None else len(group)
                    choices.append(prediction.choice)
                    images.append(int(orders[t][prediction.choice]))
                    rankings.append([int(orders[t][k]) for k in prediction.ranking])
                    tie = tie_verdict(group or [observations[id(view)]], prediction)
                    if tie is not None:
                        ties.append(tie)
            except Exception as exc:
                origin = third_party_origin("calibrator", calibrator)
                if origin is None:
                    raise  # posdebias's own calibrator: a bug, reported as such
                self._drop(
                    label,
                    failure_message(
                        "calibrator", calibrator.name, origin, exc, f"on instance {instance.id!r}"
                    ),
                )
                continue
            cost.instances += 1
            record.choices[label] = choices
            record.chosen[label] = images
            record.rankings[label] = rankings
            if ties:
                record.ties[label] = ties
        return record

    def seconds_per_instance(self) -> dict[str, float]:
        """Row -> seconds per test instance by :meth:`CostAccount.seconds_per_instance`'s one
        cost model (empty when no forward pass ran in this process to measure a pass by)."""
        per_pass = self.cache.seconds_per_pass()
        if per_pass is None:
            return {}
        return {label: cost.seconds_per_instance(per_pass) for label, cost in self.costs.items()}

    def _drop(self, label: str, message: str) -> None:
        """Stop running a failed third-party calibrator; the others carry on."""
        self.failures[label] = message
        del self.calibrators[label], self.costs[label]
        warn_plugin(f"{message}; dropped from the run, the other calibrators carry on")

    def run(
        self,
        instances: Iterable[Instance],
        *,
        on_record: Callable[[InstanceRecord], None] | None = None,
    ) -> list[InstanceRecord]:
        records = []
        for instance in instances:
            record = self.evaluate_instance(instance)
            records.append(record)
            if on_record is not None:
                on_record(record)
        return records


def tie_verdict(observations: Sequence[Observation], prediction: Prediction) -> bool | None:
    """Whether a judge's tie label wins in one order (:func:`tie_label_wins`), its probability
    the mean over the observations the calibrator predicted from (one order, or all that
    ``permutation_average`` averages, as it averages the answers'); None without a tie label."""
    tied = [o.tie_logprob for o in observations if o.tie_logprob is not None]
    if not tied:
        return None
    return tie_label_wins(float(np.mean(np.exp(tied))), prediction.probabilities)


def summarize(
    records: Sequence[InstanceRecord], labels: Iterable[str], n: int
) -> dict[str, Metrics]:
    """Metrics per calibrator label from instance records (all with the same T)."""
    if not records:
        raise InputError("no evaluated instances to summarise")
    targets = np.array([record.targets for record in records])
    summary = {}
    for label in labels:
        choices = np.array([record.choices[label] for record in records])
        images = np.array([record.chosen[label] for record in records])
        metrics = compute_metrics(targets, choices, images, n)
        tied = np.array([record.ties.get(label) or [False] * len(choices[0]) for record in records])
        if tied.any():
            # a generated answer of the tie label has no answer chosen but parsed: no failure
            failed = float(np.mean((choices < 0) & ~tied))
            metrics = metrics.model_copy(update={"no_answer": 100.0 * failed})
        summary[label] = metrics
    return summary
