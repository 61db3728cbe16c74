"""Rotated lmms-eval tasks: the transform, the metrics against posdebias's, the task writer
and its command (`posdebias lmms-eval-task`)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml
from harness_helpers import require_lmms_eval, write_task_module
from hypothesis import given
from hypothesis import strategies as st

from posdebias.benchmarks.files import load_benchmark
from posdebias.cli import main
from posdebias.errors import InputError
from posdebias.evaluation.job import split_held_out
from posdebias.evaluation.metrics import compute_metrics
from posdebias.integrations import lmms_eval_tasks as tasks
from posdebias.integrations.harness import doc_instance


@given(n=st.integers(2, 8), target=st.integers(0, 7), rotation=st.integers(0, 7))
def test_rotation_moves_the_candidates_and_the_truth_together(n, target, rotation):
    target, rotation = target % n, rotation % n
    doc = {"id": "x", "query": "q", "images": [f"img{k}" for k in range(n)], "target": target}
    rotated = tasks.rotate_doc(doc, rotation)
    assert rotated["images"][rotated["target"]] == f"img{target}"
    assert [rotated["images"][i] for i in range(n)] == [
        f"img{k}" for k in rotated["posdebias_order"]
    ]
    assert rotated["posdebias_order"] == [(i + rotation) % n for i in range(n)]
    instance = doc_instance(rotated, "t")  # the same convention as Instance.rotated
    base = doc_instance(doc, "t")
    assert instance.candidate_ids == base.rotated(rotation).candidate_ids
    assert instance.target == base.rotated(rotation).target


def test_the_transform_shows_every_item_in_every_rotation(lmms_eval_installed):
    import datasets

    docs = [{"id": f"i{k}", "query": "q", "images": ["a", "b", "c"], "target": k} for k in range(3)]
    rotated = tasks.rotation_transform("vanilla")(datasets.Dataset.from_list(docs))
    assert len(rotated) == 9
    rows = list(rotated)
    assert [(r["posdebias_item"], r["posdebias_rotation"]) for r in rows] == [
        (f"i{k}", r) for k in range(3) for r in range(3)
    ]
    assert {r["posdebias_calibrator"] for r in rows} == {"vanilla"}
    with pytest.raises(ValueError, match="rotations must be 1..3"):
        tasks.rotation_transform("vanilla", 4)(datasets.Dataset.from_list(docs))


def records_from(targets, choices, chosen, n):
    return [
        {
            "item": f"i{i}",
            "rotation": t,
            "target": int(targets[i, t]),
            "choice": int(choices[i, t]),
            "chosen": int(chosen[i, t]),
            "n": n,
        }
        for i in range(targets.shape[0])
        for t in range(targets.shape[1])
    ]


def test_aggregations_are_posdebias_metrics():
    rng = np.random.default_rng(0)
    n, items = 4, 30
    orders = [[(i + r) % n for i in range(n)] for r in range(n)]
    base_targets = rng.integers(0, n, items)
    targets = np.array([[orders[r].index(t) for r in range(n)] for t in base_targets])
    choices = rng.integers(-1, n, (items, n))
    chosen = np.array(
        [[orders[r][c] if c >= 0 else -1 for r, c in enumerate(row)] for row in choices]
    )
    records = records_from(targets, choices, chosen, n)
    rng.shuffle(records)  # the harness gathers ranks in any order
    ours = compute_metrics(targets, choices, chosen, n)
    assert tasks.accuracy(records) == ours.accuracy_mean
    assert tasks.rstd(records) == ours.rstd
    assert tasks.consistency(records) == ours.consistency
    assert tasks.circular(records) == 100.0 * np.mean(np.all(targets == choices, axis=1))


def test_an_item_cut_short_by_limit_is_left_out():
    targets = np.array([[0, 1], [1, 0]])
    records = records_from(targets, targets, targets, 2)
    records.append({"item": "late", "rotation": 0, "target": 0, "choice": 1, "chosen": 1, "n": 2})
    assert tasks.accuracy(records) == 100.0 and tasks.circular(records) == 100.0


def test_circular_eval_is_no_number_without_every_rotation():
    """A task written with ``--rotations 2`` for N = 4 shows half the rotations: "right in
    every rotation" over two of them is a number `evaluate` never gives (it leaves
    CircularEval absent): NaN, while Acc is over the rotations shown."""
    targets = np.array([[0, 3], [1, 0]])
    records = records_from(targets, targets, targets, 4)
    assert tasks.accuracy(records) == 100.0 and np.isnan(tasks.circular(records))


def test_parse_choice_reads_labels_and_losses():
    labels = ["A", "B", "C", "D"]
    assert tasks.parse_choice("C", labels) == 2
    assert tasks.parse_choice("The answer is B.", labels) == 1
    assert tasks.parse_choice("none of them", labels) == -1
    assert tasks.parse_choice([(2.0, False), (0.5, True), (1.0, False), (3.0, False)], labels) == 1


def test_writer_holds_out_what_evaluate_holds_out(organism_benchmark, tmp_path):
    out = tmp_path / "tasks"
    args = ["lmms-eval-task", "--benchmark", str(organism_benchmark), "--out", str(out)]
    assert main([*args, "--name", "demo", "--calibration-count", "5", "--count", "7"]) == 0
    calibration, test = split_held_out(load_benchmark(organism_benchmark).instances, 5, 0)
    read = lambda name: [json.loads(x) for x in (out / name).read_text().splitlines()]  # noqa: E731
    assert [doc["id"] for doc in read("demo_calibration.jsonl")] == [i.id for i in calibration]
    assert [doc["id"] for doc in read("demo_items.jsonl")] == [i.id for i in test[:7]]
    group = yaml.safe_load((out / "demo.yaml").read_text())
    assert group == {
        "group": "demo",
        "task": ["demo_vanilla", "demo_attention_guided"],
        "metadata": {"version": 1},
    }
    text = (out / "demo_attention_guided.yaml").read_text()
    assert "process_docs: !function demo_posdebias.docs_1" in text
    assert (
        "docs_1 = rotation_transform('attention_guided', None, items=ITEMS, "
        "calibration=CALIBRATION)" in (out / "demo_posdebias.py").read_text()
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--name", "bad-name"], "task name 'bad-name'"),
        (["--name", "ok", "--rotations", "5"], "rotations of 4 candidates must be a whole"),
        (["--name", "ok", "--calibration-count", "-1"], "must be a whole number from 0 to 10,000"),
        (["--name", "ok", "--count", "10000000"], "the count must be a whole number from 1 to"),
        (["--name", "ok", "--seed", "-2"], "the seed must be a whole number from 0 to"),
        (["--name", "ok", "--calibrators", "vanilla,vanilla"], "calibrators repeated"),
        (["--name", "ok", "--calibrators", "vanilla,bogus"], "unknown calibrator 'bogus'"),
        (["--name", "ok", "--calibrators", "Vanilla"], "unknown calibrator 'Vanilla'"),
    ],
)
def test_bad_arguments_exit_2_and_write_nothing(
    organism_benchmark, tmp_path, capsys, extra, message
):
    out = tmp_path / "tasks"
    args = ["lmms-eval-task", "--benchmark", str(organism_benchmark), "--out", str(out), *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_existing_task_files_are_never_replaced(organism_benchmark, tmp_path, capsys):
    out = tmp_path / "tasks"
    out.mkdir()
    (out / "demo.yaml").write_text("mine\n")
    args = ["lmms-eval-task", "--benchmark", str(organism_benchmark), "--out", str(out)]
    assert main([*args, "--name", "demo"]) == 2
    assert "already holds demo.yaml" in capsys.readouterr().err
    assert (out / "demo.yaml").read_text() == "mine\n" and sorted(out.iterdir()) == [
        out / "demo.yaml"
    ]


def test_require_lmms_eval_fails_loudly_in_ci(monkeypatch):
    import harness_helpers

    monkeypatch.setattr(harness_helpers, "HAS_LMMS_EVAL", False)
    monkeypatch.setattr(harness_helpers, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match="lmms-eval is not installed"):
        require_lmms_eval()


def test_doc_to_visual_and_text_for_other_models(organism_benchmark, tmp_path):
    """What the task shows models other than posdebias's: the images in the order shown,
    through the guarded image reader, and the task's default prompt text."""
    from posdebias.errors import InputError

    item = load_benchmark(organism_benchmark).instances[0]
    doc = tasks.rotate_doc(
        {"id": item.id, "query": item.stem, "images": [str(i) for i in item.images], "target": 0},
        1,
    )
    pictures = tasks.doc_to_visual(doc)
    assert [p.size for p in pictures] == [(64, 64)] * 4
    from PIL import Image

    with Image.open(doc["images"][0]) as first:
        assert np.array_equal(np.asarray(pictures[0]), np.asarray(first.convert("RGB")))
    assert tasks.doc_to_text(doc).startswith("Given 4 images indexed from 1 to 4")
    assert tasks.doc_to_target(doc) == str(doc["target"] + 1)
    with pytest.raises(InputError, match="image file"):
        tasks.doc_to_visual({**doc, "images": [str(tmp_path / "missing.png")] * 4})
    mcq = {"id": "q", "task": "multiple_choice", "query": "Capital of France?", "target": 1}
    mcq["texts"] = ["Rome", "Paris", "Madrid"]
    text = tasks.doc_to_text(tasks.rotate_doc(mcq, 1))
    assert "Question: Capital of France?" in text and "A. Paris\nB. Madrid\nC. Rome" in text
    assert tasks.doc_to_target(tasks.rotate_doc(mcq, 1)) == "A"


