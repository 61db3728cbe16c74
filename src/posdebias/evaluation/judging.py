"""What judge users measure on a pairwise run: position consistency, the position an
inconsistent judge favours, and agreement with the human votes (docs/evaluation.md, "Pairwise
judges").

A pair (an instance of ``pairwise_judge``) counts when the run showed it in both orders, the
file's (answer 1 first) and the swapped one. Per calibrator or decoder row:

* the **verdict** on a pair is the answer chosen in both orders; a pair answered
  inconsistently (or without an answer in an order) is a **tie**: the conservative rule of
  Zheng et al. (2023), who call a judge twice with the answers swapped and declare a win only
  when both calls agree;
* ``consistency``: % of pairs with the same answer in both orders (position consistency,
  Zheng et al. 2023; Shi et al. 2024); ``first_position`` / ``second_position``: % of pairs
  answered with the answer at position 1 (2) in both orders, i.e. inconsistent and biased
  toward that position (Zheng et al.'s Table 2); ``no_verdict``: % of pairs without an
  answer in some order. The four add up to 100;
* ``first_preference``: % of the position-biased pairs that favour position 1
  (``first_position / (first_position + second_position)``; 50 = no side, None when every
  pair is consistent);
* ``agreement``: % of the human votes, on pairs with a verdict, that prefer the judge's answer,
  votes for a tie left out (MT-Bench's agreement "without tie"); ``agreement_with_ties``: % of
  all human votes equal to the verdict, a tie vote agreeing with a tie verdict (MT-Bench's
  "with tie"). The votes are the instance's ``votes_a`` / ``votes_b`` / ``votes_tie`` (an
  MT-Bench pair judged by several people), else one vote for its target.

With a tie label (``task_prompt.tie_label``, docs/evaluation.md "Tie label") an order's answer
may be the tie label (``InstanceRecord.ties``): a pair answered with it in both orders is
consistent and its verdict a tie; a pair answered with it in one order only is inconsistent and
a tie (``one_tie``, % of pairs, then a fifth share of the 100); ``tie_answers`` is the % of
answers (two per pair) that are the tie label. Both are None (absent from results.json) in runs
without a tie label.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from posdebias.core.instance import Instance
from posdebias.evaluation.metrics import Percent
from posdebias.evaluation.runner import InstanceRecord

#: The verdict of a pair that was not answered alike in both orders.
TIE = -1


class JudgeMetrics(BaseModel):
    """A pairwise judge's position consistency and agreement with people (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pairs: int = Field(description="pairs shown in both orders")
    consistency: Percent = Field(description="% of pairs with the same answer in both orders")
    first_position: Percent = Field(description="% of pairs answered position 1 in both orders")
    second_position: Percent = Field(description="% of pairs answered position 2 in both orders")
    no_verdict: Percent = Field(description="% of pairs without an answer in some order")
    first_preference: Percent | None = Field(
        description="% of the position-biased pairs that favour position 1 (50: no side)"
    )
    ties: Percent = Field(
        description="% of pairs whose verdict is a tie (not alike in both orders, or the tie "
        "label in both)"
    )
    human_votes: int = Field(description="human votes on the pairs")
    agreement: Percent | None = Field(description="% agreement with the votes, ties left out")
    agreement_with_ties: Percent | None = Field(
        description="% agreement with every vote, a tie verdict agreeing with a tie vote"
    )
    tie_answers: Percent | None = Field(
        default=None, description="% of the answers (two per pair) that are the tie label"
    )
    one_tie: Percent | None = Field(
        default=None, description="% of pairs answered with the tie label in one order only"
    )

    @model_serializer(mode="wrap")
    def _without_tie_label(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The tie-label counts only in runs with a tie label: other runs' rows read as
        before it existed."""
        fields: dict[str, Any] = handler(self)
        for name in TIE_LABEL_FIELDS:
            if fields.get(name) is None:
                fields.pop(name, None)
        return fields


#: The JudgeMetrics fields of a run with a tie label only.
TIE_LABEL_FIELDS = ("tie_answers", "one_tie")


def human_votes(instance: Instance) -> tuple[int, int, int]:
    """(votes for answer 1, for answer 2, for a tie) of a pair, in the file's order."""
    meta: Any = instance.metadata.get("meta") or {}
    keys = ("votes_a", "votes_b", "votes_tie")
    if all(isinstance(meta.get(key), int) for key in keys):
        return int(meta["votes_a"]), int(meta["votes_b"]), int(meta["votes_tie"])
    return (1, 0, 0) if instance.target == 0 else (0, 1, 0)


def _both_orders(record: InstanceRecord) -> tuple[int, int] | None:
    """The indices of the file order and of the swapped order among the record's orders."""
    index = {tuple(order): t for t, order in reversed(list(enumerate(record.orders)))}
    if (0, 1) in index and (1, 0) in index:
        return index[(0, 1)], index[(1, 0)]
    return None


def judge_metrics(
    records: Sequence[InstanceRecord], instances: Sequence[Instance], labels: Iterable[str]
) -> dict[str, JudgeMetrics] | None:
    """Per row, the judge measures of a pairwise run; None for a run of another task or one
    that never showed a pair in both orders (``--orders 1``)."""
    if not instances or any(i.task != "pairwise_judge" or i.n != 2 for i in instances):
        return None
    shown = [
        (record, instance, both)
        for record, instance in zip(records, instances, strict=True)
        if (both := _both_orders(record)) is not None
    ]
    if not shown:
        return None
    out = {}
    for label in labels:
        same = first = second = missing = 0
        agreed = counted = agreed_all = counted_all = 0
        tie_label = any(label in record.ties for record, _, _ in shown)
        answered_tie = both_tie = one_tie = 0
        for record, instance, (file_order, swapped) in shown:
            choices = record.choices[label]
            chosen = record.chosen[label]
            flags = record.ties.get(label) or [False] * len(choices)
            said_tie = (flags[file_order], flags[swapped])
            answered_tie += sum(said_tie)
            positions = (choices[file_order], choices[swapped])
            if any(p < 0 and not tie for p, tie in zip(positions, said_tie, strict=True)):
                missing += 1
                verdict = TIE
            elif all(said_tie):
                same += 1
                both_tie += 1
                verdict = TIE
            elif any(said_tie):
                one_tie += 1
                verdict = TIE
            elif chosen[file_order] == chosen[swapped]:
                same += 1
                verdict = chosen[file_order]
            else:
                first += positions == (0, 0)
                second += positions == (1, 1)
                verdict = TIE
            votes = human_votes(instance)
            counted_all += sum(votes)
            agreed_all += votes[2] if verdict == TIE else votes[verdict]
            if verdict != TIE:
                counted += votes[0] + votes[1]
                agreed += votes[verdict]
        pairs = len(shown)
        out[label] = JudgeMetrics(
            pairs=pairs,
            consistency=100.0 * same / pairs,
            first_position=100.0 * first / pairs,
            second_position=100.0 * second / pairs,
            no_verdict=100.0 * missing / pairs,
            first_preference=100.0 * first / (first + second) if first + second else None,
            ties=100.0 * (pairs - same + both_tie) / pairs,
            human_votes=counted_all,
            agreement=100.0 * agreed / counted if counted else None,
            agreement_with_ties=100.0 * agreed_all / counted_all if counted_all else None,
            tie_answers=100.0 * answered_tie / (2 * pairs) if tie_label else None,
            one_tie=100.0 * one_tie / pairs if tie_label else None,
        )
    return out
