"""The shipped organism: loads offline by name, and the default run shows the phenomenon."""

from __future__ import annotations

import json

import pytest

from posdebias.cli import main
from posdebias.organism import MODEL_DIR, MODEL_NAME


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """The bundled benchmark is built into a fresh cache; nothing may touch the network."""
    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "cache"


def test_bundled_folder_holds_a_complete_model():
    names = {path.name for path in MODEL_DIR.iterdir()}
    expected = {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "processor_config.json",
        "chat_template.jinja",
        "posdebias_prompt.json",
        "README.md",
        "training.json",
    }
    assert expected <= names, expected - names
    assert (MODEL_DIR / "model.safetensors").stat().st_size < 3_000_000  # fp16, small wheel


def test_loads_offline_by_name_through_the_llava_adapter(cache_dir):
    import posdebias
    from posdebias.adapters.llava import LlavaAdapter
    from posdebias.organism.build import PROMPT

    adapter = posdebias.load_adapter(MODEL_NAME)
    assert isinstance(adapter, LlavaAdapter)
    assert adapter.model.config.model_type == "llava"
    assert adapter.prompt == PROMPT  # read from posdebias_prompt.json, not special-cased
    described = adapter.describe()
    assert described["model_id"] == MODEL_NAME and described["dtype"] == "float16"
    assert described["num_layers"] == 4


def test_default_run_reproduces_logit_attention_divergence(cache_dir, tmp_path, capsys):
    """No --adapter / --model: the organism on the bundled benchmark, every calibrator.

    A smaller sample than the default run (60 instances x 2 orders), so the thresholds are a
    little looser than issue 7's targets for the full run.
    """
    out = tmp_path / "run"
    assert main(["evaluate", "--count", "60", "--orders", "2", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["adapter"]["model_id"] == MODEL_NAME
    assert results["adapter"]["adapter"] == "llava"
    assert str(cache_dir) in results["source"]["benchmark"]
    metrics = {name: c["metrics"] for name, c in results["calibrators"].items()}
    assert set(metrics) == {
        "vanilla",
        "pride",
        "attention_readout",
        "purified_attention",
        "attention_guided",
        "permutation_average",
    }
    vanilla = metrics["vanilla"]
    assert vanilla["accuracy_mean"] <= 85 and vanilla["rstd"] >= 20  # the bias is there
    assert metrics["purified_attention"]["accuracy_mean"] >= 90  # the attention is right
    guided = metrics["attention_guided"]
    assert guided["accuracy_mean"] >= 90 and guided["consistency"] >= 75
    assert "posdebias/organism" in capsys.readouterr().out
