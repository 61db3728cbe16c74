"""What every harness integration shares: its documents as instances, one calibrated Debiaser.

A harness (lmms-eval, VLMEvalKit) hands a model one request at a time: a prompt it built and
a document. posdebias needs the structure behind the prompt (the query and its N candidates),
so :func:`doc_instance` reads it from the document and refuses, naming the task, a document it
cannot read (no candidates: a free-form question). :class:`HarnessDebiaser` loads the model
once, calibrates once per run (from a saved ``posdebias calibrate`` state, a benchmark folder,
or the task's own held-out items), shares that calibration across the harness's processes
(rank 0 fits and writes, the others wait and read), and records where it came from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

import posdebias.defaults as defaults
from posdebias._inputs import CONFIG_LIMIT, UsableName, parse_json, read_input_text
from posdebias._io import cache_root
from posdebias._rundir import RunFolder
from posdebias._version import __version__
from posdebias.adapters.base import Adapter
from posdebias.api import Debiaser, Ranking
from posdebias.benchmarks.files import MANIFEST_FILE, load_benchmark, sha256_file
from posdebias.benchmarks.tasks import answer_index
from posdebias.core.instance import Instance
from posdebias.core.observation import Prediction
from posdebias.core.state import CalibrationState
from posdebias.errors import (
    CalibrationError,
    ConfigError,
    InputError,
    PosdebiasError,
    validation_message,
)
from posdebias.evaluation.job import calibration_items
from posdebias.evaluation.states import (
    StateRefusals,
    load_states,
    row_source,
    row_states,
    save_states,
    state_key,
    states_folder,
)
from posdebias.loading import load_adapter
from posdebias.registry import get_registry

#: Document fields that the rotated tasks (:mod:`posdebias.integrations.lmms_eval_tasks`)
#: add: the base item, the rotation shown, the order (new position i shows base candidate
#: order[i]), the calibrator whose answer the task scores, and the labels the task expects.
ITEM, ROTATION, ORDER, CALIBRATOR, LABELS = (
    "posdebias_item",
    "posdebias_rotation",
    "posdebias_order",
    "posdebias_calibrator",
    "posdebias_labels",
)

#: Where a task keeps the held-out items that ``calibration=task`` calibrates on.
CALIBRATION_SPLIT = "calibration"
#: Document field of a rotated task: the digest of its calibration split as written
#: (:func:`posdebias.integrations.lmms_eval_tasks.items_digest`), checked when it is read.
CALIBRATION_ITEMS = "posdebias_calibration_items"
#: Document field of a rotated lm-eval task: the file of its calibration split (lm-eval hands
#: a model its requests' documents only, not the task's other splits).
CALIBRATION_FILE = "posdebias_calibration_file"
#: ``calibration=task``: calibrate on the task's own held-out items.
FROM_TASK = "task"


#: The calibration provenance of this process's harness model (one model per harness run):
#: the rotated tasks' records carry it into the harness's sample logs.
_PROVENANCE: dict[str, Any] | None = None
#: What a shared calibration folder of the cache records about its fit (and marks it ours).
PROVENANCE_FILE = "provenance.json"


def current_provenance() -> dict[str, Any] | None:
    """Where this process's harness model got its calibration (None before it calibrated)."""
    return _PROVENANCE


class TaskMappingError(InputError):
    """A harness task whose documents posdebias cannot turn into N candidates."""


def parse_names(value: Any) -> list[str]:
    """A list of names from a harness argument: harnesses split their model arguments on
    commas, so lists are written ``a+b`` or ``a;b`` (a quoted ``"a,b"`` works too)."""
    if isinstance(value, (list, tuple)):
        items = [str(item) for item in value]
    else:
        items = re.split(r"[,;+|]", str(value).strip().strip("'\""))
    names = [item.strip() for item in items if item.strip()]
    if not names:
        raise ConfigError("calibrators: give at least one name, e.g. calibrators=attention_guided")
    return names


