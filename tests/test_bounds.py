"""Every number a user gives has a documented range, checked before any work.

One class of problem, many doors: a flag (``--count 1e9``), a config file (``tau: .inf``), a
calibrator, decoder or adapter option, a sweep value, a saved calibration state, a benchmark
file or manifest, a study's point files. The model-level tests walk every model that takes such
numbers (so a new option without a range fails here); the CLI tests try the examples of each
door through the real command line: exit 2, a message naming the value and its range, nothing
written, and no time spent.
"""

from __future__ import annotations

import json
import math
import re
import time
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from helpers import build_shapes_benchmark
from posdebias.cli import main

SIM = ("evaluate", "--adapter", "synthetic")


def _numeric(annotation) -> bool:
    if annotation in (int, float):
        return True
    return any(arg is not bool and _numeric(arg) for arg in typing.get_args(annotation))


def _models() -> dict[str, type[BaseModel]]:
    """Every model whose numbers come from a user or a file."""
    from posdebias.benchmarks.config import AdversarialOptions, BuildConfig, ShapesSource
    from posdebias.benchmarks.files import BenchmarkManifest, InstanceRecord, SourceInfo
    from posdebias.core.state import CalibrationState
    from posdebias.evaluation.config import EvaluateConfig
    from posdebias.evaluation.sweep.store import PointRow, PointTiming, TimingFile
    from posdebias.integrations.harness import HarnessConfig
    from posdebias.registry import get_registry

    registry = get_registry()
    models: dict[str, type[BaseModel]] = {
        "config": EvaluateConfig,
        "build config": BuildConfig,
        "shapes source": ShapesSource,
        "CLIP options": AdversarialOptions,
        "harness settings": HarnessConfig,
        "calibration state": CalibrationState,
        "benchmark manifest": BenchmarkManifest,
        "manifest source": SourceInfo,
        "benchmark line": InstanceRecord,
        "sweep point row": PointRow,
        "sweep timing": PointTiming,
        "sweep timing file": TimingFile,
    }
    for kind, names, get in (
        ("adapter", registry.adapter_names(), registry.adapter_class),
        ("calibrator", registry.calibrator_names(), registry.calibrator_class),
        ("decoder", registry.decoder_names(), registry.decoder_class),
    ):
        for name in names:
            cls = get(name)
            if cls.__module__.startswith("posdebias."):
                models[f"{kind} {name}"] = cls.Options
    return models


#: Fitted or measured values: checked to be finite (the attention prior also non-negative) and
#: shaped as N and the layers say, but of any size: no range of their own.
_ANY_SIZE = {
    ("calibration state", "observed_profile"),
    ("calibration state", "bias_matrix"),
    ("calibration state", "gamma"),
    ("calibration state", "attention_prior"),
    ("calibration state", "logit_prior"),
    ("benchmark line", "similarities"),
    ("benchmark line", "caption_similarities"),
    ("benchmark line", "meta"),
    ("benchmark manifest", "counts"),
    ("sweep point row", "value"),
}


def test_every_number_a_user_gives_has_a_range_and_plugins_shows_it():
    """A numeric field without both ends of a range (its own or its items') is a door left
    open; `posdebias plugins --options` prints the range the model checks."""
    from posdebias.cli.plugins import option_range

    missing, seen = [], 0
    for label, model in _models().items():
        for name, info in model.model_fields.items():
            if not _numeric(info.annotation) or (label, name) in _ANY_SIZE:
                continue
            seen += 1
            shown = option_range(info)
            if " to " not in shown:
                missing.append(f"{label}: {name} ({shown or 'no range'})")
    assert not missing, missing
    assert seen > 60


@pytest.mark.parametrize("bad", [10**12, -(10**12), math.inf, -math.inf, math.nan])
def test_option_models_refuse_huge_and_non_finite_numbers(bad):
    """Each numeric option of every built-in options model and of the run config, set alone
    to a huge or a non-finite value, is refused by validation (before any work)."""
    accepted = []
    for label, model in _models().items():
        if not label.startswith(("adapter", "calibrator", "decoder", "config", "CLIP")):
            continue
        for name, info in model.model_fields.items():
            if not _numeric(info.annotation):
                continue
            if isinstance(bad, float) and not any(
                arg is float or (_numeric(arg) and float in typing.get_args(arg))
                for arg in (info.annotation, *typing.get_args(info.annotation))
            ):
                continue  # an int field: json cannot carry inf or nan into it
            value = _shaped(info.annotation, bad)
            try:
                model.model_validate({name: value})
            except ValidationError:
                continue
            accepted.append(f"{label}: {name} = {value!r}")
    assert not accepted, accepted


