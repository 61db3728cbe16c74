"""One evaluation job from a config: adapter, instances, calibrators, run, results.

This is the one place that wires the pieces together for the CLI (`posdebias evaluate`,
`posdebias calibrate`) and for data-parallel runs; each piece stays usable on its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from posdebias.adapters.base import Adapter
from posdebias.adapters.synthetic import SyntheticAdapter, synthetic_instances
from posdebias.benchmarks.files import load_benchmark
from posdebias.calibrators.base import Calibrator
from posdebias.core.instance import RetrievalInstance
from posdebias.core.state import CalibrationState
from posdebias.decoders.base import Decoder
from posdebias.errors import CalibrationError, InputError
from posdebias.evaluation.config import EvaluateConfig
from posdebias.evaluation.decoding import DecisionCache, DecoderRows, decoder_costs
from posdebias.evaluation.distributed import Shard, current_shard
from posdebias.evaluation.divergence import divergence_profiles
from posdebias.evaluation.results import CalibratorResult, EvaluationResults, plugin_versions
from posdebias.evaluation.runner import (
    Evaluator,
    InstanceRecord,
    ObservationCache,
    fit_calibrators,
    summarize,
)
from posdebias.evaluation.store import PersistentObservationCache, RunDirectory
from posdebias.loading import create_adapter, load_adapter
from posdebias.registry import BundledModel, get_registry


def bundled_model(config: EvaluateConfig) -> BundledModel | None:
    """The bundled model the config runs: the registry's default model (registered by a plugin,
    the organism for posdebias itself) when neither a model nor an adapter is named, or the
    bundled model the config names; None for any other model."""
    registry = get_registry()
    if config.model is None and config.adapter.name is None:
        return registry.default_model()
    return registry.bundled_model(config.model) if config.model is not None else None


def resolved_model(config: EvaluateConfig) -> str | None:
    """The model the config loads: its ``model``, or the default bundled model's name when
    neither a model nor an adapter is named."""
    if config.model is None and config.adapter.name is None:
        default = get_registry().default_model()
        if default is None:
            raise InputError("name a model (--model) or an adapter (--adapter)")
        return default.name
    return config.model


def build_adapter(config: EvaluateConfig, shard: Shard | None = None) -> Adapter:
    """The adapter named by the config; ``model`` loads a Hugging Face model (by model_type
    unless an adapter name is given); with neither, the default bundled model."""
    options = dict(config.adapter.options)
    model = resolved_model(config)
    if model is not None:
        if shard is not None and shard.distributed and not {"device", "device_map"} & set(options):
            options["device"] = shard.device
        return load_adapter(model, adapter=config.adapter.name, **options)
    return create_adapter(config.adapter.name, **options)


def with_default_batch_size(config: EvaluateConfig) -> EvaluateConfig:
    """The config with the bundled model's own batch size when it runs and no batch size was
    given (results do not depend on the batch size; the run is recorded with it)."""
    bundled = bundled_model(config)
    if "batch_size" in config.model_fields_set or bundled is None or bundled.batch_size is None:
        return config
    return config.model_copy(update={"batch_size": bundled.batch_size})


@contextlib.contextmanager
def default_model_threads(config: EvaluateConfig) -> Iterator[None]:
    """Run a bundled model with the torch thread count it asks for (the caller's setting is
    restored after). Other models keep torch's own setting."""
    bundled = bundled_model(config)
    if bundled is None or bundled.threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(bundled.threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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

    calibration: list[RetrievalInstance]
    test: list[RetrievalInstance]
    description: dict[str, Any] = field(default_factory=dict)


def split_held_out(
    instances: list[RetrievalInstance], count: int, seed: int
) -> tuple[list[RetrievalInstance], list[RetrievalInstance]]:
    """Hold ``count`` calibration instances out of a benchmark by seed (file order kept)."""
    if count >= len(instances):
        raise InputError(
            f"the benchmark has {len(instances)} instances; holding out {count} for calibration "
            "leaves none to test. Lower --calibration-count or give a separate calibration file."
        )
    chosen = set(np.random.default_rng(seed).choice(len(instances), count, replace=False).tolist())
    calibration = [inst for i, inst in enumerate(instances) if i in chosen]
    test = [inst for i, inst in enumerate(instances) if i not in chosen]
    return calibration, test


def load_instances(config: EvaluateConfig, adapter: Adapter) -> InstanceSource:
    """(calibration, test) instances: from ``benchmark`` (calibration held out by seed, or
    from ``calibration_benchmark``), the bundled shapes benchmark for the bundled model, or the
    simulated model's own instances."""
    benchmark_path = config.benchmark
    model_id = getattr(adapter, "model_id", None)
    bundled = get_registry().bundled_model(model_id) if isinstance(model_id, str) else None
    if benchmark_path is None and bundled is not None and bundled.benchmark is not None:
        size = bundled.benchmark_size
        if size is not None and config.count + config.calibration_count > size:
            raise InputError(
                f"the bundled benchmark has {size} instances, fewer than --count "
                f"{config.count} plus {config.calibration_count} calibration instances; lower "
                "--count or build a larger one with `posdebias build --source shapes`"
            )
        benchmark_path = bundled.benchmark(config.n)
    if benchmark_path is None:
        if not isinstance(adapter, SyntheticAdapter):  # it simulates its own instances
            raise InputError(
                f"adapter {adapter.name!r} needs real images: pass --benchmark DIR (build one "
                "with `posdebias build`)"
            )

        return InstanceSource(
            calibration=synthetic_instances(
                config.calibration_count, config.n, config.seed + 1, "cal"
            ),
            test=synthetic_instances(config.count, config.n, config.seed, "test"),
            description={"source": "synthetic", "n": config.n},
        )

    benchmark = load_benchmark(benchmark_path)
    description = {"benchmark": str(benchmark_path), "benchmark_sha256": benchmark.fingerprint}
    if config.calibration_benchmark is not None:
        held = load_benchmark(config.calibration_benchmark)
        calibration = held.instances[: config.calibration_count]
        test = benchmark.instances
        description["calibration_benchmark_sha256"] = held.fingerprint
    else:
        calibration, test = split_held_out(
            benchmark.instances, config.calibration_count, config.seed
        )
    return InstanceSource(calibration, test[: config.count], description)


def load_states(path: Path) -> dict[str, CalibrationState]:
    """Calibration states from a file or a directory of ``<label>.json`` files."""
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise CalibrationError(f"{path} holds no calibration state (*.json)")
        return {file.stem: CalibrationState.load(file) for file in files}
    state = CalibrationState.load(path)
    return {state.calibrator: state}


def resolve_states(
    config: EvaluateConfig,
    adapter: Adapter,
    calibrators: dict[str, Calibrator],
    calibration: list[RetrievalInstance],
    n: int,
    cache: ObservationCache,
) -> dict[str, CalibrationState]:
    """Saved states where ``--calibration`` gives them (checked against this model and
    setting), freshly fitted ones for the rest."""
    metadata = adapter.describe()
    provided: dict[str, CalibrationState] = {}
    if config.calibration is not None:
        saved = load_states(config.calibration)
        for label, calibrator in calibrators.items():
            state = saved.get(label) or next(
                (s for s in saved.values() if s.calibrator == calibrator.name), None
            )
            if state is None:
                continue
            state.check_compatible(
                calibrator=calibrator.name,
                n=n,
                layers=adapter.attention_layers if calibrator.needs_attention else None,
                label_set=adapter.labels_for(n),
                adapter=adapter.name,
            )
            provided[label] = state
    missing = {label: c for label, c in calibrators.items() if label not in provided}
    fitted = (
        fit_calibrators(
            adapter,
            missing,
            calibration,
            batch_size=config.batch_size,
            cache=cache,
            metadata={k: metadata.get(k) for k in ("model_id", "prompt_hash")},
        )
        if missing
        else {}
    )
    return {label: provided.get(label) or fitted[label] for label in calibrators}


def run_identity(config: EvaluateConfig, adapter: Adapter, source: InstanceSource) -> dict:
    """What must match for ``--resume`` to reuse a run's observations and records."""
    described = {k: v for k, v in adapter.describe().items() if k not in ("device",)}
    # the benchmark is identified by its content hash: a moved folder still resumes
    source_identity = {k: v for k, v in source.description.items() if k != "benchmark"}
    identity = {
        "adapter": json.loads(json.dumps(described, sort_keys=True, default=str)),
        "source": source_identity,
        "seed": config.seed,
        "orders": config.orders,
        "count": config.count,
        "calibration_count": config.calibration_count,
    }
    if config.calibration is not None:
        digest = hashlib.sha256()
        for path in (
            sorted(config.calibration.glob("*.json"))
            if config.calibration.is_dir()
            else [config.calibration]
        ):
            digest.update(path.read_bytes())
        identity["calibration"] = digest.hexdigest()
    return identity


def peak_memory() -> dict[str, float]:
    """Peak resident memory of this process (MB) and, on CUDA, peak allocated GPU memory."""
    usage = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            usage["cuda_max_allocated_mb"] = torch.cuda.max_memory_allocated() / 2**20
    except ImportError:
        pass
    return usage


def run_evaluation(
    config: EvaluateConfig,
    *,
    resume: bool = False,
    on_record: Callable[[InstanceRecord, dict[str, float]], None] | None = None,
    shard: Shard | None = None,
) -> EvaluationResults | None:
    """Calibrate, evaluate T orders per test instance, and summarise.

    With ``config.out`` every observation and instance record is logged as it is made, so
    ``resume=True`` continues an interrupted run. In a data-parallel run every rank returns
    None except rank 0, which returns the merged results.
    """
    with default_model_threads(config):
        return _run_evaluation(config, resume=resume, on_record=on_record, shard=shard)


def _run_evaluation(
    config: EvaluateConfig,
    *,
    resume: bool,
    on_record: Callable[[InstanceRecord, dict[str, float]], None] | None,
    shard: Shard | None,
) -> EvaluationResults | None:
    started = time.perf_counter()
    shard = shard or current_shard()
    calibrators = build_calibrators(config)
    decoders = build_decoders(config)
    adapter = build_adapter(config, shard)
    config = with_default_batch_size(config)
    source = load_instances(config, adapter)
    if not source.test:
        raise InputError("no test instances to evaluate")
    n = source.test[0].n
    run_dir = None
    cache: ObservationCache = ObservationCache()
    decisions = DecisionCache()
    logs = []
    if config.out is not None:
        run_dir = RunDirectory(config.out, rank=shard.rank if shard.distributed else None)
        if shard.distributed and not shard.is_main:
            shard.wait()  # rank 0 creates or checks the directory first
            run_dir.prepare(run_identity(config, adapter, source), resume=True)
        else:
            run_dir.prepare(run_identity(config, adapter, source), resume=resume)
            if shard.distributed:
                shard.wait()
        observation_log = run_dir.open_observation_log()
        logs.append(observation_log)
        cache = PersistentObservationCache(observation_log)
        if decoders:
            generation_log = run_dir.open_generation_log()
            logs.append(generation_log)
            decisions = DecisionCache(generation_log)
        if resume or shard.distributed:
            cache.load(run_dir.observation_logs())
            decisions.load(run_dir.generation_logs())
    try:
        states = resolve_states(config, adapter, calibrators, source.calibration, n, cache)
        if run_dir is not None and shard.is_main:
            for label, state in states.items():
                state.save(run_dir.states_dir / f"{label}.json")
        fitted = time.perf_counter()
        evaluator = Evaluator(
            adapter,
            calibrators,
            states,
            orders=config.orders,
            seed=config.seed,
            batch_size=config.batch_size,
            cache=cache,
        )
        rows = DecoderRows(
            adapter, decoders, decisions, batch_size=config.batch_size, seed=config.seed
        )
        done = run_dir.read_records() if (run_dir is not None and resume) else {}
        labels = set(calibrators) | set(decoders)
        todo = [
            instance
            for index, instance in enumerate(source.test)
            if shard.owns(index)
            and not labels
            <= set(done.get(instance.id, InstanceRecord(instance.id, [], [])).choices)
        ]
        record_log = run_dir.open_record_log() if run_dir is not None else None
        if record_log is not None:
            logs.append(record_log)
        correct = dict.fromkeys([*calibrators, *decoders], 0)
        seen = 0
        for instance in todo:
            record = rows.add(evaluator.evaluate_instance(instance), instance)
            done[record.instance_id] = record
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
    finally:
        for log in logs:
            log.close()
    evaluated = time.perf_counter()
    if shard.distributed:
        shard.wait()
        if not shard.is_main:
            return None
        assert run_dir is not None and isinstance(cache, PersistentObservationCache)
        done = run_dir.read_records()
        cache.load(run_dir.observation_logs())
        decisions.load(run_dir.generation_logs())
    missing = [instance.id for instance in source.test if instance.id not in done]
    if missing:
        raise InputError(f"{len(missing)} test instances have no record (first: {missing[0]})")
    records = [done[instance.id] for instance in source.test]
    calibrators = {k: c for k, c in calibrators.items() if k not in evaluator.failures}
    states = {k: s for k, s in states.items() if k not in evaluator.failures}
    metrics = summarize(records, [*calibrators, *decoders], n)
    views = {
        record.instance_id: [instance.permuted(order) for order in record.orders]
        for record, instance in zip(records, source.test, strict=True)
    }
    generated_costs = decoder_costs(decoders, views, decisions)

    results = EvaluationResults(
        settings=config.model_dump(mode="json", exclude={"out"}),
        adapter=adapter.describe(),
        source=source.description,
        n=n,
        orders=config.orders,
        seed=config.seed,
        num_instances=len(records),
        calibration_ids=[instance.id for instance in source.calibration],
        test_ids=[instance.id for instance in source.test],
        calibrators={
            label: CalibratorResult(
                name=calibrator.name,
                options=calibrator.options.model_dump(mode="json"),
                metrics=metrics[label],
                cost={"forward_passes_per_instance": config.orders * calibrator.forward_passes(n)},
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
                cost=generated_costs[label].as_dict(),
                kind="decoder",
            )
            for label, decoder in decoders.items()
        },
        failed=dict(evaluator.failures),
        plugins=plugin_versions(adapter, {**calibrators, **decoders}),
        divergence=divergence_profiles(
            calibrators, states, source.test, records, cache, config.seed
        ),
        timing={
            "calibration_seconds": fitted - started,
            "evaluation_seconds": evaluated - fitted,
            "total_seconds": time.perf_counter() - started,
            "seconds_per_instance": {
                label: cost.per_instance()["seconds_per_instance"]
                for label, cost in evaluator.costs.items()
            }
            | {label: cost.seconds for label, cost in generated_costs.items()},
            "instances_evaluated_in_this_process": len(todo),
            "world_size": shard.world,
            **peak_memory(),
        },
    )
    if run_dir is not None:
        results.save(run_dir.results_path)
    return results
