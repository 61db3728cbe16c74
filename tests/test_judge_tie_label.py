"""A pairwise judge's optional tie label (``task_prompt.tie_label``, MT-Bench's ``[[C]]``): the
prompt offers it, the adapter scores it beside the answers' labels, the stated tie rule turns
it into tie verdicts, the judge measures count them; off by default, and bad labels refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

import posdebias
from posdebias.cli import main
from posdebias.core.answers import AnswerParser
from posdebias.core.instance import Instance
from posdebias.core.labels import get_label_set
from posdebias.core.observation import Observation, Prediction, softmax, tie_label_wins
from posdebias.core.tasks import DEFAULT_TEMPLATES, task_template, task_variant
from posdebias.errors import ConfigError, PosdebiasError
from posdebias.evaluation.judging import judge_metrics
from posdebias.evaluation.runner import InstanceRecord, tie_verdict
from posdebias.testing import tiny_model_and_processor

TIE = {"task_prompt": {"tie_label": "C"}}
PAIR = Instance(
    stem="Which colour is warmer?", texts=("red", "blue"), target=0, id="x", task="pairwise_judge"
)


def _text(messages: list[dict]) -> str:
    return "".join(item["text"] for m in messages for item in m["content"] if "text" in item)


def test_the_prompt_offers_the_tie_only_with_the_option():
    upper = get_label_set("upper")
    plain = _text(task_template("pairwise_judge").messages(PAIR, upper))
    tied = _text(task_template("pairwise_judge", {"tie_label": "C"}).messages(PAIR, upper))
    assert "tie" not in plain.lower() and "Respond with A or B only" in plain
    assert "Respond with A or B, or C for a tie, only and nothing else." in tied
    # an instruction of one's own gets the offer appended, or places {tie} itself
    own = task_template("pairwise_judge", {"tie_label": "T", "instruction": "Judge them."})
    assert _text(own.messages(PAIR, upper)).startswith("Judge them. Respond with T for a tie.")
    placed = task_template("pairwise_judge", {"tie_label": "T", "query": "{first}/{last}/{tie}:"})
    assert _text(placed.messages(PAIR, upper)).endswith("A/B/T:")
    # the prompt variants keep the tie request where they keep the answer-only one
    varied = task_variant("pairwise_judge", tied_template := task_template(
        "pairwise_judge", {"tie_label": "C"}), "instruction")  # fmt: skip
    assert varied.instruction.endswith("or {tie} for a tie, only and nothing else.")
    assert tied_template.tie_label == "C"
    for variant in ("cot", "self_consistency", "posdebias_cot", "posdebias_instruction"):
        shown = _text(task_variant("pairwise_judge", tied_template, variant).messages(PAIR, upper))
        assert "C for a tie" in shown, variant
    # other tasks have no tie answer; an unset tie label leaves every prompt hash as it was
    assert task_template("multiple_choice", {"tie_label": "C"}) == DEFAULT_TEMPLATES[
        "multiple_choice"]  # fmt: skip
    for template in DEFAULT_TEMPLATES.values():
        fields = template.model_dump(mode="json")
        del fields["tie_label"]
        import hashlib

        canonical = json.dumps(fields, sort_keys=True).encode()
        assert template.digest() == hashlib.sha256(canonical).hexdigest()


def test_the_tie_rule():
    """p_tie > (1 - p_tie) max_j q_j: the tie's share of the three-way distribution that keeps
    the model's tie mass and splits the rest as the calibrated answer probabilities."""
    assert tie_label_wins(0.5, np.array([0.6, 0.4]))  # 0.5 > 0.30
    assert not tie_label_wins(0.3, np.array([0.5, 0.5]))  # 0.3 < 0.35
    assert tie_label_wins(0.36, np.array([0.5, 0.5]))  # a calibrator evening the answers
    assert not tie_label_wins(0.36, np.array([0.9, 0.1]))  # ... or not
    # uncalibrated, the rule is the model's own argmax over the three labels
    rng = np.random.default_rng(0)
    for _ in range(500):
        three = softmax(rng.normal(size=3) * 3)
        answers = three[:2] / three[:2].sum()
        assert tie_label_wins(three[2], answers) == (np.argmax(three) == 2)
    # the runner's verdict: mean tie probability over the observations used
    tie_obs = Observation(np.log([0.5, 0.5]), tie_logprob=float(np.log(0.6)))
    assert tie_verdict([tie_obs], Prediction(np.log([0.7, 0.3])))
    low = Observation(np.log([0.5, 0.5]), tie_logprob=float(np.log(0.1)))
    assert not tie_verdict([tie_obs, low], Prediction(np.log([0.7, 0.3])))  # 0.35 < 0.65 * 0.7
    assert tie_verdict([Observation(np.log([0.5, 0.5]))], Prediction(np.log([0.5, 0.5]))) is None
    # an observation's tie label survives its record
    assert Observation.from_dict(tie_obs.to_dict()).tie_logprob == pytest.approx(np.log(0.6))
    assert "tie_logprob" not in low.__class__(np.log([0.5, 0.5])).to_dict()


