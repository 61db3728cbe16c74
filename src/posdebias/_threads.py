"""torch's CPU threads: one default for a shared machine, one scope that sets and restores them.

torch starts with one intra-op thread per core. On a machine other processes also use, that is
the slowest setting there is: on a busy 2-core machine a query of the bundled organism took
1,451 ms with torch's 2 threads and 94 ms with 1 (``perf/serving.py``), because the
threads wait for each other on cores that are not free. Too few threads costs at most the
share of the cores left idle; too many costs far more. So the default is half the CPUs this
process may use (``OMP_NUM_THREADS`` when set), and a count chosen by the user
(``--threads``, ``Debiaser(threads=...)``) holds over a preset's or the default.

torch is imported only where a model runs: :func:`torch_threads` records the count and
:func:`apply_threads` (called when a model is loaded and before each forward) sets it once torch
is there, so commands that never load torch (the simulated model) never import it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from posdebias._inputs import check_whole_number


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """torch CPU threads when none is chosen: ``OMP_NUM_THREADS`` if it holds a whole number,
    else half the CPUs this process may use (at least 1)."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) >= 1:
        return min(int(value), available_cpus())
    return max(1, available_cpus() // 2)


def check_threads(value: Any, what: str = "threads") -> int:
    """``value`` if it is a whole number from 1 to the CPUs of this machine, else an InputError
    (more threads than CPUs only slows torch down; far more crash its thread pool)."""
    return check_whole_number(what, value, 1, available_cpus())


@dataclass
class _Scope:
    count: int
    user: bool
    before: int | None = None  # torch's count when this scope first changed it


_SCOPE: ContextVar[_Scope | None] = ContextVar("posdebias_torch_threads", default=None)


@contextlib.contextmanager
def torch_threads(threads: int | None = None, *, user: bool = False) -> Iterator[int]:
    """Run torch on ``threads`` CPU threads inside the block (None: :func:`default_threads`);
    torch's count is restored after.

    ``user``: the count was chosen by the user (``--threads``, ``Debiaser(threads=...)``); a
    scope inside it that is not (a preset's count, the default) keeps the user's. Yields the
    count in force.
    """
    outer = _SCOPE.get()
    if outer is not None and outer.user and not user:
        apply_threads()
        yield outer.count
        return
    scope = _Scope(check_threads(threads) if threads is not None else default_threads(), user)
    token = _SCOPE.set(scope)
    try:
        apply_threads()
        yield scope.count
    finally:
        _SCOPE.reset(token)
        if scope.before is not None:
            import torch

            torch.set_num_threads(scope.before)


def apply_threads() -> None:
    """Put torch on the count of the enclosing :func:`torch_threads` scope, if torch is loaded
    (called before work that runs torch; each thread checks its own count, since a thread pool's
    worker may have started under another)."""
    scope = _SCOPE.get()
    if scope is None or "torch" not in sys.modules:
        return
    import torch

    current = torch.get_num_threads()
    if current != scope.count:
        if scope.before is None:
            scope.before = current
        torch.set_num_threads(scope.count)
