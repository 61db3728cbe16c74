"""Every user error is exit 2 with a message, never "internal error": one test per class of
docs/errors.md (unvalidated numbers, unescaped output, unbounded echo, configs that explode,
third-party exceptions, tampered logs, broken plugins), each with several variants.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import build_shapes_benchmark
from posdebias.cli import main, printable
from posdebias.errors import InputError, OutputError

SIMULATED = ("--adapter", "synthetic")


def run(args, capsys):
    try:
        code = main([str(a) for a in args])
    except SystemExit as usage:  # argparse's usage errors (typed paths among them) exit 2 too
        code = usage.code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "internal error" not in captured.err, captured.err
    return code, captured.out, captured.err


# unvalidated numbers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["evaluate", *SIMULATED, "--seed", "-1"],
            "seed: Input should be greater than or equal to 0",
        ),
        (["calibrate", *SIMULATED, "--seed", "-7", "--out", "x"], "seed: Input should be greater"),
        (["evaluate", *SIMULATED, "--batch-size", "0"], "batch_size: Input should be greater"),
        (["evaluate", *SIMULATED, "--orders", "-2"], "orders: Input should be greater"),
    ],
)
def test_numbers_are_validated_before_use(capsys, args, message):
    code, _, err = run(args, capsys)
    assert code == 2 and message in err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--seed", "-3", "--seed must be a whole number from 0 to 4,294,967,295, got -3"),
        ("--shapes-seed", "-1", "--shapes-seed must be a whole number from 0 to 4,294,967,295"),
        ("--batch-size", "0", "--batch-size must be a whole number from 1 to 4,096, got 0"),
        ("--batch-size", "-64", "--batch-size must be a whole number from 1 to 4,096, got -64"),
        ("--batch-size", "99999", "--batch-size must be a whole number from 1 to 4,096, got"),
    ],
)
def test_build_numbers_are_validated_before_anything_is_written(
    tmp_path, capsys, flag, value, message
):
    args = ["build", "--source", "shapes", "--root", tmp_path / "root", "--setting"]
    args += ["adversarial", "--clip-pretrained", "none", "--out", tmp_path / "out", flag, value]
    code, _, err = run(args, capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "root").exists() and not (tmp_path / "out").exists()


# unescaped output: rich markup and emoji codes in user text --------------------------------------


MARKUP = ["[bold red]x[/]", "[/]", "[link=file:///etc]y", ":smile: [[", "a]b[/c"]


@pytest.mark.parametrize("label", MARKUP)
def test_markup_in_a_label_is_printed_as_written(tmp_path, capsys, label):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"calibrators": [{"name": "vanilla", "label": label}]}))
    code, out, err = run(["evaluate", *SIMULATED, "--config", config, "--count", "2"], capsys)
    if code == 2:  # labels name files, so a label with these characters may be refused
        assert "label" in err and err.startswith("error: ")
    else:
        assert code == 0, err
        assert label in out  # shown literally, not styled away


@pytest.mark.parametrize("name", ["[/red]run", "[bold]x[/bold]", ":rocket:"])
def test_markup_in_paths_is_printed_as_written(tmp_path, capsys, name):
    out_dir = tmp_path / name
    code, out, err = run(["evaluate", *SIMULATED, "--count", "2", "--out", out_dir], capsys)
    assert code == 0, err
    assert str(out_dir / "results.json") in out.replace("\n", "")
    root = tmp_path / f"shapes{name}"
    args = ["build", "--source", "shapes", "--root", root, "--setting", "random"]
    code, out, err = run([*args, "--count", "4", "--out", tmp_path / f"b{name}"], capsys)
    assert code == 0, err
    assert f"shapes dataset generated in {root}" in " ".join(out.split())


def test_markup_in_a_caption_and_image_paths_through_rank(tmp_path, capsys):
    """`posdebias rank` prints the caption and the image paths: both exactly as given."""
    calibration = tmp_path / "pride.json"
    code, _, err = run(
        ["calibrate", "--calibrators", "pride", "--count", "1", "--out", calibration], capsys
    )
    assert code == 0, err
    from posdebias.testing import write_test_images

    images = write_test_images(tmp_path / "[red]imgs[/]", 4, size=16)
    caption = "[/] a :smile: [bold]caption"
    code, out, err = run(["rank", "--calibration", calibration, caption, *images], capsys)
    assert code == 0, err
    flat = "".join(out.split())
    assert "".join(caption.split()) in flat
    assert all("".join(str(image).split()) in flat for image in images)


# unbounded echo and terminal control characters in messages --------------------------------------


@pytest.mark.parametrize(
    "value",
    ["x" * 100_000, "\x1b[2J\x1b[31mred", "a\rb\u2028c\x07d", "[" * 5000],
)
def test_error_messages_quote_a_bounded_printable_excerpt(capsys, value):
    code, _, err = run(["evaluate", *SIMULATED, "--calibrators", value], capsys)
    assert code == 2 and err.startswith("error: unknown calibrator")
    assert len(err) < 3000
    assert "\x1b" not in err and "\r" not in err and "\u2028" not in err and "\x07" not in err


def test_printable_bounds_lines_and_escapes_controls():
    text = printable("a\x1b[0m\n" + "y" * 5000 + "\n" * 200)
    assert "\\x1b[0m" in text and "more characters" in text and "more lines" in text


def test_argparse_errors_are_printable_and_bounded(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--count", "\x1b[2J" + "9" * 10_000 + "z"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "invalid int value" in err
    assert "\x1b" not in err and len(err) < 3000


# configs that explode ----------------------------------------------------------------------------


def _alias_bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels):
        refs = ", ".join([f"*a{level - 1}"] * 9)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + f"\nseed: *a{levels - 1}\n"


@pytest.mark.parametrize("levels", [4, 9, 12])
def test_yaml_alias_bombs_are_refused_quickly(tmp_path, capsys, levels):
    config = tmp_path / "bomb.yaml"
    config.write_text(_alias_bomb(levels))
    code, _, err = run(["evaluate", *SIMULATED, "--config", config], capsys)
    assert code == 2 and "expands to more than 10000 YAML nodes" in err and len(err) < 1000


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("long.json", '{"seed": ' + "9" * 5000 + "}", "not usable JSON"),
        ("deep.yaml", "a: " + "[" * 5000 + "]" * 5000, "nested too deeply"),
        ("self.yaml", "a: &a [*a]\n", "YAML"),
        ("bad.toml", "[[[", "cannot be parsed"),
        ("latin1.yaml", None, "is not UTF-8 text"),
    ],
)
def test_broken_config_files(tmp_path, capsys, name, text, message):
    config = tmp_path / name
    if text is None:
        config.write_bytes(b"seed: \xff\xfe\n")
    else:
        config.write_text(text)
    code, _, err = run(["evaluate", *SIMULATED, "--config", config], capsys)
    assert code == 2 and message in err and len(err) < 2000


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("k=[unclosed", "cannot be parsed as YAML"),
        ("=3", "must look like KEY=VALUE"),
        ("no-equals-sign", "must look like KEY=VALUE"),
        ("a b=1", "must look like KEY=VALUE"),
        ("label_set=&a [*a]", "YAML"),
    ],
)
def test_malformed_adapter_options(tmp_path, capsys, option, message):
    args = ["rank", "--calibration", tmp_path / "x.json", "--adapter-option", option, "cap"]
    code, _, err = run([*args, "a.png", "b.png"], capsys)
    assert code == 2 and message in err


# prompt templates ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("{caption.__class__}", "unknown placeholder {caption.__class__}"),
        ("{n.real} {caption}", "unknown placeholder {n.real}"),
        ("{caption[0]}", "unknown placeholder {caption[0]}"),
        ("{caption:>99999999999}", "wider than 100"),
        ("{caption:.{n}}", "nested"),
        ("{} {caption}", "unknown placeholder {}"),
        ("{caption", "invalid"),
    ],
)
def test_prompt_templates_cannot_reach_into_objects_or_grow_huge(query, message):
    from posdebias.adapters.hf.prompt import coerce_prompt
    from posdebias.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("[", r"\[")):
        coerce_prompt({"query": query})


def test_prompt_template_error_through_the_cli(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("adapter: {options: {prompt: {query: '{caption.__init__.__globals__}'}}}\n")
    code, _, err = run(["evaluate", "--config", config, "--count", "1"], capsys)
    assert code == 2 and "unknown placeholder" in err and "__builtins__" not in err


# datasets -----------------------------------------------------------------------------------------


def _coco(tmp_path, images):
    from PIL import Image

    root = tmp_path / "coco"
    (root / "annotations").mkdir(parents=True)
    for image in images:
        Image.new("RGB", (8, 8), (image["id"] * 20, 0, 0)).save(root / image["file_name"])
    annotations = [
        {"id": i, "image_id": image["id"], "caption": f"caption {i}"}
        for i, image in enumerate(images)
    ]
    payload = {"images": images, "annotations": annotations}
    (root / "annotations" / "captions_x.json").write_text(json.dumps(payload))
    return root


def test_coco_ids_sharing_a_file_name(tmp_path, capsys):
    images = [{"id": i, "file_name": f"{i}.png"} for i in range(6)]
    root = _coco(tmp_path, images)
    payload = json.loads((root / "annotations" / "captions_x.json").read_text())
    payload["images"][3]["file_name"] = "1.png"
    payload["images"][5]["file_name"] = "./1.png"
    (root / "annotations" / "captions_x.json").write_text(json.dumps(payload))
    args = ["build", "--source", "coco", "--root", root, "--setting", "random", "-N", "2"]
    code, _, err = run([*args, "--count", "2", "--out", tmp_path / "out"], capsys)
    assert code == 2 and "is also the file of image 1" in err and "image 5" in err


@pytest.mark.parametrize("index", ["\u00b2", "\u0663", "\uff11", "1\u00b9"])
def test_flickr8k_index_must_be_ascii_digits(tmp_path, capsys, index):
    from PIL import Image

    root = tmp_path / "flickr"
    root.mkdir()
    for name in ("a.jpg", "b.jpg"):
        Image.new("RGB", (8, 8)).save(root / name, format="JPEG")
    (root / "Flickr8k.token.txt").write_text(f"a.jpg#0\tone\nb.jpg#{index}\ttwo\n")
    args = ["build", "--source", "flickr8k", "--root", root, "--setting", "random", "-N", "2"]
    code, _, err = run([*args, "--count", "1", "--out", tmp_path / "out"], capsys)
    assert code == 2 and "line 2: expected 'name.jpg#k<TAB>caption'" in err


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085", "\x1c", "\x0b", "\x0c"])
def test_jsonl_survives_unicode_line_separators_through_build(tmp_path, capsys, separator):
    """Image names holding a character str.splitlines() splits on: valid JSON Lines, read back
    intact from the source file and from the benchmark `posdebias build` writes."""
    from PIL import Image

    from posdebias.benchmarks.files import load_benchmark

    root = tmp_path / "images"
    root.mkdir()
    lines = []
    for index in range(4):
        name = f"image{separator}{index}.png"
        Image.new("RGB", (8, 8), (index * 50, 0, 0)).save(root / name)
        caption = f"first{separator}second {index}"
        lines.append(json.dumps({"image": name, "caption": caption}, ensure_ascii=False))
    source = tmp_path / "captions.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["build", "--source", "jsonl", "--root", root, "--captions", source]
    args += ["--setting", "random", "-N", "2", "--count", "3", "--out", tmp_path / "out"]
    code, _, err = run(args, capsys)
    assert code == 0, err
    written = (tmp_path / "out" / "benchmark.jsonl").read_text(encoding="utf-8")
    assert written.count("\n") == 3  # JSON escapes control characters, not U+2028/U+0085
    assert (separator in written) == (ord(separator) > 0x7F)
    benchmark = load_benchmark(tmp_path / "out")
    assert len(benchmark.instances) == 3
    assert all(separator in image_id for i in benchmark.instances for image_id in i.candidate_ids)
    assert all(inst.stem.startswith("first second") for inst in benchmark.instances)


# third-party exceptions at the boundary: truncated weights ---------------------------------------


@pytest.mark.parametrize("keep", [0.5, 0.01, 0.0])
def test_truncated_safetensors_is_a_clear_error(tmp_path, capsys, keep):
    from posdebias.testing import save_tiny_model

    model = save_tiny_model("llava", tmp_path / "model")
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])
    bench = build_shapes_benchmark(tmp_path, count=6)
    args = ["evaluate", "--model", model, "--benchmark", bench, "--count", "1", "--orders", "1"]
    code, _, err = run([*args, "--calibrators", "vanilla"], capsys)
    assert code == 2 and "damaged or truncated" in err


# tampered but valid-JSON run logs -----------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(["evaluate", *SIMULATED, "--count", "3", "--out", str(out)]) == 0
    return out


def _tamper(record):
    first = dict(record)
    label = sorted(first["choices"])[0]
    yield "a list", [1, 2]
    yield "missing key", {k: v for k, v in first.items() if k != "targets"}
    yield "choices not a mapping", {**first, "choices": "x"}
    yield "choice out of range", {**first, "choices": {**first["choices"], label: [99] * 5}}
    yield "images disagree", {**first, "chosen": {**first["chosen"], label: [0] * 5}}
    yield "order not a permutation", {**first, "orders": [[0, 0, 1, 2]] * 5}
    yield "target out of range", {**first, "targets": [7] * 5}
    yield "id not a string", {**first, "instance_id": 12}


@pytest.mark.parametrize("variant", range(8))
def test_tampered_run_logs_are_refused_not_trusted(finished_run, tmp_path, capsys, variant):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    lines = (out / "records.jsonl").read_text().split("\n")
    name, bad = list(_tamper(json.loads(lines[0])))[variant]
    lines[0] = json.dumps(bad)
    (out / "records.jsonl").write_text("\n".join(lines))
    code, _, err = run(["evaluate", *SIMULATED, "--count", "3", "--out", out, "--resume"], capsys)
    assert code == 2 and "records.jsonl:1: a run log record is corrupt (" in err, name
    assert err.rstrip().endswith("run again without --resume"), err  # the whole message


@pytest.mark.parametrize(
    "row",
    [
        [1],
        {"key": 5, "observation": {}},
        {"observation": {}},
        {"key": "k", "observation": 3},
        {"key": "k", "observation": {}},  # these two said only what the observation lacked
        {"key": "k", "observation": {"label_logprobs": [0.0, 0.0, 0.0, 0.0]}},
    ],
)
def test_tampered_observation_logs_are_refused(finished_run, tmp_path, capsys, row):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    lines = (out / "observations.jsonl").read_text().split("\n")
    lines[0] = json.dumps(row)
    (out / "observations.jsonl").write_text("\n".join(lines))
    code, _, err = run(["evaluate", *SIMULATED, "--count", "3", "--out", out, "--resume"], capsys)
    assert code == 2 and "observations.jsonl: record 1: a run log record is corrupt" in err, err
    assert err.rstrip().endswith("run again without --resume"), err


# plugins that break the contract ------------------------------------------------------------------


def _register_broken_adapter(behaviour: str) -> None:
    import posdebias
    from posdebias.adapters.families.synthetic import SyntheticAdapter
    from posdebias.core.observation import Observation, log_softmax
    from posdebias.registry import get_registry

    class Broken(SyntheticAdapter):
        name = "broken"

        def observe_many(self, instances, *, batch_size=1):
            observed = super().observe_many(instances, batch_size=batch_size)
            if behaviour == "raises":
                raise RuntimeError("the plugin's own bug")
            if behaviour == "too few":
                return observed[:-1]
            if behaviour == "wrong n":
                return [Observation(label_logprobs=log_softmax(np.zeros(7))) for _ in observed]
            if behaviour == "not observations":
                return [None for _ in observed]
            if behaviour == "invalid observation":
                return [Observation(label_logprobs=np.zeros(instances[0].n))]
            return observed

    class Plugin:
        @posdebias.hookimpl
        def posdebias_register_adapters(self, register):
            register(Broken)

    get_registry().add_plugin(Plugin(), name="acme-broken")


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        ("raises", "failed observing instance"),
        ("too few", "observations for"),
        ("wrong n", "returned 7 label scores for instance"),
        ("not observations", "returned a NoneType for instance"),
        ("invalid observation", "label_logprobs must be normalised"),
    ],
)
def test_a_broken_plugin_adapter_is_named(tmp_path, capsys, behaviour, message):
    bench = build_shapes_benchmark(tmp_path, count=6)
    _register_broken_adapter(behaviour)
    args = ["evaluate", "--adapter", "broken", "--benchmark", bench, "--count", "2",
            "--calibration-count", "2"]  # fmt: skip
    code, _, err = run(args, capsys)
    # a plugin's failure: exit 1 with the plugin named (the plugin contract), never posdebias's
    # "internal error"; an invalid Observation is the Observation's own input error (exit 2)
    assert code in (1, 2) and message in err
    if behaviour != "invalid observation":  # that one is the Observation's own check
        assert "adapter 'broken' from plugin 'acme-broken'" in err


def test_a_raising_plugin_calibrator_is_named(capsys):
    import posdebias
    from posdebias.calibrators.vanilla import Vanilla
    from posdebias.registry import get_registry

    class Exploding(Vanilla):
        name = "exploding"

        def _predict(self, observation, state, rotations):
            raise ZeroDivisionError("oops")

    class Plugin:
        @posdebias.hookimpl
        def posdebias_register_calibrators(self, register):
            register(Exploding)

    get_registry().add_plugin(Plugin(), name="acme-calibrators")
    args = ["evaluate", *SIMULATED, "--calibrators", "exploding,vanilla", "--count", "2"]
    code, _, err = run(args, capsys)
    # the failing calibrator is dropped, the others are reported, and the run ends with its
    # error (exit 1: an incomplete run), never as posdebias's internal error
    assert code in (1, 2)
    assert "calibrator 'exploding' from plugin 'acme-calibrators'" in err
    assert "ZeroDivisionError: oops" in err
    # ranking names it too (it was Python's own error: "internal error" on the command line)
    from posdebias import Debiaser
    from posdebias.adapters.families.synthetic import SyntheticAdapter
    from posdebias.errors import PluginError

    debiaser = Debiaser(SyntheticAdapter(), ["vanilla", "exploding"])
    for ask in (
        lambda: debiaser.rank("q", list("abcd")),
        lambda: list(debiaser.rank_many([("q", list("abcd"))])),
    ):
        with pytest.raises(
            PluginError,
            match="'exploding' from plugin 'acme-calibrators' failed on query .*: oops",
        ):
            ask()


def test_jsonl_lines_split_on_newline_only():
    from posdebias._inputs import jsonl_lines

    assert jsonl_lines('{"a":"x\u2028y\u0085z"}\r\n{}\n') == ['{"a":"x\u2028y\u0085z"}', "{}", ""]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("c.json", '{"out": "run\\u0000x"}'),
        ("c.yaml", 'out: "run\\0x"\n'),
        ("c.toml", 'out = "a\\u0000"'),
    ],
)
def test_nul_characters_are_refused(tmp_path, capsys, name, text):
    config = tmp_path / name
    config.write_text(text)
    code, _, err = run(["evaluate", *SIMULATED, "--config", config, "--count", "1"], capsys)
    assert code == 2 and "contains a NUL character" in err
    code = main(["evaluate", *SIMULATED, "--out", "run\x00x"])
    assert code == 2 and "contains a NUL character" in capsys.readouterr().err


@pytest.mark.figures("png")  # a bad formula fails the drawing, in any format
@pytest.mark.parametrize("label", ["$\\frac{", "_hidden", "a$b$c", "$$"])
def test_labels_in_figures_are_drawn_as_written(finished_run, tmp_path, capsys, label):
    """matplotlib reads `$` as math (a bad formula fails the figure) and hides `_` legend
    entries: `posdebias report` on results whose labels hold them still draws every figure."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    results = json.loads((out / "results.json").read_text())
    first = sorted(results["calibrators"])[0]

    def renamed(value):  # the label renamed everywhere it appears, as a key or as a value
        if isinstance(value, dict):
            return {(label if k == first else k): renamed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [renamed(v) for v in value]
        return label if value == first else value

    (out / "results.json").write_text(json.dumps(renamed(results)))
    for figure in (out / "figures").glob("*.png"):
        figure.unlink()
    code, _, err = run(["report", out], capsys)
    assert code == 0, err
    assert len(list((out / "figures").glob("*.png"))) >= 2


# advice names only what exists ---------------------------------------------------------------


@pytest.mark.parametrize("change", ["root gone", "root climbs out", "manifest removed"])
def test_a_benchmark_whose_images_cannot_be_found_gives_advice_that_exists(
    tmp_path, capsys, change
):
    """No command that reads a benchmark takes an image root, so the command line's advice
    names none; the library's names the argument that does."""
    from posdebias.benchmarks.files import load_benchmark
    from posdebias.errors import BenchmarkError

    bench = build_shapes_benchmark(tmp_path)
    manifest = json.loads((bench / "manifest.json").read_text())
    target = bench
    if change == "manifest removed":
        (bench / "manifest.json").unlink()
        target = bench / "benchmark.jsonl"
    else:
        manifest["root"] = str(tmp_path / "gone") if change == "root gone" else "../.."
        (bench / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run(["evaluate", *SIMULATED, "--benchmark", target, "--count", "2"], capsys)
    back = "put the images back where the manifest says"
    rebuild = "rebuild the benchmark where they are now with posdebias build"
    advice = ["give the folder posdebias build wrote (with its manifest.json)"]
    if change != "manifest removed":
        advice = [back, rebuild]
    assert code == 2 and all(part in " ".join(err.split()) for part in advice), err
    assert "--root" not in err and "root=" not in err, err
    with pytest.raises(BenchmarkError) as info:
        load_benchmark(target)
    assert "load_benchmark(path, root=...)" in str(info.value)


# names no file system can hold ------------------------------------------------------------------

LONG = "a" * 10_000 + ".png"  # over any path limit
PART = "b" * 300 + ".png"  # one name part over 255 bytes, the path itself short


def _rewrite_benchmark(bench, edit):
    """Edit the first line of a built benchmark, keeping its manifest's hash in step (the
    edit is then the only thing wrong with it)."""
    import hashlib

    lines = (bench / "benchmark.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    edit(record)
    lines[0] = json.dumps(record)
    data = ("\n".join(lines) + "\n").encode()
    (bench / "benchmark.jsonl").write_bytes(data)
    manifest = json.loads((bench / "manifest.json").read_text())
    manifest["benchmark_sha256"] = hashlib.sha256(data).hexdigest()
    (bench / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("name", [LONG, PART, "sub/" + PART])
def test_an_image_name_too_long_for_any_file_system_in_a_benchmark(tmp_path, capsys, name):
    bench = build_shapes_benchmark(tmp_path, count=4)
    _rewrite_benchmark(bench, lambda record: record["images"].__setitem__(1, name))
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = run(
        ["evaluate", *SIMULATED, "--benchmark", bench, "--count", "2", "--out", tmp_path / "r"],
        capsys,
    )
    assert code == 2 and "line 1: image path" in err and "is too long" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("name", [LONG, PART])
def test_an_image_name_too_long_in_a_build_source(tmp_path, capsys, name):
    from posdebias.benchmarks.sources import read_flickr8k, read_jsonl

    root = tmp_path / "images"
    root.mkdir()
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"image": name, "caption": "a thing"}) + "\n")
    args = ["build", "--source", "jsonl", "--root", root, "--captions", data, "-N", "2"]
    code, _, err = run([*args, "--count", "1", "--out", tmp_path / "out"], capsys)
    assert code == 2 and "line 1: image" in err and "is too long" in err, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(Exception, match="is too long"):
        read_jsonl(root, data)
    token = tmp_path / "captions.txt"
    token.write_text(f"image,caption\n{name},a thing\n")
    with pytest.raises(Exception, match=r"image name '.*is too long"):
        read_flickr8k(root, token)


@pytest.mark.parametrize(
    "where",
    [
        "--benchmark",
        "--calibration",
        "--out",
        "--model",
        "config benchmark",
        "config out",
        "rank image",
        "build root",
    ],
)
def test_a_path_too_long_for_any_file_system_on_the_command_line(tmp_path, capsys, where):
    args = ["evaluate", *SIMULATED, "--count", "2"]
    if where == "rank image":
        args = ["rank", *SIMULATED, "--calibration", tmp_path / "s.json", "--task", "retrieval"]
        args += ["c", "a.png", PART]
    elif where == "build root":
        args = ["build", "--source", "shapes", "--root", tmp_path / PART, "--out", tmp_path / "o"]
    elif where.startswith("config"):
        config = tmp_path / "c.yaml"
        config.write_text(json.dumps({where.split()[1]: str(tmp_path / LONG)}))
        args += ["--config", config]
    else:
        args += [where, tmp_path / PART]
    code, _, err = run(args, capsys)
    assert code == 2 and "is too long" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == (["c.yaml"] if "config" in where else [])


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "--adapter", "synthetic", "--count", "2", "--out", ""],
        ["calibrate", "--adapter", "synthetic", "--count", "2", "--out", " "],
        ["sweep", "top_k", "--adapter", "synthetic", "--values", "1", "--out", ""],
        ["build", "--source", "shapes", "--root", "shapes", "--count", "4", "--out", ""],
        ["evaluate", "--adapter", "synthetic", "--benchmark", ""],
        ["evaluate", "--model", " ", "--count", "2"],
        ["rank", "--adapter", "synthetic", "--calibration", "s", "--task", "retrieval", "q", ""],
        ["evaluate", "--config", "{config}"],
    ],
)
def test_an_empty_path_is_refused_not_read_as_the_current_folder(
    tmp_path, monkeypatch, capsys, argv
):
    """``--out "$UNSET"`` (or ``out: ""`` in a config) wrote a whole run into the current
    folder: Path("") is ".". Refused with exit 2; the folder stays empty."""
    config = tmp_path / "c.yaml"
    config.write_text('out: ""\nadapter: {name: synthetic}\ncount: 2\n')
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    code, _, err = run([arg.replace("{config}", str(config)) for arg in argv], capsys)
    assert code == 2 and "an empty path: name a file or folder" in err
    assert not list(here.iterdir())


