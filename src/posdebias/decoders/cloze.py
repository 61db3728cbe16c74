"""Cloze rows: each option's text scored as the model's reply to the question alone.

The options are NOT listed in the prompt and no label is asked for: for each candidate k the
model is posed the question alone (a user message, the chat template's generation prompt) and
the candidate's text is scored as its reply,

    sum:      s_k = log P(text_k | question) = sum_t log P(token_t | question, tokens_<t)
    mean:     s_k / (tokens of text_k)
    per_char: s_k / (characters of text_k)

over the full vocabulary, and the row chooses argmax_k. This is lm-evaluation-harness's
multiple-choice scoring (``acc`` is the sum; its ``acc_norm`` divides by the characters, here
``per_char``; ``mean`` is the per-token mean): what the model knows about the answers with no
labels to map them to, the ceiling a label answer free of position bias could reach.

Each option is scored without the others, so the choice is the same candidate under every
order by construction (``order_independent``): the row has no position bias to measure, and
its Cons. and RStd are not shown as if it had. Exact ties go to the candidate whose identity
sorts first, not to a position. The options of one instance are scored once for all its
orders: N forward passes per instance.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator

from posdebias._inputs import excerpt
from posdebias._markers import register_hook
from posdebias.adapters.base import Adapter, ReplyRequest, ReplyScore
from posdebias.core.instance import Instance
from posdebias.core.tasks import check_placeholders
from posdebias.decoders.base import Decision, Decoder, DecoderOptions
from posdebias.errors import AdapterError, InputError

Score = Literal["sum", "mean", "per_char"]
SCORE_TEXT = (
    "sum (log-probability of the option's text, lm-eval's acc), mean (per token) or "
    "per_char (per character, lm-eval's acc_norm)"
)


class ClozeOptions(DecoderOptions):
    score: Score = Field(default="sum", description=SCORE_TEXT)
    question: str = Field(
        default="{question}",
        description="the user's message; {question} is the instance's stem (the options are "
        "never shown)",
    )

    @field_validator("question")
    @classmethod
    def _shows_the_question(cls, value: str) -> str:
        check_placeholders(value, {"question": ""})
        if "{question}" not in value:
            raise ValueError("the message never shows the stem: put {question} in it")
        return value


class ClozeMeanOptions(ClozeOptions):
    score: Score = Field(default="mean", description=SCORE_TEXT)


def reply_value(score: ReplyScore, kind: Score) -> float:
    """One option's cloze score: the sum, or the sum per token or per character."""
    if kind == "mean":
        return score.logprob / score.tokens
    if kind == "per_char":
        return score.logprob / score.characters
    return score.logprob


def order_free_choice(values: Sequence[float], identities: Sequence[str]) -> int:
    """The position of the best value; a tie goes to the candidate whose identity sorts
    first, so that the chosen candidate never depends on the order."""
    best = max(values)
    tied = [position for position, value in enumerate(values) if value == best]
    return min(tied, key=lambda position: identities[position])


class Cloze(Decoder):
    """The options' texts scored as the reply to the question alone (sum of log-probs)."""

    name = "cloze"
    Options = ClozeOptions
    options: ClozeOptions
    summary = "each option's text scored as the reply to the question alone (lm-eval's acc)"
    order_independent = True

    def message(self, instance: Instance) -> str:
        return self.options.question.format(question=instance.stem)

    def check(self, adapter: Adapter, instances: Sequence[Instance]) -> None:
        problem = adapter.reply_problem()
        if problem is not None:
            raise AdapterError(f"decoder {self.name!r}: {problem}")
        adapter.check_replies(
            [
                ReplyRequest(message=self.message(instance), reply=text, source=instance.id)
                for instance in instances
                for text in check_text_candidates(instance, self.name)
            ]
        )

    def decide(
        self,
        adapter: Adapter,
        views: Sequence[Instance],
        *,
        batch_size: int = 1,
        seeds: Sequence[int],
    ) -> list[Decision]:
        started = time.perf_counter()
        index: dict[tuple[str, str], int] = {}
        requests: list[ReplyRequest] = []
        for view in views:
            message = self.message(view)
            for text in check_text_candidates(view, self.name):
                if (message, text) not in index:
                    index[(message, text)] = len(requests)
                    requests.append(ReplyRequest(message=message, reply=text, source=view.id))
        scores = adapter.score_replies(requests, batch_size=batch_size)
        if len(scores) != len(requests):
            raise AdapterError(
                f"adapter {adapter.name!r} returned {len(scores)} reply scores for "
                f"{len(requests)} replies"
            )
        share = (time.perf_counter() - started) / max(len(views), 1)
        decisions: list[Decision] = []
        charged: set[int] = set()
        for view in views:
            message = self.message(view)
            rows = [index[(message, text)] for text in check_text_candidates(view, self.name)]
            values = [reply_value(scores[row], self.options.score) for row in rows]
            if not all(math.isfinite(value) for value in values):
                raise AdapterError(
                    f"adapter {adapter.name!r} scored a reply of instance {excerpt(view.id)} "
                    "as NaN or infinite; check the model's numerics (dtype)"
                )
            fresh = set(rows) - charged  # each reply costs one forward, in the first view
            charged |= fresh
            decisions.append(
                Decision(
                    choice=order_free_choice(values, view.candidate_ids),
                    forward_passes=len(fresh),
                    seconds=share,
                )
            )
        return decisions


class ClozeMean(Cloze):
    """Cloze with the per-token mean log-probability (longer options are not penalised)."""

    name = "cloze_mean"
    Options = ClozeMeanOptions
    options: ClozeMeanOptions
    summary = "cloze with the per-token mean log-probability of each option's text"


def check_text_candidates(instance: Instance, decoder: str) -> list[str]:
    """The candidates' texts, or an InputError when the instance shows any image (cloze
    scores texts alone) or a candidate has no text."""
    if instance.all_images or any(text is None for text in instance.texts):
        raise InputError(
            f"decoder {decoder!r} scores each option's text as the reply to the question "
            f"alone, but instance {excerpt(instance.id)} has image candidates or images in its "
            "stem; use it on text tasks (multiple_choice, pairwise_judge, rerank with text "
            "candidates only)"
        )
    return [text for text in instance.texts if text is not None]


posdebias_register_decoders = register_hook(Cloze, ClozeMean)


__all__ = ["Cloze", "ClozeMean", "order_free_choice", "reply_value"]
