"""The CLI on the simulated model: default run, flags, config files, errors."""

from __future__ import annotations

import json

import pytest

from posdebias.cli import main
from posdebias.errors import ConfigError
from posdebias.evaluation.config import load_config


def test_simulated_evaluate_prints_the_table(capsys, tmp_path):
    assert (
        main(["evaluate", "--adapter", "synthetic", "--count", "40", "--out", str(tmp_path)]) == 0
    )
    out = capsys.readouterr().out
    for name in (
        "vanilla",
        "pride",
        "attention_readout",
        "purified_attention",
        "attention_guided",
        "permutation_average",
        "Acc",
        "RStd",
        "Cons.",
    ):
        assert name in out
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["num_instances"] == 40 and results["orders"] == 5 and results["n"] == 4
    guided = results["calibrators"]["attention_guided"]["metrics"]
    vanilla = results["calibrators"]["vanilla"]["metrics"]
    assert guided["accuracy_mean"] > vanilla["accuracy_mean"]
    cost = results["calibrators"]["permutation_average"]["cost"]
    assert cost["forward_passes_per_instance"] == 4 * 5  # N rotations x T orders


def test_flags_override_the_config_file(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(
        'orders = 3\ncount = 7\n[adapter]\nname = "synthetic"\n[adapter.options]\nnum_layers = 6\n'
    )
    loaded = load_config(config, orders=2)
    assert (loaded.orders, loaded.count, loaded.adapter.options) == (2, 7, {"num_layers": 6})
    # --adapter naming another adapter drops the file's options (they are that adapter's); a
    # file that names no adapter gives its options to the one --adapter names
    assert load_config(config, adapter="organism").adapter.options == {}
    config.write_text("[adapter.options]\nnum_layers = 6\n")
    loaded = load_config(config, adapter="synthetic")
    assert (loaded.adapter.name, loaded.adapter.options) == ("synthetic", {"num_layers": 6})


def test_n_flag_changes_the_number_of_candidates(tmp_path):
    assert (
        main(
            [
                "evaluate",
                "--adapter",
                "synthetic",
                "-N",
                "6",
                "--count",
                "5",
                "--orders",
                "2",
                "--calibrators",
                "vanilla,attention_guided",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["n"] == 6
    assert len(results["calibrators"]["vanilla"]["metrics"]["recall_per_position"]) == 6


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("ordres: 3\n", "unknown key 'ordres'"),
        ("orders: many\n", "orders: Input should be a valid integer"),
        ("calibrators: {attention_guided: {mixture: linear}}\n", "mixture"),
        ("calibrators: {attention_guided: {taus: 3}}\n", "unknown option 'taus'"),
        ("calibrators: [vanila]\n", "unknown calibrator 'vanila'; known calibrators"),
        ("adapter: {name: synthetic, options: {num_layer: 3}}\n", "unknown option 'num_layer'"),
        ("- just\n- a list\n", "mapping"),
    ],
)
def test_bad_config_names_the_field(tmp_path, capsys, content, message):
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    assert main(["evaluate", "--config", str(config), "--count", "3"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_missing_config_file(capsys, tmp_path):
    assert main(["evaluate", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ConfigError):
        main(["--debug", "evaluate", "--config", str(tmp_path / "nope.yaml")])


def test_calibrator_needing_attention_with_an_adapter_without_it(capsys):
    """An adapter that gives no attention: attention calibrators fail with a clear message."""
    from posdebias import get_calibrator
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.errors import ObservationError
    from posdebias.evaluation.runner import fit_calibrators

    class Blind(SyntheticAdapter):
        name = "blind"
        provides_attention = False

        def observe_one(self, instance):
            obs = super().observe_one(instance)
            return type(obs)(label_logprobs=obs.label_logprobs, target=obs.target)

    with pytest.raises(ObservationError, match="needs attention.*vanilla, pride"):
        fit_calibrators(
            Blind(), {"g": get_calibrator("attention_guided")}, synthetic_instances(2, 4)
        )