def test_an_empty_path_from_python_or_a_harness_is_refused(tmp_path, monkeypatch):
    """``Debiaser.load("")``, ``save("")`` and a harness's ``calibration=`` of an unset
    variable read or wrote the current folder's states."""
    import posdebias
    from posdebias import Debiaser
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.errors import InputError
    from posdebias.integrations.harness import HarnessConfig

    monkeypatch.chdir(tmp_path)
    debiaser = Debiaser(SyntheticAdapter(), "pride")
    debiaser.calibrate(synthetic_instances(3, 4))
    with pytest.raises(InputError, match="Debiaser.save: an empty path"):
        debiaser.save("")
    debiaser.save(tmp_path / "pride.json")
    with pytest.raises(InputError, match="Debiaser.load: an empty path"):
        Debiaser.load(" ", SyntheticAdapter())
    with pytest.raises(InputError, match="the model: an empty path"):
        posdebias.load_adapter("")
    for field in ("calibration", "pretrained", "cache_dir", "adapter_options"):
        for value in ("", " ", "a\x00b", "x" * 300):
            settings = {"pretrained": "synthetic", field: value}
            with pytest.raises(ValueError, match="an empty path|NUL|too long"):
                HarnessConfig(**settings)
    state = debiaser.state
    organism = Debiaser(posdebias.load_adapter("posdebias/organism"), "vanilla")
    (tmp_path / "images").mkdir()
    images = [str(tmp_path / "images" / f"{k}.png") for k in range(3)]
    for k, image in enumerate(images):
        Image.new("RGB", (32, 32), (80 * k, 0, 0)).save(image)
    for path in ("", " ", "a\x00.json", "x" * 300):  # the one writer and the one reader
        with pytest.raises(OutputError, match="an empty path|NUL|too long"):
            state.save(path)
        with pytest.raises(InputError, match="an empty path|NUL|too long"):
            type(state).load(path)
        with pytest.raises(InputError, match="image file: (an empty path|the path)"):
            organism.rank("q", [path, *images])  # was "image file . is not a regular file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "pride.json"]


