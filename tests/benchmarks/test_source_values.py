"""Every number and every text of every task source is read by one strict reader: a number
that is no plain number (``"²"``, ``2.0``, 5,000 digits, ``NaN``) and a text no file can hold (a
lone surrogate) are named with the file, the line and the field, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from posdebias._inputs import file_decimal_number, file_whole_number, loads_json, text_problem
from posdebias.cli import main
from posdebias.errors import InputError

LONG = "7" * 5000


def jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def build(tmp_path, capsys, source, data, *extra):
    out = tmp_path / "out"
    code = main(["build", "--source", source, "--data", str(data), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err and not out.exists()
    assert code == 2, err
    return err


def turn(q, a):
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


@pytest.mark.parametrize(
    "answer", ["\u00b2", "\u0663", "1\u00b2", LONG, "2.0", "1e0", "-1", True, 2.0, "", "0x2"]
)
def test_an_mcq_answer_that_is_no_plain_number_names_file_line_and_field(tmp_path, capsys, answer):
    rows = [{"id": "a", "question": "q", "options": ["x", "y", "z"], "answer": 1},
            {"id": "b", "question": "q", "options": ["x", "y", "z"], "answer": answer}]  # fmt: skip
    data = jsonl(tmp_path / "mcq.jsonl", rows)
    err = build(tmp_path, capsys, "mcq", data)
    assert f"{data}: 1 problem" in err and "line 2: answer" in err
    assert "is not a whole number (digits only, at most 18 digits, no decimal point)" in err
    assert "write a 1-based index or a letter" in err
    assert "Exceeds the limit" not in err and "invalid literal" not in err


@pytest.mark.parametrize("letter", ["\u00b2", "\u0663", LONG, "1.5", "AB"])
def test_an_mmlu_answer_that_is_no_letter_or_number_is_named(tmp_path, capsys, letter):
    data = tmp_path / "x_test.csv"
    data.write_text(f"Q?,a,b,c,d,A\nQ2?,a,b,c,d,{letter}\n", encoding="utf-8")
    err = build(tmp_path, capsys, "mmlu", data)
    assert "x_test.csv line 2: answer" in err


@pytest.mark.parametrize("preferred", ["\u00b2", LONG, 1.0, False, "C", 3])
def test_a_pairwise_preference_that_is_no_1_2_a_or_b_is_named(tmp_path, capsys, preferred):
    rows = [{"id": "p", "question": "q", "answers": ["a", "b"], "preferred": preferred}]
    err = build(tmp_path, capsys, "pairwise", jsonl(tmp_path / "p.jsonl", rows))
    assert "line 1: 'preferred'" in err


@pytest.mark.parametrize("value", [2.0, "2", True, 3, 0, "\u00b2", None])
def test_an_mtbench_turn_is_a_whole_number_as_written(tmp_path, capsys, value):
    row = {"question_id": 1, "model_a": "a", "model_b": "b", "winner": "model_a", "turn": value,
           "conversation_a": turn("Q", "A") * 2, "conversation_b": turn("Q", "B") * 2}  # fmt: skip
    err = build(tmp_path, capsys, "mtbench", jsonl(tmp_path / "mt.jsonl", [row]))
    assert "line 1: turn" in err and "TypeError" not in err


@pytest.mark.parametrize("source", ["muirbench", "blink"])
@pytest.mark.parametrize("answer", ["\u00b2", LONG, "(\u0663)", 1.0])
def test_muirbench_and_blink_answers_go_through_the_same_reader(tmp_path, capsys, source, answer):
    key = "options" if source == "muirbench" else "choices"
    row = {"question": "q", key: ["x", "y"], "answer": answer}
    err = build(tmp_path, capsys, source, jsonl(tmp_path / "m.jsonl", [row]))
    assert "line 1: answer" in err


def beir(tmp_path, score):
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    jsonl(folder / "corpus.jsonl", [{"_id": f"d{k}", "text": f"passage {k}"} for k in range(6)])
    jsonl(folder / "queries.jsonl", [{"_id": "q0", "text": "which passage"}])
    (folder / "qrels" / "test.tsv").write_text(f"q0\td0\t1\nq0\td1\t{score}\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "score", ["nan", "NaN", "inf", "-Infinity", "1e999", "\u00b2", "1_0", LONG, "1e13", "0x1"]
)
def test_a_beir_relevance_that_is_no_finite_number_is_named(tmp_path, capsys, score):
    # a NaN score became the right passage, or "two candidates are the same" naming neither
    folder = beir(tmp_path, score)
    for seed in ("0", "2"):
        err = build(tmp_path, capsys, "beir", folder, "-N", "3", "--seed", seed)
        assert "test.tsv: 1 problem" in err and "line 2: score" in err
        assert "is not a finite number" in err or "is out of range" in err


def test_plain_beir_relevances_still_build(tmp_path, capsys):
    for score in ("2", "0.5", " 1 ", "1e-3", "-1"):
        folder = beir(tmp_path / score.strip(), score)
        code = main(["build", "--source", "beir", "--data", str(folder), "-N", "3",
                     "--out", str(tmp_path / score.strip() / "o")])  # fmt: skip
        assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_json_constants_no_json_allows_are_refused_in_every_jsonl_source(
    tmp_path, capsys, constant
):
    # Python's json module reads NaN and Infinity; JSON does not have them
    text = '{"id": "a", "question": "q", "options": ["x", "y"], "answer": ' + constant + "}\n"
    data = tmp_path / "mcq.jsonl"
    data.write_text(text)
    err = build(tmp_path, capsys, "mcq", data)
    assert "line 1: not usable JSON" in err
    if constant != "1e999":
        assert "is no number JSON allows" in err
    with pytest.raises(ValueError):
        loads_json(f"[{constant}]")


SURROGATE = "\ud800"


@pytest.mark.parametrize(
    ("source", "rows"),
    [
        ("mcq", [{"id": "a", "question": "q", "options": ["x", "y" + SURROGATE], "answer": 1}]),
        (
            "mcq",
            [
                {
                    "id": "a",
                    "question": "q",
                    "options": [{"text": SURROGATE + "x"}, "y"],
                    "answer": 1,
                }
            ],
        ),
        ("mcq", [{"id": "a" + SURROGATE, "question": "q", "options": ["x", "y"], "answer": 1}]),
        ("pairwise", [{"id": "p", "question": "q", "answers": ["a", "b\udfff"], "preferred": 1}]),
        (
            "muirbench",
            [{"question": "q", "options": ["x", "y"], "answer": "A", "task": "t" + SURROGATE}],
        ),
        ("blink", [{"question": "q", "choices": ["x\udc80", "y"], "answer": "A"}]),
        (
            "mtbench",
            [
                {
                    "question_id": 1,
                    "model_a": "a",
                    "model_b": "b",
                    "winner": "model_a",
                    "conversation_a": turn("Q", "A" + SURROGATE),
                    "conversation_b": turn("Q", "B"),
                }
            ],
        ),
        (
            "mtbench",
            [
                {
                    "question_id": 1,
                    "model_a": "a" + SURROGATE,
                    "model_b": "b",
                    "winner": "model_a",
                    "conversation_a": turn("Q", "A"),
                    "conversation_b": turn("Q", "B"),
                }
            ],
        ),
    ],
)
def test_a_lone_surrogate_in_any_field_is_refused_before_anything_is_written(
    tmp_path, capsys, source, rows
):
    # an option's surrogate failed at write time with a UnicodeEncodeError
    err = build(tmp_path, capsys, source, jsonl(tmp_path / "d.jsonl", rows))
    assert "line 1:" in err and "half of a surrogate pair" in err
    assert "UnicodeEncodeError" not in err


def test_a_lone_surrogate_in_a_beir_passage_or_mmlu_cell_is_refused(tmp_path, capsys):
    folder = beir(tmp_path, "1")
    jsonl(folder / "corpus.jsonl", [{"_id": f"d{k}", "text": f"p {k}\ud834"} for k in range(6)])
    err = build(tmp_path, capsys, "beir", folder, "-N", "3")
    assert "corpus.jsonl" in err and "half of a surrogate pair" in err
    data = tmp_path / "s_test.csv"
    data.write_bytes("Q?,a,b\udc80,c,d,A\n".encode("utf-8", "surrogatepass"))
    err = build(tmp_path, capsys, "mmlu", data)
    assert "s_test.csv" in err and "UnicodeEncodeError" not in err


def test_the_readers_themselves():
    assert file_whole_number("12", "f", 0, 99) == 12 and file_whole_number(3, "f", 0, 9) == 3
    for bad in ("\u00b2", "\u0663", "1 2", "+1", True, 1.0, "9" * 19, 10**30):
        with pytest.raises(InputError, match="f .* is not a whole number"):
            file_whole_number(bad, "f", 0, 10**40)
    with pytest.raises(InputError, match="is not a whole number"):
        file_whole_number("3", "f", 0, 9, text=False)
    assert file_decimal_number("-0.5e1", "s") == -5.0 and file_decimal_number(2, "s") == 2.0
    for bad in ("nan", "inf", float("nan"), "1_0", "\u00b2", True, 10**400, "1e13", 2e12):
        with pytest.raises(InputError, match="s "):
            file_decimal_number(bad, "s")
    assert text_problem("caf\u00e9") is None and "U+D800" in str(text_problem("a\ud800"))