class HarnessConfig(BaseModel):
    """The settings a harness passes (``--model_args`` in lmms-eval, keyword arguments in
    VLMEvalKit's config); unknown settings are refused with the list of known ones."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    pretrained: UsableName = Field(description="model id or local folder (or posdebias/organism)")
    calibrators: list[str] = Field(
        default_factory=lambda: ["attention_guided"],
        description="calibrator names; the first answers requests of tasks that name none",
    )
    calibration: UsableName | None = Field(
        default=None,
        description="a saved `posdebias calibrate` state (file or folder), a benchmark folder, "
        "or 'task' (the task's held-out calibration split)",
    )
    calibration_count: int = Field(
        default=defaults.CALIBRATION_COUNT,
        ge=1,
        le=defaults.MAX_CALIBRATION,
        description="items M to calibrate on",
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=defaults.MAX_SEED,
        description="which calibration_count items of a larger calibration (as evaluate's seed)",
    )
    calibration_transfer: bool = Field(
        default=False, description="allow a saved state fitted on another model"
    )
    adapter: str | None = Field(default=None, description="adapter name (default: by model)")
    label_set: str | None = Field(default=None, description="digits, upper, ... (default: task's)")
    adapter_options: UsableName | None = Field(
        default=None,
        description="a JSON file of further adapter options (task_prompt, answer_prefix, ...)",
    )
    dtype: str = "auto"
    device: str | None = None
    batch_size: int = Field(
        default=1, ge=1, le=defaults.MAX_BATCH_SIZE, description="forward batch size"
    )
    cache_dir: UsableName | None = Field(
        default=None, description="folder for the calibration shared by the processes"
    )

    @field_validator("calibrators", mode="before")
    @classmethod
    def _names(cls, value: Any) -> list[str]:
        return parse_names(value)

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any], source: str) -> HarnessConfig:
        """Validated settings; a wrong or unknown one is a ConfigError naming it."""
        try:
            return cls.model_validate(dict(arguments))
        except ValidationError as exc:
            known = ", ".join(cls.model_fields)
            raise ConfigError(validation_message(exc, source) + f"; known: {known}") from None


def _list(value: Any) -> list[Any] | None:
    return list(value) if isinstance(value, (list, tuple)) and value else None


def doc_texts(doc: Mapping[str, Any]) -> list[Any] | None:
    """A document's text candidates: ``texts``, ``options`` (MuirBench) or ``choices`` (MMLU)."""
    return _list(doc.get("texts")) or _list(doc.get("options")) or _list(doc.get("choices"))


def doc_kind(doc: Mapping[str, Any]) -> str:
    """The task kind of a document: its ``task``, else multiple choice with text candidates,
    else retrieval (the one rule of the model and the task files' functions)."""
    return str(doc.get("task") or ("multiple_choice" if doc_texts(doc) else "retrieval"))


def answer_position(answer: Any, n: int, *, base: int = 1) -> int | None:
    """A foreign layout's ``answer`` as :func:`~posdebias.benchmarks.tasks.answer_index`
    reads it (``base``: 1 in lmms-eval's layouts; 0 in lm-eval's), None when it names none."""
    try:
        return answer_index(answer, n, base=base)
    except InputError:
        return None