def _shaped(annotation, value):
    """``value`` where the field wants it: alone, or as the item of a list or tuple."""
    for arg in (annotation, *typing.get_args(annotation)):
        origin = typing.get_origin(arg)
        if origin is list:
            item = typing.get_args(arg)[0]
            return [_shaped(item, value)] if typing.get_origin(item) is list else [value]
        if origin is tuple:
            return [value, value]
    return value


# -- saved calibration states -------------------------------------------------------------------


def _state_payload() -> dict:
    return {
        "schema_version": 2,
        "calibrator": "attention_guided",
        "n": 2,
        "num_layers": 2,
        "observed_profile": [[-0.1, -2.4], [-1.9, -0.2]],
        "bias_matrix": [[-0.6, -2.4], [-1.9, -0.7]],
        "gamma": 0.5,
        "attention_prior": [[0.3, 0.2], [0.25, 0.25]],
        "num_observations": 4,
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"attention_prior": [[-0.3, 0.2], [0.25, 0.25]]}, "attention_prior holds negative"),
        ({"attention_prior": [[0.3, -1e-9], [0.25, 0.25]]}, "attention_prior holds negative"),
        ({"attention_prior": [[0.3, 0.2]]}, "attention_prior has 1 layers but num_layers is 2"),
        # JSON has no NaN / Infinity: refused as the file is read, before any field
        ({"bias_matrix": [[-0.6, "NaN"], [-1.9, -0.7]]}, "NaN is no number JSON allows"),
        ({"gamma": "Infinity"}, "Infinity is no number JSON allows"),
        (
            {"n": 27, "observed_profile": None, "bias_matrix": None, "attention_prior": None},
            "n: Input should be less than or equal to 26",
        ),
        ({"num_layers": 0}, "num_layers: Input should be greater than or equal to 1"),
        ({"num_observations": -4}, "num_observations: Input should be greater than or equal"),
        # numbers as written: an edited state is not read laxly
        ({"num_layers": 2.0}, "num_layers: Input should be a valid integer (got 2.0)"),
        ({"num_observations": True}, "num_observations: Input should be a valid integer (got"),
        ({"gamma": "0.5"}, "gamma: Input should be a valid number (got '0.5')"),
    ],
)
def test_a_saved_state_with_impossible_numbers_is_refused_at_load(
    tmp_path, capsys, change, message
):
    """A negative attention prior used to surface as "posterior contains NaN" (exit 1)."""
    path = tmp_path / "state.json"
    text = json.dumps({**_state_payload(), **change})
    path.write_text(text.replace('"NaN"', "NaN").replace('"Infinity"', "Infinity"))
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(
        [
            *SIM,
            "--calibration",
            str(path),
            "--calibrators",
            "attention_guided",
            "--count",
            "2",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "internal error" not in err and "NaN" not in err.split(message)[0][-40:]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_valid_saved_state_of_the_same_shape_loads():
    from posdebias.core.state import CalibrationState

    state = CalibrationState.from_payload(_state_payload())
    assert state.attention_prior_array.min() >= 0


# -- the examples, and variants, through the command line --------------------------------


def _cli(capsys, *args) -> tuple[int, str]:
    started = time.perf_counter()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    assert time.perf_counter() - started < 60  # refused before any work
    return code, err


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["evaluate", "--count", "1e9"], "argument --count: invalid int value"),
        (["evaluate", "--count", "1000000000"], "count: Input should be less than or equal to"),
        ([*SIM, "--orders", "100000"], "orders: Input should be less than or equal to 1000"),
        ([*SIM, "--calibration-count", "1000000"], "calibration_count: Input should be less"),
        ([*SIM, "--batch-size", "100000000"], "batch_size: Input should be less than or equal"),
        ([*SIM, "--seed", str(2**40)], "seed: Input should be less than or equal to 4294967295"),
        ([*SIM, "--resamples", "10000000"], "resamples: Input should be less than or equal"),
        (
            ["calibrate", "--adapter", "synthetic", "--count", "1000000", "--out", "OUT"],
            "calibration_count: Input should be less than or equal to 10000",
        ),
        (
            [
                "build",
                "--source",
                "shapes",
                "--root",
                "OUT/r",
                "--count",
                "1000000000",
                "--out",
                "OUT/b",
            ],
            "--count must be a whole number from 1 to 1,000,000",
        ),
        (
            [
                "build",
                "--source",
                "shapes",
                "--root",
                "OUT/r",
                "--shapes-images",
                "1000000000",
                "--out",
                "OUT/b",
            ],
            "--shapes-images must be a whole number from 1 to 100,000",
        ),
        (
            [
                "build",
                "--source",
                "shapes",
                "--root",
                "OUT/r",
                "--shapes-image-size",
                "100000",
                "--out",
                "OUT/b",
            ],
            "--shapes-image-size must be a whole number from 8 to 4,096",
        ),
        (
            [
                "build",
                "--source",
                "shapes",
                "--root",
                "OUT/r",
                "--pool-size",
                "10000000000",
                "--out",
                "OUT/b",
            ],
            "--pool-size must be a whole number from 1 to 1,000,000",
        ),
        (
            ["organism", "train", "--out", "OUT/m", "--threads", "100000"],
            "--threads must be a whole number from 1 to",
        ),
        (
            ["organism", "train", "--out", "OUT/m", "--steps", "1", "1", "1", "10000000"],
            "--steps must be a whole number from 1 to 1,000,000",
        ),
        (
            ["organism", "train", "--out", "OUT/m", "--batch-size", "1000000"],
            "--batch-size must be a whole number from 2 to 4,096",
        ),
        (
            ["report", "--compare", "OUT/a", "OUT/b", "--seed", "-1"],
            "--seed must be a whole number from 0 to 4,294,967,295",
        ),
        (["check", "--model", "OUT/m", "-N", "27"], "-N must be a whole number from 2 to 26"),
        (
            [
                "build",
                "--source",
                "shapes",
                "--root",
                "OUT/r",
                "--count",
                "60000",
                "--out",
                "OUT/b",
            ],
            "this shapes build would generate 120,000 images (--pool-size, or 2 x --count), over",
        ),
        (
            [
                "build",
                "--source",
                "shapes",
                "--root",
                "OUT/r",
                "--pool-size",
                "200000",
                "--out",
                "OUT/b",
            ],
            "this shapes build would generate 200,000 images",
        ),
    ],
)
def test_numbers_on_the_command_line_are_bounded(tmp_path, capsys, args, message):
    args = [str(a).replace("OUT", str(tmp_path / "out")) for a in args]
    code, err = _cli(capsys, *args)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("calibrators:\n  attention_guided: {tau: .inf}\n", "tau: Input should be less than"),
        ("calibrators:\n  attention_guided: {tau: .nan}\n", "tau: Input should be"),
        ("calibrators:\n  attention_guided: {tau: 1e300}\n", "tau: Input should be less than"),
        ("calibrators:\n  attention_guided: {top_k: 100000}\n", "top_k: Input should be less"),
        ("calibrators:\n  attention_guided: {layer_range: [0, 99999]}\n", "layer_range.1:"),
        ("calibrators:\n  permutation_average: {count: 1000000}\n", "count: Input should be"),
        ("calibrators:\n  label_free: {iterations: 1000000000}\n", "iterations: Input should"),
        ("decoders:\n  generated: {max_new_tokens: 1000000000}\n", "max_new_tokens: Input"),
        ("decoders:\n  self_consistency: {samples: 1000000000}\n", "samples: Input should"),
        ("decoders:\n  self_consistency: {temperature: .inf}\n", "temperature: Input should"),
        ("decoders:\n  sofa: {layer_stride: 1000000}\n", "layer_stride: Input should be less"),
        ("adapter: {name: synthetic, options: {num_layers: 1000000000}}\n", "num_layers: Input"),
        ("adapter: {name: synthetic, options: {noise: .inf}}\n", "noise: Input should be"),
        ("adapter: {name: synthetic, options: {latency: 1e9}}\n", "latency: Input should be"),
        ("count: 1000000000\n", "count: Input should be less than or equal to 1000000"),
        ("calibration_count: 1000000\n", "calibration_count: Input should be less than or"),
        ("orders: 1e9\n", "orders: Input should be a valid integer"),
        ("seed: -5\n", "seed: Input should be greater than or equal to 0"),
    ],
)
def test_numbers_in_config_files_are_bounded(tmp_path, capsys, config, message):
    path = _config(tmp_path, config)
    count = [] if config.startswith("count:") else ["--count", "2"]  # a flag overrides the file
    code, err = _cli(capsys, "evaluate", "--config", path, *count, "--out", tmp_path / "r")
    assert code == 2 and message in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("study", "values", "message"),
    [
        (
            "calibration_size",
            "1,1000000",
            "calibration_count: Input should be less than or equal to 10000",
        ),
        ("calibration_size", "5,20000", "calibration_size=20000: calibration_count: Input"),
        ("n", "2,30", "n=30: n: Input should be less than or equal to 26"),
        ("tau", "1,inf", "values.1: Input should be a finite number"),
        ("tau", "1,5000", "tau=5000: tau: Input should be less than or equal to 1000"),
        ("tau", "nan", "values.0: Input should be a finite number"),
        ("top_k", "1,2,100000", "top_k=100000: top_k: Input should be less than or equal"),
    ],
)
def test_sweep_values_are_bounded_before_any_point_runs(tmp_path, capsys, study, values, message):
    """The sweep over a huge calibration size used to hang: every point is checked first."""
    out = tmp_path / "sweep"
    code, err = _cli(
        capsys,
        "sweep",
        study,
        "--values",
        values,
        "--adapter",
        "synthetic",
        "--count",
        "2",
        "--out",
        out,
    )
    assert code == 2 and message in err, err
    assert not out.exists()