@given(rotation=st.integers(0, 3), answer=st.sampled_from(["A", "b", "(C)", 4, "2"]))
def test_a_foreign_layout_rotates_its_options_and_its_answer(rotation, answer):
    """Any multiple-choice task (MuirBench's layout: options, answer letter) rotates with
    `rotated_docs`: the options move, the answer follows in its own format."""
    doc = {"id": "m1", "question": "Which?", "options": ["w", "x", "y", "z"], "answer": answer}
    rotated = tasks.rotate_doc(doc, rotation)
    right = {"A": "w", "b": "x", "(C)": "y", 4: "z", "2": "x"}[answer]
    assert rotated["options"][rotated["target"]] == right
    moved = rotated["answer"]
    assert type(moved) is type(answer)
    assert doc_instance({**rotated, "target": None}, "t").target == rotated["target"]
    assert (str(moved).strip("()").isupper()) == (str(answer).strip("()").isupper())
    assert tasks.doc_labels(rotated) == ["A", "B", "C", "D"]


def test_rotated_docs_refuses_an_answer_that_names_no_option(lmms_eval_installed):
    import datasets

    docs = datasets.Dataset.from_list(
        [{"id": "m", "question": "?", "options": ["a", "b"], "answer": "Q"}]
    )
    with pytest.raises(ValueError, match="answer 'Q' names no candidate"):
        tasks.rotated_docs(docs)


