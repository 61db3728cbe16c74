"""`posdebias check` / check_adapter, the first-batch verification, and the span hook."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from adapter_reference import tiny_chameleon, tiny_granite4_vision, tiny_pair

from helpers import build_shapes_benchmark
from posdebias import get_adapter, get_registry, hookimpl
from posdebias._images import min_image_side
from posdebias.adapters.families.qwen2_vl import Qwen3VLAdapter
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.spans import ImageSpan
from posdebias.cli import main
from posdebias.errors import AdapterError
from posdebias.testing import check_adapter, save_tiny_model, tiny_model_and_processor
from posdebias.testing.check import check_instances
from posdebias.testing.tiny.mistral3 import tiny_llava_pixtral

CHECKS = ["image spans", "label tokens", "scores = own forward", "probe = eager", "batch 1 vs 2",
          "rotation", "preprocessing"]  # fmt: skip


def _figure(result) -> float:
    return float(re.search(r"max \|diff\| ([0-9.e+-]+)", result.figure).group(1))


def test_check_passes_on_every_builtin_family(family):
    report = check_adapter(get_adapter(*tiny_pair(family)))
    assert report.passed, report.summary()
    assert [r.name for r in report.results] == CHECKS
    assert all(r.status == "PASS" for r in report.results), report.summary()
    scores = report["scores = own forward"]
    assert "multi-token labels included" in scores.figure and _figure(scores) < 1e-4
    assert _figure(report["probe = eager"]) < 1e-5


@pytest.mark.parametrize(
    ("family", "figure"),
    [
        ("idefics3", "7 tokens each, 4 runs"),  # the global view with its markers
        ("smolvlm", "7 tokens each, 4 runs"),
        ("idefics2", "3 tokens each, 4 runs"),  # the whole image's image_seq_len tokens
    ],
)
def test_check_passes_with_image_splitting_off(family, figure):
    model, processor = tiny_model_and_processor(family)
    processor.image_processor.do_image_splitting = False
    report = check_adapter(get_adapter(model, processor))
    assert report.passed, report.summary()
    assert figure in report["image spans"].figure


def test_check_passes_on_a_pixtral_llava_checkpoint():
    """Pixtral-12B in the llava format: the LLaVA adapter reads the Pixtral rows."""
    model, processor = tiny_llava_pixtral()
    adapter = get_adapter(model, processor)
    assert adapter.name == "llava"
    report = check_adapter(adapter)
    assert report.passed, report.summary()
    assert "4 runs" in report["image spans"].figure  # one block per image, breaks included


@pytest.mark.parametrize(
    "family",
    ["qwen3_vl", "qwen3_vl_moe", "qwen2_5_vl", "glm4v", "paddleocr_vl", "qwen2_5_omni_thinker",
     "qwen3_omni_moe_thinker"],
)  # fmt: skip
def test_check_refuses_the_generic_adapter_on_multimodal_rope_before_any_forward(family):
    model, processor = tiny_pair(family)
    calls = _count_forwards(model)
    adapter = get_adapter(model, processor, adapter="generic")
    with pytest.raises(AdapterError, match="get_rope_index.*1-D positions"):
        check_adapter(adapter)
    assert calls[0] == 0  # refused from the config, not after a wrong forward


class _WrongPositions(Qwen3VLAdapter):
    """A Qwen3-VL adapter that forgot multimodal RoPE (1-D positions, no declared problem)."""

    name = "qwen3_vl_1d"

    def prompt_position_ids(self, inputs):
        return HFAdapter.prompt_position_ids(self, inputs)


class _WrongPositionsPlugin:
    @hookimpl
    def posdebias_register_adapters(self, register):
        register(_WrongPositions)


def _count_forwards(model) -> list[int]:
    calls = [0]

    def hook(module, args, kwargs):
        calls[0] += 1

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return calls


def test_first_batch_is_verified_once_per_model_with_one_extra_forward():
    model, processor = tiny_model_and_processor("qwen3_vl")
    calls = _count_forwards(model)
    instances = check_instances(3, multi_token_n=None)
    adapter = get_adapter(model, processor)
    adapter.observe_many(instances, batch_size=2)
    assert calls[0] == 1 + 1  # the batch, and the model's own forward of its unpadded row
    calls[0] = 0
    get_adapter(model, processor).observe_many(instances, batch_size=2)  # a new adapter
    assert calls[0] == 1  # the verdict is cached per model


def test_wrong_positions_stop_the_first_batch_with_a_clear_error():
    model, processor = tiny_model_and_processor("qwen3_vl")
    calls = _count_forwards(model)
    adapter = _WrongPositions(model, processor, model_id="tiny-qwen3")
    instances = check_instances(3, multi_token_n=None)
    with pytest.raises(AdapterError) as error:
        adapter.observe_many(instances)
    message = str(error.value)
    assert "'qwen3_vl_1d' adapter's label scores differ from the model's own forward" in message
    assert "model_type 'qwen3_vl'" in message and "posdebias check --model tiny-qwen3" in message
    calls[0] = 0
    with pytest.raises(AdapterError, match="differ from the model's own forward"):
        adapter.observe(instances[0])
    assert calls[0] == 1  # the failed verdict is cached too: only the batch itself ran
    assert check_adapter(adapter)["scores = own forward"].status == "FAIL"


def test_generic_refuses_before_any_forward():
    model, processor = tiny_model_and_processor("qwen3_vl")
    calls = _count_forwards(model)
    adapter = get_adapter(model, processor, adapter="generic")
    with pytest.raises(AdapterError, match="cannot score model_type 'qwen3_vl'.*get_rope_index"):
        adapter.observe(check_instances(2, multi_token_n=None)[0])
    assert calls[0] == 0
    llava = get_adapter(*tiny_pair("llava"), adapter="generic")
    assert llava.position_problem() is None  # 1-D RoPE: the generic adapter is right there
    assert check_adapter(llava).passed


class _SplitRuns(Qwen3VLAdapter):
    """Gives each image as the union of two runs (markers + first half, second half)."""

    name = "qwen3_vl_split"

    def image_spans(self, input_ids, num_images, replacements):
        spans = super().image_spans(input_ids, num_images, replacements)
        middle = [(s.start + s.end) // 2 for s in spans]
        return [ImageSpan(((s.start, m), (m, s.end))) for s, m in zip(spans, middle, strict=True)]


class _EvenSplit(Qwen3VLAdapter):
    """Wrong: splits all image tokens evenly, ignoring how many each image has."""

    name = "qwen3_vl_even"

    def image_spans(self, input_ids, num_images, replacements):
        positions = [t for t, token in enumerate(input_ids) if token in self.image_token_ids()]
        size = len(positions) // num_images
        return [
            ImageSpan.from_positions(
                positions[k * size : (k + 1) * size if k < num_images - 1 else None]
            )
            for k in range(num_images)
        ]


@pytest.mark.parametrize("family", ["qwen2_5_omni_thinker", "qwen3_omni_moe_thinker"])
def test_the_omni_thinkers_pass_only_with_their_own_positions(family):
    """The thinkers' 3-D positions (from their get_rope_index) are what the scores row checks:
    the same adapter with 1-D positions fails it."""
    model, processor = tiny_model_and_processor(family)
    adapter = get_adapter(model, processor)
    assert adapter.name == {"qwen2_5_omni_thinker": "qwen2_5_omni"}.get(family, "qwen3_omni_moe")

    class OneDimensional(type(adapter)):
        name = "omni_1d"

        def prompt_position_ids(self, inputs):
            return HFAdapter.prompt_position_ids(self, inputs)

    batch = adapter.prepare_batch(check_instances(2, multi_token_n=None))
    positions = adapter.prompt_position_ids(batch.inputs)
    assert positions.shape[0] == 3 and not torch.equal(positions[1], positions[2])  # h != w
    report = check_adapter(OneDimensional(model, processor))
    assert report["scores = own forward"].status == "FAIL", report.summary()


def test_span_hook_unions_pass_and_wrong_spans_fail_the_rotation_check():
    model, processor = tiny_pair("qwen3_vl")
    report = check_adapter(_SplitRuns(model, processor))
    assert report.passed, report.summary()
    assert ", 8 runs," in report["image spans"].figure
    wrong = check_adapter(_EvenSplit(model, processor))
    rotation = wrong["rotation"]
    assert rotation.status == "FAIL" and "do not follow the images" in rotation.cause


@pytest.fixture(scope="module")
def saved_qwen3(tmp_path_factory):
    return save_tiny_model("qwen3_vl", tmp_path_factory.mktemp("models") / "qwen3_vl")


def test_cli_check_passes_and_fails_with_exit_codes(saved_qwen3, capsys):
    assert main(["check", "--model", str(saved_qwen3), "-N", "3"]) == 0
    out = capsys.readouterr().out
    assert "all 7 checks passed" in out and out.count("PASS") == 7
    # the generic adapter on multimodal RoPE: refused before any forward, exit 2, no table
    assert main(["check", "--model", str(saved_qwen3), "--adapter", "generic", "-N", "3"]) == 2
    captured = capsys.readouterr()
    assert "cannot score model_type 'qwen3_vl'" in captured.err
    assert "get_rope_index" in captured.err and "PASS" not in captured.out


def test_cli_check_bad_input_exits_2(saved_qwen3, tmp_path, capsys):
    assert main(["check", "--model", str(saved_qwen3), "-N", "1"]) == 2
    assert "-N must be a whole number from 2 to 26" in capsys.readouterr().err
    missing = tmp_path / "nope.png"
    assert main(["check", "--model", str(saved_qwen3), "--image", str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_evaluate_with_a_wrong_adapter_stops_before_writing(saved_qwen3, tmp_path, capsys):
    bench = build_shapes_benchmark(tmp_path, count=4, n=3)
    out = tmp_path / "run"
    args = ["evaluate", "--model", str(saved_qwen3), "--benchmark", str(bench), "--out", str(out)]
    code = main([*args, "--adapter", "generic", "--count", "2", "--calibration-count", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "the 'generic' adapter cannot score model_type 'qwen3_vl'" in err
    assert "posdebias check" in err and "Traceback" not in err
    assert not out.exists()


def test_check_instances_have_padding_and_multi_token_labels():
    instances = check_instances(4)
    assert [i.n for i in instances] == [4, 4, 10]
    sizes = {image.size for image in instances[2].images}
    assert len(sizes) > 4  # images of different sizes and aspect ratios
    adapter = get_adapter(*tiny_pair("qwen3_vl"))
    batch = adapter.prepare_batch(instances[:2])
    assert bool((batch.inputs["attention_mask"] == 0).any())
    assert torch.equal(
        batch.inputs["attention_mask"][1], torch.ones_like(batch.inputs["attention_mask"][1])
    )


def test_cli_check_on_a_benchmarks_instances(saved_qwen3, tmp_path, capsys):
    bench = build_shapes_benchmark(tmp_path, count=3, n=3)
    assert main(["check", "--model", str(saved_qwen3), "--benchmark", str(bench)]) == 0
    assert "all 7 checks passed" in capsys.readouterr().out


def test_the_preprocessing_row_says_what_was_shrunk_and_compares_the_originals(tmp_path):
    """Files far larger than the processor's size are shrunk before the processor; the row
    names each one with its factor and measures the scores on the original files."""
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for index, (width, height) in enumerate([(640, 480), (48, 48), (500, 700)]):
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        path = tmp_path / f"big-{index}.png"
        Image.fromarray(pixels).save(path)
        paths.append(path)
    adapter = get_adapter(*tiny_pair("llava"))
    side = min_image_side(adapter.processor)
    assert side is not None and side * 2 <= 480  # the first and third files get shrunk
    report = check_adapter(adapter, check_instances(3, images=paths, multi_token_n=None))
    row = report["preprocessing"]
    assert "image 1 640x480 ->" in row.figure and "image 3 500x700 ->" in row.figure
    assert "image 2" not in row.figure  # 48 x 48 went to the processor as it was
    assert "shrunk" in row.figure and "scores on the original files differ" in row.figure
    assert row.status == ("PASS" if _figure(row) <= 1e-4 else "FAIL")
    small = check_adapter(adapter)["preprocessing"]  # the generated images: nothing shrunk
    assert (small.status, small.figure) == ("PASS", "no image file was shrunk before the processor")


def test_check_runs_one_at_a_time_where_the_adapter_says_batching_is_unsafe():
    """Llama 4 with floor_scale within the prompt: the NoPE temperature would count padding,
    so the adapter refuses padded batches; check's probe and batch rows fall back and say so."""
    model, processor = tiny_model_and_processor("llama4")  # its own copy: the config changes
    text = model.config.text_config
    text.attn_temperature_tuning, text.floor_scale = True, 16
    adapter = get_adapter(model, processor)
    report = check_adapter(adapter)
    assert report.passed, report.summary()
    assert "one instance at a time" in report["probe = eager"].figure
    assert "batching unsafe here, ran one at a time" in report["batch 1 vs 2"].figure