def test_numbers_in_a_benchmark_file_and_manifest_are_bounded(tmp_path, capsys):
    """A benchmark line or manifest edited to impossible numbers is refused with the line."""
    import hashlib

    bench = build_shapes_benchmark(tmp_path, count=4)
    capsys.readouterr()
    lines = (bench / "benchmark.jsonl").read_text().splitlines()
    good_manifest = (bench / "manifest.json").read_text()
    cases = [
        (
            "line",
            lambda r: r.update(similarities=[0.1, "NaN", 0.2, 0.3]),
            "Input should be a finite number",
        ),
        ("line", lambda r: r.update(caption_index=10**15), "caption_index: Input should be"),
        ("manifest", lambda m: m.update(count=10**12), "count: Input should be less than"),
        ("manifest", lambda m: m.update(seed=-1), "seed: Input should be greater than"),
        ("manifest", lambda m: m["source"].update(pool_size=-3), "pool_size: Input should be"),
    ]
    for where, edit, message in cases:
        manifest = json.loads(good_manifest)
        if where == "line":
            record = json.loads(lines[0])
            edit(record)
            data = ("\n".join([json.dumps(record), *lines[1:]]) + "\n").replace('"NaN"', "NaN")
            (bench / "benchmark.jsonl").write_text(data)
            manifest["benchmark_sha256"] = hashlib.sha256(data.encode()).hexdigest()
        else:
            edit(manifest)
        (bench / "manifest.json").write_text(json.dumps(manifest))
        code, err = _cli(
            capsys, *SIM, "--benchmark", bench, "--count", "2", "--out", tmp_path / "run"
        )
        assert code == 2 and message in err, (where, err)
        assert not (tmp_path / "run").exists()
        (bench / "benchmark.jsonl").write_text("\n".join(lines) + "\n")
        (bench / "manifest.json").write_text(good_manifest)
    restored = _cli(capsys, *SIM, "--benchmark", bench, "--count", "2", "--calibration-count", "1")
    assert restored[0] == 0, restored[1]