def test_an_items_file_edited_to_move_a_truth_is_refused(
    organism_benchmark, tmp_path, lmms_eval_installed
):
    """The tasks' metrics come from the benchmark's truth: the written module names a digest
    of the items, and its transform refuses items whose truth (or candidates) changed since,
    as lmms-eval loads them (the json dataset loader)."""
    import datasets

    out = tmp_path / "tasks"
    module = write_task_module(
        organism_benchmark, out, "edit", "--count", "6", "--calibrators", "vanilla"
    )
    items = out / "edit_items.jsonl"

    def load():
        return datasets.load_dataset("json", data_files=str(items), split="train")

    assert len(module.docs_0(load())) == 6 * 4  # as written: every item in its 4 rotations
    lines = items.read_text().splitlines()
    for field, change in (
        ("target", lambda doc: (doc["target"] + 1) % 4),
        ("images", lambda doc: doc["images"][::-1]),
    ):
        doc = json.loads(lines[2])
        doc[field] = change(doc)
        items.write_text("\n".join([*lines[:2], json.dumps(doc), *lines[3:]]) + "\n")
        with pytest.raises(InputError, match="the items file was edited"):
            module.docs_0(load())
    items.write_text("\n".join(lines) + "\n")
    assert len(module.docs_0(load())) == 24


