"""The text organism's world: questions "Which of these is a fruit?" over words of eight kinds.

Every question names one category; exactly one option is a word of that category, the others
are words of other categories. A question is fixed by its category, its right word, its
distractors and where the right word sits; all of them are drawn from seeded numpy generators
in list order (never set or hash order), so the same seed gives the same questions on every
machine and Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posdebias.core.instance import Instance

#: Ten single-word members of each category, in declaration order.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "colour": ("red", "green", "blue", "yellow", "purple", "pink", "brown", "black", "white",
               "grey"),
    "animal": ("dog", "cat", "horse", "cow", "sheep", "lion", "tiger", "mouse", "rabbit", "fox"),
    "fruit": ("apple", "banana", "pear", "grape", "lemon", "cherry", "peach", "plum", "mango",
              "melon"),
    "tool": ("hammer", "saw", "drill", "wrench", "spade", "chisel", "axe", "rake", "pliers",
             "shovel"),
    "vehicle": ("car", "bus", "train", "bicycle", "truck", "boat", "plane", "taxi", "tram", "van"),
    "country": ("France", "Spain", "Italy", "Japan", "Brazil", "Canada", "Egypt", "India",
                "Kenya", "Peru"),
    "instrument": ("piano", "guitar", "violin", "drum", "flute", "harp", "trumpet", "cello",
                   "banjo", "tuba"),
    "sport": ("tennis", "golf", "football", "rugby", "hockey", "boxing", "rowing", "cricket",
              "skiing", "judo"),
}  # fmt: skip


def question_text(category: str) -> str:
    """``Which of these is a fruit?`` (``an`` before a vowel)."""
    article = "an" if category[0] in "aeiou" else "a"
    return f"Which of these is {article} {category}?"


@dataclass(frozen=True)
class Question:
    """One multiple-choice question: the options in order and where the right one is."""

    category: str
    options: tuple[str, ...]
    target: int

    @property
    def text(self) -> str:
        return question_text(self.category)

    def instance(self, instance_id: str) -> Instance:
        """The question as a ``multiple_choice`` instance."""
        return Instance(
            stem=self.text,
            texts=self.options,
            target=self.target,
            id=instance_id,
            task="multiple_choice",
        )

    def record(self, instance_id: str) -> dict[str, object]:
        """The question as a line of the ``mcq`` benchmark source (``answer`` 1-based)."""
        return {
            "id": instance_id,
            "question": self.text,
            "options": list(self.options),
            "answer": self.target + 1,
        }


def draw_questions(rng: np.random.Generator, count: int, n: int) -> list[Question]:
    """``count`` questions with ``n`` options: a category, one of its words, ``n - 1`` words of
    the other categories and the right word's position, each drawn uniformly."""
    names = list(CATEGORIES)
    drawn = []
    for _ in range(count):
        category = names[int(rng.integers(len(names)))]
        members = CATEGORIES[category]
        right = members[int(rng.integers(len(members)))]
        others = [word for name in names if name != category for word in CATEGORIES[name]]
        distractors = [others[int(i)] for i in rng.choice(len(others), n - 1, replace=False)]
        target = int(rng.integers(n))
        options = (*distractors[:target], right, *distractors[target:])
        drawn.append(Question(category=category, options=options, target=target))
    return drawn


def draw_instances(rng: np.random.Generator, count: int, n: int, prefix: str) -> list[Instance]:
    """:func:`draw_questions` as instances with ids ``prefix-0``, ``prefix-1``, ..."""
    return [q.instance(f"{prefix}-{k}") for k, q in enumerate(draw_questions(rng, count, n))]
