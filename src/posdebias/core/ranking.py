"""Rank aggregation: the ranking closest to several rankings of the same candidates.

Permutation self-consistency (Tang et al., NAACL 2024) shows a list in several orders, reads a
ranking from each, and keeps the central ranking: the one with the least total Kendall tau
distance to them all (the Kemeny ranking). The Kemeny ranking is found exactly by dynamic
programming over subsets of candidates up to :data:`EXACT_KEMENY_MAX_N` candidates (the
paper's lists of 20 use a solver; ours stay small); beyond, the Borda ranking (mean position)
is improved by swapping adjacent candidates while a swap lowers the distance (local
Kemenisation, Dwork et al., WWW 2001), which keeps the Condorcet winner on top.
"""

from __future__ import annotations

import numpy as np

from posdebias.errors import InputError

#: Largest N whose Kemeny ranking is computed exactly (2^N subsets).
EXACT_KEMENY_MAX_N = 8


def precedence(rankings: np.ndarray) -> np.ndarray:
    """[N, N] counts: ``P[a, b]`` = how many of the rankings ([R, N], best first) put candidate
    ``a`` above candidate ``b``."""
    rankings = np.asarray(rankings, dtype=np.int64)
    if rankings.ndim != 2 or rankings.shape[0] == 0:
        raise InputError(f"rankings must be a non-empty [R, N] array, got {rankings.shape}")
    place = _places(rankings)
    return (place[:, :, None] < place[:, None, :]).sum(axis=0)


def borda(rankings: np.ndarray) -> np.ndarray:
    """Candidates by mean position over the rankings (ties: lower candidate index first)."""
    place = _places(np.asarray(rankings, dtype=np.int64))
    return np.lexsort((np.arange(place.shape[1]), place.sum(axis=0)))


def _places(rankings: np.ndarray) -> np.ndarray:
    """[R, N]: the position each ranking (best first) puts each candidate at."""
    count, n = rankings.shape
    place = np.empty_like(rankings)
    place[np.arange(count)[:, None], rankings] = np.arange(n)
    return place


def _exact(p: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The Kemeny ranking by dynamic programming over the set of candidates placed first:
    adding ``x`` after the set S costs the rankings that put x above a member of S. Among
    optimal rankings the one that follows ``start`` longest wins (candidates tried in that
    order, only a strictly lower cost replaces an earlier choice)."""
    n = p.shape[0]
    full = (1 << n) - 1
    cost = np.full(1 << n, np.iinfo(np.int64).max, dtype=np.int64)
    cost[0] = 0
    choice = np.full(1 << n, -1, dtype=np.int64)
    above = np.zeros((1 << n, n), dtype=np.int64)  # above[S, x] = sum_{s in S} P[x, s]
    for subset in range(1, full + 1):
        low = (subset & -subset).bit_length() - 1
        above[subset] = above[subset & (subset - 1)] + p[:, low]
    for subset in range(full + 1):
        if cost[subset] == np.iinfo(np.int64).max:
            continue
        for x in start.tolist():
            bit = 1 << x
            if subset & bit:
                continue
            total = cost[subset] + above[subset, x]
            if total < cost[subset | bit]:
                cost[subset | bit] = total
                choice[subset | bit] = x
    ranking = []
    subset = full
    while subset:
        x = int(choice[subset])
        ranking.append(x)
        subset ^= 1 << x
    return np.array(ranking[::-1], dtype=np.int64)


def _local(p: np.ndarray, ranking: np.ndarray) -> np.ndarray:
    """Swap adjacent candidates while more rankings prefer the lower one (local Kemenisation)."""
    ranking = ranking.copy()
    changed = True
    while changed:
        changed = False
        for i in range(ranking.size - 1):
            a, b = ranking[i], ranking[i + 1]
            if p[b, a] > p[a, b]:
                ranking[i], ranking[i + 1] = b, a
                changed = True
    return ranking


def kemeny(rankings: np.ndarray) -> np.ndarray:
    """The central ranking of ``rankings`` ([R, N], each a permutation of candidates, best
    first): exact Kemeny up to :data:`EXACT_KEMENY_MAX_N` candidates, else Borda improved by
    local Kemenisation (module docstring). Deterministic; ties follow the Borda order."""
    rankings = np.asarray(rankings, dtype=np.int64)
    p = precedence(rankings)
    start = borda(rankings)
    if rankings.shape[1] <= EXACT_KEMENY_MAX_N:
        return _exact(p, start)
    return _local(p, start)