@pytest.mark.parametrize("taken", ["demo.yaml", "demo_vanilla.yaml", "demo_items.jsonl"])
@pytest.mark.parametrize("kind", ["dangling link", "link to a file", "folder"])
def test_a_users_link_or_folder_at_a_task_name_is_never_replaced(
    organism_benchmark, tmp_path, capsys, taken, kind
):
    # a dangling link tasks/d/t.yaml was deleted (exists() said no, the rename replaced it)
    out = tmp_path / "tasks"
    out.mkdir()
    target = tmp_path / "elsewhere.yaml"
    if kind == "dangling link":
        (out / taken).symlink_to(tmp_path / "nowhere.yaml")
    elif kind == "link to a file":
        target.write_text("theirs\n")
        (out / taken).symlink_to(target)
    else:
        (out / taken).mkdir()
    args = ["lmms-eval-task", "--benchmark", str(organism_benchmark), "--out", str(out)]
    assert main([*args, "--name", "demo"]) == 2
    assert f"already holds {taken}" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == [taken]
    assert os.path.lexists(out / taken) and (kind == "folder") == (out / taken).is_dir()
    if kind == "link to a file":
        assert target.read_text() == "theirs\n"


def test_a_name_taken_while_the_files_are_written_leaves_none_of_them(tmp_path):
    # the check before writing and the write are apart: the write itself never replaces
    from posdebias._io import write_files_together
    from posdebias.errors import OutputError

    out = tmp_path / "tasks"
    out.mkdir()
    (out / "b.yaml").symlink_to(tmp_path / "nowhere")
    files = {"a.yaml": b"a", "b.yaml": b"b", "c.yaml": b"c"}
    with pytest.raises(OutputError, match="already holds .*b.yaml"):
        write_files_together(out, files, new=True)
    assert sorted(p.name for p in out.iterdir()) == ["b.yaml"]
    assert (out / "b.yaml").is_symlink()
    assert write_files_together(tmp_path / "fresh", files, new=True)
    assert (tmp_path / "fresh" / "c.yaml").read_bytes() == b"c"


@pytest.mark.parametrize(
    ("answer", "position"),
    [("B", 1), ("(b)", 1), ("B.", 1), (" c ", 2), (2, 1), ("2", 1), ("(3)", 2),
     ("ß", None), ("É", None), ("٢", None), ("²", None), (True, None), (2.0, None),
     ("0", None), (4, None), ("D", None), ("", None), ("AB", None)],
)  # fmt: skip
def test_every_door_reads_an_answer_alike(tmp_path, capsys, answer, position):
    """A benchmark file (`posdebias build`), a harness document and a rotated task read an
    `answer` by one rule: `B.` was refused by the harness, `ß` crashed it (ord of "SS")."""
    doc = {"id": "x", "question": "q", "options": ["a", "b", "c"], "answer": answer}
    data = tmp_path / "mcq.jsonl"
    data.write_text(json.dumps(doc) + "\n")
    out = tmp_path / "bench"
    code = main(["build", "--source", "mcq", "--data", str(data), "--out", str(out)])
    err = capsys.readouterr().err
    if position is None:
        assert code == 2 and "answer" in err and "Traceback" not in err
        with pytest.raises(InputError, match="names no candidate"):
            tasks.rotate_doc(doc, 1)
        with pytest.raises(InputError):  # no truth: the model cannot score the document
            doc_instance(doc, "t").target  # noqa: B018
        return
    assert code == 0, err
    assert load_benchmark(out).instances[0].target == position
    assert doc_instance(doc, "t").target == position
    rotated = tasks.rotate_doc(doc, 1)  # the options move by one; the answer is written alike
    assert rotated["options"][rotated["target"]] == "abc"[position]
    again = tasks.rotate_doc({**rotated, "target": None}, 0)
    assert again["target"] == rotated["target"]
