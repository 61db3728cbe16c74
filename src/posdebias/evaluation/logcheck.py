"""Rows of a run's logs, checked before ``--resume`` trusts them.

The logs are ours, but they sit in a folder the user can edit: a line that is valid JSON with
the wrong shape (a list, a missing key, a choice of 99 among 4 images) must be a clear error,
never a crash and never a silently wrong metric.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posdebias._inputs import excerpt
from posdebias.errors import ResumeError

#: The recorded choice of an order without a valid answer (a decoder's; counts as wrong).
NO_ANSWER = -1
_FIX = "delete the run directory (or the log) and run again without --resume"


def corrupt(what: str) -> ResumeError:
    """A run log record this version did not write (``what`` says how), and what to do."""
    return ResumeError(f"a run log record is corrupt ({what}); {_FIX}")


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise corrupt(f"{name} must be a list of integers, got {excerpt(value, 40)}")
    return value


def chosen_key(row: Mapping[str, Any]) -> str:
    """The key of the chosen candidates in a record: ``chosen``, or ``chosen_images`` as the
    logs of 0.2 wrote it (read, never written)."""
    return "chosen_images" if "chosen" not in row and "chosen_images" in row else "chosen"


def check_record_row(row: Any) -> None:
    """An instance record: id, T orders (permutations of one N), targets and, per calibrator or
    decoder, T choices in range (a decoder's -1: no valid answer) and the candidates they
    show."""
    if not isinstance(row, Mapping):
        raise corrupt(f"expected an object, got {type(row).__name__}")
    chosen = chosen_key(row)
    for key in ("instance_id", "orders", "targets", "choices", chosen):
        if key not in row:
            raise corrupt(f"missing {key!r}")
    if not isinstance(row["instance_id"], str) or not row["instance_id"]:
        raise corrupt(f"instance_id must be a string, got {excerpt(row['instance_id'], 40)}")
    orders = row["orders"]
    if not isinstance(orders, list) or not orders:
        raise corrupt("orders must be a non-empty list")
    n = None
    for order in orders:
        order = _int_list(order, "an order")
        n = n or len(order)
        if sorted(order) != list(range(n)):
            raise corrupt(f"order {excerpt(order, 40)} is not a permutation of 0..{n - 1}")
    assert n is not None
    targets = _int_list(row["targets"], "targets")
    if len(targets) != len(orders) or any(not 0 <= t < n for t in targets):
        raise corrupt(f"targets {excerpt(targets, 40)} do not fit {len(orders)} orders of N={n}")
    for name in ("choices", chosen):
        if not isinstance(row[name], Mapping):
            raise corrupt(f"{name} must be an object of calibrator labels")
    for label, choices in row["choices"].items():
        choices = _int_list(choices, f"choices of {excerpt(label, 40)}")
        if len(choices) != len(orders) or any(not NO_ANSWER <= c < n for c in choices):
            raise corrupt(
                f"choices of {excerpt(label, 40)} do not fit {len(orders)} orders of N={n}"
            )
        shown = row[chosen].get(label)
        expected = [
            NO_ANSWER if c == NO_ANSWER else order[c]
            for order, c in zip(orders, choices, strict=True)
        ]
        if shown != expected:
            raise corrupt(f"{chosen} of {excerpt(label, 40)} disagree with its choices")
    _check_rankings(row, len(orders), n, chosen)
    ties = row.get("ties")
    if ties is not None and not (
        isinstance(ties, Mapping)
        and all(
            label in row["choices"]
            and isinstance(flags, list)
            and len(flags) == len(orders)
            and all(isinstance(flag, bool) for flag in flags)
            for label, flags in ties.items()
        )
    ):
        raise corrupt("ties must hold, per row label with choices, one true/false per order")


def _check_rankings(row: Mapping[str, Any], orders: int, n: int, chosen: str) -> None:
    """Optional ``rankings``: per row label with choices, T permutations of the N candidates
    whose first is the chosen candidate."""
    rankings = row.get("rankings")
    if rankings is None:
        return
    if not isinstance(rankings, Mapping):
        raise corrupt("rankings must be an object of calibrator labels")
    for label, ranked in rankings.items():
        images = row[chosen].get(label)
        if images is None or not isinstance(ranked, list) or len(ranked) != orders:
            raise corrupt(f"rankings of {excerpt(label, 40)} do not fit its choices")
        for ranking, image in zip(ranked, images, strict=True):
            ranking = _int_list(ranking, f"a ranking of {excerpt(label, 40)}")
            if sorted(ranking) != list(range(n)) or ranking[0] != image:
                raise corrupt(f"a ranking of {excerpt(label, 40)} is no ranking of its choice")


def truth_problem(
    orders: list[list[int]], targets: list[int], truth: int, expected: list[list[int]]
) -> str | None:
    """Why a logged record does not fit its instance (None if it does): orders other than the
    ones the run draws for it, or targets other than where the benchmark's truth (``truth``,
    a position in the file order) lands in those orders. Metrics come from the benchmark:
    a log's own copy of the truth is checked, never believed."""
    if orders != expected:
        return (
            f"shows the candidates in orders {excerpt(orders, 60)}, not the ones this run "
            f"draws for it ({excerpt(expected, 60)})"
        )
    where = [order.index(truth) for order in orders]
    if targets != where:
        return (
            f"has targets {excerpt(targets, 40)}, but the benchmark's truth (candidate "
            f"{truth + 1} of the file) is at positions {where} of its orders"
        )
    return None


def check_observation_row(row: Any) -> None:
    """An observation log row: a string key and an observation object."""
    if not isinstance(row, Mapping):
        raise corrupt(f"expected an object, got {type(row).__name__}")
    if not isinstance(row.get("key"), str) or not isinstance(row.get("observation"), Mapping):
        raise corrupt("an observation row needs a string 'key' and an 'observation' object")
