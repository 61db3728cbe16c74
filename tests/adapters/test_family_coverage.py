"""The coverage table of the Adapters page: every image-text family of the installed
transformers with its verdict, and the generic adapter's refusals before any forward."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import transformers

from posdebias import get_adapter
from posdebias.adapters.families.generic import structural_problem
from posdebias.cli import main
from posdebias.errors import AdapterError
from posdebias.testing import tiny_model_and_processor
from posdebias.testing.check import check_instances
from posdebias.testing.coverage import (
    BUILT_IN,
    GENERIC,
    REFUSED,
    coverage_markdown,
    family_coverage,
    image_text_model_types,
    recorded_sweep,
)

#: One worker runs the module, so the coverage table (about 4 s) is built once, not on each.
pytestmark = pytest.mark.xdist_group("family_coverage")

DOC = Path(__file__).parents[2] / "docs" / "adapters.md"
REGENERATE = "posdebias plugins --families --markdown"


@pytest.fixture(scope="module")
def coverage():
    transformers.logging.set_verbosity_error()
    return family_coverage()


def _documented_table() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"<!-- families:start -->\n(.*?)<!-- families:end -->", text, re.S)
    assert match, "docs/adapters.md lost its families markers"
    return match.group(1)


def test_the_documented_table_is_the_commands_output(coverage):
    """Fails when transformers gains (or loses) a family, or a verdict changes: paste the
    output of `posdebias plugins --families --markdown` between the markers."""
    documented = _documented_table()
    listed = re.findall(r"^\| `([^`]+)` \|", documented, re.M)
    missing = sorted(set(image_text_model_types()) - set(listed))
    assert not missing, f"families not in docs/adapters.md: {missing}; run {REGENERATE}"
    assert documented == coverage_markdown(coverage), f"table out of date; run {REGENERATE}"


def test_every_family_has_one_verdict_and_the_built_ins_are_the_registrys(coverage):
    assert [row.model_type for row in coverage] == image_text_model_types()
    assert {row.verdict for row in coverage} <= {BUILT_IN, GENERIC, REFUSED}
    verdicts = {row.model_type: row for row in coverage}
    built_in = ("qwen2_5_vl", "llava_onevision", "internvl", "glm46v", "lfm2_vl", "llava_next",
                "molmo2", "kimi_k25", "ovis2", "cohere2_vision", "paddleocr_vl", "aya_vision",
                "idefics2", "gemma4", "mllama", "qwen2_5_omni_thinker",
                "qwen3_omni_moe_thinker")  # fmt: skip
    for family in built_in:
        assert verdicts[family].verdict == BUILT_IN
    for family, reason in (
        ("gemma3n", "(KV sharing)"),
        ("glm_ocr", "GlmOcrModel.get_rope_index"),
        ("t5gemma2", "encoder-decoder"),
    ):
        assert verdicts[family].verdict == REFUSED and reason in verdicts[family].detail


def test_the_recorded_sweep_speaks_for_every_generic_family(coverage):
    """Each family the config does not refuse was built as a tiny model of its own classes and
    run through `posdebias check`: the row says it passed every row, was refused at load (before
    any forward), or why no tiny model could be built; none failed a row after a forward."""
    swept = recorded_sweep()
    assert swept, "the family sweep was recorded on another transformers: rerun it (README)"
    assert set(swept) <= set(image_text_model_types())
    assert {entry["verdict"] for entry in swept.values()} <= {"PASS", "refused", "could not build"}
    verdicts = {row.model_type: row for row in coverage}
    for row in coverage:
        if row.verdict == GENERIC:
            assert row.detail.startswith(("checked", "not checked")), row
    # a language model that keeps no cache of its own (the adapter hands it one)
    assert verdicts["granite4_vision"].detail.startswith("checked")
    # tiles and the global view in one run of image tokens per image: the image's span
    assert verdicts["deepseek_ocr2"].detail.startswith("checked")
    # text between an image's tiles: refused by the processor dry run
    assert verdicts["step3p7"].verdict == REFUSED
    assert "at load: its processor splits images into tiles" in verdicts["step3p7"].detail


def test_a_sweep_recorded_on_another_transformers_is_not_used(monkeypatch):
    monkeypatch.setattr("transformers.__version__", "0.0.1")  # the module as imported now
    assert recorded_sweep() == {}
    rows = {row.model_type: row for row in family_coverage()}
    assert rows["granite4_vision"].verdict == GENERIC
    assert rows["granite4_vision"].detail.startswith("processor dry run")


def test_structural_problems_come_from_the_checkpoints_own_config():
    """What a family's default config does not show, a checkpoint's config can: KV sharing
    (Gemma 4 E2B / E4B) and unknown layer kinds are refused from the config alone."""
    config = transformers.AutoConfig.for_model("gemma4")
    assert structural_problem(config) is None
    config.get_text_config().num_kv_shared_layers = 2
    assert "last 2 layers reuse other layers' key/value states" in structural_problem(config)
    llava = transformers.AutoConfig.for_model("llava")
    llava.text_config.layer_types = ["full_attention", "mamba"] * 16
    assert "unknown layer type(s) ['mamba']" in structural_problem(llava)


def test_cli_prints_the_families_and_refuses_markdown_alone(capsys):
    assert main(["plugins", "--families", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out == _documented_table()
    assert main(["plugins", "--markdown"]) == 2
    assert "--markdown goes with --families" in capsys.readouterr().err


def test_the_generic_adapter_refuses_a_cross_attention_model_before_any_forward():
    """A model whose images enter through cross-attention (here: a LLaVA whose config declares
    cross-attention layers, as Mllama's does) is refused before the first forward."""
    model, processor = tiny_model_and_processor("llava")  # its own copy: the config changes
    model.config.text_config.cross_attention_layers = [1]
    calls = [0]
    model.register_forward_pre_hook(lambda *a, **k: calls.__setitem__(0, calls[0] + 1))
    adapter = get_adapter(model, processor, adapter="generic")
    with pytest.raises(AdapterError, match=r"cross-attention layers \[1\]"):
        adapter.verify(check_instances(3, multi_token_n=None)[0])
    assert calls[0] == 0


@pytest.mark.parametrize(
    ("family", "reason"),
    [
        # the chat template's <image> is only text the processor replaces
        ("ovis2", "image token '<image>' is not in the vocabulary"),
        # a wide image is split into tiles, a line break after each tile's patch tokens
        ("cohere2_vision", "splits images into tiles with text between them (4 runs of image"),
        # the checkpoints' processors have no chat template (the adapter brings the format)
        ("paligemma", "has no chat template"),
        # multimodal RoPE: the model computes 3-D positions from the image grids
        ("paddleocr_vl", "PaddleOCRVLModel.get_rope_index"),
    ],
)
def test_the_generic_adapter_refuses_the_built_in_families_it_cannot_read(family, reason):
    """The families that needed their own adapter: forced onto the generic one, each stops with
    its reason before any forward."""
    model, processor = tiny_model_and_processor(family)
    calls = [0]
    model.register_forward_pre_hook(lambda *a, **k: calls.__setitem__(0, calls[0] + 1))
    with pytest.raises(AdapterError, match=re.escape(reason)):
        get_adapter(model, processor, adapter="generic").verify(
            check_instances(3, multi_token_n=None)[0]
        )
    assert calls[0] == 0


def test_a_processor_that_writes_text_between_an_images_tiles_is_refused_before_any_forward():
    """Step 3.7 cuts a large or wide image into tiles, each its image tokens between
    <patch_start> and <patch_end>, before the global view: the model itself reads the tiled
    prompt, but the generic adapter cannot tell which runs belong to which image, so it stops at
    load (the processor dry run) with the reason; an image small enough for no tiles is one run."""
    import torch
    from adapter_reference import tiny_step3p7
    from PIL import Image

    model, processor = tiny_step3p7()
    images = [Image.new("RGB", size, colour) for size, colour in
              (((56, 56), (200, 30, 30)), ((224, 112), (30, 30, 200)))]  # fmt: skip
    text = "USER: <im_patch><im_patch>Which? ASSISTANT:"
    inputs = processor(text=[text], images=[images], return_tensors="pt")
    assert inputs["num_local_patches"].tolist() == [0, 8]  # the wide image: 4 x 2 tiles
    ids = inputs["input_ids"][0]
    assert int((ids == model.config.image_token_id).sum()) == 4 + 8 + 4
    with torch.inference_mode():
        model(**inputs)  # the premise: its own forward reads the tiles
    calls = [0]
    model.register_forward_pre_hook(lambda *a, **k: calls.__setitem__(0, calls[0] + 1))
    adapter = get_adapter(model, processor)
    assert adapter.name == "generic"
    with pytest.raises(AdapterError, match=r"splits images into tiles with text between them"):
        adapter.verify(check_instances(3, multi_token_n=None)[0])
    assert calls[0] == 0


def test_a_model_that_answers_through_a_separate_decoder_is_refused_from_its_class():
    """A block-diffusion model (DiffusionGemma) writes its answer on a canvas of decoder inputs:
    refused from the class alone; BLIP-2's forward takes decoder inputs too, but on a
    decoder-only language model (its config says so) the prompt is continued as usual."""
    from transformers import Blip2ForConditionalGeneration, DiffusionGemmaForBlockDiffusion

    problem = structural_problem(
        transformers.AutoConfig.for_model("diffusion_gemma"), DiffusionGemmaForBlockDiffusion
    )
    assert problem is not None and "decoder_input_ids" in problem
    assert "DiffusionGemmaForBlockDiffusion answers through a separate decoder" in problem
    blip = transformers.AutoConfig.for_model("blip-2")
    assert structural_problem(blip, Blip2ForConditionalGeneration) is None
    blip.use_decoder_only_language_model = False  # BLIP-2 on T5: an encoder-decoder answer
    assert "decoder_input_ids" in structural_problem(blip, Blip2ForConditionalGeneration)


def test_only_cross_attention_in_the_language_model_is_refused():
    """Aria pools vision features with a cross-attention projector: that is the vision side's
    own, and the generic adapter reads the language model right; cross-attention inside the
    language model (Mllama, IDEFICS) is refused before any forward."""
    import torch

    model, processor = tiny_model_and_processor("llava")  # its own copy: modules are added
    model.model.multi_modal_projector.cross_attn = torch.nn.Identity()
    adapter = get_adapter(model, processor, adapter="generic")
    assert adapter.support_problem() is None
    model.model.language_model.layers[1].cross_attn = torch.nn.Identity()
    adapter = get_adapter(model, processor, adapter="generic")
    problem = adapter.support_problem()
    assert problem is not None and "its language model has 1 cross-attention module(s)" in problem
    assert "layers.1.cross_attn" in problem
