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
    with pytest.raises(ValueError, match="last_number, answer_is"):
        AnswerParser("digits", 4, "middle")  # type: ignore[arg-type]
    with pytest.raises(Exception, match="unknown label set"):
        AnswerParser("emoji", 4)


# -- the paper's and the authors' rules (the issue's examples) --------------------------------


@pytest.mark.parametrize(
    ("text", "first", "last_number"),
    [
        ("2 4", 1, 3),  # our first valid label vs the authors' last number
        ("image2", None, 1),  # a number inside a word: no label for us, a number for them
        ("2nd", None, 1),
        ("Image 3.", 2, 2),
        ("7", None, None),  # out of range for N = 4 under both rules
        ("12", None, None),  # one number, not "1" and "2"
    ],
)
def test_generated_vanilla_first_label_vs_last_number(text, first, last_number):
    assert AnswerParser("digits", 4, "first").parse(text) == first
    assert AnswerParser("digits", 4, "last_number").parse(text) == last_number


@pytest.mark.parametrize(
    ("text", "vote"),
    [
        ("The answer is 7, so 2", None),  # an out-of-range K after the phrase casts no vote
        ("Reasoning... the answer is 3", 2),  # lower-case t
        ("The answer is 2. Or the answer is 4.", 1),  # the first match decides
        ("I would say 4, maybe 2", 1),  # no phrase: the last number in 1..N
        ("The answer is image 3", 2),  # no "The answer is K" match: the last number
        ("nothing here", None),
    ],
)
def test_self_consistency_answer_is_rule(text, vote):
    assert AnswerParser("digits", 4, "answer_is").parse(text) == vote


def test_self_consistency_old_rule_voted_where_the_paper_does_not():
    assert AnswerParser("digits", 4, "last").parse("The answer is 7, so 2") == 1


def test_answer_is_for_letters():
    parser = AnswerParser("upper", 4, "answer_is")
    assert parser.parse('The answer is "C", then A') == 2
    assert parser.parse("The answer is E, so A") is None
    assert parser.parse("I pick D") == 3


@pytest.mark.parametrize(
    ("label_set", "text", "vote"),
    [
        ("upper", "The answer is option B", 1),  # a word naming what the label labels
        ("upper", "The answer is: (C) pear", 2),
        ("upper", "The answer is the letter D.", 3),
        ("upper", "The answer is clearly B", None),  # another word: no vote
        ("roman", "The answer is option IV", 3),
        ("words", "The answer is the third option", 2),
        ("lower", "Reasoning. the answer is (b)", 1),
    ],
)
def test_answer_is_allows_the_words_that_name_a_label(label_set, text, vote):
    assert AnswerParser(label_set, 4, "answer_is").parse(text) == vote


@pytest.mark.parametrize(
    ("label_set", "text", "position"),
    [
        ("upper", "Answer: (B)", 1),
        ("upper", "**C**", 2),
        ("upper", "B) pear", 1),
        ("roman", "Answer: IV", 3),
        ("roman", "(III)", 2),
        ("words", "the second option", 1),
    ],
)
def test_a_short_answer_names_its_label_in_every_set(label_set, text, position):
    assert AnswerParser(label_set, 4, "first").parse(text) == position


@pytest.mark.parametrize("which", ["first", "last", "last_number", "answer_is"])
def test_a_generated_number_of_thousands_of_digits_is_no_label(which):
    # int() of 5,000 digits raises "Exceeds the limit (4300 digits)": a model can write them
    parser = AnswerParser("digits", 4, which)
    long = "9" * 5000
    assert parser.parse(f"The answer is {long}") is None
    assert parser.parse(f"{long} or 2") == 1
    assert parser.parse(f"2 then image{long}") == 1
