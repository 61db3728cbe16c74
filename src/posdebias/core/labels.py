"""Label sets: the strings the model answers with, and the words the prompt uses to name them."""

from __future__ import annotations

from dataclasses import dataclass

import posdebias.defaults as defaults
from posdebias.errors import InputError, UnknownNameError

_ROMAN = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]  # fmt: skip

_ORDINALS = [
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
    "seventeenth", "eighteenth", "nineteenth", "twentieth", "twenty-first", "twenty-second",
    "twenty-third", "twenty-fourth", "twenty-fifth", "twenty-sixth",
]  # fmt: skip

MAX_CANDIDATES = defaults.MAX_CANDIDATES


def roman_numeral(value: int) -> str:
    """Roman numeral of a positive integer (``4 -> 'IV'``)."""
    digits = []
    for amount, symbol in _ROMAN:
        count, value = divmod(value, amount)
        digits.append(symbol * count)
    return "".join(digits)


@dataclass(frozen=True)
class LabelSet:
    """A named way to index N candidates; ``labels(n)`` gives the N answer strings."""

    name: str
    description: str
    capacity: int

    def labels(self, n: int) -> list[str]:
        check_candidate_count(n, self)
        if self.name == "digits":
            return [str(i) for i in range(1, n + 1)]
        if self.name == "upper":
            return [chr(ord("A") + i) for i in range(n)]
        if self.name == "lower":
            return [chr(ord("a") + i) for i in range(n)]
        if self.name == "roman":
            return [roman_numeral(i) for i in range(1, n + 1)]
        return _ORDINALS[:n]

    def range_text(self, n: int) -> str:
        """How the prompt names the range, e.g. ``'1 to 4'`` or ``'A to D'``."""
        labels = self.labels(n)
        return f"{labels[0]} to {labels[-1]}"


LABEL_SETS: dict[str, LabelSet] = {
    "digits": LabelSet("digits", "1, 2, 3, ...", MAX_CANDIDATES),
    "upper": LabelSet("upper", "A, B, C, ...", 26),
    "lower": LabelSet("lower", "a, b, c, ...", 26),
    "roman": LabelSet("roman", "I, II, III, ...", MAX_CANDIDATES),
    "words": LabelSet("words", "first, second, third, ...", len(_ORDINALS)),
}


def get_label_set(name: str) -> LabelSet:
    """Look up a label set by name; unknown names list the known ones."""
    try:
        return LABEL_SETS[name]
    except KeyError:
        known = ", ".join(LABEL_SETS)
        raise UnknownNameError(f"unknown label set {name!r}; choose one of: {known}") from None


def check_candidate_count(n: int, label_set: LabelSet | None = None) -> None:
    """Reject N < 2 or an N that the label set cannot name."""

    if n < 2:
        raise InputError(f"N={n} candidates: retrieval needs at least 2 images per instance")
    limit = label_set.capacity if label_set else MAX_CANDIDATES
    if n > limit:
        which = f"label set {label_set.name!r}" if label_set else "posdebias"
        raise InputError(
            f"N={n} candidates, but {which} can name at most {limit}; use fewer candidates "
            "per instance or another label set"
        )