def test_a_tilde_is_the_home_folder_at_every_door(tmp_path, monkeypatch, capsys):
    """`--benchmark "~/b"` (quoted: no shell expands it) and `benchmark: ~/b` in a config file
    said "does not exist", while a harness and load_adapter expanded it."""
    from posdebias._images import open_image
    from posdebias.integrations.harness import HarnessConfig

    monkeypatch.setenv("HOME", str(tmp_path))
    bench = build_shapes_benchmark(tmp_path / "b", count=6, n=3)
    relative = "~/" + str(bench.relative_to(tmp_path))
    args = [*SIMULATED, "--count", "2", "--calibration-count", "2"]
    code, _, err = run(["evaluate", *args, "--benchmark", relative, "--out", "~/run1"], capsys)
    assert code == 0 and (tmp_path / "run1" / "results.json").is_file(), err
    config = tmp_path / "c.yaml"
    config.write_text(f"benchmark: {relative}\nout: ~/run2\n")
    code, _, err = run(["evaluate", *args, "--config", config], capsys)
    assert code == 0 and (tmp_path / "run2" / "results.json").is_file(), err
    cache = HarnessConfig(pretrained="m", cache_dir="~/cache").cache_dir
    assert cache == str(tmp_path / "cache")
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")  # every image opened (Debiaser.rank's)
    assert open_image("~/a.png").size == (8, 8)
    # a ~ no home folder is known for: refused at every door (an internal error on the
    # command line, a literal folder "~nosuchuser" from a config file)
    unknown = "~posdebias-no-such-user/x"
    code, _, err = run(["evaluate", *args, "--out", unknown], capsys)
    assert code == 2 and "no home folder is known" in err, err
    config.write_text(f"out: {unknown}\n")
    code, _, err = run(["evaluate", *args, "--config", config], capsys)
    assert code == 2 and "no home folder is known" in err, err
    with pytest.raises(ValueError, match="no home folder is known"):
        HarnessConfig(pretrained="m", cache_dir=unknown)
    assert not list(tmp_path.glob("~*")) and not list(Path.cwd().glob("~posdebias*"))