@pytest.mark.parametrize("terminal", [False, True])
def test_cli_check_rows_read_pass_and_fail_without_markup(
    saved_qwen3, capsys, monkeypatch, terminal
):
    """In a pipe and in a terminal: a table whose result column says PASS / FAIL, never the
    markup that styles it."""
    if terminal:
        monkeypatch.setenv("FORCE_COLOR", "1")
        monkeypatch.setenv("TTY_COMPATIBLE", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    # an adapter that forgot multimodal RoPE and declares no problem: the check runs and the
    # scores row FAILs (exit 1); the generic adapter would be refused before the table
    get_registry().add_plugin(_WrongPositionsPlugin(), name="wrong-positions")
    assert main(["check", "--model", str(saved_qwen3), "--adapter", "qwen3_vl_1d", "-N", "3"]) == 1
    out = capsys.readouterr().out
    assert "[green]" not in out and "[red]" not in out and "[/" not in out
    rows = [line for line in out.splitlines() if "PASS" in line or "FAIL" in line]
    assert sum("PASS" in row for row in rows) >= 5 and sum("FAIL" in row for row in rows) >= 1
    assert any(row.count("│") >= 3 or row.count("┃") >= 3 for row in rows)  # table cells
    if terminal:
        assert "\x1b[" in out  # styled by the terminal, not by words
    else:
        assert "\x1b" not in out


@pytest.mark.parametrize("device", ["cuda:99", "npu:0", "cpu:abc"])
def test_cli_check_on_a_device_that_is_not_there_exits_2(saved_qwen3, capsys, device):
    assert main(["check", "--model", str(saved_qwen3), "-N", "3", "--device", device]) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err and "device" in err, err


@pytest.mark.parametrize("kind", ["folder", "fifo", "dev-zero"])
def test_a_prompt_file_that_is_not_a_regular_file_is_refused_not_skipped(tmp_path, capsys, kind):
    """Another prompt must never be used in silence because the model's own is unreadable."""
    import os

    model = save_tiny_model("qwen3_vl", tmp_path / "qwen3_vl")
    prompt = model / "posdebias_prompt.json"
    if kind == "folder":
        prompt.mkdir()
    elif kind == "fifo":
        os.mkfifo(prompt)
    else:
        prompt.symlink_to("/dev/zero")
    assert main(["check", "--model", str(model), "-N", "3"]) == 2
    err = capsys.readouterr().err
    assert "prompt file" in err and "internal error" not in err, err


def test_a_language_model_that_keeps_no_cache_of_its_own_is_given_one():
    """Granite 4 Vision's layer-by-layer forward fills a cache it is given but makes none: the
    adapter hands it one (once it has seen that), and every check row passes."""
    model, processor = tiny_granite4_vision()
    adapter = get_adapter(model, processor)
    assert adapter.name == "generic"
    batch = adapter.prepare_batch(check_instances(2, multi_token_n=None)[:1])
    with torch.inference_mode():
        output = model(**batch.inputs, use_cache=True)
    assert output.cache is None  # the premise: no cache of its own
    report = check_adapter(adapter)
    assert report.passed, report.summary()
    assert all(r.status == "PASS" for r in report.results), report.summary()
    assert "multi-token labels included" in report["scores = own forward"].figure


def test_a_model_whose_config_is_its_language_models_passes_every_row():
    """Chameleon's config has no text sub-config: the model's own config is the language
    model's, and the generic adapter reads it there (probe, eager reference, layers)."""
    model, processor = tiny_chameleon()
    assert getattr(model.config, "text_config", None) is None  # the premise
    adapter = get_adapter(model, processor)
    assert adapter.name == "generic" and adapter.language_key is None
    report = check_adapter(adapter)
    assert all(r.status == "PASS" for r in report.results), report.summary()
    assert "over 3 layers" in report["probe = eager"].figure
