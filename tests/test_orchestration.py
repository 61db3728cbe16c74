"""The run's phases, presets, a pure describe(n), the build config, early attention checks."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import yaml

import posdebias.defaults as defaults
from helpers import build_shapes_benchmark
from posdebias.cli import main
from posdebias.errors import InputError
from posdebias.evaluation.config import load_config
from posdebias.evaluation.distributed import Shard
from posdebias.evaluation.job import (
    calibrate,
    evaluate_shard,
    finish,
    merge,
    prepare,
    run_evaluation,
)
from posdebias.evaluation.preset import Preset, ResolvedConfig, resolve_preset

SRC = Path(__file__).parents[1] / "src" / "posdebias"


def _timeless(results) -> dict:
    payload = results.model_dump(mode="json")
    payload.pop("timing")
    return payload


def test_phases_one_by_one_equal_the_whole_run(tmp_path):
    """Each phase takes what it needs and hands the next a frozen value; run step by step,
    they give what the whole run gives."""
    config = load_config(None, adapter="synthetic", count=12, orders=2, out=tmp_path / "a")
    with prepare(resolve_preset(config, None), shard=Shard()) as prepared:
        assert prepared.earlier == {} and prepared.files is not None
        calibrated = calibrate(prepared)
        assert set(calibrated.states) == set(prepared.calibrators) == set(calibrated.fingerprints)
        assert sorted(p.name for p in (tmp_path / "a" / "states").iterdir()) == sorted(
            f"{label}.json" for label in prepared.calibrators
        )
        seen = []
        evaluated = evaluate_shard(
            prepared, calibrated, lambda record, accuracy: seen.append(record.instance_id)
        )
        assert len(seen) == 12 and evaluated.evaluated_here == 12
        assert set(evaluated.records) == set(seen) and prepared.earlier == {}
        assert merge(prepared, evaluated) is evaluated  # one process: nothing to gather
        stepwise = finish(prepared, calibrated, evaluated)
        for value in (prepared, calibrated, evaluated):
            with pytest.raises(dataclasses.FrozenInstanceError):
                value.n = 3  # type: ignore[misc]
    whole = run_evaluation(config.model_copy(update={"out": tmp_path / "b"}))
    assert _timeless(stepwise) == _timeless(whole)
    # the lock is released on leaving: a resumed run reuses every record of the first
    with prepare(resolve_preset(config, None), resume=True, shard=Shard()) as again:
        assert set(again.earlier) == set(seen)
        evaluated = evaluate_shard(again, calibrate(again))
        assert evaluated.evaluated_here == 0 and set(evaluated.records) == set(seen)


def test_a_data_parallel_run_needs_a_run_directory(tmp_path):
    """Ranks hand their records to rank 0 through --out: without it, a clear error before
    any model is built (not a failed assertion at the merge)."""
    config = load_config(None, adapter="synthetic", count=4, orders=1)
    with pytest.raises(InputError, match="a data-parallel run needs --out DIR"):
        prepare(resolve_preset(config, None), shard=Shard(rank=0, world=2))


def test_a_preset_fills_only_what_the_config_leaves_open(tmp_path, torch_threads_elsewhere):
    """A preset for the simulated model: its batch, its benchmark, its threads."""
    import torch

    bench = build_shapes_benchmark(tmp_path, count=defaults.CALIBRATION_COUNT + 4, n=3)
    calls = []

    def benchmark(n: int, needed: int) -> Path:
        calls.append((n, needed, torch.get_num_threads()))
        return bench

    preset = Preset(model="m", benchmark=benchmark, batch_size=9, threads=1)
    open_config = load_config(None, orders=3, n=3)
    resolved = resolve_preset(open_config, preset)
    assert resolved.config.model == "m" and resolved.config.batch_size == 9
    assert resolved.preset is preset
    # a batch size the user gave is kept; another model does not get the preset
    given = resolve_preset(load_config(None, orders=3, batch_size=2), preset)
    assert given.config.batch_size == 2
    other = resolve_preset(load_config(None, model="other"), preset)
    assert other.preset is None and other.config.batch_size == 1
    named = resolve_preset(load_config(None, adapter="synthetic"), preset)
    assert named.preset is None and named.config.model is None
    # the preset's benchmark factory is what prepare reads (with the preset's threads)
    before = torch_threads_elsewhere
    resolved = ResolvedConfig(load_config(None, adapter="synthetic", n=3), preset)
    with resolved.threads():
        prepared = prepare(resolved, shard=Shard())
    assert calls == [(3, 200 + defaults.CALIBRATION_COUNT, 1)]
    assert torch.get_num_threads() == before
    assert prepared.source.description["benchmark_sha256"] and prepared.n == 3


def test_evaluation_knows_no_model_by_name():
    """No module of the evaluation layer imports the organism or names the default model."""
    for path in (SRC / "evaluation").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("posdebias.organism"), path
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("posdebias.organism") for a in node.names), path
        assert "posdebias/organism" not in path.read_text(), path


def test_describe_is_a_pure_function_of_the_adapter_and_n(tmp_path):
    from posdebias.core.instance import Instance
    from posdebias.loading import load_adapter
    from posdebias.testing import save_tiny_model, write_test_images

    model = save_tiny_model("llava", tmp_path / "model")
    adapter = load_adapter(model, dtype="float32", device="cpu")
    before = {n: adapter.describe(n) for n in (2, 3, 4)}
    assert before[3]["labels"] == ["1", "2", "3"] and before[4]["labels"] == ["1", "2", "3", "4"]
    assert adapter.describe()["labels"] is None
    images = write_test_images(tmp_path / "images", 3)
    adapter.observe(Instance(stem="a red square", images=tuple(images), target=0, id="x"))
    assert {n: adapter.describe(n) for n in (2, 3, 4)} == before
    assert adapter.describe()["labels"] is None  # not the last N seen


def test_run_json_and_results_agree_on_the_adapter(tmp_path):
    from posdebias.testing import save_tiny_model

    model = save_tiny_model("llava", tmp_path / "model")
    bench = build_shapes_benchmark(tmp_path, count=8, n=3)
    out = tmp_path / "run"
    args = ["evaluate", "--model", model, "--benchmark", bench, "--calibrators", "vanilla"]
    assert (
        main([str(a) for a in [*args, "--orders", "1", "--calibration-count", "2", "--out", out]])
        == 0
    )
    run = json.loads((out / "run.json").read_text())["adapter"]
    results = json.loads((out / "results.json").read_text())["adapter"]
    assert run["labels"] == results["labels"] == ["1", "2", "3"]
    assert {k: v for k, v in results.items() if k != "device"} == run


def test_attention_calibrator_with_a_blind_adapter_fails_before_any_forward(tmp_path, capsys):
    from posdebias import hookimpl
    from posdebias.adapters.families.synthetic import SyntheticAdapter
    from posdebias.registry import get_registry

    forwards = []

    class Blind(SyntheticAdapter):
        name = "blind"
        provides_attention = False

        @classmethod
        def create(cls, **options):
            return cls(**options)

        def observe_many(self, instances, *, batch_size=1):
            forwards.append(len(instances))
            return super().observe_many(instances, batch_size=batch_size)

    class Plugin:
        @hookimpl
        def posdebias_register_adapters(self, register):
            register(Blind)

    get_registry().add_plugin(Plugin(), name="blind-plugin")
    for calibrators in ("vanilla,attention_guided", "purified_attention", "attention_readout"):
        out = tmp_path / calibrators.replace(",", "_")
        code = main(
            ["evaluate", "--adapter", "blind", "--calibrators", calibrators, "--out", str(out)]
        )
        err = capsys.readouterr().err
        assert code == 2 and "needs attention" in err and "blind" in err, err
        assert forwards == [] and not out.exists()


# -- the build config -----------------------------------------------------------------------


def _shapes_config(root: Path, out: Path, **extra) -> dict:
    return {
        "source": {"kind": "shapes", "root": str(root), "images": 30, "seed": 1},
        "setting": "random",
        "n": 3,
        "count": 8,
        "seed": 2,
        "out": str(out),
        **extra,
    }


@pytest.mark.parametrize("suffix", [".yaml", ".toml", ".json"])
def test_build_config_file_equals_the_flags(tmp_path, suffix):
    flags = tmp_path / "flags"
    args = ["build", "--source", "shapes", "--root", tmp_path / "shapes", "--setting", "random"]
    args += ["-N", "3", "--count", "8", "--seed", "2", "--shapes-images", "30"]
    args += ["--shapes-seed", "1", "--out", flags]
    assert main([str(a) for a in args]) == 0
    config = tmp_path / f"build{suffix}"
    payload = _shapes_config(tmp_path / "shapes", tmp_path / "from-file")
    config.write_text(
        json.dumps(payload)
        if suffix == ".json"
        else yaml.safe_dump(payload)
        if suffix == ".yaml"
        else _toml(payload)
    )
    assert main(["build", "--config", str(config)]) == 0
    for name in ("benchmark.jsonl",):
        assert (flags / name).read_bytes() == (tmp_path / "from-file" / name).read_bytes()
    # flags override the file
    assert (
        main(["build", "--config", str(config), "--seed", "5", "--out", str(tmp_path / "c")]) == 0
    )
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["seed"] == 5 and manifest["n"] == 3


def _toml(payload: dict) -> str:
    lines = []
    for key, value in payload.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {json.dumps(value)}")
    for key, value in payload.items():
        if isinstance(value, dict):
            lines.append(f"[{key}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"cuont": 3}, "unknown key 'cuont'"),
        ({"source": {"kind": "coco", "root": "x", "images": 3}}, "source.coco.images"),
        ({"source": {"root": "x"}}, "the source kind is missing"),
        ({"adversarial": {"clip_model": "ViT-B-32"}}, "adversarial options are given for a random"),
        ({"adversarial": {"caption_threshold": 2}}, "caption_threshold"),
        ({"n": "four"}, "n: Input should be a valid integer"),
    ],
)
def test_build_config_errors_name_the_field(tmp_path, capsys, change, message):
    config = tmp_path / "build.yaml"
    payload = {**_shapes_config(tmp_path / "shapes", tmp_path / "out"), **change}
    config.write_text(yaml.safe_dump(payload))
    assert main(["build", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "shapes").exists()


def test_build_config_in_python_matches_the_cli(tmp_path):
    from posdebias.benchmarks.build import build_benchmark
    from posdebias.benchmarks.config import BuildConfig, ShapesSource

    config = BuildConfig(
        source=ShapesSource(root=tmp_path / "shapes", images=30, seed=1),
        out=tmp_path / "py",
        n=3,
        count=8,
        seed=2,
    )
    report = build_benchmark(config)
    assert report.manifest.count == 8 and report.manifest.source.shapes["seed"] == 1
    cli = tmp_path / "cli.yaml"
    cli.write_text(yaml.safe_dump(_shapes_config(tmp_path / "shapes", tmp_path / "cli")))
    assert main(["build", "--config", str(cli)]) == 0
    assert (tmp_path / "py" / "benchmark.jsonl").read_bytes() == (
        tmp_path / "cli" / "benchmark.jsonl"
    ).read_bytes()
    assert config.adversarial is None  # CLIP options exist only for adversarial builds