def doc_instance(doc: Mapping[str, Any], task: str) -> Instance:
    """The posdebias instance a harness document describes.

    Read: the stem (``query``, ``question`` or ``caption``), the N candidates (``images``:
    their images, paths or PIL images, None for a text-only one; ``texts``, ``options`` or
    ``choices``: their texts), the images of the stem (``stem_images``), the task kind
    (``task``; default ``multiple_choice`` with texts, ``retrieval`` with images only) and the
    truth (``target``, a 0-based position; or ``answer``, a letter or a 1-based index). This is
    the line layout of a posdebias benchmark file, so the documents of ``posdebias
    lmms-eval-task`` are read as they are; a document without candidates (a free-form
    question) is refused naming the task.
    """
    query = next(
        (doc[key] for key in ("query", "question", "caption") if isinstance(doc.get(key), str)),
        None,
    )
    images, texts = _list(doc.get("images")), doc_texts(doc)
    n = len(texts or images or [])
    if query is None or n < 2 or (images and texts and len(images) != len(texts)):
        fields = ", ".join(sorted(str(key) for key in doc)[:20]) or "none"
        raise TaskMappingError(
            f"task {task!r} cannot be answered by posdebias: its documents need a stem "
            "('query', 'question' or 'caption') and at least 2 candidates ('images' and/or "
            f"'texts' / 'options' / 'choices', a list, one per candidate), but have the fields: "
            f"{fields}. Write a task posdebias can read with `posdebias lmms-eval-task` (or "
            "`posdebias lm-eval-task`)."
        )
    item = str(doc.get(ITEM, doc.get("id", "")) or hashlib.sha1(query.encode()).hexdigest()[:12])
    order = doc.get(ORDER)
    if order is None:
        order = list(range(n))
    if sorted(order) != list(range(n)):
        raise TaskMappingError(
            f"task {task!r}, item {item!r}: {ORDER} {list(order)[:12]} is not a permutation of "
            f"its {n} candidates"
        )
    kind = doc_kind(doc)
    target = doc.get("target")
    if target is None and doc.get("answer") is not None:
        target = answer_position(doc["answer"], n)
        if target is None:
            raise TaskMappingError(
                f"task {task!r}, item {item!r}: answer {doc['answer']!r} names none of the "
                f"{n} candidates (give a letter or a 1-based index)"
            )
    if target is not None and (isinstance(target, bool) or not isinstance(target, int)):
        raise TaskMappingError(
            f"task {task!r}, item {item!r}: target must be a 0-based position, got {target!r}"
        )
    image_ids: tuple[str, ...] = ()
    if images and any(image is not None and not isinstance(image, (str, Path)) for image in images):
        # in-memory images have no stable identity: name them by item and base position
        image_ids = tuple(f"{item}:{base}" for base in order)
    try:
        return Instance(
            stem=query,
            images=tuple(images or ()),
            texts=tuple(texts or ()),
            stem_images=tuple(doc.get("stem_images") or ()),
            target=target,
            id=item,
            candidate_ids=image_ids,
            task=kind,
        )
    except InputError as exc:
        raise TaskMappingError(f"task {task!r}: {exc}") from None


@contextlib.contextmanager
def said_to_harness_users() -> Iterator[None]:
    """posdebias' errors as a harness user meets them: their advice names the model argument
    or command to use, not the Python method (``transfer=True`` is ``calibration_transfer=True``
    in the model arguments). The error goes on as it was raised (type, traceback, cause).
    Also a decorator."""
    try:
        yield
    except PosdebiasError as exc:
        exc.say_at("harness")
        raise


def _shared_calibration_folder(folder: Path) -> RunFolder:
    """A harness calibration folder of the cache (``states/``, then the ``provenance.json``
    that says it is complete), checked through the run-directory layer before anything is
    fitted or written: no links, nothing but state files in ``states/``. A folder holding
    only ``states/`` (a writer stopped before its provenance) is ours, written over."""
    shared = RunFolder(
        folder,
        marker=None,
        own=re.compile(re.escape(PROVENANCE_FILE) + r"\Z"),
        subfolders=("states",),
        flag="cache_dir",
        kind="posdebias harness calibration",
    )
    shared.check()
    states_folder(shared.path("states"), flag="cache_dir").check()
    shared.create()
    return shared


