"""Decoder rows in a run: decisions made once, logged as made, reused on resume.

Every decision (its texts, parsed answers and cost) is appended to ``generations[.rankR].jsonl``
in the run directory and fsynced before the instance's record is written, keyed by the decoder's
digest (name + options) and the view (instance id + images in order). A killed run loses at
most the decision being generated; ``--resume`` reads the log and generates only what is
missing, so the resumed results equal an uninterrupted run's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posdebias._threads import apply_threads
from posdebias.adapters.base import Adapter
from posdebias.core.instance import Instance
from posdebias.decoders.base import Decision, Decoder
from posdebias.decoders.generated import tie_label_of
from posdebias.errors import OutputError
from posdebias.evaluation.logcheck import NO_ANSWER, corrupt  # NO_ANSWER: no valid answer
from posdebias.evaluation.runner import InstanceRecord, LoggedStore, observation_key


def decision_key(decoder: Decoder, view: Instance) -> str:
    return f"{decoder.digest()}|{observation_key(view)}"


def view_seed(seed: int, view: Instance) -> int:
    """The sampling seed of one view: a function of the run seed and the view only."""
    digest = hashlib.sha256(f"{seed}\x1f{observation_key(view)}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class DecisionCache(LoggedStore[Decision]):
    """Decisions by :func:`decision_key` (logged in a run directory)."""

    field = "decision"

    def read(self, row: Any) -> Decision:
        decision = _logged_decision(row)
        if decision is None:
            raise corrupt("not a decision this version wrote")
        return decision


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _logged_decision(row: object) -> Decision | None:
    """The decision of one generation-log record, or None when the record is not well formed."""
    if not isinstance(row, dict) or not isinstance(row.get("key"), str):
        return None
    payload = row.get("decision")
    fields = ("choice", "texts", "answers", "forward_passes", "generated_tokens", "seconds")
    if not isinstance(payload, dict) or set(payload) != set(fields):
        return None
    texts, answers, seconds = payload["texts"], payload["answers"], payload["seconds"]
    well_formed = (
        (payload["choice"] is None or _is_count(payload["choice"]))
        and isinstance(texts, list)
        and all(isinstance(text, str) for text in texts)
        and isinstance(answers, list)
        and all(answer is None or _is_count(answer) for answer in answers)
        and _is_count(payload["forward_passes"])
        and _is_count(payload["generated_tokens"])
        and isinstance(seconds, (int, float))
        and not isinstance(seconds, bool)
    )
    return Decision.from_dict(payload) if well_formed else None


def decide_cached(
    decoder: Decoder,
    adapter: Adapter,
    views: Sequence[Instance],
    cache: DecisionCache,
    *,
    batch_size: int = 1,
    seed: int = 0,
) -> list[Decision]:
    """The decoder's decisions for ``views``, running it only for views not in ``cache``."""
    keys = [decision_key(decoder, view) for view in views]
    missing: dict[str, Instance] = {}
    for key, view in zip(keys, views, strict=True):
        if cache.get(key) is None and key not in missing:
            missing[key] = view  # two orders of an instance may coincide: decide once
    if missing:
        todo = list(missing.values())
        apply_threads()  # in this thread: the count of the enclosing torch_threads scope
        decided = decoder.decide(
            adapter, todo, batch_size=batch_size, seeds=[view_seed(seed, v) for v in todo]
        )
        for key, decision in zip(missing, decided, strict=True):
            cache.put(key, decision)
    found = [cache.get(key) for key in keys]
    # a judge's tie label is parsed as position N (core/answers.py)
    tie = int(any(tie_label_of(adapter, view.task) is not None for view in views))
    for view, known in zip(views, found, strict=True):
        if known is None or (known.choice is not None and known.choice >= view.n + tie):
            raise OutputError(
                f"the generation log holds an answer outside 1..{view.n} for {decoder.name} on "
                f"instance {view.id!r} (the log was edited or damaged); delete the run directory "
                "and start again without --resume"
            )
    return [known for known in found if known is not None]  # all present: checked above


@dataclass
class DecoderCost:
    """What a decoder row cost per test instance (all T orders), from its logged decisions."""

    forward_passes: float
    generated_tokens: float
    seconds: float

    def as_dict(self) -> dict[str, float]:
        """The reproducible part (seconds go to the results' ``timing``)."""
        return {
            "forward_passes_per_instance": self.forward_passes,
            "generated_tokens_per_instance": self.generated_tokens,
        }


def decoder_costs(
    decoders: Mapping[str, Decoder],
    views: Mapping[str, Sequence[Instance]],
    cache: DecisionCache,
) -> dict[str, DecoderCost]:
    """Cost per decoder label over every test instance's views (resumed ones included)."""
    costs = {}
    count = max(len(views), 1)
    for label, decoder in decoders.items():
        decisions = [
            cache.get(decision_key(decoder, view)) for shown in views.values() for view in shown
        ]
        present = [d for d in decisions if d is not None]
        costs[label] = DecoderCost(
            forward_passes=sum(d.forward_passes for d in present) / count,
            generated_tokens=sum(d.generated_tokens for d in present) / count,
            seconds=sum(d.seconds for d in present) / count,
        )
    return costs


class DecoderRows:
    """Adds the decoder rows to each instance record (the same T orders as the calibrators)."""

    def __init__(
        self,
        adapter: Adapter,
        decoders: Mapping[str, Decoder],
        cache: DecisionCache,
        *,
        batch_size: int = 1,
        seed: int = 0,
    ) -> None:
        self.adapter = adapter
        self.decoders = dict(decoders)
        self.cache = cache
        self.batch_size = batch_size
        self.seed = seed

    def add(self, record: InstanceRecord, instance: Instance) -> InstanceRecord:
        views = [instance.permuted(order) for order in record.orders]
        for label, decoder in self.decoders.items():
            decisions = decide_cached(
                decoder, self.adapter, views, self.cache, batch_size=self.batch_size, seed=self.seed
            )
            # a parsed answer of N is a judge's tie label: no answer chosen, a tie in that order
            ties = [d.choice == instance.n for d in decisions]
            choices = [
                NO_ANSWER if d.choice is None or tie else int(d.choice)
                for d, tie in zip(decisions, ties, strict=True)
            ]
            if tie_label_of(self.adapter, instance.task) is not None:
                record.ties[label] = ties
            record.choices[label] = choices
            record.chosen[label] = [
                NO_ANSWER if choice == NO_ANSWER else int(order[choice])
                for choice, order in zip(choices, record.orders, strict=True)
            ]
        return record
