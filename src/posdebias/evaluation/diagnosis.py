"""What a run's rows say together: notes printed under the table and written in report.md.

* **Order-independent rows** (cloze): the same candidate is chosen under every order by
  construction, so their Cons. and RStd are not shown (table.py) and a note says why.
* **The label answer ignores the content.** Permutation averaging averages the label scores
  over every rotation of the options, which cancels any preference for a position: what is left
  is what the labels know about the options' content. Cloze scores each option's text as the
  reply to the question alone: what the model knows, without labels. When permutation averaging
  is at chance while cloze is clearly above it, the model knows answers its label does not
  follow, and no calibration of the label scores can help: a calibrator corrects how the label
  scores depend on the position, and with the position averaged out they tell the right option
  no better than chance.

The rule compares the rows' 95% bootstrap intervals of accuracy (the run's statistics) with
chance, 100 / N, and with each other; no threshold is a constant tuned to a model:

    labels ignore content  <=>  perm.low <= chance          (permutation averaging's interval
                                                             does not exclude chance)
                           and  cloze.low > chance          (cloze is above chance)
                           and  cloze.low > perm.high       (and above permutation averaging)

With several rows of a kind, the permutation-averaging row most favourable to the labels (the
highest upper bound) and the cloze row with the highest lower bound are compared, so the
diagnosis is never the product of picking a weak row.
"""

from __future__ import annotations

from dataclasses import dataclass

from posdebias.evaluation.results import EvaluationResults
from posdebias.evaluation.statistics import Interval

#: The calibrator whose accuracy is what the label scores know once position is averaged out.
LABEL_FREE_OF_POSITION = "permutation_average"


def labels_ignore_content(chance: float, label_free: Interval, knowledge: Interval) -> bool:
    """The rule of the module docstring: ``label_free`` (permutation averaging's accuracy
    interval) does not exclude ``chance`` while ``knowledge`` (cloze's) lies above both."""
    return label_free.low <= chance and knowledge.low > chance and knowledge.low > label_free.high


def _range(interval: Interval) -> str:
    return f"{interval.value:.1f}% [{interval.low:.1f}, {interval.high:.1f}]"


@dataclass(frozen=True)
class ContentDiagnosis:
    """The finding that the label answer ignores the content, with the figures it rests on."""

    label_row: str
    knowledge_row: str
    chance: float
    label_free: Interval
    knowledge: Interval

    def message(self) -> str:
        return (
            "Diagnosis: the label answer ignores the options' content. "
            f"{self.label_row} (the label scores averaged over every rotation of the options, "
            f"which cancels any preference for a position) reaches {_range(self.label_free)}, "
            f"an interval that does not exclude chance ({self.chance:.1f}%), while "
            f"{self.knowledge_row} (each option's text scored as the reply to the question "
            f"alone, no labels) reaches {_range(self.knowledge)}, above chance and above "
            f"{self.label_row}. The model knows answers that its label does not follow. No "
            "calibration of the label scores can help: a calibrator (pride, contextual, the "
            "bias profile of attention_guided) corrects how the label scores depend on the "
            "position, and with the position averaged out they tell the right option no better "
            "than chance, so there is nothing for it to recover. Only evidence read elsewhere "
            "can: the cloze scores, or the attention rows where a layer is informative. "
            "(Rule: the 95% intervals of accuracy against chance = 100 / N and each other.)"
        )


def content_diagnosis(results: EvaluationResults) -> ContentDiagnosis | None:
    """The diagnosis of the module docstring, or None when the rule does not hold or the run
    lacks what it needs (statistics, a permutation-averaging row, an order-independent row)."""
    stats = results.statistics
    if stats is None:
        return None
    chance = 100.0 / results.n
    labels = [
        (label, stats.rows[label].accuracy)
        for label, row in results.calibrators.items()
        if row.kind == "calibrator" and row.name == LABEL_FREE_OF_POSITION and label in stats.rows
    ]
    knowing = [
        (label, stats.rows[label].accuracy)
        for label in results.order_independent_rows()
        if label in stats.rows
    ]
    if not labels or not knowing:
        return None
    label_row, label_free = max(labels, key=lambda item: item[1].high)
    knowledge_row, knowledge = max(knowing, key=lambda item: item[1].low)
    if not labels_ignore_content(chance, label_free, knowledge):
        return None
    return ContentDiagnosis(label_row, knowledge_row, chance, label_free, knowledge)


def order_independent_note(results: EvaluationResults) -> str | None:
    """Why the order-independent rows show no RStd and Cons., or None without such rows."""
    rows = results.order_independent_rows()
    if not rows:
        return None
    return (
        f"{', '.join(rows)}: order-independent (each option is scored without the others), so "
        "the same option is chosen under every order by construction: Cons. would be 100% and "
        "RStd would measure only where the orders put the right option, so neither is shown. "
        "Their accuracy is what the model knows of the answers without labels to map them to "
        "(its knowledge ceiling, as lm-evaluation-harness scores multiple choice)."
    )


def run_notes(results: EvaluationResults) -> list[str]:
    """The notes printed under the table and written in report.md, in that order."""
    notes = [order_independent_note(results)]
    diagnosis = content_diagnosis(results)
    notes.append(None if diagnosis is None else diagnosis.message())
    return [note for note in notes if note is not None]
