"""The pre-0.2 import paths keep working for one minor release, each with a DeprecationWarning
that names the new path (docs/compatibility.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

#: Every module of the flat pre-0.2 ``posdebias.adapters`` package -> its new home.
OLD_MODULES = {
    "posdebias.adapters.spans": "posdebias.adapters.hf.spans",
    "posdebias.adapters.scoring": "posdebias.adapters.hf.scoring",
    "posdebias.adapters.prompt": "posdebias.adapters.hf.prompt",
    "posdebias.adapters.generation": "posdebias.adapters.hf.generation",
    "posdebias.adapters.verify": "posdebias.adapters.hf.verify",
    "posdebias.adapters.cache": "posdebias.adapters.hf.cache",
    "posdebias.adapters.layers": "posdebias.adapters.hf.layers",
    "posdebias.adapters.probe": "posdebias.adapters.attention",
    "posdebias.adapters.sofa": "posdebias.adapters.attention.sofa",
    "posdebias.adapters.shared_prefix": "posdebias.adapters.attention.shared_prefix",
    "posdebias.adapters.check": "posdebias.testing.check",
    "posdebias.adapters.tiny": "posdebias.testing.tiny.common",
    **{
        f"posdebias.adapters.{family}": f"posdebias.adapters.families.{family}"
        for family in (
            "synthetic",
            "generic",
            "qwen2_vl",
            "qwen3_vl",
            "qwen3_5",
            "idefics3",
            "mistral3",
            "glm4v",
            "gemma3",
            "llama4",
            "llava_onevision",
            "internvl",
            "llava",
        )
    },
}

#: Names the old modules' users import from them, still importable from the old path.
OLD_NAMES = {
    "posdebias.adapters.hf": ["HFAdapter", "HFAdapterOptions", "PreparedBatch", "load_image"],
    "posdebias.adapters.spans": ["ImageSpan", "SpanTokens", "find_image_spans", "span_matrix"],
    "posdebias.adapters.probe": ["PROBE_NAME", "install_probe", "recording", "register_probe"],
    "posdebias.adapters.generation": ["Generation", "GenerationSettings", "generate_many"],
    "posdebias.adapters.sofa": ["SofaSettings", "sofa_attention"],
    "posdebias.adapters.check": ["check_adapter", "CheckReport"],
    "posdebias.adapters.tiny": ["build_tokenizer", "text_config"],
    "posdebias.adapters.qwen2_vl": ["Qwen2VLAdapter"],
    "posdebias.adapters": ["HFAdapter", "Qwen2VLAdapter", "SyntheticAdapter", "LlavaAdapter"],
}

_SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    report = {}
    for old, names in json.loads(sys.argv[1]).items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(f"import {old}")  # an import statement, as a user writes it
            module = sys.modules[old]
            values = [getattr(module, name) for name in names]
        report[old] = {
            "module": module.__name__,
            "found": sum(value is not None for value in values),
            "warnings": [
                [str(w.message), w.filename] for w in caught if w.category is DeprecationWarning
            ],
        }
    print(json.dumps(report))
    """
)


def _import(cases: dict[str, list[str]]) -> dict:
    """Import each module and its names in a fresh interpreter: what it is, what warned."""
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(cases)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout)


def test_every_old_module_path_is_its_new_module_with_a_deprecation_warning():
    report = _import({old: [] for old in OLD_MODULES})
    for old, new in OLD_MODULES.items():
        assert report[old]["module"] == new, old
        messages = [m for m, _ in report[old]["warnings"] if m.startswith(f"module {old} ")]
        assert len(messages) == 1, (old, report[old]["warnings"])
        assert f"use {new}" in messages[0] and "removed in posdebias 0.3" in messages[0]


def test_old_names_import_from_their_old_places_and_the_warning_points_at_the_caller():
    report = _import(OLD_NAMES)
    for old, names in OLD_NAMES.items():
        assert report[old]["found"] == len(names), old
        if old != "posdebias.adapters.hf":  # the package keeps its path (its surface is new)
            assert report[old]["warnings"], old
        # attributed to the importing code (here "<string>"), not to posdebias or importlib
        assert all(file == "<string>" for _, file in report[old]["warnings"]), report[old]


def test_the_hf_surface_does_not_warn_and_a_name_outside_it_does():
    report = _import({"posdebias.adapters.hf": ["HFAdapter", "SpanTokens", "ImageSpan"]})
    assert report["posdebias.adapters.hf"]["warnings"] == []
    report = _import({"posdebias.adapters.hf": ["load_image"]})
    [(message, _)] = report["posdebias.adapters.hf"]["warnings"]
    assert "use posdebias.adapters.hf.adapter.load_image" in message


def test_an_unknown_name_is_still_an_attribute_error():
    import posdebias.adapters

    with pytest.raises(AttributeError, match="NoSuchAdapter"):
        posdebias.adapters.NoSuchAdapter  # noqa: B018


def test_candidate_ids_is_image_ids_with_a_warning():
    from posdebias import Instance

    instance = Instance("q", images=("a.png", "b.png"), target=0, id="i", image_ids=("a", "b"))
    with pytest.warns(
        DeprecationWarning, match=r"Instance.candidate_ids .* use Instance.image_ids"
    ):
        assert instance.candidate_ids == instance.image_ids == ("a", "b")
