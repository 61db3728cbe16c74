"""The shipped organism: loads offline by name, and the default run shows the phenomenon."""

from __future__ import annotations

import json

import pytest

from helpers import reused_and_rebuilt
from posdebias.cli import main
from posdebias.organism import MODEL_DIR, MODEL_NAME


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
    assert (MODEL_DIR / "model.safetensors").stat().st_size < 6_000_000  # float32, a small wheel


def test_loads_offline_by_name_through_the_llava_adapter(cache_dir):
    import posdebias
    from posdebias.adapters.families.llava import LlavaAdapter
    from posdebias.organism.build import PROMPT

    adapter = posdebias.load_adapter(MODEL_NAME)
    assert isinstance(adapter, LlavaAdapter)
    assert adapter.model.config.model_type == "llava"
    # read from posdebias_prompt.json (written in the older form), not special-cased
    assert adapter.task_templates["retrieval"] == PROMPT
    described = adapter.describe()
    assert described["model_id"] == MODEL_NAME and described["dtype"] == "float32"
    assert described["num_layers"] == 4


def test_default_run_reproduces_logit_attention_divergence(cache_dir, tmp_path, capsys):
    """No --adapter / --model: the organism on the bundled benchmark, every calibrator.

    A smaller sample than the default run (60 instances x 2 orders, a few seconds) checked
    against the targets of the full run; a regression in the adapter, the probe or a
    calibrator breaks one of them.
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
    assert vanilla["accuracy_mean"] <= 80 and vanilla["rstd"] >= 25  # the bias is there
    guided = metrics["attention_guided"]
    assert guided["accuracy_mean"] >= 95 and guided["consistency"] >= 85
    readout = metrics["attention_readout"]["accuracy_mean"]  # raw attention: confounded
    assert readout <= guided["accuracy_mean"] - 8
    assert metrics["purified_attention"]["accuracy_mean"] > readout + 8  # the prior fixes it
    # per layer: the two selected layers carry the evidence and a positional sink, which
    # dividing by the static prior removes
    layers = {entry["layer"]: entry for entry in results["divergence"]["layers"]}
    assert sorted(layers) == [0, 1, 2, 3]
    for layer in (1, 2):
        entry = layers[layer]
        assert entry["selected"] > 0.9 and entry["prior_peak"] == 2  # the second to last
        assert entry["raw_truth"] > 0.5 and entry["raw_positional"] > 0.3
        assert entry["purified_truth"] > entry["raw_truth"] + 0.1
        assert entry["purified_positional"] < entry["raw_positional"] - 0.2
    assert "posdebias/organism" in capsys.readouterr().out


def test_default_run_refuses_more_instances_than_the_bundled_benchmark(cache_dir, capsys):
    assert main(["evaluate", "--count", "600", "--calibrators", "vanilla"]) == 2
    err = capsys.readouterr().err
    assert "bundled benchmark has 500 instances" in err and "posdebias build" in err


def test_bundled_benchmark_is_reused_and_rebuilt_when_damaged(tmp_path):
    from posdebias.organism.benchmark import BENCHMARK_COUNT, bundled_benchmark

    assert len(reused_and_rebuilt(bundled_benchmark, tmp_path)) == BENCHMARK_COUNT


#: Every row of the paper's ablation (Table 4): the raw attention, the attention prior, the
#: method without its prior, the full method; plus the baselines.
ABLATION_ROWS = {
    "calibrators": [
        "vanilla",
        "pride",
        "attention_readout",
        "purified_attention",
        "attention_guided",
        {
            "name": "attention_guided",
            "label": "attention_guided_no_prior",
            "options": {"attention_prior": False},
        },
        "permutation_average",
    ]
}


@pytest.mark.parametrize("n", [2, 4, 8, 12])
def test_each_stage_of_the_method_is_needed_at_every_n(n, cache_dir, tmp_path):
    """The organism's answer is biased but better than chance at every N, and from N = 4 on the
    ablation keeps the paper's order (100 instances x 2 orders per N): raw attention is
    informative but confounded by a positional sink and a salient colour (attention_readout well
    below the method), dividing by the static prior removes the sink (purified_attention above
    the readout) but not the saliency, which only the answer's evidence in the bias profile
    corrects (the method above the purified attention), the method without its prior falls
    behind, and PriDe's one static prior cannot undo a bias that depends on where the truth
    is."""
    out = tmp_path / "run"
    config = tmp_path / "rows.json"
    config.write_text(json.dumps(ABLATION_ROWS))
    args = ["evaluate", "-N", str(n), "--count", "100", "--orders", "2", "--config", str(config)]
    assert main([*args, "--out", str(out)]) == 0
    metrics = {
        name: c["metrics"]
        for name, c in json.loads((out / "results.json").read_text())["calibrators"].items()
    }
    accuracy = {name: m["accuracy_mean"] for name, m in metrics.items()}
    assert accuracy["vanilla"] >= 100 / n + 10 and metrics["vanilla"]["rstd"] >= 20
    assert accuracy["permutation_average"] >= accuracy["vanilla"]
    if n < 4:
        return
    guided = accuracy["attention_guided"]
    assert accuracy["attention_readout"] < accuracy["purified_attention"] < guided
    assert accuracy["attention_readout"] <= guided - 8
    assert accuracy["pride"] <= guided - 10
    assert accuracy["attention_guided_no_prior"] < guided
    assert guided >= accuracy["vanilla"] + 15
