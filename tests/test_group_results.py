"""Per-group results (MMLU subjects, BLINK sub-tasks, BEIR datasets) with their macro average,
and the run's tables exported as CSV, LaTeX and markdown for any run directory."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from posdebias.cli import main
from posdebias.core.instance import Instance
from posdebias.evaluation.export import csv_text, latex_text, markdown_text
from posdebias.evaluation.groups import UNGROUPED, group_statistics
from posdebias.evaluation.statistics import Outcomes
from posdebias.testing import save_tiny_model


def _instances(groups):
    return [
        Instance(
            stem="q",
            texts=("a", "b", "c"),
            target=0,
            id=f"i{k}",
            task="multiple_choice",
            metadata={} if g is None else {"meta": {"group": g}},
        )
        for k, g in enumerate(groups)
    ]


def test_groups_their_macro_average_and_intervals():
    groups = ["x"] * 6 + ["y"] * 2 + [None]
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 3, size=(9, 2))
    choices = targets.copy()
    choices[:6] = (targets[:6] + 1) % 3  # group x: always wrong
    outcome = Outcomes(targets=targets, choices=choices, chosen=choices)
    stats = group_statistics({"row": outcome}, _instances(groups), 3, resamples=200, seed=0)
    assert stats is not None
    assert stats.instances == {UNGROUPED: 1, "x": 6, "y": 2}
    per = stats.rows["row"]
    assert per["x"].accuracy.value == 0.0 and per["y"].accuracy.value == 100.0
    assert stats.macro["row"].accuracy.value == pytest.approx(200 / 3)  # unweighted over groups
    for row in [*per.values(), stats.macro["row"]]:
        for ci in (row.accuracy, row.rstd, row.consistency):
            assert ci.low <= ci.value <= ci.high
    assert group_statistics({"row": outcome}, _instances([None] * 9), 3, resamples=100, seed=0) \
        is None  # fmt: skip


@pytest.mark.parametrize(
    ("text", "latex", "markdown", "spreadsheet"),
    [
        ("a&b_%x", r"a\&b\_\%x", "a&b_%x", "a&b_%x"),
        ("=HYPERLINK(1)", "=HYPERLINK(1)", "=HYPERLINK(1)", "'=HYPERLINK(1)"),
        ("a|b\\c", r"a|b\textbackslash{}c", "a\\|b\\\\c", "a|b\\c"),
        ("x\x1b[2Jy{}", r"x\textbackslash{}x1b[2Jy\{\}", "x\\\\x1b[2Jy{}", "x\\x1b[2Jy{}"),
    ],
)
def test_every_format_escapes_what_a_file_supplied(text, latex, markdown, spreadsheet):
    assert latex_text(text) == latex
    assert markdown_text(text) == markdown
    assert csv_text(text) == spreadsheet


@pytest.fixture(scope="module")
def mmlu_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("mmlu")
    data = root / "data"
    data.mkdir()
    for subject in ("anatomy", "a&b_%x"):
        rows = [[f"{subject} question {k}?", f"{k}", f"{k + 1}", f"{k + 2}", f"{k + 3}",
                 "ABCD"[k % 4]] for k in range(5)]  # fmt: skip
        buffer = io.StringIO()
        csv.writer(buffer).writerows(rows)
        (data / f"{subject}_test.csv").write_text(buffer.getvalue())
    bench = root / "bench"
    assert main(["build", "--task", "multiple_choice", "--source", "mmlu", "--data", str(data),
                 "--out", str(bench)]) == 0  # fmt: skip
    model = save_tiny_model("qwen3", root / "model")
    out = root / "run"
    assert main(["evaluate", "--task", "multiple_choice", "--benchmark", str(bench), "--model",
                 str(model), "--calibrators", "vanilla, pride", "--count", "8",
                 "--calibration-count", "2", "--orders", "2", "--out", str(out)]) == 0  # fmt: skip
    return out


def test_an_mmlu_run_has_per_subject_and_macro_rows(mmlu_run):
    results = json.loads((mmlu_run / "results.json").read_text())
    groups = results["groups"]
    assert groups["key"] == "group"
    assert set(groups["instances"]) == {"anatomy", "a&b_%x"}
    assert sum(groups["instances"].values()) == results["num_instances"] == 8
    assert set(groups["rows"]) == set(groups["macro"]) == {"vanilla", "pride"}
    for row in groups["rows"].values():
        for measures in [*row.values()]:
            for ci in measures.values():
                assert ci["low"] <= ci["value"] <= ci["high"]
    macro = groups["macro"]["vanilla"]["accuracy"]["value"]
    per = [groups["rows"]["vanilla"][g]["accuracy"]["value"] for g in groups["instances"]]
    assert macro == pytest.approx(sum(per) / 2)
    report = (mmlu_run / "report.md").read_text()
    assert "## Groups" in report and "a&b_%x (n=" in report and "| macro |" in report


@pytest.mark.parametrize("fmt", ["csv", "latex", "markdown"])
def test_report_prints_every_format_and_writes_nothing(mmlu_run, capsys, fmt):
    before = {p: p.stat().st_mtime_ns for p in mmlu_run.rglob("*")}
    capsys.readouterr()
    assert main(["report", str(mmlu_run), "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in mmlu_run.rglob("*")} == before
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(out)))
        assert {r["section"] for r in rows} == {"results", "ranking", "groups"}
        macro = [r for r in rows if r["group"] == "macro" and r["measure"] == "Acc"]
        assert len(macro) == 2
        for r in rows:
            assert float(r["low"]) <= float(r["value"]) <= float(r["high"])
    elif fmt == "latex":
        assert out.count(r"\begin{tabular}") == 4  # results, ranking, per-group, macro
        assert r"a\&b\_\%x (n=" in out
    else:
        assert "| row | Acc | RStd | Cons. |" in out and "a&b_%x (n=" in out


def test_report_format_refuses_an_unknown_format(mmlu_run, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error
        main(["report", str(mmlu_run), "--format", "xlsx"])
    assert exit_info.value.code == 2
    assert "xlsx" in capsys.readouterr().err


@pytest.mark.parametrize("section", ["groups", "ranking"])
def test_a_section_naming_another_row_is_refused_before_writing(mmlu_run, tmp_path, capsys,
                                                                 section):  # fmt: skip
    edited = tmp_path / "edited"
    edited.mkdir()
    payload = json.loads((mmlu_run / "results.json").read_text())
    payload[section]["rows"]["ghost"] = payload[section]["rows"].pop("pride")
    (edited / "results.json").write_text(json.dumps(payload))
    capsys.readouterr()
    assert main(["report", str(edited), "--format", "csv"]) == 2
    assert f"{section}.rows names ['ghost']" in capsys.readouterr().err
    assert sorted(p.name for p in edited.iterdir()) == ["results.json"]


@pytest.mark.parametrize(
    ("source", "row", "group"),
    [
        (
            "blink",
            {
                "idx": "b1",
                "sub_task": "Jigsaw",
                "question": "q?",
                "choices": ["x", "y"],
                "answer": "(A)",
            },
            "Jigsaw",
        ),
        (
            "muirbench",
            {
                "idx": "m1",
                "task": "Counting",
                "question": "q?",
                "options": ["x", "y"],
                "answer": "A",
                "image_list": [],
            },
            "Counting",
        ),
    ],
)
def test_builds_mark_the_group_of_blink_and_muirbench(tmp_path, source, row, group):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(row) + "\n")
    out = tmp_path / "bench"
    assert main(["build", "--source", source, "--data", str(data), "--out", str(out)]) == 0
    line = json.loads((out / "benchmark.jsonl").read_text())
    assert line["meta"]["group"] == group
