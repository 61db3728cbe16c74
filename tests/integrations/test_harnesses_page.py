"""docs/harnesses.md's lmms-eval section as a user meets it: its commands run as written from an
empty folder and print its table; a task without ids rotates; a refusal stops lmms-eval."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from harness_helpers import offline_env, page_blocks, require_lmms_eval

import posdebias.defaults as defaults
from posdebias.cli import main
from posdebias.integrations import lmms_eval_tasks as tasks
from posdebias.integrations.harness import HarnessConfig


def _run(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run by bash in ``folder`` as a user runs it: ``posdebias`` and ``lmms-eval``
    on the PATH (this environment's), offline, one thread."""
    env = offline_env(folder)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def test_the_lmms_eval_walkthrough_runs_as_written_and_prints_the_pages_table(tmp_path):
    require_lmms_eval()
    blocks = page_blocks()
    (index,) = [k for k, b in enumerate(blocks) if b[0].startswith("lmms-eval run:")]
    marker, lang, script = blocks[index]
    assert "test_harnesses_page.py" in marker and lang == "bash"
    table_marker, table_lang, table = blocks[index + 1]
    assert table_marker == "" and table_lang == "text"
    folder = tmp_path / "empty"
    folder.mkdir()
    done = _run(script, folder)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    printed = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert printed == table.splitlines()
    assert list((folder / "results").rglob("*_results.json"))
    hint = next(line for line in done.stdout.splitlines() if line.startswith("run: lmms-eval"))
    # the hint names what the page's command gives, MODEL aside
    page_args = shlex.split(script.replace("\\\n", " "))
    ours = page_args[page_args.index("--model_args") + 1]
    assert hint.split("--model_args ")[1].split()[0] == ours.replace(
        "pretrained=posdebias/organism", "pretrained=MODEL"
    )


FOREIGN_BASE = """task: muirbench
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: answer
generation_kwargs:
  max_new_tokens: 8
metric_list:
  - metric: exact_match
metadata:
  version: 1
"""

QUESTIONS = [
    {"question": "Which is a fruit?", "options": ["car", "apple", "stone", "cloud"], "answer": "B"},
    {"question": "Which is an animal?", "options": ["cat", "pen", "road", "cup"], "answer": "A"},
    {"question": "Which is a colour?", "options": ["desk", "lamp", "red", "shoe"], "answer": "C"},
]


def _foreign_task(folder: Path, questions: list[dict]) -> Path:
    """The page's rotated-task YAML, verbatim, over a local task named like the page's
    (documents without any id field)."""
    ((yaml_text,),) = [(b[2],) for b in page_blocks() if b[0] == "lmms-eval task"]
    include = folder / "tasks"
    include.mkdir(parents=True)
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in questions))
    (include / "muirbench.yaml").write_text(FOREIGN_BASE.format(data=data))
    (include / "muirbench_rotated.yaml").write_text(yaml_text)
    return include


def _lmms_eval(folder: Path, include: Path) -> subprocess.CompletedProcess[str]:
    command = [
        "lmms-eval",
        "--model",
        "posdebias",
        "--model_args",
        "pretrained=posdebias/text-organism,calibrators=vanilla,label_set=upper",
        "--tasks",
        "muirbench_rotated",
        "--include_path",
        str(include),
        "--output_path",
        "results",
        "--log_samples",
    ]
    return _run(shlex.join(command), folder)


