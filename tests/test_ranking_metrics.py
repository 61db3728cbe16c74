"""Ranking measures (nDCG@k, MRR, Recall@k) of every row that ranks, the central (Kemeny)
ranking of permutation self-consistency, and a BEIR-format rerank run end to end."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from posdebias.calibrators.permutation_self_consistency import PermutationSelfConsistency
from posdebias.cli import main
from posdebias.core.instance import Instance
from posdebias.core.observation import Observation, log_softmax
from posdebias.core.ranking import EXACT_KEMENY_MAX_N, borda, kemeny, precedence
from posdebias.errors import InputError, ResumeError
from posdebias.evaluation.logcheck import check_record_row
from posdebias.evaluation.ranking_metrics import (
    randomisation_p,
    ranking_values,
    relevance_grades,
)
from posdebias.testing import save_tiny_model


def test_ndcg_mrr_and_recall_by_hand():
    grades = np.array([[3.0, 0.0, 1.0, 0.0]])
    rankings = np.array([[[2, 0, 1, 3], [0, 2, 1, 3]]])  # two orders of one instance
    values = ranking_values(rankings, grades)
    log3 = math.log2(3)
    first = (1 + 3 / log3) / (3 + 1 / log3)  # DCG@3 / IDCG@3 of [1, 3, 0]
    assert values["nDCG@3"][0].tolist() == pytest.approx([100 * first, 100.0])
    assert values["nDCG@1"][0].tolist() == pytest.approx([100 / 3, 100.0])
    assert values["MRR"][0].tolist() == [100.0, 100.0]  # rank 1 is relevant in both
    assert values["Recall@1"][0].tolist() == [50.0, 50.0]  # one of the two relevant
    assert values["Recall@3"][0].tolist() == [100.0, 100.0]
    assert "Recall@5" not in values and "nDCG@10" in values  # k >= N: nDCG only (BEIR's @10)
    binary = ranking_values(np.array([[[1, 2, 0, 3]]]), np.array([[1.0, 0, 0, 0]]))
    assert binary["MRR"][0, 0] == pytest.approx(100 / 3)
    assert binary["nDCG@10"][0, 0] == pytest.approx(100 / math.log2(4))


def _instance(relevance: str | None, target: int = 0) -> Instance:
    meta = {} if relevance is None else {"meta": {"relevance": relevance}}
    return Instance(
        stem="q", texts=("a", "b", "c"), target=target, id="i", metadata=meta, task="rerank"
    )


def test_relevance_grades_read_checked_and_defaulted():
    assert relevance_grades(_instance(None, target=2)).tolist() == [0, 0, 1]
    assert relevance_grades(_instance("2,-1,1")).tolist() == [2, 0, 1]  # judged bad: no gain
    for bad, message in [
        ("2,x,1", "comma-separated numbers"),
        ("2,1", "3 finite grades"),
        ("2,nan,1", "comma-separated numbers .*'nan' is not a finite number"),
        ("2,inf,1", "'inf' is not a finite number"),
        ("1e999,0,0", "'1e999' is not a finite number"),
        ("1e308,1e308,0", "'1e308' is out of range"),  # finite, but its sum is not
        ("2,-1e308,1", "'-1e308' is out of range"),
        ("2,1_0,1", "'1_0' is not a finite number"),
        ("1,2,0", "highest grade"),
        ("0,0,0", "no candidate has a positive grade"),
    ]:
        with pytest.raises(InputError, match=message):
            relevance_grades(_instance(bad))


def test_randomisation_test_is_exact_where_it_must_be():
    assert randomisation_p(np.zeros(10), 500, 0) == 1.0
    strong = randomisation_p(np.full(30, 5.0), 999, 0)  # every sign flip is smaller
    assert strong == pytest.approx(1 / 1000, rel=0.05)
    noise = randomisation_p(np.random.default_rng(1).normal(size=40), 999, 0)
    assert 0.05 < noise <= 1.0


def kendall_distance(ranking: np.ndarray, rankings: np.ndarray) -> int:
    """Total Kendall tau distance (discordant pairs) of ``ranking`` to every ranking."""
    p = precedence(np.asarray(rankings))
    order = np.asarray(ranking)
    first, second = np.triu_indices(order.size, k=1)
    return int(p[order[second], order[first]].sum())  # pairs the others put the other way


@pytest.mark.parametrize("n", range(2, 7))
def test_kemeny_is_the_exact_central_ranking(n):
    rng = np.random.default_rng(n)
    for _ in range(40):
        rankings = np.array([rng.permutation(n) for _ in range(int(rng.integers(1, 6)))])
        found = kemeny(rankings)
        best = min(
            kendall_distance(np.array(p), rankings) for p in itertools.permutations(range(n))
        )
        assert sorted(found.tolist()) == list(range(n))
        assert kendall_distance(found, rankings) == best


def test_beyond_the_exact_limit_kemeny_improves_on_borda():
    rng = np.random.default_rng(0)
    n = EXACT_KEMENY_MAX_N + 4
    for _ in range(20):
        rankings = np.array([rng.permutation(n) for _ in range(5)])
        assert kendall_distance(kemeny(rankings), rankings) <= kendall_distance(
            borda(rankings), rankings
        )
    same = np.array([list(range(n))] * 3)
    assert kemeny(same).tolist() == list(range(n))  # unanimity is kept


def test_self_consistency_returns_the_central_ranking_of_its_orders():
    calibrator = PermutationSelfConsistency()
    n = 4
    rng = np.random.default_rng(3)
    view = Instance(stem="q", texts=tuple("abcd"), target=1, id="v", task="rerank")
    orders = calibrator.permutations_for(view)
    observed = [Observation(label_logprobs=log_softmax(rng.normal(size=n))) for _ in orders]
    prediction = calibrator.predict(
        observed[0], calibrator.fit([], n=n), rotations=observed, orders=orders
    )
    by_candidate = np.stack(
        [o.label_logprobs[np.argsort(order)] for order, o in zip(orders, observed, strict=True)]
    )
    rankings = np.argsort(-by_candidate, axis=1, kind="stable")
    assert prediction.ranking == kemeny(rankings).tolist()
    assert prediction.choice == prediction.ranking[0]
    borda_one = PermutationSelfConsistency(aggregation="borda").predict(
        observed[0], calibrator.fit([], n=n), rotations=observed, orders=orders
    )
    assert borda_one.ranking == borda(rankings).tolist()
    assert calibrator.forward_passes(n) == n  # one pass per cyclic order, as permutation_average


def _record(rankings):
    return {
        "instance_id": "i",
        "orders": [[0, 1, 2]],
        "targets": [0],
        "choices": {"v": [1]},
        "chosen": {"v": [1]},
        "rankings": rankings,
    }


def test_a_logged_ranking_must_be_a_ranking_of_its_choice():
    check_record_row(_record({"v": [[1, 0, 2]]}))
    for bad in ({"v": [[0, 1, 2]]}, {"v": [[1, 1, 2]]}, {"v": [[1, 0]]}, {"v": []}, {"w": [[1]]},
                ["x"]):  # fmt: skip
        with pytest.raises(ResumeError, match="corrupt"):
            check_record_row(_record(bad))


def _beir(folder):
    (folder / "qrels").mkdir(parents=True)
    corpus = [{"_id": f"d{k}", "text": f"passage {k} on subject {k % 5}"} for k in range(30)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in corpus))
    queries = [{"_id": f"q{k}", "text": f"subject {k % 5} question {k}"} for k in range(9)]
    (folder / "queries.jsonl").write_text("".join(json.dumps(row) + "\n" for row in queries))
    qrels = ["query-id\tcorpus-id\tscore"]
    qrels += [f"q{k}\td{k}\t2\nq{k}\td{k + 10}\t1" for k in range(9)]
    (folder / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    return folder


def test_a_beir_rerank_run_reports_ndcg_mrr_recall_with_intervals(tmp_path, capsys):
    bench = tmp_path / "bench"
    data = _beir(tmp_path / "scifact")
    assert main(["build", "--task", "rerank", "--source", "beir", "--data", str(data),
                 "-N", "4", "--out", str(bench)]) == 0  # fmt: skip
    line = json.loads((bench / "benchmark.jsonl").read_text().splitlines()[0])
    assert line["meta"]["group"] == "scifact"
    grades = [float(g) for g in line["meta"]["relevance"].split(",")]
    assert grades[line["target"]] == 2.0 and sorted(grades) == [0, 0, 0, 2]
    model = save_tiny_model("qwen3", tmp_path / "model")
    out = tmp_path / "run"
    assert main(["evaluate", "--task", "rerank", "--benchmark", str(bench), "--model", str(model),
                 "--calibrators", "vanilla, permutation_average, permutation_self_consistency",
                 "--count", "6", "--calibration-count", "2", "--orders", "3",
                 "--out", str(out)]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    ranking = results["ranking"]
    assert ranking["graded"] is True
    assert set(ranking["rows"]) == {
        "vanilla",
        "permutation_average",
        "permutation_self_consistency",
    }
    for row, measures in ranking["rows"].items():
        assert {"nDCG@10", "MRR", "Recall@1", "Recall@3"} <= set(measures)
        for ci in measures.values():
            assert 0 <= ci["low"] <= ci["value"] <= ci["high"] <= 100
        # Recall@1 with one relevant candidate is the accuracy
        accuracy = results["calibrators"][row]["metrics"]["accuracy_mean"]
        assert measures["Recall@1"]["value"] == pytest.approx(accuracy)
    compared = {(c["row"], c["measure"]) for c in ranking["comparisons"]}
    assert ("permutation_self_consistency", "nDCG@10") in compared
    assert all(0 < c["p_value"] <= 1 for c in ranking["comparisons"])
    assert results["groups"]["instances"] == {"scifact": 6}
    report = (out / "report.md").read_text()
    assert "## Ranking" in report and "| nDCG@1 |" in report and "randomisation" in report
    capsys.readouterr()
    assert main(["report", str(out), "--format", "latex"]) == 0
    latex = capsys.readouterr().out
    assert r"\begin{tabular}" in latex and "nDCG@10" in latex
    assert r"permutation\_self\_consistency" in latex


@pytest.mark.parametrize("grade", ["nan", "inf", "-1e308", "1e308", "1e999"])
def test_a_benchmark_line_whose_grades_are_not_finite_or_absurd_stops_the_run(
    tmp_path, capsys, grade
):
    """meta.relevance of a benchmark line goes through the one reader of decimals in files:
    nan, inf and 1e999 are no finite number, and 1e308 (finite) would make nDCG's sums
    infinite. Exit 2 naming the instance and the grade, before the run directory is made."""
    import hashlib

    bench = tmp_path / "bench"
    data = _beir(tmp_path / "scifact")
    assert main(["build", "--task", "rerank", "--source", "beir", "--data", str(data),
                 "-N", "4", "--out", str(bench)]) == 0  # fmt: skip
    lines = (bench / "benchmark.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    grades = first["meta"]["relevance"].split(",")
    grades[(first["target"] + 1) % 4] = grade
    first["meta"]["relevance"] = ",".join(grades)
    (bench / "benchmark.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    manifest = json.loads((bench / "manifest.json").read_text())
    manifest["benchmark_sha256"] = hashlib.sha256(
        (bench / "benchmark.jsonl").read_bytes()
    ).hexdigest()
    (bench / "manifest.json").write_text(json.dumps(manifest))
    model = save_tiny_model("qwen3", tmp_path / "model")
    capsys.readouterr()
    out = tmp_path / "run"
    code = main(["evaluate", "--task", "rerank", "--benchmark", str(bench), "--model", str(model),
                 "--calibrators", "vanilla", "--count", "4", "--calibration-count", "5",
                 "--orders", "2", "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert "internal error" not in err and "Traceback" not in err
    assert f"'{grade}' is " in err and "meta.relevance" in err
    assert not out.exists()