@pytest.mark.parametrize("seed", [True, 1000.0, 3.0, "3", -1])
def test_a_harness_reads_its_numbers_as_a_config_file_does(seed):
    """lm-eval and lmms-eval turn `seed=true` into True and `seed=1e3` into 1000.0; a config
    file refuses both, so does a harness (it read them as 1 and 1000)."""
    from posdebias.integrations.harness import HarnessConfig

    for field in ("seed", "calibration_count", "batch_size"):
        with pytest.raises(InputError) as refused:
            HarnessConfig.from_arguments({"pretrained": "synthetic", field: seed}, "model args")
        said = str(refused.value).replace(field, "seed", 1)
        typed = "seed: Input should be a valid integer" in said
        assert typed or (seed == -1 and "seed: Input should be greater" in said), said
    assert HarnessConfig.from_arguments({"pretrained": "s", "seed": 3}, "model args").seed == 3


@pytest.mark.parametrize("name", ["my model", "a..b", "org/na me", "\x1b[31mred", "x-"])
def test_a_model_name_that_is_no_path_and_no_hub_id_is_refused(tmp_path, capsys, name):
    """It reached the hub client, whose HFValidationError was an internal error (exit 1)."""
    import posdebias

    refused = "is neither a local path (none exists) nor a Hugging Face model id"

    code, _, err = run(
        ["evaluate", "--model", name, "--count", "2", "--out", tmp_path / "o"], capsys
    )
    assert code == 2 and refused in err and "\x1b" not in err, err
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"model": name, "count": 2}))
    code, _, err = run(["evaluate", "--config", config, "--out", tmp_path / "o"], capsys)
    assert code == 2 and refused in err, err
    with pytest.raises(InputError, match=re.escape(refused)):
        posdebias.load_adapter(name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_a_chat_template_too_long_for_a_file_name_is_a_template_error(tmp_path, capsys):
    """`Path.is_file` raised ENAMETOOLONG on it: an internal error, exit 1."""
    args = ["evaluate", "--model", "posdebias/text-organism", "--count", "2"]
    code, _, err = run([*args, "--chat-template", "x" * 300, "--out", tmp_path / "o"], capsys)
    assert code == 2 and "is not a Jinja template" in err, err
    assert not (tmp_path / "o").exists()