def test_the_pages_rotated_task_needs_no_id_and_a_refusal_stops_lmms_eval(tmp_path):
    """Documents without an id rotate (grouped by their position); a document rotated_docs
    refuses used to surface as a KeyError inside a RetryError with exit status 0 and no
    results: now lmms-eval stops with exit status 2 and the reason."""
    require_lmms_eval()
    good = tmp_path / "good"
    done = _lmms_eval(good, _foreign_task(good, QUESTIONS))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (samples,) = (good / "results").rglob("*_samples_muirbench_rotated.jsonl")
    records = [json.loads(line) for line in samples.read_text().splitlines() if line]
    shown = sorted((record["acc"]["item"], record["acc"]["rotation"]) for record in records)
    assert shown == [(f"item-{k}", r) for k in range(3) for r in range(4)]  # 3 items x 4 orders
    for metric in ("acc", "rstd", "cons", "circular"):
        assert re.search(rf"\|{metric}\s*\|", done.stdout), metric
    bad = tmp_path / "bad"
    broken = [*QUESTIONS[:2], {**QUESTIONS[2], "answer": "Q"}]
    done = _lmms_eval(bad, _foreign_task(bad, broken))
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "error: item 'item-2': answer 'Q' names no candidate" in done.stderr
    assert "RetryError" not in done.stderr and not list(bad.rglob("*_results.json"))


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"id": "m1"}, "m1"),
        ({"question_id": 17}, "17"),
        ({"idx": 0}, "0"),
        ({"sample_id": "s"}, "s"),
        ({"id": None, "index": 3}, "3"),
        ({}, "item-5"),
    ],
)
def test_an_item_is_named_by_its_id_field_or_its_position(document, expected):
    doc = {"question": "?", "options": ["a", "b"], "answer": "A", **document}
    assert tasks.rotate_doc(doc, 1, 5)[tasks.ITEM] == expected


def test_without_an_id_or_a_position_the_error_says_what_to_add():
    with pytest.raises(ValueError, match=r"none of the fields \['id', 'question_id'"):
        tasks.rotate_doc({"question": "?", "options": ["a", "b"]}, 0)


def test_rotated_docs_in_python_raises_as_usual(lmms_eval_installed):
    """Outside lmms-eval's command line a refusal is an exception, not an exit."""
    import datasets

    docs = datasets.Dataset.from_list([{"question": "?", "options": ["a", "b"], "answer": "Q"}])
    with pytest.raises(ValueError, match="'item-0': answer 'Q' names no candidate"):
        tasks.rotated_docs(docs)


def _hint(benchmark: Path, out: Path, *flags: str, capsys) -> list[str]:
    args = ["lmms-eval-task", "--benchmark", str(benchmark), "--out", str(out), "--name", "t"]
    assert main([*args, *flags]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("run: ")]
    command = shlex.split(line.removeprefix("run: "))
    assert command[:3] == ["lmms-eval", "--model", "posdebias"]
    assert command[command.index("--include_path") + 1] == str(out)
    from lmms_eval.utils import simple_parse_args_string

    # as lmms-eval reads them (numbers become numbers): every argument is known and valid
    model_args = simple_parse_args_string(command[command.index("--model_args") + 1])
    HarnessConfig.model_validate({**model_args, "pretrained": "m"})
    return sorted(f"{k}={v}" for k, v in model_args.items())


def test_the_printed_command_has_every_model_argument_the_tasks_need(
    organism_benchmark, tmp_path, capsys
):
    rows = [
        {"id": f"q{k}", "question": f"Question {k}?", "answer": "ABCD"[k % 4],
         "options": ["alpha", "beta", "gamma", "delta"]}
        for k in range(defaults.CALIBRATION_COUNT + 10)
    ]  # fmt: skip
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    mcq = tmp_path / "mcq"
    assert main(["build", "--source", "mcq", "--data", str(data), "--out", str(mcq)]) == 0
    capsys.readouterr()
    held = str(defaults.CALIBRATION_COUNT)  # the model's default size is not repeated
    # the model answers each task in the task's own labels (letters here) unless told otherwise
    assert _hint(mcq, tmp_path / "a", "--calibration-count", held, capsys=capsys) == [
        "calibration=task",
        "calibrators=vanilla+attention_guided",
        "pretrained=MODEL",
    ]
    assert _hint(mcq, tmp_path / "b", "--label-set", "lower", capsys=capsys) == [
        "calibration=CALIBRATION",
        "calibrators=vanilla+attention_guided",
        "label_set=lower",
        "pretrained=MODEL",
    ]
    assert _hint(organism_benchmark, tmp_path / "my tasks", "--calibration-count", "8",
                 "--calibrators", "pride", capsys=capsys) == [
        "calibration=task",
        "calibration_count=8",
        "calibrators=pride",
        "pretrained=MODEL",
    ]  # fmt: skip
    assert _hint(organism_benchmark, tmp_path / "c", "--label-set", "upper", capsys=capsys) == [
        "calibration=CALIBRATION",
        "calibrators=vanilla+attention_guided",
        "label_set=upper",
        "pretrained=MODEL",
    ]
