"""Position bias in lm-evaluation-harness's own tables: rotated tasks and their metrics.

The same rotated tasks and metrics as lmms-eval's (:mod:`posdebias.integrations.lmms_eval_tasks`
holds the transform, the records and the aggregations; they are harness-neutral), with what
lm-eval does its own way:

* a multiple-choice response is the log-likelihood of each choice and lm-eval picks the
  LARGEST (lmms-eval: the smallest loss), so :func:`process_results` reads the argmax;
* an lm-eval multiple-choice document names its truth ``answer`` as an index into its choices
  from 0 (MMLU: ``{"question", "choices": [...], "answer": 2}``), so :data:`rotated_docs`
  reads and moves it that way (a letter stays a letter);
* lm-eval hands a model the documents of its requests only, so a task written by
  ``posdebias lm-eval-task`` records the file of its calibration split in every document
  (``calibration=task``).

``posdebias lm-eval-task`` writes these tasks from a benchmark (:func:`write_rotated_tasks`
with ``harness="lm-eval"``); ``process_docs: !function
posdebias.integrations.lm_eval_tasks.rotated_docs`` rotates a multiple-choice task you have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from posdebias.integrations.lmms_eval_tasks import (
    CANDIDATE_FIELDS,
    accuracy,
    choice_records,
    circular,
    consistency,
    doc_labels,
    doc_to_choice,
    doc_to_target,
    doc_to_target_index,
    doc_to_text,
    doc_to_visual,
    parse_choice,
    rotation_transform,
    rstd,
)

__all__ = [
    "LM_EVAL_FIELDS",
    "accuracy",
    "circular",
    "consistency",
    "doc_choices",
    "doc_to_choice",
    "doc_to_target",
    "doc_to_target_index",
    "doc_to_text",
    "doc_to_visual",
    "process_results",
    "rotated_docs",
    "rotation_transform",
    "rstd",
]

#: The candidate lists of an lm-eval document: MMLU's ``choices`` and posdebias's own fields.
LM_EVAL_FIELDS = ("choices", *CANDIDATE_FIELDS)

#: ``process_docs: !function posdebias.integrations.lm_eval_tasks.rotated_docs``: any
#: multiple-choice task with a list of choices (MMLU's layout) in its N cyclic rotations; its
#: ``answer`` (an index from 0, or a letter) moves with the choices, so the task's own
#: ``doc_to_text`` and ``doc_to_target`` still read it.
rotated_docs = rotation_transform(None, fields=LM_EVAL_FIELDS, answer_base=0)


def process_results(doc: Mapping[str, Any], results: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """One record per document under every metric: the chosen position is the generated
    label, or the choice of the largest log-likelihood (lm-eval's multiple-choice rule)."""
    labels = doc_choices(doc)
    first = results[0]
    if isinstance(first, str):
        choice = parse_choice(first, labels)
    else:
        choice = int(np.argmax([float(pair[0]) for pair in results]))
    return choice_records(doc, choice, labels)


def doc_choices(doc: Mapping[str, Any]) -> list[str]:
    """The labels of a document: posdebias's own, or one letter per choice (A, B, ...)."""
    if doc.get("choices") and not doc.get("texts") and not doc.get("options"):
        return [chr(ord("A") + k) for k in range(len(doc["choices"]))]
    return doc_labels(doc)
