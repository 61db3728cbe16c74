"""The VLMEvalKit wrapper, through the interface VLMEvalKit's inference calls.

Why not against VLMEvalKit's own base class here: VLMEvalKit is not on the package index under
its own name (`pip download --no-deps vlmeval` finds no distribution); the only packaging there,
`ms-vlmeval` (ModelScope's), imports every model and dataset module of the kit when its
`vlmeval.vlm.base` is imported and needs about seventy heavy packages, several compiled from
source (OpenCV, decord, lpips, polygon3 ...; 38 minutes to install on a 2-core machine): too
much for a CI run on a machine with only Python. So these tests drive the wrapper as
VLMEvalKit's `infer_data` does (a ``supported_VLM`` entry built with functools.partial,
``use_custom_prompt``, ``set_dump_image``, then ``generate(message=..., dataset=...)`` with its
message format), and the base-class test checks the real ``BaseModel`` wherever VLMEvalKit can
be imported. (All of them passed with ms-vlmeval 0.0.20, VLMEvalKit 0.2rc1, installed.)
"""

from __future__ import annotations

import importlib.util
from functools import partial

import pytest

import posdebias
from posdebias.errors import ConfigError, InputError
from posdebias.integrations.vlmevalkit import PosdebiasVLM, VLMEvalKitInterface, message_instance


@pytest.fixture(scope="module")
def supported_vlm(organism_benchmark):
    """What a user adds to VLMEvalKit's vlmeval/config.py (the docs page gives the lines)."""
    return {
        "posdebias-organism": partial(
            PosdebiasVLM,
            pretrained="posdebias/organism",
            calibrators="attention_guided+vanilla",
            calibration=str(organism_benchmark),
        )
    }


@pytest.fixture(scope="module")
def model(supported_vlm):
    return supported_vlm["posdebias-organism"]()


def test_answers_like_the_debiaser_through_vlmevalkits_calls(model, organism_benchmark):
    from posdebias.benchmarks.files import load_benchmark

    assert model.use_custom_prompt("MyDataset") is False
    model.set_dump_image(lambda line: line["image_path"])
    assert model.dump_image({"image_path": ["a.png"]}, "MyDataset") == ["a.png"]
    assert model.INTERLEAVE is False and model.provenance["source"] == "benchmark"
    debiaser = posdebias.Debiaser(model.harness.adapter, ["attention_guided"])
    debiaser.states = {"attention_guided": model.harness.debiaser.states["attention_guided"]}
    for item in load_benchmark(organism_benchmark).instances[5:9]:
        message = [{"type": "image", "value": str(image)} for image in item.images]
        message.append({"type": "text", "value": item.stem})
        answer = model.generate(message=message, dataset="MyDataset")
        assert answer == str(debiaser.rank(item.stem, item.images).choice + 1)


def test_messages_without_candidates_are_refused_naming_the_dataset():
    with pytest.raises(InputError, match="dataset 'MMBench' gives 1 image"):
        message_instance(
            [{"type": "image", "value": "a.png"}, {"type": "text", "value": "q"}], "MMBench"
        )
    with pytest.raises(InputError, match="has no text"):
        message_instance(
            [{"type": "image", "value": "a.png"}, {"type": "image", "value": "b.png"}], "X"
        )


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="calibration=task is for lmms-eval"):
        PosdebiasVLM(pretrained="posdebias/organism", calibration="task")
    with pytest.raises(ConfigError, match="known: pretrained"):
        PosdebiasVLM(pretrained="posdebias/organism", temperature=0)


def test_base_class_is_vlmevalkits_where_installed_else_its_interface():
    if importlib.util.find_spec("vlmeval") is not None:
        from vlmeval.vlm.base import BaseModel

        assert issubclass(PosdebiasVLM, BaseModel)
    else:
        assert issubclass(PosdebiasVLM, VLMEvalKitInterface)
    for name in (
        "generate",
        "generate_inner",
        "use_custom_prompt",
        "build_prompt",
        "set_dump_image",
    ):
        assert callable(getattr(PosdebiasVLM, name))
