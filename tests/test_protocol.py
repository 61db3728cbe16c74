"""``protocol: reference`` changes exactly what docs/method.md documents, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import posdebias.defaults as defaults
from helpers import build_shapes_benchmark
from posdebias.benchmarks.files import load_benchmark
from posdebias.cli import main
from posdebias.evaluation.protocol import REFERENCE, reference_layer_range
from posdebias.testing import save_tiny_model

ATTENTION_CALIBRATORS = {"attention_readout", "purified_attention", "attention_guided"}


@pytest.mark.parametrize(
    ("depth", "expected"),
    [(4, (2, 4)), (12, (7, 12)), (21, (12, 21)), (22, (21, 22)), (28, (21, 28)), (36, (21, 36)),
     (48, (21, 36))],
)  # fmt: skip
def test_reference_layers_map_to_every_depth(depth, expected):
    assert reference_layer_range(depth) == expected


def _run(tmp_path: Path, name: str, *args: object) -> tuple[dict, list[dict]]:
    out = tmp_path / name
    assert main(["evaluate", *map(str, args), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return results, records


def _settings_difference(default: dict, reference: dict) -> dict:
    return {
        key: (default["settings"].get(key), reference["settings"].get(key))
        for key in set(default["settings"]) | set(reference["settings"])
        if default["settings"].get(key) != reference["settings"].get(key)
    }


def test_reference_preset_on_the_simulated_model(tmp_path):
    """Orders, calibration source and size and candidate layers change; the rest is
    identical."""
    bench = build_shapes_benchmark(tmp_path, count=defaults.CALIBRATION_COUNT + 10, n=4)
    args = ["--adapter", "synthetic", "--benchmark", bench, "--orders", "4", "--count", "10"]
    default, default_records = _run(tmp_path, "default", *args)
    reference, records = _run(tmp_path, "reference", *args, "--protocol", "reference")

    changed = _settings_difference(default, reference)
    assert set(changed) == {"protocol", "calibrators", "calibration_count"}
    assert changed["protocol"] == ("default", "reference")
    # the paper's M = 5 under the reference protocol, unless M is given
    assert changed["calibration_count"] == (defaults.CALIBRATION_COUNT, 5)
    for before, after in zip(*changed["calibrators"], strict=True):
        assert before["name"] == after["name"]
        if before["name"] in ATTENTION_CALIBRATORS:
            # the simulated model has 8 layers: the reference's top fraction, layers 5..7,
            # chosen per query by summed attention mass as the authors' code does
            authors = {"layer_range": [5, 8], "layer_selection": "mass", "span_mass": "sum"}
            assert after["options"] == {**before["options"], **authors}
        elif before["name"] == "permutation_average":  # the authors' random permutations
            extra = {"permutations": "random", "draw": "per_instance"}
            assert after["options"] == {**before["options"], **extra}
        else:
            assert after == before
    for label in ("attention_guided", "purified_attention"):
        assert reference["calibrators"][label]["options"]["layer_range"] == [5, 8]
        assert default["calibrators"][label]["options"]["layer_range"] is None
    assert reference["adapter"] == default["adapter"]

    # one shared set of distinct orders, identity first
    orders = {json.dumps(record["orders"]) for record in records}
    assert len(orders) == 1
    (shared,) = [record["orders"] for record in records[:1]]
    assert shared[0] == [0, 1, 2, 3] and len({tuple(o) for o in shared}) == 4
    assert len({json.dumps(record["orders"]) for record in default_records}) > 1

    # calibration: the first 5 instances of the file, also tested
    file_ids = [instance.id for instance in load_benchmark(bench).instances]
    assert reference["calibration_ids"] == file_ids[:5]
    assert reference["test_ids"] == file_ids[:10]
    assert not set(default["calibration_ids"]) & set(default["test_ids"])
    assert len(default["calibration_ids"]) == defaults.CALIBRATION_COUNT
    given, _ = _run(tmp_path, "given", *args, "--protocol", "reference", "--calibration-count", "3")
    assert given["calibration_ids"] == file_ids[:3]


def test_reference_preset_on_a_hugging_face_model(tmp_path):
    """Image size, label scoring and the prompt's trailing space reach the adapter."""
    model = save_tiny_model("llava", tmp_path / "model")
    bench = build_shapes_benchmark(tmp_path, count=8, n=3)
    args = ["--model", model, "--benchmark", bench, "--orders", "2", "--count", "3"]
    args += ["--calibration-count", "2", "--calibrators", "vanilla,attention_guided"]
    default, _ = _run(tmp_path, "default", *args)
    reference, _ = _run(tmp_path, "reference", *args, "--protocol", "reference")
    before, after = default["adapter"], reference["adapter"]
    changed = {key for key in before if before[key] != after[key]}
    assert changed == {"image_size", "logits_processors", "max_patches", "prompt", "prompt_hash"}
    assert (before["max_patches"], after["max_patches"]) == (None, "reference")
    assert (before["image_size"], after["image_size"]) == (None, REFERENCE.image_size)
    assert after["logits_processors"] == "generation_config"
    assert before["prompt"]["query"].endswith("Answer:")
    assert after["prompt"] == {**before["prompt"], "query": before["prompt"]["query"] + " "}
    assert after["prompt"]["query"].endswith("Answer: ")
    layers = reference["calibrators"]["attention_guided"]["options"]["layer_range"]
    assert layers == list(reference_layer_range(after["num_layers"]))