def test_the_ranges_page_says_what_the_models_check():
    """docs/errors.md's table of ranges names each config key with the range its model
    checks (a changed bound without the page fails here)."""
    import re

    from posdebias.benchmarks.config import AdversarialOptions, BuildConfig, ShapesSource
    from posdebias.cli.plugins import option_range
    from posdebias.evaluation.config import EvaluateConfig

    owners = {"source": ShapesSource, "adversarial": AdversarialOptions}
    text = (Path(__file__).parents[1] / "docs" / "errors.md").read_text()
    section = text.split("### The ranges", 1)[1].split("\n## ", 1)[0]
    checked = 0
    for row in section.splitlines():
        if not row.startswith("| `"):
            continue
        keys, shown = (cell.strip() for cell in row.strip("|").split("|"))
        for key in re.findall(r"`([a-z_.]+)`", keys.split("(")[0]):
            owner, _, name = key.rpartition(".")
            model = owners.get(owner) or (
                EvaluateConfig if name in EvaluateConfig.model_fields else BuildConfig
            )
            assert option_range(model.model_fields[name]) == shown, (key, shown)
            checked += 1
    assert checked >= 11


# -- numbers and booleans as written --------------------------------------------------------


def _fields_of(annotation, kind) -> bool:
    """Whether a field takes ``kind`` (int or bool) alone or as the item of a list / tuple."""
    if annotation is kind:
        return True
    return any(_fields_of(arg, kind) for arg in typing.get_args(annotation))


