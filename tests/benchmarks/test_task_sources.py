"""Sources of the candidate tasks: real files in, benchmark folders out, bad lines named."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from PIL import Image

from posdebias.benchmarks.files import BENCHMARK_FILE, MANIFEST_FILE, load_benchmark
from posdebias.benchmarks.tasks import BM25, build_task_benchmark
from posdebias.cli import main
from posdebias.errors import BenchmarkError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def image(path, colour=(200, 10, 10)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), colour).save(path)
    return path.name


def test_mcq_jsonl_with_letters_indexes_stem_images_and_image_options(tmp_path):
    image(tmp_path / "s.png")
    image(tmp_path / "o.png", (0, 0, 255))
    data = write_jsonl(
        tmp_path / "mcq.jsonl",
        [
            {"id": "a", "question": "Which?", "options": ["x", "y", "z"], "answer": "c"},
            {
                "id": "b",
                "question": "Shown?",
                "options": [{"image": "o.png", "text": "blue"}, "red", "green"],
                "answer": 1,
                "images": ["s.png"],
            },
        ],
    )
    assert (
        main(["build", "--source", "mcq", "--data", str(data), "--out", str(tmp_path / "b")]) == 0
    )
    bench = load_benchmark(tmp_path / "b")
    assert bench.task == "multiple_choice" and bench.manifest.format_version == 2
    first, second = bench.instances
    assert (first.texts, first.target, first.task) == (("x", "y", "z"), 2, "multiple_choice")
    assert second.target == 0 and second.images[0] == str(tmp_path / "o.png")
    assert second.images[1:] == (None, None) and second.stem_images == (str(tmp_path / "s.png"),)
    # the same build gives the same bytes
    again = tmp_path / "again"
    assert main(["build", "--source", "mcq", "--data", str(data), "--out", str(again)]) == 0
    assert (again / BENCHMARK_FILE).read_bytes() == (tmp_path / "b" / BENCHMARK_FILE).read_bytes()


def test_bad_mcq_lines_are_named_and_nothing_is_written(tmp_path, capsys):
    (tmp_path / "outside.png").write_bytes(b"")
    root = tmp_path / "data"
    root.mkdir()
    data = write_jsonl(
        root / "mcq.jsonl",
        [
            {"id": "a", "question": "q", "options": ["x", "y"], "answer": "C"},
            {"id": "b", "question": " ", "options": ["x", "y"], "answer": 1},
            {"id": "c", "question": "q", "options": ["x"], "answer": 1},
            {"id": "d", "question": "q", "options": ["x", "y"], "answer": 1,
             "images": ["../outside.png"]},
            {"id": "e", "question": "q", "options": ["x", "y"], "answer": 1, "colour": "red"},
        ],
    )  # fmt: skip
    out = tmp_path / "b"
    assert main(["build", "--source", "mcq", "--data", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    for expected in (
        "line 1: answer 'C' is out of range for 2 options",
        "line 2: 'question' must be a non-empty string",
        "line 3: 'options' must be a list of 2..26 options",
        "line 4: image '../outside.png' is outside the root",
        "line 5: unknown keys ['colour']",
    ):
        assert expected in err
    assert "Traceback" not in err and not out.exists()


def test_duplicate_options_and_ids_are_refused(tmp_path):
    data = write_jsonl(
        tmp_path / "m.jsonl",
        [
            {"id": "a", "question": "q", "options": ["x", "x"], "answer": 1},
        ],
    )
    with pytest.raises(BenchmarkError, match="line 1: two candidates are the same"):
        build_task_benchmark("multiple_choice", "mcq", data, tmp_path / "o")
    write_jsonl(data, [{"id": "a", "question": "q", "options": ["x", "y"], "answer": 1}] * 2)
    with pytest.raises(BenchmarkError, match=r"line 2: duplicate id 'a' \(first on line 1\)"):
        build_task_benchmark("multiple_choice", "mcq", data, tmp_path / "o")


def test_mmlu_csv_folder(tmp_path):
    folder = tmp_path / "mmlu"
    folder.mkdir()
    (folder / "anatomy_test.csv").write_text(
        'What is the largest organ?,Skin,Liver,"Heart, mostly",Lung,A\nSecond?,a,b,c,d,D\n'
    )
    (folder / "astronomy_test.csv").write_text("Star?,Sun,Moon,Mars,Venus,a\n")
    report = build_task_benchmark("multiple_choice", "mmlu", folder, tmp_path / "b")
    assert report.manifest.n == 4 and report.manifest.count == 3
    instances = load_benchmark(tmp_path / "b").instances
    assert [i.id for i in instances] == ["anatomy-00001", "anatomy-00002", "astronomy-00001"]
    assert instances[0].texts == ("Skin", "Liver", "Heart, mostly", "Lung")
    assert [i.target for i in instances] == [0, 3, 0]
    assert instances[0].metadata["meta"] == {"subject": "anatomy", "group": "anatomy"}
    (folder / "bad_test.csv").write_text("Q?,a,b,c,d,E\nonly,two\n")
    with pytest.raises(BenchmarkError) as caught:
        build_task_benchmark("multiple_choice", "mmlu", folder, tmp_path / "c")
    assert "bad_test.csv line 1: answer 'E' is out of range" in str(caught.value)
    assert "bad_test.csv line 2: expected question, options and the answer letter" in str(
        caught.value
    )


def test_muirbench_and_blink_layouts_with_images_next_to_the_data(tmp_path):
    for name in ("a.png", "b.png"):
        image(tmp_path / "images" / name)
    muir = write_jsonl(
        tmp_path / "muir.jsonl",
        [
            {
                "idx": "m1",
                "task": "Counting",
                "question": "How many?",
                "options": ["1", "2", "3", "4"],
                "answer": "B",
                "image_list": ["images/a.png", "images/b.png"],
            },
            {"idx": "m2", "question": "Few?", "options": ["1", "2"], "answer": "A",
             "image_list": ["images/a.png"]},
        ],
    )  # fmt: skip
    report = build_task_benchmark("multiple_choice", "muirbench", muir, tmp_path / "m", n=4)
    assert report.manifest.n == 4 and report.manifest.counts["skipped_other_n"] == 1
    (instance,) = load_benchmark(tmp_path / "m").instances
    assert instance.stem_images == tuple(str(tmp_path / "images" / n) for n in ("a.png", "b.png"))
    assert instance.target == 1 and instance.metadata["meta"]["task"] == "Counting"
    blink = write_jsonl(
        tmp_path / "blink.jsonl",
        [{"idx": "b1", "question": "Same?", "choices": ["yes", "no"], "answer": "(B)",
          "image_1": "images/a.png", "image_2": "images/b.png", "image_3": None}],
    )  # fmt: skip
    build_task_benchmark("multiple_choice", "blink", blink, tmp_path / "bl")
    (instance,) = load_benchmark(tmp_path / "bl").instances
    assert instance.target == 1 and len(instance.stem_images) == 2
    (tmp_path / "images" / "b.png").unlink()
    with pytest.raises(BenchmarkError, match="line 1: image 'images/b.png' not found"):
        build_task_benchmark("multiple_choice", "blink", blink, tmp_path / "bl2")


def test_pairwise_and_mtbench(tmp_path):
    data = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "p1", "question": "Why?", "answers": ["Because.", "No idea."], "preferred": 1},
            {"id": "p2", "question": "How?", "answers": ["Thus.", "So."], "preferred": "B"},
        ],
    )
    build_task_benchmark("pairwise_judge", "pairwise", data, tmp_path / "p")
    bench = load_benchmark(tmp_path / "p")
    assert [(i.task, i.target) for i in bench.instances] == [("pairwise_judge", 0)] * 1 + [
        ("pairwise_judge", 1)
    ]

    def turn(q, a):
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]

    rows = [
        {"question_id": 81, "model_a": "m1", "model_b": "m2", "winner": "model_b",
         "judge": "expert_0", "turn": 1, "conversation_a": turn("Write.", "A1"),
         "conversation_b": turn("Write.", "B1")},
        {"question_id": 81, "model_a": "m1", "model_b": "m3", "winner": "tie",
         "judge": "expert_0", "turn": 1, "conversation_a": turn("Write.", "A1"),
         "conversation_b": turn("Write.", "C1")},
    ]  # fmt: skip
    report = build_task_benchmark(
        "pairwise_judge", "mtbench", write_jsonl(tmp_path / "mt.jsonl", rows), tmp_path / "mt"
    )
    assert report.manifest.counts["tie_pairs"] == 1
    assert report.manifest.counts["votes"] == 2 and report.manifest.counts["pairs"] == 2
    (instance,) = load_benchmark(tmp_path / "mt").instances
    assert instance.texts == ("A1", "B1") and instance.target == 1
    assert instance.id == "81-m1-m2-t1"
    assert (instance.metadata["meta"]["votes_a"], instance.metadata["meta"]["votes_b"]) == (0, 1)


def mt_row(qid, model_a, model_b, winner, judge, turn, answers_a, answers_b):
    """One MT-Bench human-judgement row (the layout of mt_bench_human_judgments)."""
    questions = [f"Question {qid} first.", f"Question {qid} follow-up."]

    def conversation(answers):
        out = []
        for question, answer in zip(questions, answers, strict=True):
            out += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        return out

    return {
        "question_id": qid, "model_a": model_a, "model_b": model_b, "winner": winner,
        "judge": judge, "turn": turn, "conversation_a": conversation(answers_a),
        "conversation_b": conversation(answers_b), "tstamp": 1687221890.0,
    }  # fmt: skip


GPT = ["Paris is the capital.", "It lies on the Seine."]
LLAMA = ["I think Lyon.", "On a river."]
VICUNA = ["The capital is Paris.", "Beside the Seine river."]


def test_mtbench_turn_two_keeps_turn_one(tmp_path):
    rows = [mt_row(81, "gpt-4", "llama-13b", "model_a", "expert_1", 2, GPT, LLAMA)]
    build_task_benchmark(
        "pairwise_judge", "mtbench", write_jsonl(tmp_path / "mt.jsonl", rows), tmp_path / "mt"
    )
    (instance,) = load_benchmark(tmp_path / "mt").instances
    assert instance.stem == (
        "Question 81 first.\n\nFollow-up question (judge the answers to this one): "
        "Question 81 follow-up."
    )
    assert instance.texts == (
        "Answer to the first question: Paris is the capital.\n\n"
        "Answer to the follow-up question: It lies on the Seine.",
        "Answer to the first question: I think Lyon.\n\n"
        "Answer to the follow-up question: On a river.",
    )
    assert instance.target == 0 and instance.id == "81-gpt-4-llama-13b-t2"
    # the judge's prompt holds turn 1's question and both turn-1 answers
    from posdebias.core.labels import get_label_set
    from posdebias.core.tasks import task_template

    messages = task_template("pairwise_judge").messages(instance, get_label_set("upper"))
    prompt = "".join(item["text"] for item in messages[0]["content"])
    for text in ("Question 81 first.", "Question 81 follow-up.", "I think Lyon.", "Paris is"):
        assert text in prompt


def test_mtbench_votes_of_several_judges_become_one_instance(tmp_path):
    rows = [
        # three experts on (gpt-4, llama): two prefer gpt-4, one (asked in the other order) llama
        mt_row(81, "gpt-4", "llama-13b", "model_a", "expert_1", 1, GPT, LLAMA),
        mt_row(81, "llama-13b", "gpt-4", "model_b", "expert_2", 1, LLAMA, GPT),
        mt_row(81, "gpt-4", "llama-13b", "model_b", "expert_3", 1, GPT, LLAMA),
        # (gpt-4, vicuna): one vote each way and a tie: no majority, counted as a tie pair
        mt_row(81, "gpt-4", "vicuna-13b", "model_a", "expert_1", 1, GPT, VICUNA),
        mt_row(81, "vicuna-13b", "gpt-4", "model_a", "expert_2", 1, VICUNA, GPT),
        mt_row(81, "gpt-4", "vicuna-13b", "tie (bothbad)", "expert_3", 1, GPT, VICUNA),
        # (llama, vicuna) turn 2: a tie and two votes for vicuna: vicuna wins
        mt_row(81, "llama-13b", "vicuna-13b", "tie", "expert_1", 2, LLAMA, VICUNA),
        mt_row(81, "llama-13b", "vicuna-13b", "model_b", "expert_2", 2, LLAMA, VICUNA),
        mt_row(81, "vicuna-13b", "llama-13b", "model_a", "expert_3", 2, VICUNA, LLAMA),
    ]
    report = build_task_benchmark(
        "pairwise_judge", "mtbench", write_jsonl(tmp_path / "mt.jsonl", rows), tmp_path / "mt"
    )
    counts = report.manifest.counts
    assert (counts["votes"], counts["pairs"], counts["tie_pairs"]) == (9, 3, 1)
    first, second = load_benchmark(tmp_path / "mt").instances
    assert first.id == "81-gpt-4-llama-13b-t1" and first.target == 0
    assert first.texts == tuple(GPT[:1] + LLAMA[:1])
    meta = {k: first.metadata["meta"][k] for k in ("votes_a", "votes_b", "votes_tie", "judges")}
    assert meta == {"votes_a": 2, "votes_b": 1, "votes_tie": 0,
                    "judges": "expert_1,expert_2,expert_3"}  # fmt: skip
    # a tie vote stands against a winner's votes: two for vicuna outweigh one tie
    assert second.id == "81-llama-13b-vicuna-13b-t2" and second.target == 1
    assert (second.metadata["meta"]["votes_b"], second.metadata["meta"]["votes_tie"]) == (2, 1)


@pytest.mark.parametrize(
    ("votes", "expected"),
    [
        ([0], 0), ([1, 1, 0], 1), ([0, 1], None), ([None, None, 0], None),
        ([None, 0], None), ([None, 0, 0], 0), ([None, None, 1, 1, 1], 1),
    ],
)  # fmt: skip
def test_majority_rule(votes, expected):
    from posdebias.benchmarks.tasks import majority

    assert majority(votes) == expected


def test_mtbench_conflicting_conversations_are_refused(tmp_path):
    rows = [
        mt_row(81, "gpt-4", "llama-13b", "model_a", "expert_1", 1, GPT, LLAMA),
        mt_row(81, "gpt-4", "llama-13b", "model_a", "expert_2", 1, VICUNA, LLAMA),
    ]
    with pytest.raises(BenchmarkError, match="line 2: another conversation for the pair of line 1"):
        build_task_benchmark(
            "pairwise_judge", "mtbench", write_jsonl(tmp_path / "mt.jsonl", rows), tmp_path / "m"
        )
    assert not (tmp_path / "m").exists()


def test_bm25_matches_its_formula():
    docs = ["the cat sat", "the dog sat on the cat", "birds fly"]
    scores = BM25(docs).scores("cat sat")
    lengths = [3, 6, 2]
    mean = sum(lengths) / 3
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # cat and sat are in 2 of 3 documents
    expected = [
        sum(idf * 1 * 2.5 / (1 + 1.5 * (1 - 0.75 + 0.75 * length / mean)) for _ in range(2))
        for length in lengths[:2]
    ]
    np.testing.assert_allclose(scores, [*expected, 0.0])


def beir(tmp_path):
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    corpus = [{"_id": f"d{k}", "title": "", "text": f"passage {k} about topic {k % 3}"}
              for k in range(12)]  # fmt: skip
    corpus[5]["text"] = "apples and oranges grow on trees"
    corpus[6]["text"] = "oranges are citrus fruit"
    corpus[7]["text"] = "apples are red fruit"
    write_jsonl(folder / "corpus.jsonl", corpus)
    write_jsonl(folder / "queries.jsonl", [{"_id": "q1", "text": "apples oranges"},
                                           {"_id": "q2", "text": "topic 1"}])  # fmt: skip
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td5\t2\nq2\td1\t1\nq2\td4\t1\n"
    )
    return folder


def test_beir_rerank_random_and_bm25_hard_negatives(tmp_path):
    folder = beir(tmp_path)
    one = build_task_benchmark("rerank", "beir", folder, tmp_path / "r1", n=4, seed=3)
    two = build_task_benchmark("rerank", "beir", folder, tmp_path / "r2", n=4, seed=3)
    assert one.manifest.benchmark_sha256 == two.manifest.benchmark_sha256
    instances = load_benchmark(tmp_path / "r1").instances
    assert [i.id for i in instances] == ["q1", "q2"]
    first = instances[0]
    assert first.texts[first.target] == "apples and oranges grow on trees"
    second = instances[1]
    assert "passage 4" not in " ".join(t for t in second.texts if t)  # relevant: never negative
    hard = build_task_benchmark(
        "rerank", "beir", folder, tmp_path / "h", n=3, seed=0, setting="adversarial"
    )
    assert hard.manifest.setting == "adversarial"
    q1 = load_benchmark(tmp_path / "h").instances[0]
    negatives = {t for k, t in enumerate(q1.texts) if k != q1.target}
    assert negatives == {"oranges are citrus fruit", "apples are red fruit"}  # BM25's top two
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tnope\t1\n")
    with pytest.raises(BenchmarkError, match="line 2: query 'q1' or passage 'nope'"):
        build_task_benchmark("rerank", "beir", folder, tmp_path / "x")


def test_version_one_manifests_still_read_and_newer_ones_are_refused(tmp_path):
    data = write_jsonl(
        tmp_path / "m.jsonl", [{"id": "a", "question": "q", "options": ["x", "y"], "answer": 1}]
    )
    build_task_benchmark("multiple_choice", "mcq", data, tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / MANIFEST_FILE).read_text())
    manifest["format_version"] = 3
    (tmp_path / "b" / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BenchmarkError, match="format_version"):
        load_benchmark(tmp_path / "b")
    manifest["format_version"] = 1
    (tmp_path / "b" / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BenchmarkError, match="has format_version 2"):
        load_benchmark(tmp_path / "b")


def test_evaluate_checks_the_task_against_the_benchmark(tmp_path, capsys):
    data = write_jsonl(
        tmp_path / "m.jsonl",
        [{"id": f"q{k}", "question": f"q{k}?", "options": ["x", "y", "z"], "answer": 1 + k % 3}
         for k in range(8)],
    )  # fmt: skip
    build_task_benchmark("multiple_choice", "mcq", data, tmp_path / "b")
    base = ["evaluate", "--adapter", "synthetic", "--benchmark", str(tmp_path / "b")]
    assert main([*base, "--task", "rerank"]) == 2
    assert "--task rerank, but the benchmark" in capsys.readouterr().err
    small = ["--count", "3", "--calibration-count", "2", "--orders", "2"]
    assert main([*base, "--task", "multiple_choice", *small]) == 0


def test_a_sweep_runs_on_a_candidate_task_benchmark(tmp_path):
    data = write_jsonl(
        tmp_path / "m.jsonl",
        [{"id": f"q{k}", "question": f"q{k}?", "options": ["x", "y", "z"], "answer": 1 + k % 3}
         for k in range(6)],
    )  # fmt: skip
    build_task_benchmark("multiple_choice", "mcq", data, tmp_path / "b")
    out = tmp_path / "sweep"
    args = ["sweep", "tau", "--adapter", "synthetic", "--benchmark", str(tmp_path / "b"),
            "--values", "5", "--count", "3", "--calibration-count", "2", "--orders", "2",
            "--out", str(out), "--calibrators", "vanilla,attention_guided"]  # fmt: skip
    assert main(args) == 0
    assert len((out / "results.csv").read_text().splitlines()) == 3  # header + 2 rows