class HarnessDebiaser:
    """One model and its calibrators for a whole harness run.

    ``rank`` / ``world_size`` / ``barrier`` describe the harness's processes: rank 0 fits a
    calibration and writes it, the others wait at ``barrier`` and read it.
    """

    @said_to_harness_users()
    def __init__(
        self,
        config: HarnessConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        barrier: Callable[[], None] | None = None,
        adapter: Adapter | None = None,
    ) -> None:
        self.config = config
        self.rank, self.world_size = rank, world_size
        self.barrier = barrier or (lambda: None)
        registry = get_registry()
        for name in config.calibrators:
            registry.calibrator_class(name)  # unknown names listed before the model loads
        self.adapter = adapter or load_adapter(
            config.pretrained,
            adapter=config.adapter,
            dtype=config.dtype,
            device=config.device,
            label_set=config.label_set,
            **read_adapter_options(config.adapter_options),
        )
        self.debiaser = Debiaser(self.adapter, config.calibrators, batch_size=config.batch_size)
        fitting = [label for label, c in self.debiaser.calibrators.items() if c.needs_fit]
        if fitting and config.calibration is None:
            raise ConfigError(
                f"calibrators {fitting} need a calibration: pass calibration=<a state saved by "
                "`posdebias calibrate`>, calibration=<a benchmark folder>, or calibration=task "
                "(the task's held-out items)"
            )
        self.fitting = fitting
        #: where the calibration came from (None until calibrated); recorded by the harness
        self.provenance: dict[str, Any] | None = None
        self._cache: dict[tuple[str, tuple[str, ...]], Ranking] = {}

    # -- calibration ---------------------------------------------------------------------

    @said_to_harness_users()
    def calibrate(self, task_items: Callable[[], list[Instance]] | None = None) -> None:
        """Calibrate once (later calls return at once). ``task_items`` gives the task's
        held-out items for ``calibration=task``."""
        if self.provenance is not None:
            return
        source = self.config.calibration
        if not self.fitting:
            self._record({"source": "none", "calibrators": list(self.debiaser.calibrators)})
            return
        assert source is not None
        path = Path(source)  # ~ expanded by the settings' validation
        if source != FROM_TASK and path.exists() and not _is_benchmark(path):
            self._load_saved(path)
            return
        if source == FROM_TASK:
            if task_items is None:
                raise ConfigError(
                    "calibration=task needs a task with a held-out 'calibration' split (write "
                    "one with `posdebias lmms-eval-task --calibration-count M`)"
                )
            items = task_items()
            origin: dict[str, Any] = {"source": "task", "split": CALIBRATION_SPLIT}
        elif path.exists():
            benchmark = load_benchmark(path)
            items = benchmark.instances
            origin = {
                "source": "benchmark",
                "path": str(path.resolve()),
                "benchmark_sha256": benchmark.fingerprint,
            }
        else:
            raise ConfigError(
                f"calibration={source!r} is neither a saved calibration state, a benchmark "
                "folder, nor 'task'; give one of them"
            )
        if not items:
            raise CalibrationError(f"calibration from {origin['source']}: no items to fit on")
        count = self.config.calibration_count  # the default: as many as there are, up to it
        if len(items) < count and "calibration_count" in self.config.model_fields_set:
            more = "write the task with more" if source == FROM_TASK else "give a larger benchmark"
            raise ConfigError(
                f"calibration_count={count}, but the {origin['source']}'s calibration holds "
                f"{len(items)} items; ask for at most {len(items)} (or {more})"
            )
        items = calibration_items(items, count, self.config.seed)
        origin["calibration_ids"] = [item.id for item in items]
        self._fit_shared(items, origin)

    def _record(self, provenance: dict[str, Any]) -> None:
        global _PROVENANCE
        self.provenance = provenance
        _PROVENANCE = provenance

    def _load_saved(self, path: Path) -> None:
        refusals = StateRefusals()  # unreadable files, missing and refused states, together
        saved = load_states(path, refusals)
        states: dict[str, CalibrationState] = {}
        sources: dict[str, str] = {}  # each state's file, named when it is refused
        missing: list[str] = []
        for label, calibrator in self.debiaser.calibrators.items():
            found = {}
            with refusals.checking():  # two states of the row for one N: named with the rest
                found = row_states(saved, label, calibrator)  # one per N they were fitted for
            for key, state in found.items():
                row = state_key(label, state.n, len(found) > 1)
                states[row] = state
                sources[row] = row_source(path, key, state, label)
            own_files = [*path.glob(f"{label}.json"), *path.glob(f"{label}.n*.json")]
            if not found and calibrator.needs_fit and not own_files:
                missing.append(label)  # (a file of its own that cannot be read is named above)
        if missing:
            which = "calibrator" if len(missing) == 1 else "calibrators"
            refusals.add(
                CalibrationError(
                    f"calibration {path} holds no state for {which} "
                    f"{', '.join(map(repr, missing))} (it holds {sorted(saved)}); calibrate "
                    f"{'it' if len(missing) == 1 else 'them'} with `posdebias calibrate`"
                )
            )
        self.debiaser.use_states(
            states, transfer=self.config.calibration_transfer, refusals=refusals, sources=sources
        )
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        self._record(
            {
                "source": "saved",
                "path": str(path.resolve()),
                "sha256": {file.name: sha256_file(file) for file in files},
                "model_id": next((s.model_id for s in states.values()), None),
                "transfer": self.config.calibration_transfer,
            }
        )

    def _fit_shared(self, items: list[Instance], origin: dict[str, Any]) -> None:
        """Rank 0 fits and writes; every other rank waits for it and reads the same states."""
        key = hashlib.sha256(
            json.dumps(
                {
                    "model": self.adapter.describe(),
                    "calibrators": self.config.calibrators,
                    "items": origin["calibration_ids"],
                    "origin": {k: v for k, v in origin.items() if k != "calibration_ids"},
                    "version": __version__,
                },
                sort_keys=True,
                default=str,
            ).encode()
        ).hexdigest()[:16]
        base = Path(self.config.cache_dir) if self.config.cache_dir else cache_root() / "harness"
        folder = base / f"calibration-{key}"
        if self.rank == 0:
            shared = _shared_calibration_folder(folder)  # refused before any fit
            self.debiaser.calibrate(items)
            several = len(self.debiaser.calibrated_n) > 1  # <label>.n<N>.json, as save() does
            fitted = {
                state_key(label, n, several): self.debiaser.states_for(n)[label]
                for n in self.debiaser.calibrated_n
                for label in self.fitting
            }
            # the states first, the provenance that marks the folder complete last
            save_states(fitted, shared.path("states"))
            shared.write_json(PROVENANCE_FILE, {**origin, "states": str(folder / "states")})
        if self.world_size > 1:
            self.barrier()
        if self.rank != 0:  # every N rank 0 fitted, through the gate as any saved state
            self.debiaser.use_states(load_states(folder / "states"))
        self._record({**origin, "states": str(folder / "states"), "shared_by_rank": 0})

    # -- answers -------------------------------------------------------------------------

    def labels(self, instance: Instance) -> list[str]:  # the task's own unless one is named
        return self.adapter.labels_for(instance.n, instance.task)

    @said_to_harness_users()
    def answers(self, instances: Sequence[Instance]) -> list[Ranking]:
        """Every calibrator's answer per instance; each distinct view is observed once per
        run, however many tasks (calibrator rows) ask for it."""
        if self.provenance is None:
            raise CalibrationError("calibrate() must run before the first answer")
        keys = [(instance.id, instance.candidate_ids) for instance in instances]
        todo: dict[tuple[str, tuple[str, ...]], Instance] = {}
        for key, instance in zip(keys, instances, strict=True):
            if key not in self._cache and key not in todo:
                todo[key] = instance
        if todo:
            self._cache.update(zip(todo, self.debiaser.rank_many(list(todo.values())), strict=True))
        return [self._cache[key] for key in keys]

    def calibrator_label(self, requested: str | None, task: str) -> str:
        """The calibrator whose answer a request gets: the one its task names, else the
        first one given."""
        if requested is None:
            return self.debiaser.primary
        if requested not in self.debiaser.calibrators:
            raise ConfigError(
                f"task {task!r} scores calibrator {requested!r}, but the model runs "
                f"{list(self.debiaser.calibrators)}; add it to calibrators= (e.g. "
                f"calibrators={'+'.join([*self.debiaser.calibrators, requested])})"
            )
        return requested