@pytest.mark.parametrize(
    ("kind", "given"),
    [(int, True), (int, "5"), (int, 5.0), (bool, "yes"), (bool, 1), (bool, "true")],
)
def test_every_model_a_user_writes_reads_numbers_and_booleans_as_written(kind, given):
    """``count: true`` was read as 1, ``"5"`` as 5, ``1.0`` as a whole number and ``"yes"`` as a
    boolean: every whole-number and boolean field of every model that reads a config, an
    option or a benchmark file refuses them now, naming the field and how to write it."""
    accepted, seen = [], 0
    for label, model in _models().items():
        if label in ("calibration state", "sweep point row", "sweep timing", "sweep timing file"):
            continue  # files posdebias writes itself
        if label == "harness settings":
            continue  # a harness's command line gives text, as a flag does
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if not _fields_of(annotation, kind) or (kind is int and _fields_of(annotation, float)):
                continue
            seen += 1
            try:
                model.model_validate({name: _shaped(annotation, given)})
            except ValidationError as exc:
                if any(error["loc"][0] == name for error in exc.errors()):
                    continue
            accepted.append(f"{label}: {name} = {given!r}")
    assert not accepted, accepted
    assert seen > (40 if kind is int else 5)


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("c.yaml", "count: true\n", "count: Input should be a valid integer (got True); write a "
         "whole number, without quotes or a decimal point"),
        ("c.yaml", "count: '5'\n", "count: Input should be a valid integer (got '5')"),
        ("c.yaml", "count: 5.0\n", "count: Input should be a valid integer (got 5.0)"),
        ("c.yaml", "calibration_transfer: 'yes'\n", "calibration_transfer: Input should be a "
         "valid boolean (got 'yes'); write true or false, without quotes"),
        ("c.yaml", "calibration_transfer: 1\n", "calibration_transfer: Input should be a valid "
         "boolean (got 1)"),
        ("c.json", '{"count": 5.0}', "count: Input should be a valid integer (got 5.0)"),
        ("c.toml", "count = true\n", "count: Input should be a valid integer (got True)"),
        ("c.yaml", "calibrators:\n  attention_guided: {top_k: true}\n",
         "calibrator 'attention_guided': top_k: Input should be a valid integer (got True)"),
        ("c.yaml", "calibrators:\n  attention_guided: {tau: '5'}\n",
         "tau: Input should be a valid number (got '5'); write a number, without quotes"),
        ("c.yaml", "calibrators:\n  attention_guided: {layer_range: [0.0, 2]}\n",
         "layer_range.0: Input should be a valid integer (got 0.0)"),
        ("c.yaml", "decoders:\n  generated: {max_new_tokens: '8'}\n",
         "max_new_tokens: Input should be a valid integer (got '8')"),
        ("c.yaml", "adapter: {name: synthetic, options: {num_layers: 4.0}}\n",
         "num_layers: Input should be a valid integer (got 4.0)"),
    ],
)  # fmt: skip
def test_config_files_are_read_as_written(tmp_path, capsys, name, config, message):
    path = tmp_path / name
    path.write_text(config)
    code, err = _cli(capsys, "evaluate", "--config", path, "--out", tmp_path / "r")
    assert code == 2 and message in err, err
    if "num_layers" not in message:  # an adapter's options are checked with its model
        assert f"error: {path}: " in err  # the file is named
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"colours": {"red": [220.0, 40, 40]}}, "colours.red.0: Input should be a valid integer"),
        ({"jitter": "0.1"}, "jitter: Input should be a valid number (got '0.1')"),
        ({"min_objects": True}, "min_objects: Input should be a valid integer (got True)"),
    ],
)
def test_a_shape_space_file_is_read_as_written(tmp_path, space, message):
    from posdebias.benchmarks.shapes import load_shape_space
    from posdebias.errors import BenchmarkError

    path = tmp_path / "space.json"
    path.write_text(json.dumps(space))
    with pytest.raises(BenchmarkError) as caught:
        load_shape_space(path)
    assert f"{path}: invalid shape space: {message}" in str(caught.value)


