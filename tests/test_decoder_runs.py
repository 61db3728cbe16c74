"""Decoder rows in real runs: table, costs, parse failures, kill + resume, third-party decoders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import interrupted_cli, line_count, main_without_latency
from posdebias.cli import main
from posdebias.decoders.generated import majority_vote
from posdebias.evaluation.metrics import compute_metrics
from posdebias.evaluation.results import EvaluationResults
from posdebias.registry import get_registry

ROWS_CONFIG = """
adapter: {name: synthetic, options: {latency: 0.002}}
count: 24
orders: 3
calibrators: [vanilla, pride]
decoders:
  - generated
  - instruction
  - {name: chain_of_thought, options: {max_new_tokens: 40}}
  - {name: self_consistency, options: {max_new_tokens: 40, samples: 5}}
  - {name: chain_of_thought, label: cot_cut, options: {max_new_tokens: 1}}
"""


def results_without_timing(path: Path) -> dict:
    payload = json.loads((path / "results.json").read_text())
    payload.pop("timing")
    return payload


def test_decoder_rows_costs_and_parse_failures(tmp_path, capsys):
    config = tmp_path / "rows.yaml"
    config.write_text(ROWS_CONFIG)
    run = tmp_path / "run"
    # the config's latency (for the kill test's subprocess) not slept: no number here reads it
    assert main_without_latency(["evaluate", "--config", str(config), "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert "Parse fail." in out and "self_consistency" in out
    results = EvaluationResults.load(run / "results.json")
    rows = results.calibrators
    assert [label for label, row in rows.items() if row.kind == "decoder"] == [
        "generated",
        "instruction",
        "chain_of_thought",
        "self_consistency",
        "cot_cut",
    ]
    # the simulated greedy answer is the argmax of the label scores: the scored vanilla's
    assert rows["generated"].metrics.accuracy_mean == rows["vanilla"].metrics.accuracy_mean
    assert rows["generated"].metrics.no_answer == 0.0
    # a reasoning cut after one word names no label: every order fails to parse, all wrong
    assert rows["cot_cut"].metrics.no_answer == 100.0
    assert rows["cot_cut"].metrics.accuracy_mean == 0.0
    assert rows["cot_cut"].metrics.consistency == 0.0
    cot = rows["chain_of_thought"].cost
    sc = rows["self_consistency"].cost
    assert cot.generated_tokens_per_instance > 3 * 10  # 3 orders x >10 words
    assert sc.generated_tokens_per_instance == 5 * cot.generated_tokens_per_instance
    assert sc.forward_passes_per_instance == cot.forward_passes_per_instance
    assert set(results.timing.seconds_per_instance) == set(rows)
    report = (run / "report.md").read_text()
    row = "| cot_cut | 0.00 ± 0.00 [0.0, 0.0] | 0.00 [0.0, 0.0] | 0.00 [0.0, 0.0] | 100.00 |"
    assert row in report
    assert "| vanilla |" in report and "| - |" in report
    lines = (run / "generations.jsonl").read_text().splitlines()
    keys = [json.loads(line)["key"] for line in lines]
    assert len(keys) == len(set(keys)) > 5 * 24 * 2  # one per distinct order and decoder
    logged = json.loads(lines[0])["decision"]
    assert set(logged) == {
        "choice",
        "texts",
        "answers",
        "forward_passes",
        "generated_tokens",
        "seconds",
    }


def test_killed_decoder_run_resumes_to_the_uninterrupted_results(tmp_path):
    config = tmp_path / "rows.yaml"
    config.write_text(ROWS_CONFIG)
    args = ["evaluate", "--config", str(config)]
    reference = tmp_path / "reference"
    assert main_without_latency([*args, "--out", reference]) == 0

    run = tmp_path / "run"
    generations = run / "generations.jsonl"
    code, _ = interrupted_cli([*args, "--out", run], lambda: line_count(generations) >= 40)
    assert code != 0
    assert not (run / "results.json").exists()
    before = generations.read_text().count("\n")
    assert 40 <= before < 5 * 24 * 2

    assert main_without_latency([*args, "--out", run, "--resume"]) == 0
    assert results_without_timing(run) == results_without_timing(reference)
    keys = [json.loads(line)["key"] for line in generations.read_text().splitlines()]
    expected = (reference / "generations.jsonl").read_text().count("\n")
    assert len(keys) == len(set(keys)) == expected  # nothing generated twice or lost


def test_a_third_party_decoder_is_a_row(tmp_path):
    from posdebias import hookimpl
    from posdebias.decoders import Decision, Decoder

    class AlwaysSecond(Decoder):
        name = "always_second"

        def decide(self, adapter, views, *, batch_size=1, seeds):
            return [Decision(choice=1, forward_passes=0) for _ in views]

    class Plugin:
        @hookimpl
        def posdebias_register_decoders(self, register):
            register(AlwaysSecond)

    get_registry().add_plugin(Plugin(), name="third-party")
    run = tmp_path / "run"
    args = ["--count", "8", "--orders", "4", "--decoders", "always_second", "--out", str(run)]
    assert main(["evaluate", "--adapter", "synthetic", *args]) == 0
    metrics = EvaluationResults.load(run / "results.json").calibrators["always_second"].metrics
    assert metrics.selection_rate == [0.0, 100.0, 0.0, 0.0]
    assert metrics.no_answer == 0.0


def test_unknown_decoder_and_label_clash_are_clear_errors(capsys):
    assert main(["evaluate", "--adapter", "synthetic", "--decoders", "beam_search"]) == 2
    assert "unknown decoder 'beam_search'" in capsys.readouterr().err
    assert main(["evaluate", "--adapter", "synthetic", "--decoders", "vanilla"]) == 2
    assert "labels must be unique across calibrators and decoders" in capsys.readouterr().err


def test_no_answer_metrics():
    targets = np.array([[0, 1], [2, 3]])
    choices = np.array([[0, -1], [-1, -1]])
    images = np.array([[5, -1], [-1, -1]])
    metrics = compute_metrics(targets, choices, images, 4)
    assert metrics.no_answer == 75.0
    assert metrics.accuracy_per_order == [50.0, 0.0]
    assert metrics.confusion[0] == [100.0, 0.0, 0.0, 0.0]
    assert metrics.confusion[1] == [0.0, 0.0, 0.0, 0.0]  # the row's pair had no answer
    assert metrics.selection_rate == [25.0, 0.0, 0.0, 0.0]
    assert metrics.consistency == 0.0


def test_majority_vote_rule():
    assert majority_vote([2, 1, 1, None]) == 1
    assert majority_vote([2, 1, 1, 2]) == 2  # tie: the answer of the earliest sample
    assert majority_vote([None, 3, 0, 0, 3]) == 3
    assert majority_vote([None, None]) is None
    assert majority_vote([None], fallback="first") == 0


@pytest.mark.figures("png")
def test_the_shipped_config_runs_every_row_on_the_organism(tmp_path):
    """examples/paper_baselines.yaml: every row of the paper's comparison in one run (here on 3
    instances x 2 orders; the shipped count is 40 x 5)."""
    config = Path(__file__).parents[1] / "examples" / "paper_baselines.yaml"
    run = tmp_path / "run"
    args = ["evaluate", "--config", str(config), "--count", "3", "--orders", "2", "--out", str(run)]
    assert main(args) == 0
    results = EvaluationResults.load(run / "results.json")
    rows = results.calibrators
    assert list(rows) == [
        "vanilla",
        "pride",
        "permutation_average_cyclic",
        "permutation_average_random",
        "permutation_average_authors",
        "contextual",
        "batch",
        "attention_guided",
        "attention_guided_no_prior",
        "vanilla_generated",
        "instruction",
        "chain_of_thought",
        "self_consistency",
        "sofa",
        "sofa_generated",
        "sofa_authors",
    ]
    assert rows["permutation_average_cyclic"].cost.forward_passes_per_instance == 2 * 4
    assert rows["permutation_average_random"].cost.forward_passes_per_instance == 2 * 16
    assert rows["permutation_average_authors"].cost.forward_passes_per_instance == 2 * 16
    assert rows["sofa"].cost.forward_passes_per_instance == 2
    sc = rows["self_consistency"].cost
    cot = rows["chain_of_thought"].cost
    assert 5 * cot.generated_tokens_per_instance < sc.generated_tokens_per_instance
    assert sc.generated_tokens_per_instance <= 2 * 10 * 12  # 10 samples of <= 12 tokens
    assert sc.forward_passes_per_instance <= cot.forward_passes_per_instance + 2 * 11
    assert rows["vanilla_generated"].cost.generated_tokens_per_instance <= 2 * 2
    report = (run / "report.md").read_text()
    for label in rows:
        assert f"| {label} |" in report
    assert (run / "figures" / "confusion.png").is_file()