def check_task_labels(task: str, expected: Sequence[str] | None, labels: list[str]) -> None:
    """Refuse a task whose documents expect other labels than the model answers with."""
    if expected is not None and list(expected) != labels:
        raise TaskMappingError(
            f"task {task!r} expects the labels {list(expected)}, but the model answers "
            f"with {labels}; pass label_set= to --model_args to match (upper: A, B, ...)"
        )


def label_loglikelihood(
    prediction: Prediction, labels: list[str], continuation: Any, task: str
) -> tuple[float, bool]:
    """A harness's log-likelihood request of one label: the calibrated log-probability of
    ``continuation`` and whether it is the calibrated choice (any other text is refused)."""
    continuation = str(continuation).strip()
    if continuation not in labels:
        raise TaskMappingError(
            f"task {task!r} asks the log-likelihood of {continuation!r}, "
            f"which is not one of the labels {labels}; posdebias scores labels only"
        )
    position = labels.index(continuation)
    logprob = float(np.log(max(float(prediction.probabilities[position]), 1e-45)))
    return logprob, bool(position == prediction.choice)


def read_adapter_options(path: str | None) -> dict[str, Any]:
    """The adapter options of the JSON file ``adapter_options`` names (a harness's arguments
    are flat text, too flat for a prompt template); load_adapter checks each option."""
    if path is None:
        return {}
    text = read_input_text(path, "adapter options file", limit=CONFIG_LIMIT, error=ConfigError)
    what = f"adapter_options {path}"
    options = parse_json(text, what, error=ConfigError)
    if not isinstance(options, dict):
        raise ConfigError(f"{what}: write a JSON object of adapter options, e.g. {_EXAMPLE}")
    reserved = sorted(set(options) & {"model", "adapter", "dtype", "device", "label_set"})
    if reserved:
        raise ConfigError(f"{what}: give {reserved} as harness arguments, not in the file")
    return options