def test_numbers_with_an_exponent_in_yaml_are_numbers(tmp_path, capsys):
    """YAML 1.1 reads ``1e-2`` as text; read strictly it would be refused, so posdebias reads
    it as the number it is (YAML 1.2), and a huge one meets its range."""
    from posdebias._inputs import load_yaml

    assert load_yaml("a: 1e-2\nb: 2E+3\nc: '1e3'\nd: 1e\n", "x") == {
        "a": 0.01,
        "b": 2000.0,
        "c": "1e3",
        "d": "1e",
    }
    path = _config(tmp_path, "calibrators:\n  attention_guided: {tau: 1e4}\n")
    code, err = _cli(capsys, "evaluate", "--config", path, "--out", tmp_path / "r")
    assert code == 2 and "tau: Input should be less than or equal to 1000 (got 10000.0)" in err


# -- the Python API holds the same ranges -----------------------------------------------------


@pytest.mark.parametrize("bad", [0, 4097, 10**9, 2.5, True, "8"])
def test_the_python_api_refuses_the_batch_sizes_the_command_line_refuses(tmp_path, capsys, bad):
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.api import Debiaser
    from posdebias.errors import InputError
    from posdebias.evaluation.runner import Evaluator, fit_calibrators

    if not isinstance(bad, str):  # on the command line every number is text
        code, err = _cli(capsys, *SIM, "--batch-size", bad, "--count", 2, "--out", tmp_path / "r")
        assert code == 2 and "batch" in err and not (tmp_path / "r").exists()
    adapter = SyntheticAdapter()
    message = f"batch_size must be a whole number from 1 to 4,096, got {bad!r}"
    for call in (
        lambda: Debiaser(adapter, "vanilla", batch_size=bad),
        lambda: next(Debiaser(adapter, "vanilla").rank_many([], batch_size=bad)),
        lambda: Evaluator(adapter, {}, {}, batch_size=bad),
        lambda: fit_calibrators(adapter, {}, synthetic_instances(1, 4), batch_size=bad),
    ):
        with pytest.raises(InputError) as caught:
            call()
        assert message.replace("'", "") in str(caught.value).replace("'", "")


@pytest.mark.parametrize(
    ("setting", "bad", "message"),
    [
        ("orders", 0, "orders must be a whole number from 1 to 1,000, got 0"),
        ("orders", 1001, "orders must be a whole number from 1 to 1,000, got 1001"),
        ("orders", 2.0, "orders must be a whole number from 1 to 1,000, got 2.0"),
        ("seed", -1, "seed must be a whole number from 0 to 4,294,967,295, got -1"),
        ("seed", 2**32, "seed must be a whole number from 0 to 4,294,967,295, got 4294967296"),
        ("seed", True, "seed must be a whole number from 0 to 4,294,967,295, got True"),
    ],
)
def test_the_runner_refuses_the_orders_and_seeds_a_config_refuses(setting, bad, message):
    from posdebias.adapters.families.synthetic import SyntheticAdapter
    from posdebias.errors import InputError
    from posdebias.evaluation.config import EvaluateConfig
    from posdebias.evaluation.runner import Evaluator

    with pytest.raises(ValidationError):
        EvaluateConfig.model_validate({setting: bad})
    with pytest.raises(InputError, match=re.escape(message)):
        Evaluator(SyntheticAdapter(), {}, {}, **{setting: bad})


def test_a_config_changed_after_validation_is_checked_again_by_the_api(tmp_path):
    """An assignment or ``model_copy(update=...)`` skips pydantic's checks: run_evaluation and
    run_sweep validate the config again, as a file is, before any work."""
    from posdebias.errors import ConfigError
    from posdebias.evaluation.config import EvaluateConfig
    from posdebias.evaluation.job import run_evaluation
    from posdebias.evaluation.sweep import run_sweep
    from posdebias.evaluation.sweep.plan import SweepSpec

    config = EvaluateConfig(adapter={"name": "synthetic"}, count=2, out=tmp_path / "r")
    with pytest.raises(ConfigError, match=r"count: Input should be less than or equal to 1000000"):
        run_evaluation(config.model_copy(update={"count": 10**9}))
    config.orders = True  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"orders: Input should be a valid integer \(got True\)"):
        run_evaluation(config)
    config.orders = 0
    with pytest.raises(ConfigError, match="orders: Input should be greater than or equal to 1"):
        run_sweep("tau", config, SweepSpec(values=[1.0, 2.0]), tmp_path / "s")
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()


def test_calibrating_through_the_api_holds_the_calibration_count_range():
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.api import Debiaser
    from posdebias.errors import InputError

    instance = synthetic_instances(1, 4)[0]
    debiaser = Debiaser(SyntheticAdapter(), "attention_guided")
    with pytest.raises(InputError, match="calibration takes at most 10,000 instances"):
        debiaser.calibrate([instance] * 10_001)
    assert debiaser.state is None
