"""Read a candidate position out of a generated answer (the paper's generated baselines).

The generated rows (vanilla generation, instruction prompt, chain-of-thought, self-consistency)
ask the model for free text and parse the index from it; an answer that names no valid label
counts as wrong. One parser per label set:

* ``digits``: a whole number (``3``, ``image 3``, ``**3**``, ``03``) whose value is 1..N; numbers
  inside other tokens (``v2``, ``3.5``, ``2024``) and out-of-range numbers (``7`` for N=4, ``0``)
  are not labels.
* ``upper`` / ``lower``: a single letter standing alone (``B``, ``(b)``, ``B.``) among the first
  N letters.
* ``roman``: an upper-case numeral standing alone (``III``) among the first N numerals.
* ``words``: an ordinal word (``second``, ``Twenty-first``, ``twenty first``), case-insensitive.

``A``, ``a`` and ``I`` are also English words: a single-letter match followed by a space and a
lower-case word (``A red circle``, ``I think``) is read as a word, not a label.

Which label of a text is the answer (``which``):

* ``first``: the first valid label (a short direct answer);
* ``last``: the last valid label (chain-of-thought: the conclusion comes at the end);
* ``last_number``: the authors' rule for their generated vanilla: every run of digits, even
  inside a word (``image2``, ``2nd``), and the last one whose value is 1..N (digits only;
  other label sets read it as ``last``);
* ``answer_is``: the paper's self-consistency format: the first ``The answer is K`` (``t`` of
  either case, K a number right after it) decides, and a K outside 1..N is no answer; a text
  without such a match falls back to ``last_number``. Other label sets: K is the label right
  after the phrase (quotes, brackets, ``**`` and the words ``the``, ``option``, ``choice``,
  ``answer``, ``passage``, ``image``, ``label``, ``letter``, ``candidate`` allowed before it:
  ``The answer is option B``), else ``last``.

Empty or junk text gives None.

A pairwise judge's tie label (``tie_label``, e.g. ``C``: MT-Bench's ``[[C]]``) is read as a label
standing alone, wherever the rules above look for labels, and parsed as position N (one past the
answers): the tie.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, get_args

from posdebias.core.labels import LabelSet, get_label_set

Which = Literal["first", "last", "last_number", "answer_is"]
WHICH: tuple[str, ...] = get_args(Which)

_ALONE_BEFORE = r"(?<![A-Za-z0-9])"
_ALONE_AFTER = r"(?![A-Za-z0-9])"
_ARTICLE_LIKE = re.compile(r" [a-z]")
_DIGIT_RUN = re.compile(r"\d+")
_ANSWER_IS = re.compile(r"[Tt]he answer is\s*")
_ANSWER_IS_NUMBER = re.compile(r"[Tt]he answer is\s*(\d+)")
#: What may stand between "The answer is" and a label that is not a digit: quotes, brackets,
#: markup and the words that name what a label labels ("option B", "the third", "answer (C)").
_LABEL_LEAD = re.compile(
    r"[\s\"'*(\[<:]*(?:(?:the|option|choice|answer|passage|image|label|letter|candidate)"
    r"\b[\s\"'*(\[<:]*)*",
    re.IGNORECASE,
)


def _label_number(digits: str) -> int:
    """The value of a run of digits in a generated text, or 0 (no label) when it is too long
    to be one: ``int()`` of a model's 5,000 digits is refused (or slow)."""
    return int(digits) if len(digits) <= 18 else 0


def _token_pattern(label_set: LabelSet, labels: list[str]) -> re.Pattern[str]:
    if label_set.name == "digits":
        # not part of a word, a decimal or a longer number
        return re.compile(r"(?<![\w.,])(\d+)(?![\w]|[.,]\d)")
    if label_set.name in ("upper", "lower"):
        letters = "A-Z" if label_set.name == "upper" else "a-z"
        return re.compile(f"{_ALONE_BEFORE}([{letters}]){_ALONE_AFTER}")
    if label_set.name == "roman":
        return re.compile(f"{_ALONE_BEFORE}([IVXLCDM]+){_ALONE_AFTER}")
    # words: longest first, so "twenty-first" is not read as "first"
    alternatives = sorted(labels, key=len, reverse=True)
    body = "|".join(re.escape(word).replace(r"\-", r"[-\s]") for word in alternatives)
    return re.compile(f"{_ALONE_BEFORE}({body}){_ALONE_AFTER}", re.IGNORECASE)