@pytest.fixture(scope="module")
def qwen3():
    return tiny_model_and_processor("qwen3")


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_three_label_scores_are_read_and_the_tie_label_can_win(qwen3, family):
    import torch

    model, processor = qwen3 if family == "qwen3" else tiny_model_and_processor(family)
    tokenizer = processor
    winners = []
    for tie in ("C", "D", "E", "G", "T", "X", "Z", "3"):
        adapter = posdebias.get_adapter(model, processor, task_prompt={"tie_label": tie})
        (observation,) = adapter.observe_many([PAIR])
        # by hand: the last prompt position's logits of A, B and the tie label, softmaxed
        ids = tokenizer(adapter.render(PAIR), add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            logits = model(**ids).logits[0, -1].double()
        tokens = [tokenizer(label, add_special_tokens=False)["input_ids"][0] for label in "AB"]
        tokens.append(tokenizer(tie, add_special_tokens=False)["input_ids"][0])
        three = torch.log_softmax(logits[tokens], dim=0).numpy()
        assert observation.tie_logprob == pytest.approx(three[2], abs=1e-4)
        answers = three[:2] - np.logaddexp(three[0], three[1])
        np.testing.assert_allclose(observation.label_logprobs, answers, atol=1e-4)
        vanilla = Prediction(observation.label_logprobs)
        won = tie_verdict([observation], vanilla)
        assert won == (np.argmax(three) == 2)
        if won:
            winners.append(tie)
    assert winners, "no tie label wins for the tiny model: choose other candidates"
    assert posdebias.get_adapter(model, processor).observe_many([PAIR])[0].tie_logprob is None


def test_posdebias_check_verifies_the_three_label_scores(qwen3):
    """``check_adapter`` on a judge with a tie label: the three scores against the model's own
    forward, batched and, where the adapter refuses padded batches (Llama 4 with floor_scale
    within the prompt), one at a time."""
    from posdebias.testing.check import check_adapter

    report = check_adapter(posdebias.get_adapter(*qwen3, **TIE), n=2, task="pairwise_judge")
    assert report.passed, report.summary()
    assert "N=2: 3 distinct" in report["label tokens"].figure
    model, processor = tiny_model_and_processor("llama4")  # its own copy: the config changes
    model.config.text_config.attn_temperature_tuning = True
    model.config.text_config.floor_scale = 16
    report = check_adapter(
        posdebias.get_adapter(model, processor, **TIE), n=2, task="pairwise_judge"
    )
    assert report.passed, report.summary()
    assert "batching unsafe here" in report["batch 1 vs 2"].figure
    # the split observation gives the scores back
    three = np.log([0.2, 0.3, 0.5])
    split = Observation(three[:2] - np.logaddexp(*three[:2]), tie_logprob=float(three[2]))
    np.testing.assert_allclose(split.scored_logprobs, three)


@pytest.mark.parametrize(
    ("tie", "message"),
    [
        ("A", "task_prompt.tie_label 'A' is also an answer's label (A, B)"),
        ("", "tie_label '' must be a non-empty label"),
        ("tie", "task_prompt.tie_label 'tie' is 2 tokens"),
        ("C C", "must be one word"),
    ],
)
def test_bad_tie_labels_are_refused(qwen3, tie, message):
    with pytest.raises(ConfigError, match="tie_label") as caught:
        posdebias.get_adapter(*qwen3, task_prompt={"tie_label": tie})
    assert message in str(caught.value) and caught.value.exit_code == 2


@pytest.mark.parametrize(("tie", "labels"), [("A", "upper"), ("2", "digits")])
def test_the_openai_adapter_refuses_a_tie_label_an_answer_uses(tmp_path, capsys, tie, labels):
    from posdebias.adapters.server import ServerAdapter

    options = {"task_prompt": {"tie_label": tie}, "label_set": labels}
    with pytest.raises(ConfigError, match="is also an answer's label") as caught:
        ServerAdapter(base_url="http://127.0.0.1:9/v1", model="m", **options)
    assert caught.value.exit_code == 2
    ServerAdapter(base_url="http://127.0.0.1:9/v1", model="m", **TIE)  # a free label: taken
    # from the command line: exit 2 before any request or run directory
    config = tmp_path / "tie.json"
    config.write_text(json.dumps({"adapter": {"options": options}}))
    bench = _pairs(tmp_path)
    out = tmp_path / "run"
    args = ["evaluate", "--adapter", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model",
            "m", "--benchmark", str(bench), "--config", str(config), "--out", str(out)]  # fmt: skip
    assert main(args) == 2
    assert "is also an answer's label" in capsys.readouterr().err and not out.exists()


def test_generated_answers_parse_the_tie_label():
    parser = AnswerParser("upper", 2, "last", tie_label="C")
    assert parser.parse("[[C]]") == 2 and parser.parse("[[B]]") == 1
    assert parser.parse("B, no: C") == 2 and parser.parse("C, no: A") == 0
    assert AnswerParser("upper", 2, "first", tie_label="C").parse("C, no: A") == 2
    assert AnswerParser("upper", 2, "answer_is", tie_label="tie").parse("The answer is tie") == 2
    assert AnswerParser("upper", 2, "last").parse("[[C]]") is None  # without the option


def test_judge_metrics_count_tie_verdicts_by_hand():
    """Five pairs: the tie label in both orders, in one order, consistent, biased, and the
    tie label against no answer."""
    pairs = [
        Instance(stem=f"q{k}", texts=(f"a{k}", f"b{k}"), target=0, id=f"p{k}",
                 task="pairwise_judge", metadata={"meta": {"votes_a": 1, "votes_b": 0,
                                                           "votes_tie": 1}})
        for k in range(5)
    ]  # fmt: skip
    orders = [[0, 1], [1, 0]]
    rows = [((0, 0), (True, True)), ((0, 1), (True, False)), ((0, 1), (False, False)),
            ((0, 0), (False, False)), ((-1, -1), (True, False))]  # fmt: skip
    records = [
        InstanceRecord(
            instance_id=f"p{k}",
            orders=orders,
            targets=[0, 1],
            choices={"judge": list(chosen)},
            chosen={"judge": [-1 if c < 0 else orders[t][c] for t, c in enumerate(chosen)]},
            ties={"judge": list(flags)},
        )
        for k, (chosen, flags) in enumerate(rows)
    ]
    (row,) = judge_metrics(records, pairs, ["judge"]).values()
    assert (row.consistency, row.first_position, row.no_verdict) == (40.0, 20.0, 20.0)
    assert row.one_tie == 20.0 and row.tie_answers == 40.0  # 4 of 10 answers
    total = row.consistency + row.first_position + row.second_position + row.no_verdict
    assert total + row.one_tie == 100.0
    assert row.ties == 80.0  # all but the consistent answer p2
    # tie verdicts agree with the tie votes: p0, p1, p3, p4 (4 votes); p2 with its vote for a
    assert row.agreement_with_ties == pytest.approx(100.0 * 5 / 10)
    assert row.agreement == 100.0  # p2 only, its one vote for a
    # without tie flags, the same rows read as before and serialise without the new fields
    plain = [InstanceRecord(r.instance_id, r.orders, r.targets, r.choices, r.chosen)
             for r in records]  # fmt: skip
    (before,) = judge_metrics(plain, pairs, ["judge"]).values()
    assert before.tie_answers is None and "one_tie" not in before.model_dump()
    assert "tie_answers" in row.model_dump(mode="json")
    # the terminal and report.md tables gain the two columns only with a tie label
    from rich.console import Console

    from posdebias.evaluation.table import judge_table, plain_judge_table

    console = Console(record=True, width=200)
    console.print(judge_table({"judge": row}))
    assert "Tie label %" in console.export_text() and "| 40.00 | 20.00 |" in plain_judge_table(
        {"judge": row}
    )
    console.print(judge_table({"judge": before}))
    assert console.export_text().count("Tie label %") == 0  # export_text clears the record
    assert "Tie" not in plain_judge_table({"judge": before})
    # the flags travel with the record, and a damaged log is refused
    assert InstanceRecord.from_dict(records[1].to_dict()).ties == {"judge": [True, False]}
    damaged = {**records[1].to_dict(), "ties": {"judge": [True]}}
    with pytest.raises(PosdebiasError, match="ties must hold"):
        InstanceRecord.from_dict(damaged)


def _pairs(tmp_path):
    fruits = ["apple", "banana", "cherry", "grape", "lemon", "mango", "pear", "plum"]
    others = ["stone", "car", "cloud", "chair", "river", "shoe", "hammer", "brick"]
    rows = [
        {"id": f"p{k}", "question": "Which of these is a fruit?",
         "answers": [fruits[k % 8], others[(3 * k) % 8]][:: 1 if k % 2 == 0 else -1],
         "preferred": 1 if k % 2 == 0 else 2}
        for k in range(12)
    ]  # fmt: skip
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    bench = tmp_path / "bench"
    assert main(["build", "--task", "pairwise_judge", "--source", "pairwise", "--data",
                 str(data), "--out", str(bench)]) == 0  # fmt: skip
    return bench


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tiny model judging twelve pairs with the tie label G (which its random weights
    prefer to A and B in about half of the orders) and without it; a generated row beside the
    calibrators."""
    from posdebias.testing import save_tiny_model

    root = tmp_path_factory.mktemp("tie")
    bench = _pairs(root)
    model = save_tiny_model("qwen3", root / "model")
    config = root / "tie.json"
    config.write_text(json.dumps({"adapter": {"options": {"task_prompt": {"tie_label": "C"}}}}))
    out = {}
    for name, extra in (("tie", ["--config", str(config)]), ("plain", [])):
        out[name] = root / name
        args = ["evaluate", "--model", str(model), "--benchmark", str(bench), *extra,
                "--calibration-count", "2", "--calibrators", "vanilla,permutation_average",
                "--decoders", "generated", "--out", str(out[name])]  # fmt: skip
        assert main(args) == 0
    return bench, model, out


def test_a_run_with_the_tie_label_counts_it(runs):
    _, _, out = runs
    results = json.loads((out["tie"] / "results.json").read_text())
    records = [json.loads(line) for line in (out["tie"] / "records.jsonl").open()]
    assert set(results["judge"]) == {"vanilla", "permutation_average", "generated"}
    for label, judge in results["judge"].items():
        flags = [flag for r in records for flag in r["ties"][label]]
        assert len(flags) == 2 * judge["pairs"] == 20
        assert judge["tie_answers"] == pytest.approx(100.0 * sum(flags) / 20)
        both = sum(all(r["ties"][label]) for r in records)
        # the tie label in one order, an answer in the other (a tie and no answer: no verdict)
        once = sum(
            sorted(zip(r["ties"][label], r["choices"][label], strict=True))[0][1] >= 0
            and any(r["ties"][label])
            and not both_tied
            for r in records
            for both_tied in [all(r["ties"][label])]
        )
        assert judge["one_tie"] == pytest.approx(10.0 * once)
        shares = ("consistency", "first_position", "second_position", "no_verdict", "one_tie")
        assert sum(judge[key] for key in shares) == pytest.approx(100.0)
        assert judge["ties"] >= 10.0 * both
    # a generated answer naming the tie label is a tie in that order, and no answer
    generated = [json.loads(line)["decision"] for line in (out["tie"] / "generations.jsonl").open()]
    assert any(d["choice"] == 2 for d in generated)  # "... C ..." parsed as the tie
    for r in records:
        for flag, choice in zip(r["ties"]["generated"], r["choices"]["generated"], strict=True):
            assert not flag or choice == -1
    assert results["judge"]["generated"]["tie_answers"] > 0
    # ... which is no parse failure: the failures are the orders with neither answer nor tie
    failed = sum(
        choice < 0 and not flag
        for r in records
        for flag, choice in zip(r["ties"]["generated"], r["choices"]["generated"], strict=True)
    )
    assert results["calibrators"]["generated"]["metrics"]["no_answer"] == pytest.approx(5 * failed)
    # the tiny model answers the tie label in some orders only, and the report shows the counts
    vanilla = results["judge"]["vanilla"]
    assert 0 < vanilla["tie_answers"] < 100 and vanilla["one_tie"] > 0
    report = (out["tie"] / "report.md").read_text()
    assert "Tie label %" in report and "Tie once %" in report
    assert results["settings"]["adapter"]["options"]["task_prompt"] == {"tie_label": "C"}


def test_without_the_option_nothing_of_it_is_written(runs):
    _, _, out = runs
    results = (out["plain"] / "results.json").read_text()
    assert "tie_answers" not in results and "one_tie" not in results
    assert "tie_label" not in results
    assert all("ties" not in json.loads(line) for line in (out["plain"] / "records.jsonl").open())
    report = (out["plain"] / "report.md").read_text()
    assert "Tie label %" not in report and "Tie once" not in report


@pytest.mark.parametrize(
    ("tie", "message"),
    [
        ("B", "task_prompt.tie_label 'B' is also an answer's label"),
        ("", "must be a non-empty label"),
        ("tie", "task_prompt.tie_label 'tie' is 2 tokens"),
    ],
)
def test_the_cli_refuses_bad_tie_labels_with_exit_2(runs, tmp_path, capsys, tie, message):
    bench, model, _ = runs
    config = tmp_path / "bad.json"
    config.write_text(json.dumps({"adapter": {"options": {"task_prompt": {"tie_label": tie}}}}))
    args = ["evaluate", "--model", str(model), "--benchmark", str(bench), "--config",
            str(config), "--calibrators", "vanilla", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_the_text_organism_judges_with_a_tie_label(tmp_path, monkeypatch):
    """The bundled text organism (trained on letters) judging with the tie label C: three
    label scores per order, the judge counts consistent with its records."""
    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bench = _pairs(tmp_path)
    config = tmp_path / "tie.json"
    config.write_text(json.dumps({"adapter": {"options": TIE}}))
    out = tmp_path / "run"
    args = ["evaluate", "--model", "posdebias/text-organism", "--benchmark", str(bench),
            "--config", str(config), "--calibration-count", "5", "--calibrators",
            "vanilla,permutation_average", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    records = [json.loads(line) for line in (out / "records.jsonl").open()]
    assert results["adapter"]["labels"] == ["A", "B"]
    for label, judge in results["judge"].items():
        flags = [flag for r in records for flag in r["ties"][label]]
        assert judge["tie_answers"] == pytest.approx(100.0 * sum(flags) / len(flags))
        shares = ("consistency", "first_position", "second_position", "no_verdict", "one_tie")
        assert sum(judge[key] for key in shares) == pytest.approx(100.0)
    # three label scores per order, logged; the organism (trained to answer with an option's
    # letter) leaves the tie label little mass: it never wins, and the bias stays as it was
    logged = [json.loads(line) for line in (out / "observations.jsonl").open()]
    assert logged and all("tie_logprob" in row["observation"] for row in logged)
    vanilla = results["judge"]["vanilla"]
    assert vanilla["tie_answers"] == 0.0 and vanilla["consistency"] == pytest.approx(600 / 7)
    assert vanilla["first_position"] == pytest.approx(100 / 7)