_EXAMPLE = '{"answer_prefix": " ", "chat_template": "raw"}'


def _is_benchmark(path: Path) -> bool:
    return (path / MANIFEST_FILE).is_file() if path.is_dir() else path.suffix == ".jsonl"


#: What lm-eval and lmms-eval pass every model besides ``--model_args`` (None values are
#: dropped): no setting of posdebias.
_HARNESS_ARGUMENTS = ("max_batch_size",)


class LaunchedHarness:
    """What the lm-eval and lmms-eval models share: one :class:`HarnessDebiaser` per process
    of the harness's run, its ranks and device from accelerate (both harnesses read
    ``accelerator``, ``device`` and ``provenance`` of their model)."""

    accelerator: Any
    harness: HarnessDebiaser
    _rank: int
    _world_size: int
    _device: Any

    def _launch(
        self, arguments: dict[str, Any], source: str, adapter: Adapter | None = None
    ) -> HarnessConfig:
        """Start this process's harness from its model arguments (``source`` names them in an
        error; what the harness passes every model is dropped); a rank without a device gets
        accelerate's. Returns the config it runs with."""
        from accelerate import Accelerator

        for name in _HARNESS_ARGUMENTS:
            arguments.pop(name, None)
        config = HarnessConfig.from_arguments(arguments, source)

        self.accelerator = Accelerator()
        self._rank = self.accelerator.process_index
        self._world_size = self.accelerator.num_processes
        if self._world_size > 1 and config.device is None:
            config = config.model_copy(update={"device": str(self.accelerator.device)})
        self.harness = HarnessDebiaser(
            config,
            rank=self._rank,
            world_size=self._world_size,
            barrier=self.accelerator.wait_for_everyone,
            adapter=adapter,
        )
        self._device = self.accelerator.device if config.device is None else config.device
        return config

    def _predictions(
        self,
        docs: Sequence[Mapping[str, Any]],
        tasks: Sequence[str],
        task_items: Callable[[], list[Instance]],
        expected: Callable[[Mapping[str, Any], Instance], Sequence[str] | None],
    ) -> list[tuple[Prediction, list[str]]]:
        """Per document: the prediction of the calibrator its task scores and the labels the
        model answers with; calibrated once on first use (``task_items``: the task's held-out
        items), and a task ``expected`` to answer with other labels is refused first."""
        self.harness.calibrate(task_items)
        instances = [doc_instance(doc, task) for doc, task in zip(docs, tasks, strict=True)]
        labels = [self.harness.labels(instance) for instance in instances]
        for doc, task, instance, names in zip(docs, tasks, instances, labels, strict=True):
            check_task_labels(task, expected(doc, instance), names)
        return [
            (ranking.predictions[self.harness.calibrator_label(doc.get(CALIBRATOR), task)], names)
            for ranking, doc, task, names in zip(
                self.harness.answers(instances), docs, tasks, labels, strict=True
            )
        ]

    @property
    def device(self) -> Any:
        """The torch device the harness gathers its per-rank counts on."""
        import torch

        return torch.device(self._device)

    @property
    def provenance(self) -> dict[str, Any] | None:
        """Where the calibration came from (also in every rotated task's sample records)."""
        return self.harness.provenance
