"""One evaluation run from a config, in explicit phases, each handing the next a frozen value.

    prepare -> Prepared -> calibrate -> Calibrated -> evaluate a shard -> Evaluated
            -> merge -> Evaluated (rank 0) -> finish -> EvaluationResults

* **prepare** builds the calibrators and the adapter, loads the instances and any saved
  calibration states, and checks everything that can be checked before a forward pass or a
  file is written (a calibrator needing attention the adapter cannot give, a saved state made
  for another model, prompt or options); then it opens the run directory (lock, identity,
  logs, cached observations).
* **calibrate** fits the calibrators without a saved state (observations shared) and saves
  every state in the run directory.
* **evaluate a shard** runs this process's test instances through :meth:`Evaluator.run`,
  logging each record as it is made; records of an earlier attempt with the same calibrators
  are reused (``--resume``).
* **merge** waits for every rank of a data-parallel run and reads all their logs (rank 0).
* **finish** summarises the records into :class:`EvaluationResults` and saves them.

The CLI (``posdebias evaluate``, ``posdebias calibrate``) and data-parallel runs use these
phases; each piece stays usable on its own. Nothing here knows a particular model: a
:class:`~posdebias.evaluation.preset.Preset` handed down by the caller supplies a default
model's benchmark, batch size and threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import resource
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from posdebias._io import JsonlAppender, open_log
from posdebias.adapters.base import Adapter, describe_adapter
from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
from posdebias.benchmarks.files import benchmark_task, load_benchmark
from posdebias.calibrators.base import Calibrator
from posdebias.core.instance import Instance, candidate_noun, check_order_count
from posdebias.core.state import CalibrationState
from posdebias.core.symmetry import symmetrized_calibration_set
from posdebias.core.tasks import FORMER_FIELDS, former_digest, task_template
from posdebias.decoders.base import Decoder
from posdebias.errors import CalibrationError, ConfigError, InputError
from posdebias.evaluation.config import EvaluateConfig, checked_config, orders_of
from posdebias.evaluation.decoding import DecisionCache, DecoderRows, decoder_costs
from posdebias.evaluation.distributed import Shard, current_shard, placement
from posdebias.evaluation.divergence import divergence_profiles
from posdebias.evaluation.groups import group_statistics
from posdebias.evaluation.judging import judge_metrics
from posdebias.evaluation.preset import Preset, ResolvedConfig, named_model, resolve_preset
from posdebias.evaluation.protocol import (
    adapter_defaults,
    apply_specs,
    get_protocol,
    order_settings,
    warn_left_out_layers,
)
from posdebias.evaluation.ranking_metrics import check_relevance, ranking_statistics
from posdebias.evaluation.results import (
    AdapterDescription,
    CalibrationSource,
    CalibratorResult,
    Cost,
    EvaluationResults,
    RunSettings,
    SourceDescription,
    Timing,
    plugin_versions,
)
from posdebias.evaluation.runner import (
    Evaluator,
    InstanceRecord,
    ObservationCache,
    check_logged_truth,
    fit_calibrators,
    observe_cached,
    scored_views,
    summarize,
)
from posdebias.evaluation.states import (
    StateRefusals,
    check_state,
    load_states,
    pick_state,
    row_source,
    save_states,
    state_metadata,
)
from posdebias.evaluation.statistics import record_outcomes, run_statistics
from posdebias.evaluation.store import RunDirectory
from posdebias.loading import bundled_task, default_label_set, open_adapter, served
from posdebias.registry import get_registry


def build_adapter(config: EvaluateConfig, shard: Shard | None = None) -> Adapter:
    """The adapter named by the config; ``model`` loads a Hugging Face model (by model_type
    unless an adapter name is given; the adapter's options may name it too). Resolve a preset
    first for the bundled default."""
    options = dict(config.adapter.options)
    protocol = get_protocol(config.protocol)
    model = named_model(config)
    options.pop("model", None)
    if protocol.query_trailing_space and _takes_option(config, "answer_space"):
        options.setdefault("answer_space", True)  # the protocol's prompt, as an option
    if model is not None or _takes_option(config, "label_set"):
        # the task's labels (run.json names them); a model asked no task (rank) or given the
        # pattern of an n study's benchmarks: each query's own task's
        known = config.benchmark is not None and "{n}" not in str(config.benchmark)
        task = config_task(config) if config.task or known or model is None else None
        options.setdefault("label_set", default_label_set(task, model))
    if model is not None:
        if not served(config.adapter.name):
            options = placement(options, shard or Shard(), config.gpus_per_process)
            options["defaults"] = adapter_defaults(protocol)
        return open_adapter(model, adapter=config.adapter.name, **options)
    if config.adapter.name is None:
        none = "" if config.task is None else f"; none poses {config.task}"
        raise InputError(
            "no model to evaluate: pass --model ID_OR_PATH or --adapter NAME (the command "
            f"line's default run takes the task's bundled model{none})"
        )
    return get_registry().create_adapter(config.adapter.name, **options)


def _takes_option(config: EvaluateConfig, name: str) -> bool:
    """Whether the run's adapter has the option ``name`` (a prompt option: every built-in
    adapter that renders prompts; a plugin's may not)."""
    if config.adapter.name is None:
        return config.model is not None
    try:
        options = get_registry().adapter_class(config.adapter.name).Options
    except InputError:
        return False  # an unknown name is reported where the adapter is made
    return name in options.model_fields


def config_task(config: EvaluateConfig) -> str:
    """The task a run poses: ``--task``, else its benchmark's (read from the manifest; a
    benchmark that cannot be read is reported when it is loaded), else the task of the bundled
    model it runs on that model's own questions (``calibrate`` and ``evaluate --model
    posdebias/text-organism`` alike)."""
    if config.task is not None:
        return config.task
    if config.benchmark is None:
        return bundled_task(named_model(config)) or "retrieval"
    return benchmark_task(config.benchmark) or "retrieval"


def build_decoders(config: EvaluateConfig) -> dict[str, Decoder]:
    registry = get_registry()
    return {
        spec.key: registry.create_decoder(spec.name, **spec.options) for spec in config.decoders
    }


def build_calibrators(config: EvaluateConfig) -> dict[str, Calibrator]:
    registry = get_registry()
    return {
        spec.key: registry.create_calibrator(spec.name, **spec.options)
        for spec in config.calibrators
    }


@dataclass
class InstanceSource:
    """Calibration and test instances plus what identifies where they came from."""

    calibration: list[Instance]
    test: list[Instance]
    description: dict[str, Any] = field(default_factory=dict)

    @property
    def shows_images(self) -> bool:
        """Whether an instance shows an image (a candidate's or the question's): a run whose
        instances show none records no image option."""
        return any(instance.all_images for instance in (*self.calibration, *self.test))


def split_held_out(
    instances: list[Instance], count: int, seed: int
) -> tuple[list[Instance], list[Instance]]:
    """Hold ``count`` calibration instances out of a benchmark by seed (file order kept)."""
    if count >= len(instances):
        raise InputError(
            f"the benchmark has {len(instances)} instances; holding out {count} for calibration "
            "leaves none to test. Lower the calibration count (evaluate and sweep: "
            "--calibration-count; calibrate: --count) or give a separate calibration file."
        )
    chosen = set(np.random.default_rng(seed).choice(len(instances), count, replace=False).tolist())
    calibration: list[Instance] = []
    test: list[Instance] = []
    for i, instance in enumerate(instances):  # file order kept in both
        (calibration if i in chosen else test).append(instance)
    return calibration, test


def calibration_items(instances: list[Instance], count: int, seed: int) -> list[Instance]:
    """The M calibration instances of a file given to calibrate on: all of it when M is its
    size or more (the choice of every seed), else M by seed, as :func:`split_held_out` holds
    them out of a benchmark. The one rule of ``--calibration-benchmark`` and the harnesses."""
    return instances if count >= len(instances) else split_held_out(instances, count, seed)[0]


def check_task(wanted: str | None, task: str, path: Path) -> None:
    """Refuse a benchmark of another task than the one asked for (``--task``)."""
    if wanted is not None and wanted != task:
        raise InputError(
            f"--task {wanted}, but the benchmark {path} poses {task}; build a {wanted} "
            "benchmark (posdebias build --task ...) or drop --task"
        )


def load_instances(
    config: EvaluateConfig,
    adapter: Adapter,
    default_benchmark: Callable[[int, int], Path] | None = None,
) -> InstanceSource:
    """(calibration, test) instances: from ``benchmark`` (calibration held out by seed, or
    from ``calibration_benchmark``), a preset's default benchmark, or the simulated model's own
    instances."""
    benchmark_path = config.benchmark
    if benchmark_path is None and default_benchmark is not None:
        benchmark_path = default_benchmark(config.n, config.count + config.calibration_count)
    if benchmark_path is None:
        task = config.task or "retrieval"
        if not isinstance(adapter, SyntheticAdapter):  # it simulates its own instances
            wanted = "real images" if task == "retrieval" else f"{task} questions"
            raise InputError(
                f"adapter {adapter.name!r} needs {wanted}: pass --benchmark DIR (build one "
                f"with `posdebias build`{'' if task == 'retrieval' else f' --task {task}'})"
            )
        if task != "retrieval" or config.calibration_benchmark is not None:
            raise InputError(  # another task was run on retrieval instances, reported as its own
                f"the simulated model makes retrieval instances of its own, to test and to "
                f"calibrate; pass --benchmark DIR with {task} instances (`posdebias build`)"
            )
        test = synthetic_instances(config.count, config.n, config.seed, "test")
        if get_protocol(config.protocol).calibration_from_test:
            calibration = test[: config.calibration_count]
        else:
            calibration = synthetic_instances(
                config.calibration_count, config.n, config.seed + 1, "cal"
            )
        return InstanceSource(calibration, test, {"source": "synthetic", "n": config.n})

    benchmark = load_benchmark(benchmark_path)
    check_task(config.task, benchmark.task, benchmark_path)
    description = {"benchmark": str(benchmark_path), "benchmark_sha256": benchmark.fingerprint}
    if get_protocol(config.protocol).calibration_from_test:
        if config.calibration_benchmark is not None:
            raise InputError(
                "protocol 'reference' calibrates on the first instances of the evaluated file; "
                "drop calibration_benchmark or use protocol 'default'"
            )
        calibration = benchmark.instances[: config.calibration_count]
        return InstanceSource(calibration, benchmark.instances[: config.count], description)
    # the test: a run's without calibration_benchmark (the benchmark less its own held-out M),
    # so the two and a transfer study's pairs pair up; one too small to hold M out: all of it
    calibration, test = [], benchmark.instances
    if config.calibration_benchmark is None or config.calibration_count < len(test):
        calibration, test = split_held_out(test, config.calibration_count, config.seed)
    if config.calibration_benchmark is not None:
        held, count = load_benchmark(config.calibration_benchmark), config.calibration_count
        check_task(config.task or benchmark.task, held.task, config.calibration_benchmark)
        if count > len(held.instances):
            raise InputError(
                f"the calibration benchmark {config.calibration_benchmark} has "
                f"{len(held.instances)} instances, fewer than the calibration count {count}"
            )
        calibration = calibration_items(held.instances, count, config.seed)
        description["calibration_benchmark_sha256"] = held.fingerprint
    return InstanceSource(calibration, test[: config.count], description)


def saved_states(
    config: EvaluateConfig, adapter: Adapter, calibrators: dict[str, Calibrator], n: int
) -> dict[str, CalibrationState]:
    """The states ``--calibration`` gives, by label, each checked against this use by the
    one gate (:func:`check_state`; the model unless the config says the transfer is
    intended)."""
    if config.calibration is None:
        return {}
    refusals = StateRefusals()  # unreadable files and refused states, named together
    saved = load_states(config.calibration, refusals)
    task = config_task(config)
    provided: dict[str, CalibrationState] = {}
    folder = config.calibration.is_dir()
    checked: set[tuple[str, str, str]] = set()  # a state's uses by a calibrator
    for label, calibrator in calibrators.items():
        key = None
        with refusals.checking():  # two states of the row for this N: named with the others
            key = pick_state(saved, label, calibrator, n)
        if key is None:
            continue
        use = (key, calibrator.name, calibrator.options.model_dump_json())
        if use not in checked:  # two rows alike (other labels) are one use: checked, named once
            checked.add(use)
            with refusals.checking():  # a refusal is raised below: nothing is provided then
                check_state(
                    saved[key],
                    adapter,
                    calibrator,
                    n,
                    task,
                    transfer=config.calibration_transfer,
                    source=row_source(config.calibration, key, saved[key], label),
                )
        provided[label] = saved[key]
    refusals.raise_any()
    kinds = {c.name for c in calibrators.values()}
    if not provided and not folder and next(iter(saved.values())).calibrator not in kinds:
        # one state file that no calibrator of the run uses is a mistake, not a default (one
        # of a calibrator that needs no fit, made for another N, is just not needed)
        (state,) = saved.values()
        names = ", ".join(sorted(kinds))
        raise CalibrationError(
            f"calibration file {config.calibration} holds a state fitted by calibrator "
            f"{state.calibrator!r}, but this run has no {state.calibrator!r} calibrator (it "
            f"runs {names}); pass the calibrator it was made for, or calibrate again with "
            "`posdebias calibrate`"
        )
    return provided


def check_attention(adapter: Adapter, calibrators: dict[str, Calibrator]) -> None:
    """Refuse, before any forward pass, a calibrator that needs attention the adapter lacks."""
    if adapter.provides_attention:
        return
    blind = [label for label, c in calibrators.items() if c.needs_attention]
    if blind:
        reason = getattr(adapter, "no_attention_reason", None) or "it cannot capture attention"
        raise InputError(
            f"calibrator {blind[0]!r} needs attention, but adapter {adapter.name!r} has none: "
            f"{reason}; use vanilla, pride or permutation_average instead"
        )


def run_identity(config: EvaluateConfig, adapter: Adapter, source: InstanceSource, n: int) -> dict:
    """What must match for ``--resume`` to reuse a run's observations and records.

    Calibrators are not part of it: each record names its calibrators by fingerprint, so a
    changed calibrator has its choices predicted again from the cached observations.
    """
    task = source.test[0].task if source.test else None
    described = adapter_identity(adapter, n, task, source.shows_images, "device", "served_models")
    # the benchmark is identified by its content hash: a moved folder still resumes
    source_identity = {k: v for k, v in source.description.items() if k != "benchmark"}
    return {
        "adapter": described,
        "source": source_identity,
        "seed": config.seed,
        "protocol": config.protocol,
        "orders": orders_of(config, n),
        **({"order_kind": config.order_kind} if config.order_kind != "random" else {}),
        "count": config.count,
        "calibration_count": config.calibration_count,
    }


def adapter_identity(
    adapter: Adapter, n: int | None, task: str | None, images: bool, *left_out: str
) -> dict[str, Any]:
    """The adapter's description (:func:`describe_adapter`) as a run or study identity records
    it, in JSON values, less the keys ``left_out`` (what does not decide its observations)."""
    described = describe_adapter(adapter, n, task, images=images)
    kept = {key: value for key, value in described.items() if key not in left_out}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def saved_identity(
    saved: dict[str, Any],
    now: dict[str, Any] | None = None,
    retrieval_hash: str | None = None,
    image_options: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A run file's identity in today's terms, so that a run directory written by an older
    version still resumes: a setting today's records leave out is dropped where it was null or
    one of the adapter's ``image_options`` (a run that showed no image did not use it); a
    retrieval prompt recorded in its older form (before retrieval became a task template) is
    recorded as that template, with its hash; a text run, whose files recorded the retrieval
    template (``retrieval_hash``) instead of the prompt it posed, is read as recording this
    run's prompt (``now``: today's identity)."""
    adapter = saved.get("adapter")
    if not isinstance(adapter, dict):
        return saved
    adapter = {**adapter, **_former_template(adapter)}
    described = now.get("adapter") if now is not None else None
    if isinstance(described, dict):  # settings today's records leave out: empty, or unused
        kept = {k: v for k, v in adapter.items() if v is not None and k not in image_options}
        adapter = {k: v for k, v in adapter.items() if k in described or k in kept}
    if (
        isinstance(described, dict)
        and retrieval_hash is not None
        and adapter.get("prompt_hash") == retrieval_hash != described.get("prompt_hash")
    ):
        adapter |= {key: described.get(key) for key in ("prompt", "prompt_hash")}
    return {**saved, "adapter": adapter}


def identity_reader(
    adapter: Adapter, n: int | None, identity: dict[str, Any]
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """How a run or sweep directory of this adapter reads its saved identity in today's terms
    (:func:`saved_identity`, against today's ``identity``)."""
    retrieval = describe_adapter(adapter, n, "retrieval").get("prompt_hash")
    return partial(
        saved_identity,
        now=identity,
        retrieval_hash=None if retrieval is None else str(retrieval),
        image_options=adapter.image_options,
    )


def _former_template(adapter: dict[str, Any]) -> dict[str, Any]:
    """The prompt and hash of a retrieval prompt recorded in its older form, as the template it
    is; nothing for any other record."""
    prompt = adapter.get("prompt")
    if not isinstance(prompt, dict) or not any(name in prompt for name in FORMER_FIELDS):
        return {}
    try:
        template = task_template("retrieval", prompt)
    except ConfigError:
        return {}
    if adapter.get("prompt_hash") != former_digest(template):
        return {}
    return {"prompt": template.recorded(), "prompt_hash": template.digest()}


def decoder_fingerprint(decoder: Decoder) -> str:
    """What decides a decoder row's choices: its class and its digest (name and options)."""
    cls = type(decoder)
    text = f"{cls.__module__}.{cls.__qualname__}\x1f{decoder.digest()}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def calibrator_fingerprint(calibrator: Calibrator, state: CalibrationState) -> str:
    """Everything that decides a calibrator's choices on given observations: its class, its
    options and its fitted state."""
    cls = type(calibrator)
    payload = {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "name": calibrator.name,
        "options": calibrator.options.model_dump(mode="json"),
        "state": state.model_dump(mode="json"),
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def peak_memory() -> dict[str, float]:
    """Peak resident memory of this process (MB) and, on CUDA, peak allocated GPU memory."""
    usage = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    torch = sys.modules.get("torch")  # never imported for this: a run without it used no GPU
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        usage["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return usage


@dataclass(frozen=True)
class RunFiles:
    """This process's side of an opened run directory: the lock and the logs it appends to."""

    directory: RunDirectory
    logs: tuple[JsonlAppender, ...]

    def close_logs(self) -> None:
        for log in self.logs:
            log.close()

    def close(self) -> None:
        """Close the logs and release the run directory's lock."""
        self.close_logs()
        self.directory.folder.unlock()


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` built and checked: the run's inputs, read by every later phase.

    ``earlier`` holds the records an earlier attempt left in the run directory (``--resume``);
    ``cache`` and ``decisions`` start with its observations and decoder decisions. Close it
    (or use it as a context manager) to release the run directory.
    """

    config: EvaluateConfig
    shard: Shard
    adapter: Adapter
    calibrators: Mapping[str, Calibrator]
    decoders: Mapping[str, Decoder]
    source: InstanceSource
    n: int
    provided: Mapping[str, CalibrationState]
    started: float
    cache: ObservationCache = field(default_factory=ObservationCache)
    decisions: DecisionCache = field(default_factory=DecisionCache)
    earlier: Mapping[str, InstanceRecord] = field(default_factory=dict)
    files: RunFiles | None = None

    def close(self) -> None:
        """Close the logs and release the run directory's lock."""
        if self.files is not None:
            self.files.close()

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Calibrated:
    """What :func:`calibrate` fitted or loaded: a state and a fingerprint per label."""

    states: Mapping[str, CalibrationState]
    #: label -> what decides its choices (calibrators and decoders), see :class:`InstanceRecord`
    fingerprints: Mapping[str, str]
    fitted: float  # time.perf_counter() when calibration ended


@dataclass(frozen=True)
class Evaluated:
    """What :func:`evaluate_shard` made (and :func:`merge` gathered on rank 0): the records of
    the test instances with what their summary reads, and what this process spent."""

    records: Mapping[str, InstanceRecord]
    cache: ObservationCache
    decisions: DecisionCache
    #: label -> message, for third-party calibrators that raised (dropped from the run)
    failures: Mapping[str, str]
    seconds_per_instance: Mapping[str, float]
    evaluated_here: int
    finished: float  # time.perf_counter() when this process's shard was done


def prepare(
    resolved: ResolvedConfig,
    *,
    resume: bool = False,
    shard: Shard | None = None,
    adapter: Adapter | None = None,
    source: InstanceSource | None = None,
) -> Prepared:
    """Phase 1: build and check everything, then open the run directory (if ``out``).

    A sweep hands its shared ``adapter`` and a point's ``source``; every other check is the
    same as for ``posdebias evaluate``.
    """
    config = resolved.config
    shard = shard or current_shard()
    if shard.distributed and config.out is None:
        raise InputError(
            "a data-parallel run needs --out DIR: its processes hand their records to rank 0 "
            "through the run directory"
        )
    calibrators = build_calibrators(config)
    decoders = build_decoders(config)
    if adapter is None:
        adapter = build_adapter(config, shard)
    if config.protocol != "default":
        config = apply_specs(get_protocol(config.protocol), config, adapter.num_layers)
        calibrators = build_calibrators(config)
        decoders = build_decoders(config)
    if source is None:
        check_attention(adapter, calibrators)  # before the instances are read
        source = load_instances(config, adapter, resolved.benchmark_factory())
    n = check_run(config, adapter, calibrators, source)
    for decoder in decoders.values():
        decoder.check(adapter, source.test)  # an adapter or data the decoder cannot run on
    config = config.model_copy(update={"orders": orders_of(config, n)})  # results record T
    prepared = Prepared(
        config,
        shard,
        adapter,
        calibrators,
        decoders,
        source,
        n,
        provided=saved_states(config, adapter, calibrators, n),
        started=time.perf_counter(),
    )
    if config.out is None:
        return prepared
    return open_run_directory(prepared, config.out, resume=resume)


def check_run(
    config: EvaluateConfig,
    adapter: Adapter,
    calibrators: Mapping[str, Calibrator],
    source: InstanceSource,
) -> int:
    """Every check of a run that needs no forward pass and writes no file: attention the
    calibrators need, the adapter's scores (``verify``), data it would misread, the number of
    orders. Returns N. ``posdebias evaluate``, ``calibrate`` and every sweep point run it."""
    check_attention(adapter, dict(calibrators))
    if not source.test:
        raise InputError("no test instances to evaluate")
    adapter.verify(source.test[0])  # no silent wrong scores; before the run directory exists
    adapter.check_instances([*source.calibration, *source.test])  # data it would misread
    check_relevance(source.test)  # graded relevance that cannot be read: before any pass
    n = source.test[0].n
    if "n" in config.model_fields_set and config.n != n:  # asked for (else a default)
        noun = candidate_noun(source.test[0].task)
        where = source.description.get("benchmark")
        raise InputError(
            f"N = {config.n} was asked for (-N, n in the config, or a study's value), but "
            "these instances"
            f"{'' if where is None else f' (benchmark {where})'} have {n} {noun} each; ask "
            f"for N = {n} or give a benchmark with {config.n} {noun} per instance"
        )
    orders = orders_of(config, n)  # the one rule (both orders of a pair unless asked)
    check_order_count(n, orders)  # before any forward pass
    if config.order_kind == "cyclic" and orders > n:
        raise InputError(
            f"order_kind cyclic: {orders} orders requested, but {n} candidates have "
            f"only {n} rotations; use orders {n} or fewer"
        )
    return n


def open_run_directory(prepared: Prepared, out: Path, *, resume: bool) -> Prepared:
    """``prepared`` with its run directory created (or checked, resuming), locked, and its
    logs opened: the caches start with what an earlier attempt observed and decided."""
    shard = prepared.shard
    directory = RunDirectory(out, rank=shard.rank if shard.distributed else None)
    identity = run_identity(prepared.config, prepared.adapter, prepared.source, prepared.n)
    read_saved = identity_reader(prepared.adapter, prepared.n, identity)
    logs: list[JsonlAppender] = []
    try:
        if shard.distributed and not shard.is_main:
            shard.wait()  # rank 0 creates or checks the directory first
            directory.prepare(identity, resume=True, read_saved=read_saved)
        else:
            directory.prepare(identity, resume=resume, read_saved=read_saved)
            if shard.distributed:
                shard.wait()
        logs.append(open_log(directory.observations_path))
        cache = ObservationCache(logs[-1]).load(directory.logs("observations"))
        decisions = DecisionCache()
        if prepared.decoders:
            logs.append(open_log(directory.generations_path))
            decisions = DecisionCache(logs[-1]).load(directory.logs("generations"))
        earlier = logged_records(prepared, directory)
    except BaseException:
        RunFiles(directory, tuple(logs)).close()
        raise
    files = RunFiles(directory, tuple(logs))
    return replace(prepared, cache=cache, decisions=decisions, earlier=earlier, files=files)


def calibrate(prepared: Prepared) -> Calibrated:
    """Phase 2: fit what ``--calibration`` does not provide (on the calibration set, or on
    the test views for a calibrator that fits on them, e.g. batch calibration); save every
    state (rank 0)."""
    config, adapter, source, n = prepared.config, prepared.adapter, prepared.source, prepared.n
    calibrators = dict(prepared.calibrators)
    missing = {label: c for label, c in calibrators.items() if label not in prepared.provided}
    fitted = (
        fit_calibrators(
            adapter,
            missing,
            source.calibration,
            batch_size=config.batch_size,
            cache=prepared.cache,
            metadata=state_metadata(
                adapter,
                source.calibration[0].task if source.calibration else config_task(config),
                n,
            ),
            test_views=scored_views(source.test, **order_settings(config, n)),
        )
        if missing
        else {}
    )
    states = {label: prepared.provided.get(label) or fitted[label] for label in calibrators}
    protocol = get_protocol(config.protocol)
    if protocol.reference_layers and source.calibration and adapter.provides_attention:
        observed = observe_cached(
            adapter,
            symmetrized_calibration_set(source.calibration),
            prepared.cache,
            batch_size=config.batch_size,
        )
        states = warn_left_out_layers(
            protocol, observed, adapter.num_layers, states, config.calibrators
        )
    fingerprints = {
        label: calibrator_fingerprint(calibrator, states[label])
        for label, calibrator in calibrators.items()
    } | {label: decoder_fingerprint(decoder) for label, decoder in prepared.decoders.items()}
    if prepared.files is not None and prepared.shard.is_main:
        save_states(states, prepared.files.directory.states_dir)
    return Calibrated(states, fingerprints, fitted=time.perf_counter())


def evaluate_shard(
    prepared: Prepared,
    calibrated: Calibrated,
    on_record: Callable[[InstanceRecord, dict[str, float]], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Evaluated:
    """Phase 3: evaluate this process's test instances that have no up-to-date record
    (``on_start`` hears how many, before the first: a progress bar's total)."""
    config = prepared.config
    evaluator = Evaluator(
        prepared.adapter,
        prepared.calibrators,
        calibrated.states,
        batch_size=config.batch_size,
        cache=prepared.cache,
        **order_settings(config, prepared.n),
    )
    records = dict(prepared.earlier)
    todo = [
        instance
        for index, instance in enumerate(prepared.source.test)
        if prepared.shard.owns(index)
        and not (
            instance.id in records and records[instance.id].complete_for(calibrated.fingerprints)
        )
    ]
    rows = DecoderRows(
        prepared.adapter,
        dict(prepared.decoders),
        prepared.decisions,
        batch_size=config.batch_size,
        seed=config.seed,
    )
    by_id = {instance.id: instance for instance in todo}
    if on_start is not None:
        on_start(len(todo))
    correct = dict.fromkeys([*prepared.calibrators, *prepared.decoders], 0)
    seen = 0
    with contextlib.ExitStack() as stack:
        record_log = None
        if prepared.files is not None:
            record_log = stack.enter_context(open_log(prepared.files.directory.records_path))

        def record_made(record: InstanceRecord) -> None:
            nonlocal seen
            record = rows.add(record, by_id[record.instance_id])
            record = replace(record, fingerprints=dict(calibrated.fingerprints))
            records[record.instance_id] = record
            if record_log is not None:
                record_log.append(record.to_dict())
            seen += len(record.targets)
            for label in evaluator.failures:
                correct.pop(label, None)
            for label in correct:
                correct[label] += sum(
                    c == t for c, t in zip(record.choices[label], record.targets, strict=True)
                )
            if on_record is not None:
                on_record(record, {label: 100.0 * correct[label] / seen for label in correct})

        evaluator.run(todo, on_record=record_made)
    return Evaluated(
        records=records,
        cache=prepared.cache,
        decisions=prepared.decisions,
        failures=dict(evaluator.failures),
        seconds_per_instance=evaluator.seconds_per_instance(),
        evaluated_here=len(todo),
        finished=time.perf_counter(),
    )


def merge(prepared: Prepared, evaluated: Evaluated) -> Evaluated | None:
    """Phase 4: wait for every rank; rank 0 reads all their logs (records, observations and
    decisions). None on the other ranks."""
    if not prepared.shard.distributed:
        return evaluated
    if prepared.files is not None:
        prepared.files.close_logs()  # every line is fsynced; closed before the others read
    prepared.shard.wait()
    if not prepared.shard.is_main or prepared.files is None:
        return None
    directory = prepared.files.directory
    cache = ObservationCache().load(directory.logs("observations"))
    decisions = DecisionCache().load(directory.logs("generations"))
    records = logged_records(prepared, directory)
    return replace(evaluated, records=records, cache=cache, decisions=decisions)


def logged_records(prepared: Prepared, directory: RunDirectory) -> dict[str, InstanceRecord]:
    """The records of the run directory's logs, each checked against its test instance: shown
    in the orders this run draws, with the benchmark's truth as its targets (a log edited to
    move the truth is refused, never summarised)."""
    records = directory.read_records()
    config = prepared.config
    check_logged_truth(
        records,
        prepared.source.test,
        **order_settings(config, prepared.n),
        fix="delete the run directory (or choose a new --out) and run again",
    )
    return records


def finish(prepared: Prepared, calibrated: Calibrated, evaluated: Evaluated) -> EvaluationResults:
    """Phase 5: summarise the records of every test instance and save ``results.json``."""
    config, source, n = prepared.config, prepared.source, prepared.n
    failures = evaluated.failures  # third-party calibrators that raised: dropped, named
    calibrators = {k: c for k, c in prepared.calibrators.items() if k not in failures}
    states = {k: s for k, s in calibrated.states.items() if k not in failures}
    fingerprints = {k: f for k, f in calibrated.fingerprints.items() if k not in failures}
    known = evaluated.records
    stale = [
        instance.id
        for instance in source.test
        if instance.id not in known or not known[instance.id].complete_for(fingerprints)
    ]
    if stale:
        raise InputError(f"{len(stale)} test instances have no record (first: {stale[0]})")
    records = [known[instance.id] for instance in source.test]
    labels = [*calibrators, *prepared.decoders]
    metrics = summarize(records, labels, n)
    outcomes, shown = record_outcomes(records, labels)
    statistics = run_statistics(
        outcomes,
        n,
        orders=shown,
        baselines=config.baselines,
        resamples=config.resamples,
        seed=config.seed,
    )
    views = {
        record.instance_id: [instance.permuted(order) for order in record.orders]
        for record, instance in zip(records, source.test, strict=True)
    }
    generated_costs = decoder_costs(dict(prepared.decoders), views, evaluated.decisions)
    results = EvaluationResults(
        settings=RunSettings.model_validate(
            # the task the run posed, also when the benchmark chose it (the report's nouns)
            config.model_dump(mode="json", exclude={"out"}) | {"task": source.test[0].task}
        ),
        adapter=AdapterDescription.model_validate(
            describe_adapter(prepared.adapter, n, source.test[0].task, images=source.shows_images)
        ),
        source=SourceDescription.model_validate(source.description),
        n=n,
        orders=orders_of(config, n),
        seed=config.seed,
        num_instances=len(records),
        calibration_ids=[instance.id for instance in source.calibration],
        test_ids=[instance.id for instance in source.test],
        calibrators={
            label: CalibratorResult(
                name=calibrator.name,
                options=calibrator.options.model_dump(mode="json"),
                metrics=metrics[label],
                cost=Cost(
                    forward_passes_per_instance=orders_of(config, n)
                    * calibrator.passes_with(n, states[label])
                ),
                calibration=state_provenance(
                    states[label], label in prepared.provided, config.calibration_transfer
                ),
                diagnostics={
                    k: v for k, v in states[label].diagnostics.items() if k != "soft_targets"
                },
            )
            for label, calibrator in calibrators.items()
        }
        | {
            label: CalibratorResult(
                name=decoder.name,
                options=decoder.options.model_dump(mode="json"),
                metrics=metrics[label],
                cost=Cost.model_validate(generated_costs[label].as_dict()),
                kind="decoder",
                order_independent=decoder.order_independent,
            )
            for label, decoder in prepared.decoders.items()
        },
        failed=dict(failures),
        plugins=plugin_versions(prepared.adapter, {**calibrators, **prepared.decoders}),
        divergence=divergence_profiles(
            calibrators, states, source.test, records, evaluated.cache, config.seed
        ),
        judge=judge_metrics(records, source.test, labels),
        statistics=statistics,
        ranking=ranking_statistics(
            records,
            source.test,
            labels,
            baselines=statistics.baselines,
            resamples=config.resamples,
            seed=config.seed,
        ),
        groups=group_statistics(
            outcomes, source.test, n, resamples=config.resamples, seed=config.seed
        ),
        timing=Timing.model_validate(
            {
                "calibration_seconds": calibrated.fitted - prepared.started,
                "evaluation_seconds": evaluated.finished - calibrated.fitted,
                "total_seconds": time.perf_counter() - prepared.started,
                "seconds_per_instance": dict(evaluated.seconds_per_instance)
                | {label: cost.seconds for label, cost in generated_costs.items()},
                "seconds_per_forward_pass": prepared.cache.seconds_per_pass(),
                "instances_evaluated_in_this_process": evaluated.evaluated_here,
                "world_size": prepared.shard.world,
                **peak_memory(),
            }
        ),
    )
    if prepared.files is not None:
        results.save(prepared.files.directory.results_path)
    return results


def state_provenance(state: CalibrationState, saved: bool, transfer: bool) -> CalibrationSource:
    """Where a calibrator's state came from, for results.json: fitted in this run, or loaded
    (and from which model, and whether a transfer to another model was allowed)."""
    if not saved:
        return CalibrationSource(source="fitted")
    return CalibrationSource(source="saved", model_id=state.model_id, transfer=transfer)


def run_evaluation(
    config: EvaluateConfig,
    *,
    resume: bool = False,
    on_record: Callable[[InstanceRecord, dict[str, float]], None] | None = None,
    shard: Shard | None = None,
    preset: Preset | None = None,
    on_start: Callable[[int], None] | None = None,
) -> EvaluationResults | None:
    """Calibrate, evaluate T orders per test instance, and summarise (the five phases).

    With ``config.out`` every observation and instance record is logged as it is made, so
    ``resume=True`` continues an interrupted run. In a data-parallel run every rank returns
    None except rank 0, which returns the merged results. ``preset`` fills what the config
    leaves open for a default model (see :func:`resolve_preset`). ``on_start`` hears how many
    test instances this process evaluates, once they are known (the benchmark may hold fewer
    than ``count``; a resumed run has some done).
    """
    resolved = resolve_preset(checked_config(config), preset)
    with resolved.threads(), prepare(resolved, resume=resume, shard=shard) as prepared:
        calibrated = calibrate(prepared)
        evaluated = merge(prepared, evaluate_shard(prepared, calibrated, on_record, on_start))
        return None if evaluated is None else finish(prepared, calibrated, evaluated)
