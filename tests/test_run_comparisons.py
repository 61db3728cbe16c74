"""Statistics of whole runs through the command line, none of which reads a figure: two run
directories compare on what they share, CircularEval of a cyclic run, the statistics options
refused before any work, a typed results schema."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from posdebias.cli import main
from posdebias.evaluation.compare import compare_runs
from posdebias.evaluation.results import CalibratorResult, EvaluationResults


def synthetic_run(out: Path, *args: str) -> Path:
    assert main(["evaluate", "--adapter", "synthetic", "--orders", "3", "--out", str(out),
                 *args]) == 0  # fmt: skip
    return out


def test_compare_pairs_two_runs_on_their_shared_decisions(tmp_path, capsys):
    a = synthetic_run(tmp_path / "a", "--count", "20", "--calibrators", "vanilla,attention_guided")
    config = tmp_path / "b.yaml"  # attention_guided under the label vanilla: B - A is its gain
    config.write_text("calibrators: [{name: attention_guided, label: vanilla}]\n")
    b = synthetic_run(tmp_path / "b", "--count", "30", "--config", str(config))
    comparison = compare_runs(a, b)
    assert (comparison.instances, comparison.decisions) == (20, 60)
    [row] = comparison.rows
    own = EvaluationResults.load(a / "results.json").statistics
    assert own is not None
    [gain] = [c for c in own.comparisons if c.row == "attention_guided"]
    for end in ("value", "low", "high"):  # same instances, same resamples: same interval
        assert getattr(row.difference, end) == pytest.approx(getattr(gain.difference, end))
    assert (row.b_only, row.a_only, row.p_value) == (gain.row_only, gain.baseline_only,
                                                     gain.p_value)  # fmt: skip
    capsys.readouterr()
    assert main(["report", "--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "20 shared instances, 60 shared decisions" in out and "vanilla" in out


def test_compare_refuses_runs_that_share_nothing(tmp_path, capsys):
    a = synthetic_run(tmp_path / "a", "--count", "10", "--calibrators", "vanilla")
    other = synthetic_run(tmp_path / "other", "--count", "10", "--seed", "3",
                          "--calibrators", "vanilla")  # fmt: skip
    capsys.readouterr()
    assert main(["report", "--compare", str(a), str(other)]) == 2
    err = capsys.readouterr().err
    assert "share no test instance" in err and "Traceback" not in err
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "results.json").write_bytes((a / "results.json").read_bytes())
    assert main(["report", "--compare", str(a), str(lone)]) == 2
    assert "no records.jsonl" in capsys.readouterr().err
    assert main(["report", str(a), "--compare", str(a), str(a)]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["report", "--compare", str(a), str(a), "--resamples", "5"]) == 2
    assert "from 100 to 100,000" in capsys.readouterr().err


def test_bad_statistics_options_are_refused_before_any_work(tmp_path, capsys):
    cases = [
        (["--resamples", "50"], "resamples: Input should be greater than or equal to 100"),
        (["--baseline", "nosuchrow"], "baseline 'nosuchrow' is not a row of this run"),
    ]
    for flags, message in cases:
        out = tmp_path / "run"
        assert main(["evaluate", "--adapter", "synthetic", "--out", str(out), *flags]) == 2
        assert message in capsys.readouterr().err
        assert not out.exists()


def test_results_schema_has_no_untyped_section():
    """Every top-level section of results.json is a typed model, not a bag of Any."""

    for name, field in EvaluationResults.model_fields.items():
        shown = str(field.annotation)
        assert "Any" not in shown, (name, shown)
        if typing.get_origin(field.annotation) is dict:
            assert typing.get_args(field.annotation)[1] in (str, CalibratorResult), name
    assert EvaluationResults.model_fields["schema_version"].default == 2


def test_circular_eval_of_a_cyclic_run(tmp_path):
    """order_kind cyclic with T = N: CircularEval is the share of instances right in all N
    rotations, in results.json and report.md; with T < N it is absent."""
    out = tmp_path / "run"
    assert main(["evaluate", "--adapter", "synthetic", "--count", "12", "--orders", "4",
                 "--calibrators", "vanilla,attention_guided", "--config",
                 str(_cyclic(tmp_path)), "--out", str(out)]) == 0  # fmt: skip
    results = EvaluationResults.load(out / "results.json")
    assert results.statistics is not None
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    for label, row in results.statistics.rows.items():
        right = [all(c == t for c, t in zip(r["choices"][label], r["targets"], strict=True))
                 for r in records]  # fmt: skip
        assert row.circular is not None
        assert row.circular.value == pytest.approx(100 * sum(right) / len(right))
    assert "CircularEval [95% CI]" in (out / "report.md").read_text()
    fewer = tmp_path / "fewer"
    assert main(["evaluate", "--adapter", "synthetic", "--count", "12", "--orders", "3",
                 "--calibrators", "vanilla", "--config", str(_cyclic(tmp_path)),
                 "--out", str(fewer)]) == 0  # fmt: skip
    stats = EvaluationResults.load(fewer / "results.json").statistics
    assert stats is not None and stats.rows["vanilla"].circular is None


def _cyclic(tmp_path: Path) -> Path:
    config = tmp_path / "cyclic.yaml"
    config.write_text("order_kind: cyclic\n")
    return config


def test_compare_refuses_two_benchmarks_that_reuse_their_ids(tmp_path, capsys):
    """Two shapes benchmarks both name their instances random-00000, ...: the ids are shared,
    the questions are not, so a pairing by id would be a wrong number: refused (exit 2)."""
    from helpers import build_shapes_benchmark

    runs = []
    for seed in (1, 2):
        bench = build_shapes_benchmark(tmp_path / f"b{seed}", count=8, n=3, seed=seed)
        out = tmp_path / f"run{seed}"
        flags = ["--benchmark", str(bench), "--count", "5", "--calibration-count", "3"]
        assert main(["evaluate", *flags, "--orders", "2", "--calibrators", "vanilla",
                     "--out", str(out)]) == 0  # fmt: skip
        runs.append(out)
    same = set(json.loads((runs[0] / "results.json").read_text())["test_ids"])
    assert same & set(json.loads((runs[1] / "results.json").read_text())["test_ids"])
    capsys.readouterr()
    assert main(["report", "--compare", *map(str, runs)]) == 2
    err = capsys.readouterr().err
    assert "other instances under the same ids" in err and "different benchmarks" in err
    assert "Traceback" not in err
    assert compare_runs(runs[0], runs[0]).instances == 5  # one benchmark pairs with itself
