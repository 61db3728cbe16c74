"""The answer parser on hand-written texts: every label set, first/last, junk and range."""

from __future__ import annotations

import pytest

from posdebias.core.answers import AnswerParser


@pytest.mark.parametrize(
    ("text", "first", "last"),
    [
        ("3", 2, 2),
        (" 2\n", 1, 1),
        ("Answer: 4", 3, 3),
        ("**1**", 0, 0),
        ("Image 2 shows a dog, image 4 shows a cat. Answer: 3.", 1, 2),
        ("03", 2, 2),
        ("The answer is 7", None, None),  # out of range for N=4
        ("0", None, None),
        ("image 3.5 or 2024 or v2 or 4th", None, None),  # parts of other tokens
        ("12 apples, then 2", 1, 1),
        ("", None, None),
        ("!!!???", None, None),
        ("4, 1", 3, 0),
    ],
)
def test_digits(text, first, last):
    assert AnswerParser("digits", 4, "first").parse(text) == first
    assert AnswerParser("digits", 4, "last").parse(text) == last


def test_multi_digit_labels_are_whole_numbers():
    parser = AnswerParser("digits", 12, "last")
    assert parser.parse("between 1 and 10, I pick 10") == 9
    assert parser.parse("11") == 10
    assert parser.parse("13") is None
    assert parser.candidates("1 10 12 13 100") == [0, 9, 11]


@pytest.mark.parametrize(
    ("label_set", "text", "first", "last"),
    [
        ("upper", "B", 1, 1),
        ("upper", "(C) is right", 2, 2),
        ("upper", "A red circle is in image D.", 3, 3),  # "A red": the article
        ("upper", "Answer: A", 0, 0),
        ("upper", "E", None, None),  # out of range for N=4
        ("upper", "Both B and AB", 1, 1),
        ("lower", "a red square: (b)", 1, 1),
        ("lower", "c or d", 2, 3),
        ("lower", "B", None, None),  # case matters: not a lower label
        ("roman", "III", 2, 2),
        ("roman", "I think it is IV", 3, 3),  # "I think": the pronoun
        ("roman", "II, then I", 1, 0),
        ("roman", "VI", None, None),  # out of range
        ("roman", "iii", None, None),
        ("words", "the second image", 1, 1),
        ("words", "First I thought the fourth, then the THIRD", 0, 2),
        ("words", "fifth", None, None),
        ("words", "", None, None),
    ],
)
def test_letter_roman_and_word_sets(label_set, text, first, last):
    assert AnswerParser(label_set, 4, "first").parse(text) == first
    assert AnswerParser(label_set, 4, "last").parse(text) == last


def test_compound_ordinals_are_not_read_as_their_tail():
    parser = AnswerParser("words", 22, "last")
    assert parser.parse("the twenty-first") == 20
    assert parser.parse("the twenty first one") == 20
    assert parser.parse("the first") == 0


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError, match="first' or 'last"):
        AnswerParser("digits", 4, "middle")  # type: ignore[arg-type]
    with pytest.raises(Exception, match="unknown label set"):
        AnswerParser("emoji", 4)
