"""Pairwise judge runs end to end: an MT-Bench-format file, a tiny real model, both orders by
default, the judge measures in results.json, report.md and the terminal."""

from __future__ import annotations

import json

import numpy as np
import pytest

from posdebias.benchmarks.files import load_benchmark
from posdebias.cli import main
from posdebias.core.instance import Instance
from posdebias.core.tasks import default_orders
from posdebias.evaluation.judging import judge_metrics
from posdebias.evaluation.runner import InstanceRecord

#: pairs the text organism answers alike in both orders (of 35; seeded run)
PINNED_CONSISTENT = 27


def mt_rows():
    """MT-Bench human judgements: 6 question ids x turns 1 and 2, two or three votes each."""
    rows = []
    for qid in range(81, 87):
        questions = [f"Question {qid}: name a colour.", f"Question {qid}: and a fruit?"]
        answers = {
            "gpt-4": [f"Red, for {qid}.", f"An apple, {qid}."],
            "llama-13b": [f"I do not know {qid}.", f"No fruit {qid}."],
        }

        def conversation(model, questions=questions, answers=answers):
            out = []
            for question, answer in zip(questions, answers[model], strict=True):
                out += [{"role": "user", "content": question},
                        {"role": "assistant", "content": answer}]  # fmt: skip
            return out

        for turn in (1, 2):
            first = ("gpt-4", "llama-13b") if qid % 2 else ("llama-13b", "gpt-4")
            for judge, winner, models in (
                ("expert_0", "gpt-4", first),
                ("expert_1", "gpt-4", first[::-1]),
                ("author_2", "llama-13b" if turn == 2 else "tie", first),
            ):
                rows.append({
                    "question_id": qid, "model_a": models[0], "model_b": models[1],
                    "winner": "model_a" if winner == models[0] else
                              "model_b" if winner == models[1] else "tie",
                    "judge": judge, "turn": turn,
                    "conversation_a": conversation(models[0]),
                    "conversation_b": conversation(models[1]),
                })  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def judge_run(tmp_path_factory):
    from posdebias.testing import save_tiny_model

    root = tmp_path_factory.mktemp("judge")
    data = root / "mt.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in mt_rows()))
    bench = root / "bench"
    assert main(["build", "--task", "pairwise_judge", "--source", "mtbench", "--data", str(data),
                 "--out", str(bench)]) == 0  # fmt: skip
    model = save_tiny_model("qwen3", root / "model")
    out = root / "run"
    args = ["evaluate", "--model", str(model), "--benchmark", str(bench), "--calibration-count",
            "2", "--calibrators", "vanilla,permutation_average", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    return bench, out, model


def test_a_pairwise_run_shows_both_orders_by_default(judge_run):
    _, out, _ = judge_run
    results = json.loads((out / "results.json").read_text())
    assert results["orders"] == 2 and results["settings"]["orders"] == 2
    assert results["n"] == 2 and results["num_instances"] == 10  # 12 pairs, 2 for calibration
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 10
    assert all(sorted(r["orders"]) == [[0, 1], [1, 0]] for r in records)
    # labels are the task's letters, whatever the door
    assert results["adapter"]["labels"] == ["A", "B"]


def test_judge_measures_are_in_results_and_report(judge_run):
    bench, out, _ = judge_run
    results = json.loads((out / "results.json").read_text())
    records = {r["instance_id"]: r for r in map(json.loads, (out / "records.jsonl").open())}
    instances = {i.id: i for i in load_benchmark(bench).instances}
    assert set(results["judge"]) == {"vanilla", "permutation_average"}
    for label, judge in results["judge"].items():
        # recompute from the records by hand: same answer in both orders, else a tie
        same = first = second = agreed = agreed_all = counted = 0
        for record in records.values():
            t_file = record["orders"].index([0, 1])
            t_swap = record["orders"].index([1, 0])
            chosen = record["chosen"][label]
            positions = (record["choices"][label][t_file], record["choices"][label][t_swap])
            meta = instances[record["instance_id"]].metadata["meta"]
            votes = (meta["votes_a"], meta["votes_b"], meta["votes_tie"])
            if chosen[t_file] == chosen[t_swap]:
                same += 1
                agreed += votes[chosen[t_file]]
                agreed_all += votes[chosen[t_file]]
                counted += votes[0] + votes[1]
            else:
                first += positions == (0, 0)
                second += positions == (1, 1)
                agreed_all += votes[2]
        assert judge["pairs"] == 10 and judge["human_votes"] == 30
        assert judge["consistency"] == pytest.approx(10.0 * same)
        assert judge["first_position"] == pytest.approx(10.0 * first)
        assert judge["second_position"] == pytest.approx(10.0 * second)
        assert judge["consistency"] + judge["first_position"] + judge["second_position"] == (
            pytest.approx(100.0)
        )
        assert judge["agreement_with_ties"] == pytest.approx(100.0 * agreed_all / 30)
        if counted:
            assert judge["agreement"] == pytest.approx(100.0 * agreed / counted)
        # the classic consistency over both orders is the same quantity
        assert judge["consistency"] == pytest.approx(
            results["calibrators"][label]["metrics"]["consistency"]
        )
    # averaging the label scores over both orders gives one answer per pair
    assert results["judge"]["permutation_average"]["consistency"] == 100.0
    report = (out / "report.md").read_text()
    assert "## Pairwise judge" in report
    line = next(row for row in report.splitlines() if row.startswith("| permutation_average | 100"))
    assert line.count("|") == 8


def test_explicit_orders_still_win_and_too_many_are_refused(judge_run, tmp_path, capsys):
    bench, _, model = judge_run
    args = ["evaluate", "--model", str(model), "--benchmark", str(bench), "--calibration-count",
            "2", "--calibrators", "vanilla", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main([*args, "--orders", "5"]) == 2
    assert "5 distinct candidate orders requested, but 2 candidates" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("n", "requested", "cyclic", "expected"),
    [(2, None, False, 2), (3, None, False, 5), (4, None, False, 5), (12, None, False, 5),
     (3, None, True, 3), (4, None, True, 4), (8, None, True, 5), (2, 1, False, 1),
     (4, 7, False, 7)],
)  # fmt: skip
def test_default_orders(n, requested, cyclic, expected):
    assert default_orders(n, requested, cyclic=cyclic) == expected


def test_judge_metrics_by_hand():
    """Four pairs, one row: consistent right, consistent wrong, biased first, biased second."""
    pairs = [Instance(stem=f"q{k}", texts=(f"a{k}", f"b{k}"), target=0, id=f"p{k}",
                      task="pairwise_judge") for k in range(4)]  # fmt: skip
    orders = [[0, 1], [1, 0]]
    positions = [(0, 1), (1, 0), (0, 0), (1, 1)]  # chosen position in the file / swapped order
    records = [
        InstanceRecord(
            instance_id=f"p{k}",
            orders=orders,
            targets=[0, 1],
            choices={"judge": list(chosen)},
            chosen={"judge": [orders[t][c] for t, c in enumerate(chosen)]},
        )
        for k, chosen in enumerate(positions)
    ]
    (row,) = judge_metrics(records, pairs, ["judge"]).values()
    assert (row.consistency, row.first_position, row.second_position) == (50.0, 25.0, 25.0)
    assert row.first_preference == 50.0 and row.ties == 50.0
    # one vote per pair for answer 1: agreed on p0 only; the two ties never agree
    assert (row.agreement, row.agreement_with_ties, row.human_votes) == (50.0, 25.0, 4)
    # a results file edited past 100% (or below 0) is refused, not drawn
    for field, value in (("consistency", 150.0), ("agreement", -1.0), ("ties", 1e300)):
        with pytest.raises(ValueError, match="than or equal to"):
            type(row).model_validate({**row.model_dump(), field: value})
    # a run of one order per pair has no judge measures
    single = [InstanceRecord("p0", [[0, 1]], [0], {"judge": [0]}, {"judge": [0]})]
    assert judge_metrics(single, pairs[:1], ["judge"]) is None
    assert np.isclose(row.no_verdict, 0.0)


def test_exact_ties_go_to_the_same_candidate_in_every_order_not_to_position_1():
    from posdebias.core.observation import Observation, Prediction, tie_broken
    from posdebias.registry import get_registry

    vanilla = get_registry().create_calibrator("vanilla")
    state = vanilla.fit([], n=3, adapter="synthetic")
    half = np.log([0.4, 0.4, 0.2])  # positions 1 and 2 tie exactly
    winners = set()
    for ids in (("x", "y", "z"), ("y", "x", "z")):  # the two tied candidates swapped
        prediction = vanilla.predict(Observation(label_logprobs=half), state)
        assert prediction.tied and prediction.choice == 0  # argmax alone: position 1
        broken = tie_broken(prediction, ids)
        assert not broken.tied and broken.choice in (0, 1)
        np.testing.assert_array_equal(broken.scores, prediction.scores)
        winners.add(ids[broken.choice])
    assert len(winners) == 1  # the same candidate wins in both orders
    # over many pairs of candidates, position 1 wins about half of the ties, not all
    first = sum(
        tie_broken(Prediction(np.log([0.5, 0.5])), (f"a{k}", f"b{k}")).choice == 0
        for k in range(400)
    )
    assert first == 206  # of 400 (sha256 of the ids: fixed, near half)
    # untied scores, and a choice a calibrator made itself, are kept
    assert tie_broken(Prediction(np.log([0.3, 0.7])), ("a", "b")).choice == 1
    assert tie_broken(Prediction(np.log([0.5, 0.5]), choice=0), ("b0", "a0")).choice == 0


def test_the_bundled_text_organism_judges_with_a_first_position_bias(tmp_path, monkeypatch):
    """A real trained model (the text organism, whose bias toward the first letter was trained
    in) as a pairwise judge: default both orders and letters; every inconsistent pair goes to
    answer A, and averaging over both orders removes it. Numbers pinned (seeded run)."""
    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fruits = ["apple", "banana", "cherry", "grape", "lemon", "mango", "pear", "plum"]
    others = ["stone", "car", "cloud", "chair", "river", "shoe", "hammer", "brick"]
    rows = []
    for k in range(40):
        pair = [fruits[k % 8], others[(3 * k) % 8]]
        rows.append({"id": f"p{k}", "question": "Which of these is a fruit?",
                     "answers": pair if k % 2 == 0 else pair[::-1],
                     "preferred": 1 if k % 2 == 0 else 2})  # fmt: skip
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    bench, out = tmp_path / "bench", tmp_path / "run"
    assert main(["build", "--task", "pairwise_judge", "--source", "pairwise", "--data",
                 str(data), "--out", str(bench)]) == 0  # fmt: skip
    args = ["evaluate", "--model", "posdebias/text-organism", "--benchmark", str(bench),
            "--calibration-count", "5", "--calibrators", "vanilla,permutation_average",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert (results["orders"], results["num_instances"]) == (2, 35)
    assert results["adapter"]["labels"] == ["A", "B"]
    vanilla, averaged = results["judge"]["vanilla"], results["judge"]["permutation_average"]
    assert vanilla["first_position"] > 0 and vanilla["second_position"] == 0.0
    assert vanilla["first_preference"] == 100.0
    assert vanilla["consistency"] == pytest.approx(100.0 * PINNED_CONSISTENT / 35)
    assert vanilla["agreement_with_ties"] == pytest.approx(vanilla["consistency"])
    assert averaged["consistency"] == 100.0 and averaged["first_preference"] is None


def test_a_sweep_over_pairs_shows_both_orders_by_default(judge_run, tmp_path):
    import csv

    bench, _, model = judge_run
    out = tmp_path / "sweep"
    args = ["sweep", "calibration_size", "--values", "1,2", "--model", str(model),
            "--benchmark", str(bench), "--calibrators", "vanilla", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert rows and {row["orders"] for row in rows} == {"2"}