def test_explicit_settings_win_over_the_preset(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "adapter: {name: synthetic}\nprotocol: reference\ncount: 4\norders: 2\n"
        "calibrators: [{name: attention_guided, options: {layer_range: [0, 3]}}]\n"
    )
    out = tmp_path / "run"
    assert main(["evaluate", "--config", str(config), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["calibrators"]["attention_guided"]["options"]["layer_range"] == [0, 3]


def test_reference_refuses_a_separate_calibration_file(tmp_path, capsys):
    bench = build_shapes_benchmark(tmp_path, count=8, n=4)
    config = tmp_path / "run.yaml"
    config.write_text(f"protocol: reference\ncalibration_benchmark: {bench}\n")
    args = ["evaluate", "--adapter", "synthetic", "--config", str(config)]
    args += ["--benchmark", str(bench)]
    assert main(args) == 2
    assert "first instances of the evaluated file" in capsys.readouterr().err


def test_reference_fills_the_authors_row_choices_where_the_user_set_none():
    from posdebias.evaluation.config import EvaluateConfig
    from posdebias.evaluation.protocol import DEFAULT, apply_specs

    config = EvaluateConfig.model_validate(
        {
            "adapter": {"name": "synthetic"},
            "calibrators": ["vanilla", "permutation_average"],
            "decoders": [
                "generated",
                "instruction",
                "chain_of_thought",
                "sofa",
                "self_consistency",
                {"name": "generated", "label": "mine", "options": {"max_new_tokens": 5}},
                {"name": "chain_of_thought", "label": "cot_first", "options": {"parse": "last"}},
            ],
        }
    )
    assert apply_specs(DEFAULT, config, 8) == config
    reference = apply_specs(REFERENCE, config, 8)
    options = {spec.key: spec.options for spec in reference.decoders}
    assert options["generated"] == {"max_new_tokens": 2, "parse": "last_number"}
    assert options["sofa"] == {
        "answer": "generated",
        "within_candidate": True,
        "max_new_tokens": 2,
        "parse": "last_number",
    }
    # the authors answer the instruction prompt like their vanilla
    assert options["instruction"] == {"max_new_tokens": 2, "parse": "last_number"}
    # their chain of thought: the last digit run in 1..N, also inside a word
    assert options["chain_of_thought"] == {"parse": "last_number"}
    assert options["cot_first"] == {"parse": "last"}  # the user's wins
    assert options["self_consistency"] == {"fallback": "first", "sampling": "generation_config"}
    assert options["mine"] == {"max_new_tokens": 5, "parse": "last_number"}  # the user's wins
    calibrators = {spec.key: spec.options for spec in reference.calibrators}
    assert calibrators == {
        "vanilla": {},
        "permutation_average": {"permutations": "random", "draw": "per_instance"},
    }


def test_per_instance_permutations_are_fresh_per_instance_and_mapped_back():
    import numpy as np

    from posdebias import get_calibrator
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances

    calibrator = get_calibrator("permutation_average", permutations="random", draw="per_instance")
    shared = get_calibrator("permutation_average", permutations="random")
    instances = synthetic_instances(6, 4, seed=2)
    drawn = [tuple(map(tuple, calibrator.permutations_for(i))) for i in instances]
    assert len(set(drawn)) == len(drawn)  # afresh for every instance
    assert drawn == [tuple(map(tuple, calibrator.permutations_for(i))) for i in instances]
    assert all(orders[0] == (0, 1, 2, 3) and len(set(orders)) == 16 for orders in drawn)
    assert len({tuple(map(tuple, shared.permutations_for(i))) for i in instances}) == 1
    adapter = SyntheticAdapter()
    state = calibrator.fit([], n=4)
    for instance in instances:
        orders = calibrator.permutations_for(instance)
        views = calibrator.views_of(instance)
        observed = adapter.observe_many(views)
        prediction = calibrator.predict(observed[0], state, rotations=observed, orders=orders)
        by_image = np.mean(
            [
                obs.label_logprobs[np.argsort(order)]
                for obs, order in zip(observed, orders, strict=True)
            ],
            axis=0,
        )
        assert prediction.choice == int(np.argmax(by_image))
    with pytest.raises(Exception, match="needs the orders"):
        calibrator.predict(observed[0], state, rotations=observed)


def test_per_instance_permutations_do_not_depend_on_the_batch_size(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "adapter: {name: synthetic}\ncount: 6\norders: 2\ncalibrators:\n"
        "  - {name: permutation_average, options: {permutations: random, draw: per_instance}}\n"
    )
    records = []
    for batch in (1, 7):
        out = tmp_path / f"b{batch}"
        args = ["evaluate", "--config", str(config), "--out", str(out), "--batch-size", str(batch)]
        assert main(args) == 0
        records.append((out / "records.jsonl").read_text())
    assert records[0] == records[1]


def test_reference_warns_when_its_layer_mapping_leaves_out_the_informative_layer(tmp_path):
    """8 simulated layers, only layer 1 informative: the reference mapping (5..7) leaves it
    out, and every layer-selecting row says so in results.json and the report."""
    config = tmp_path / "run.yaml"
    config.write_text(
        "adapter: {name: synthetic, options: {informative_layers: [1]}}\nprotocol: reference\n"
        "count: 20\norders: 2\ncalibrators: [vanilla, attention_guided, "
        "{name: attention_readout, options: {layer_range: [0, 8]}}]\n"
    )
    out = tmp_path / "run"
    assert main(["evaluate", "--config", str(config), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    guided = results["calibrators"]["attention_guided"]["diagnostics"]
    assert guided["layers_left_out"] == [1]
    assert "leaving out layer(s) 1" in guided["warning"]
    assert "warning" not in results["calibrators"]["attention_readout"]["diagnostics"]
    assert "warning" not in results["calibrators"]["vanilla"]["diagnostics"]
    assert "leaving out layer(s) 1" in (out / "report.md").read_text()
    config.write_text(config.read_text().replace("protocol: reference\n", ""))
    out = tmp_path / "default"
    assert main(["evaluate", "--config", str(config), "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["calibrators"]["attention_guided"]["diagnostics"] == {}


def test_reference_on_the_organism_keeps_an_informative_layer_and_does_not_warn(tmp_path):
    """The bundled organism has 4 layers and its evidence in layers 1 and 2; the reference
    mapping keeps 2..3, so it leaves out layer 1 but keeps an equally informative one: no
    layer counts as left out, and the run raises no false alarm."""
    args = ["--protocol", "reference", "--calibrators", "vanilla,attention_guided"]
    results, _ = _run(tmp_path, "organism", *args, "--count", "8", "--orders", "2")
    guided = results["calibrators"]["attention_guided"]
    assert guided["options"]["layer_range"] == [2, 4]
    assert "layers_left_out" not in guided["diagnostics"]
    assert "warning" not in guided["diagnostics"]
    assert (
        guided["metrics"]["accuracy_mean"]
        > results["calibrators"]["vanilla"]["metrics"]["accuracy_mean"]
    )