@dataclass(frozen=True)
class AnswerParser:
    """Parses generated texts into 0-based positions for N candidates of one label set."""

    label_set: str
    n: int
    which: Which = "last"
    #: a pairwise judge's tie label, parsed as position ``n`` (module docstring)
    tie_label: str | None = None
    _labels: list[str] = field(init=False, repr=False, compare=False)
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _tie: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        labels = get_label_set(self.label_set).labels(self.n)
        if self.which not in WHICH:
            raise ValueError(f"which must be one of {', '.join(WHICH)}, got {self.which!r}")
        object.__setattr__(self, "_labels", labels)
        object.__setattr__(self, "_pattern", _token_pattern(get_label_set(self.label_set), labels))
        tie = self.tie_label
        pattern = None if tie is None else re.compile(_ALONE_BEFORE + re.escape(tie) + _ALONE_AFTER)
        object.__setattr__(self, "_tie", pattern)

    def candidates(self, text: str) -> list[int]:
        """Every valid label in ``text``, as 0-based positions (the tie label: N), in reading
        order."""
        found: list[tuple[int, int]] = []
        name = self.label_set
        for match in self._pattern.finditer(text or ""):
            token = match.group(1)
            if name == "digits":
                value = _label_number(token)
                if 1 <= value <= self.n:
                    found.append((match.start(), value - 1))
                continue
            if token in ("A", "a", "I") and _ARTICLE_LIKE.match(text, match.end()):
                continue  # "A red circle", "I think": a word, not a label
            if name == "words":
                token = re.sub(r"[-\s]+", "-", token.lower())
            if token in self._labels:
                found.append((match.start(), self._labels.index(token)))
        if self._tie is not None:
            found += [(match.start(), self.n) for match in self._tie.finditer(text or "")]
        return [position for _, position in sorted(found)]

    def numbers(self, text: str) -> list[int]:
        """Every run of digits in ``text`` with a value in 1..N, as 0-based positions."""
        values = (_label_number(run) for run in _DIGIT_RUN.findall(text or ""))
        return [value - 1 for value in values if 1 <= value <= self.n]

    def parse(self, text: str) -> int | None:
        """The answer of ``text`` by the rule ``which`` (0-based position), or None."""
        if self.which == "answer_is" and self.label_set == "digits":
            number = _ANSWER_IS_NUMBER.search(text or "")
            if number is not None:
                value = _label_number(number.group(1))
                return value - 1 if 1 <= value <= self.n else None
        elif self.which == "answer_is":
            match = _ANSWER_IS.search(text or "")
            if match is not None:
                found = self.candidates(text[match.end() :])
                starts_there = bool(found) and self._starts_with_label(text[match.end() :])
                return found[0] if starts_there else None
        if self.which in ("last_number", "answer_is") and self.label_set == "digits":
            numbers = self.numbers(text)
            return numbers[-1] if numbers else None
        found = self.candidates(text)
        if not found:
            return None
        return found[0] if self.which == "first" else found[-1]

    def _starts_with_label(self, rest: str) -> bool:
        """Whether the text after "The answer is" starts with a label (after quotes, brackets,
        markup or a word naming what it labels: ``option B``, ``the third``), not with another
        word or an out-of-range number."""
        matches = [p.search(rest) for p in (self._pattern, self._tie) if p is not None]
        match = min((m for m in matches if m is not None), key=lambda m: m.start(), default=None)
        if match is None or not _LABEL_LEAD.fullmatch(rest[: match.start()]):
            return False
        return bool(self.candidates(rest[: match.end()]))
