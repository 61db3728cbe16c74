"""The bad-input table of docs/errors.md: one test per row, through the real CLI.

Each case checks the exit code (2 for usage/input errors), a message naming the offending value
and the fix, no traceback, and no partial output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import build_shapes_benchmark, run_cli_with_file_size_limit
from posdebias.cli import main

#: These rows are about the run, not the model: the simulated model keeps them fast.
SIMULATED = ("--adapter", "synthetic")


def run(args, capsys):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.err


def calibrate(tmp_path, capsys, *extra):
    out = tmp_path / "cal"
    code, err = run(["calibrate", "--adapter", "synthetic", "--out", out, *extra], capsys)
    assert code == 0, err
    return out


# row 4: N beyond the label set / N < 2 -------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "message"),
    [
        ("1", "n: Input should be greater than or equal to 2 (got 1)"),
        ("27", "n: Input should be less than or equal to 26 (got 27)"),
    ],
)
def test_row4_candidate_count_bounds(tmp_path, capsys, n, message):
    code, err = run(
        ["evaluate", "--adapter", "synthetic", "-N", n, "--out", tmp_path / "r"], capsys
    )
    assert code == 2 and message in err
    assert not (tmp_path / "r").exists()


def test_row4_more_images_than_the_label_set_can_name():
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.errors import InputError

    instance = synthetic_instances(1, 27)[0]
    with pytest.raises(InputError, match="N=27 candidates, but label set 'upper' can name at most"):
        SyntheticAdapter(label_set="upper").observe(instance)


# row 6: calibration files --------------------------------------------------------------------


def test_row6_missing_calibration(tmp_path, capsys):
    code, err = run(
        ["evaluate", *SIMULATED, "--calibration", tmp_path / "nope.json", "--count", "2"], capsys
    )
    assert code == 2 and "does not exist" in err and "posdebias calibrate" in err


def test_row6_corrupt_calibration(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, err = run(["evaluate", *SIMULATED, "--calibration", bad, "--count", "2"], capsys)
    assert code == 2 and "not valid JSON" in err


def test_row6_wrong_schema_version(tmp_path, capsys):
    states = calibrate(tmp_path, capsys)
    path = states / "attention_guided.json"
    payload = json.loads(path.read_text())
    payload["schema_version"] = 0
    path.write_text(json.dumps(payload))
    code, err = run(["evaluate", *SIMULATED, "--calibration", states, "--count", "2"], capsys)
    assert code == 2 and "schema version 0 is not supported" in err


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("num_layers: 5", "attention rows come from layers 0-7 (global), but this model's"),
        ("label_set: upper", "its labels are ['1', '2', '3', '4'], not ['A', 'B', 'C', 'D']"),
    ],
)
def test_row6_calibration_for_another_model(tmp_path, capsys, option, message):
    states = calibrate(tmp_path, capsys)
    config = tmp_path / "c.yaml"
    config.write_text(f"adapter: {{name: synthetic, options: {{{option}}}}}\n")
    code, err = run(
        ["evaluate", "--config", config, "--calibration", states, "--count", "2"], capsys
    )
    assert code == 2 and message in err


def test_row6_calibration_from_another_adapter(tmp_path, capsys):
    states = calibrate(tmp_path, capsys)
    path = states / "pride.json"
    payload = json.loads(path.read_text())
    payload["adapter"] = "qwen2_vl"
    path.write_text(json.dumps(payload))
    code, err = run(
        ["evaluate", *SIMULATED, "--calibration", path, "--calibrators", "pride", "--count", "2"],
        capsys,
    )
    assert code == 2 and "adapter 'qwen2_vl', not 'synthetic'" in err


# row 7: unknown names and options ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--calibrators", "vanilla,atention_guided"],
            "unknown calibrator 'atention_guided'; known calibrators: attention_guided",
        ),
        (["--adapter", "qwen"], "unknown adapter 'qwen'; known adapters:"),
    ],
)
def test_row7_unknown_names(capsys, args, message):
    code, err = run(["evaluate", *args, "--count", "2"], capsys)
    assert code == 2 and message in err and "Plugins page" in err


def test_row7_unknown_calibrator_option(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("calibrators: {attention_guided: {topk: 3}}\n")
    code, err = run(["evaluate", "--config", config], capsys)
    assert code == 2 and "unknown option 'topk'" in err and "top_k" in err


# row 11: config typos and wrong types ---------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("cuont: 3\n", "unknown key 'cuont'"),
        ("orders: [1, 2]\n", "orders: Input should be a valid integer"),
        ("adapter: {name: synthetic, options: {noise: loud}}\n", "noise: Input should be a valid"),
        ("orders: 3\n  bad: indent\n", "cannot be parsed"),
    ],
)
def test_row11_config_errors_name_the_field(tmp_path, capsys, content, message):
    config = tmp_path / "c.yaml"
    config.write_text(content)
    code, err = run(["evaluate", "--config", config], capsys)
    assert code == 2 and message in err


# row 12: --resume on another configuration ---------------------------------------------------


def test_row12_resume_with_other_configuration(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        run(["evaluate", *SIMULATED, "--count", "4", "--orders", "2", "--out", out], capsys)[0] == 0
    )
    code, err = run(
        [
            "evaluate",
            *SIMULATED,
            "--count",
            "4",
            "--orders",
            "2",
            "--seed",
            "1",
            "--resume",
            "--out",
            out,
        ],
        capsys,
    )
    assert code == 2 and "seed: 0 there, 1 now" in err


# row 13: output not writable / disk full ------------------------------------------------------


def test_row13_output_directory_cannot_be_created(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, err = run(["evaluate", *SIMULATED, "--count", "2", "--out", blocker / "run"], capsys)
    assert code == 2 and "cannot create output directory" in err


def test_row13_disk_full_during_a_run_keeps_what_was_written(tmp_path, capsys):
    """A real process whose files cannot grow past 40 kB (RLIMIT_FSIZE: the kernel refuses the
    write, as a full disk does): exit 2 naming the file, no results, the logs so far kept."""
    out = tmp_path / "run"
    args = ["evaluate", *SIMULATED, "--count", "6", "--orders", "2", "--out", out]
    result = run_cli_with_file_size_limit(args, 40_000)
    assert result.returncode == 2, result.stderr
    assert "cannot write" in result.stderr and "observations.jsonl" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (out / "results.json").exists()
    kept = (out / "observations.jsonl").read_text().split("\n")[:-1]  # a torn tail is dropped
    assert kept and all(json.loads(line)["key"] for line in kept)
    # space freed: the run resumes from what was kept
    code, err = run([*args, "--resume"], capsys)
    assert code == 0, err
    assert (out / "results.json").exists()


# row 15: broken plugins -> tests/test_registry.py (import error, unknown hook) ----------------


# rows 1, 2, 3, 5: benchmark files ---------------------------------------------------------------


@pytest.fixture
def bench(tmp_path):
    """A small real shapes benchmark (images on disk) to damage."""
    return build_shapes_benchmark(tmp_path, count=12, n=4)


def rewrite_lines(bench: Path, change) -> None:
    path = bench / "benchmark.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    change(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def evaluate_bench(bench, capsys, tmp_path, *extra):
    out = tmp_path / "run"
    code, err = run(
        [
            "evaluate",
            "--adapter",
            "synthetic",
            "--benchmark",
            bench,
            "--count",
            "4",
            "--orders",
            "1",
            "--out",
            out,
            *extra,
        ],
        capsys,
    )
    assert not out.exists() or not (out / "results.json").exists()
    return code, err


def test_row1_benchmark_missing(tmp_path, capsys):
    code, err = evaluate_bench(tmp_path / "nope", capsys, tmp_path)
    assert code == 2 and "does not exist" in err and "posdebias build" in err


def test_row1_benchmark_empty(bench, tmp_path, capsys):
    (bench / "benchmark.jsonl").write_text("")
    code, err = evaluate_bench(bench, capsys, tmp_path)
    assert code == 2 and "the file is empty: it has no instances" in err


def test_row1_benchmark_not_jsonl(bench, tmp_path, capsys):
    (bench / "benchmark.jsonl").write_text("id,query,images\n1,a,b\n")
    code, err = evaluate_bench(bench, capsys, tmp_path)
    assert code == 2 and "line 1:" in err and "line 2:" in err


def test_row1_line_missing_a_field(bench, tmp_path, capsys):
    rewrite_lines(bench, lambda records: records[2].pop("target"))
    code, err = evaluate_bench(bench, capsys, tmp_path)
    assert code == 2 and "line 3: target: Field required" in err


def test_row2_image_missing(bench, tmp_path, capsys):
    rewrite_lines(bench, lambda records: records[0]["images"].__setitem__(1, "images/gone.png"))
    code, err = evaluate_bench(bench, capsys, tmp_path)
    assert code == 2 and "line 1: image 'images/gone.png' not found under" in err


def test_row3_target_out_of_range(bench, tmp_path, capsys):
    rewrite_lines(bench, lambda records: records[4].__setitem__("target", 9))
    code, err = evaluate_bench(bench, capsys, tmp_path)
    assert code == 2 and "line 5: target 9 is out of range" in err


def test_row3_duplicate_images(bench, tmp_path, capsys):
    def duplicate(records):
        records[1]["images"][2] = records[1]["images"][3]

    rewrite_lines(bench, duplicate)
    code, err = evaluate_bench(bench, capsys, tmp_path)
    assert code == 2 and "line 2:" in err and "duplicate" in err


@pytest.mark.parametrize("caption", ["", "   \t"])
def test_row5_empty_caption(bench, tmp_path, capsys, caption):
    rewrite_lines(bench, lambda records: records[3].__setitem__("query", caption))
    code, err = evaluate_bench(bench, capsys, tmp_path)
    assert code == 2 and "line 4:" in err and "empty" in err


# rows 2, 9, 10: real (tiny) Hugging Face models ------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    from posdebias.testing import save_tiny_model

    return save_tiny_model("llava", tmp_path_factory.mktemp("models") / "llava")


def evaluate_model(model, bench, capsys):
    """`posdebias evaluate --model DIR` on two instances, vanilla only: enough to load it."""
    args = ["evaluate", "--model", model, "--benchmark", bench, "--count", "2", "--orders", "1"]
    return run([*args, "--calibrators", "vanilla"], capsys)


def test_row2_corrupt_image(bench, tmp_path, capsys, tiny_llava):
    first = json.loads((bench / "benchmark.jsonl").read_text().splitlines()[0])
    root = json.loads((bench / "manifest.json").read_text())["root"]
    (Path(root) / first["images"][0]).write_bytes(b"this is not a png")
    code, err = run(
        [
            "evaluate",
            "--model",
            tiny_llava,
            "--benchmark",
            bench,
            "--count",
            "3",
            "--calibration-count",
            "5",
            "--orders",
            "1",
            "--calibrators",
            "vanilla",
        ],
        capsys,
    )
    assert code == 2 and first["images"][0] in err
    assert f"instance {first['id']!r}: image file " in err and "cannot be read as an image" in err


def test_row9_processor_without_chat_template(tmp_path, capsys, tiny_llava, bench):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_llava, model)
    for path in model.iterdir():
        if "chat_template" in path.name:
            path.unlink()
        elif path.suffix == ".json":
            payload = json.loads(path.read_text())
            if isinstance(payload, dict) and payload.pop("chat_template", None) is not None:
                path.write_text(json.dumps(payload))
    code, err = evaluate_model(model, bench, capsys)
    assert code == 2 and "has no chat template" in err


def test_row10_model_path_does_not_exist(tmp_path, capsys):
    code, err = run(["evaluate", "--model", tmp_path / "no-model", "--count", "2"], capsys)
    assert code == 2 and "no-model" in err


def test_row10_hub_id_when_offline(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = __import__("time").monotonic()
    code, err = run(
        ["evaluate", "--model", "some-org/some-model-that-is-not-cached", "--count", "2"], capsys
    )
    assert code == 2 and "offline" in err.lower()
    assert __import__("time").monotonic() - started < 30


# row 14: too few hard negatives ------------------------------------------------------------------


def test_row14_too_few_distractors_after_filters(tmp_path, capsys):
    clip_config = tmp_path / "tiny-clip.json"
    clip_config.write_text(
        json.dumps(
            {
                "embed_dim": 32,
                "vision_cfg": {
                    "image_size": 32,
                    "layers": 1,
                    "width": 64,
                    "patch_size": 16,
                    "head_width": 32,
                },
                "text_cfg": {
                    "context_length": 32,
                    "vocab_size": 49408,
                    "width": 32,
                    "heads": 2,
                    "layers": 1,
                },
            }
        )
    )
    out = tmp_path / "adv"
    code, err = run(
        [
            "build",
            "--source",
            "shapes",
            "--root",
            tmp_path / "shapes",
            "--setting",
            "adversarial",
            "-N",
            "4",
            "--count",
            "5",
            "--pool-size",
            "6",
            "--caption-threshold",
            "-0.99",
            "--clip-model",
            clip_config,
            "--clip-pretrained",
            "none",
            "--no-cache",
            "--out",
            out,
        ],
        capsys,
    )
    assert code == 2 and "anchor image" in err and "only" in err
    assert not out.exists()


def test_pickled_weights_are_refused(tmp_path, capsys, tiny_llava, bench):
    """Only safetensors weights are loaded: a checkpoint with pickled .bin weights is refused."""
    import shutil

    import torch
    from safetensors.torch import load_file

    model = tmp_path / "pickled"
    shutil.copytree(tiny_llava, model)
    weights = model / "model.safetensors"
    torch.save(load_file(weights), model / "pytorch_model.bin")
    weights.unlink()
    code, err = evaluate_model(model, bench, capsys)
    assert code == 2 and "safetensors weights only" in err


def test_a_harness_raises_an_error_on_in_its_own_words_whatever_its_constructor():
    """A plugin's error type whose constructor takes more than a message is said in a harness'
    words and raised on as itself (type, fields, traceback), not rebuilt."""
    from posdebias.core.state import RECALIBRATE
    from posdebias.errors import CalibrationError
    from posdebias.integrations.harness import said_to_harness_users

    class PathError(CalibrationError):
        def __init__(self, path, why, *, advice=None):
            super().__init__(f"{path}: {why}; {advice.library}", advice=advice)
            self.path = path

    error = PathError("a.json", "broken", advice=RECALIBRATE)
    with pytest.raises(PathError) as raised, said_to_harness_users():
        raise error
    assert raised.value is error and raised.value.path == "a.json"
    assert str(error) == f"a.json: broken; {RECALIBRATE.harness}"
    assert error.message_for("cli") == str(error)  # said once: the same at every door now
