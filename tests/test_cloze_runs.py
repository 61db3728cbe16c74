"""Cloze rows in real runs of the text organism (table, report, costs, resume), refusals that
leave nothing behind, and the diagnosis when the label answer ignores the content."""

from __future__ import annotations

import json

import pytest

from posdebias.cli import main
from posdebias.evaluation.diagnosis import content_diagnosis, labels_ignore_content
from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.statistics import Interval

RUN = ["evaluate", "--task", "multiple_choice", "--count", "6", "--orders", "3", "--calibrators",
       "vanilla,permutation_average", "--decoders", "cloze,cloze_mean"]  # fmt: skip


@pytest.fixture(scope="module")
def cloze_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("cloze") / "run"
    assert main([*RUN, "--out", str(run)]) == 0
    return run


def test_cloze_rows_in_a_run_resume_and_report(cloze_run, capsys):
    results = EvaluationResults.load(cloze_run / "results.json")
    rows = results.calibrators
    assert results.order_independent_rows() == ["cloze", "cloze_mean"]
    assert not rows["vanilla"].order_independent
    for label in ("cloze", "cloze_mean"):
        assert rows[label].kind == "decoder"
        assert rows[label].metrics.consistency == 100.0  # by construction
        assert rows[label].metrics.accuracy_std == 0.0  # the same choice in every order
        # each of the 4 options scored once per instance, whatever the 3 orders
        assert rows[label].cost.forward_passes_per_instance == 4
        assert rows[label].cost.generated_tokens_per_instance == 0
    assert rows["cloze"].options == {"score": "sum", "question": "{question}"}
    assert rows["cloze_mean"].options["score"] == "mean"
    report = (cloze_run / "report.md").read_text()
    cloze_line = next(line for line in report.splitlines() if line.startswith("| cloze |"))
    assert cloze_line.endswith("| - | - | 0.00 |")  # RStd and Cons. not shown
    assert "cloze, cloze_mean: order-independent" in report
    assert "Diagnosis" not in report  # the organism's labels follow the content (100%)
    log = (cloze_run / "generations.jsonl").read_text().splitlines()
    assert len(log) == 6 * 3 * 2  # one decision per order and row
    # resumed: every decision comes from the log, the results are the same
    capsys.readouterr()
    assert main([*RUN, "--out", str(cloze_run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "order-independent" in out
    assert (cloze_run / "generations.jsonl").read_text().splitlines() == log
    again = EvaluationResults.load(cloze_run / "results.json")
    assert again.model_dump(exclude={"timing"}) == results.model_dump(exclude={"timing"})


@pytest.mark.parametrize(
    "args",
    [
        ["--adapter", "synthetic"],  # no model to score text with
        ["--count", "2"],  # the image organism: a vision-language adapter
    ],
)
def test_cloze_where_it_cannot_run_writes_nothing(tmp_path, capsys, args):
    out = tmp_path / "run"
    assert main(["evaluate", *args, "--decoders", "cloze", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cannot score a text as the model's reply" in err and "Traceback" not in err
    assert not out.exists()


def interval(value: float, low: float, high: float) -> Interval:
    return Interval(value=value, low=low, high=high)


@pytest.mark.parametrize(
    ("label_free", "knowledge", "expected"),
    [
        ((26.0, 18.0, 34.0), (79.0, 70.0, 87.0), True),  # labels at chance, cloze far above
        ((12.0, 5.0, 20.0), (79.0, 70.0, 87.0), True),  # labels below chance: no content either
        ((40.0, 31.0, 49.0), (79.0, 70.0, 87.0), False),  # labels above chance: some content
        ((26.0, 18.0, 34.0), (30.0, 25.0, 36.0), False),  # cloze's interval reaches chance
        ((26.0, 18.0, 34.0), (40.0, 33.0, 47.0), False),  # cloze overlaps permutation averaging
        ((26.0, 25.0, 27.0), (30.0, 27.5, 32.0), True),  # narrow intervals, still apart
    ],
)
def test_the_rule_compares_intervals_with_chance_and_each_other(label_free, knowledge, expected):
    assert labels_ignore_content(25.0, interval(*label_free), interval(*knowledge)) is expected


def edited_run(source, target, edit) -> None:
    target.mkdir()
    data = json.loads((source / "results.json").read_text())
    edit(data)
    (target / "results.json").write_text(json.dumps(data))


def test_the_diagnosis_is_printed_and_written_when_labels_ignore_content(
    cloze_run, tmp_path, capsys
):
    def at_chance(data):
        rows = data["statistics"]["rows"]
        rows["permutation_average"]["accuracy"] = {"value": 22.0, "low": 11.0, "high": 33.0}
        rows["cloze"]["accuracy"] = {"value": 61.0, "low": 44.0, "high": 78.0}

    run = tmp_path / "edited"
    edited_run(cloze_run, run, at_chance)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "Diagnosis: the label answer ignores the options' content." in out
    assert "permutation_average" in out and "22.0% [11.0, 33.0]" in out
    assert "cloze" in out and "61.0% [44.0, 78.0]" in out and "chance (25.0%)" in out
    report = (run / "report.md").read_text()
    assert "No calibration of the label scores can help" in report
    diagnosis = content_diagnosis(EvaluationResults.load(run / "results.json"))
    assert diagnosis is not None and diagnosis.knowledge_row == "cloze"


def no_order_independent_row(data):
    for label in ("cloze", "cloze_mean"):
        data["calibrators"][label]["order_independent"] = False


@pytest.mark.parametrize(
    ("at_chance", "edit"),
    [
        (False, lambda data: None),  # as run: permutation averaging is right every time
        (True, lambda data: data.update(statistics=None)),  # no intervals to apply the rule to
        (True, no_order_independent_row),
        (True, lambda data: data["calibrators"]["permutation_average"].update(name="pride")),
    ],
)
def test_no_diagnosis_without_what_it_rests_on(cloze_run, tmp_path, at_chance, edit):
    def edited(data):
        if at_chance:
            rows = data["statistics"]["rows"]
            rows["permutation_average"]["accuracy"] = {"value": 22.0, "low": 11.0, "high": 33.0}
            rows["cloze"]["accuracy"] = {"value": 61.0, "low": 44.0, "high": 78.0}
        edit(data)

    run = tmp_path / "edited"
    edited_run(cloze_run, run, edited)
    assert content_diagnosis(EvaluationResults.load(run / "results.json")) is None


@pytest.mark.figures
def test_a_sweep_leaves_rstd_and_cons_of_a_cloze_row_empty(tmp_path):
    import csv

    out, config = tmp_path / "study", tmp_path / "text.yaml"
    config.write_text(
        "task: multiple_choice\ncalibrators: [vanilla, attention_guided]\ndecoders: [cloze]\n"
    )
    args = ["--values", "1,5", "--count", "4", "--orders", "2", "--out", str(out)]
    assert main(["sweep", "tau", "--config", str(config), *args]) == 0
    with open(out / "results.csv", encoding="utf-8", newline="") as handle:
        rows = {(row["point"], row["calibrator"]): row for row in csv.DictReader(handle)}
    for point in ("tau=1", "tau=5"):
        cloze, vanilla = rows[(point, "cloze")], rows[(point, "vanilla")]
        assert cloze["rstd"] == cloze["consistency"] == cloze["rstd_low"] == ""
        assert float(cloze["accuracy"]) >= 0 and vanilla["rstd"] != ""
    report = (out / "report.md").read_text()
    assert "an order-independent row (cloze)" in report
    assert (out / "figure.png").stat().st_size > 0
