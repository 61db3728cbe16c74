"""permutation_self_consistency: the central ranking of the rankings read in several orders.

Permutation self-consistency (Tang et al., "Found in the Middle: Permutation Self-Consistency
Improves Listwise Ranking in Large Language Models", NAACL 2024) shows the list in several
orders, reads a ranking from each (here: the candidates by label score) and keeps the ranking
with the least total Kendall tau distance to them all, the Kemeny ranking
(:func:`posdebias.core.ranking.kemeny`). Where ``permutation_average`` averages the scores,
this aggregates the rankings: a candidate a few orders score very high cannot outvote the
order most orders agree on. The orders are ``permutation_average``'s (N cyclic shifts by
default, or random permutations); one forward pass each.

Its scores encode the aggregated ranking only (the log-softmax of minus each candidate's place
in it): the ranking and the choice are the method's output, the probabilities are not.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from posdebias._markers import register_hook
from posdebias.calibrators.permutation_average import OrderCombiner, OrderOptions
from posdebias.core.observation import Prediction, log_softmax
from posdebias.core.ranking import borda, kemeny


class PermutationSelfConsistencyOptions(OrderOptions):
    aggregation: Literal["kemeny", "borda"] = Field(
        default="kemeny",
        description="central ranking: kemeny (least Kendall tau distance; the paper's) or "
        "borda (mean place)",
    )


class PermutationSelfConsistency(OrderCombiner):
    name = "permutation_self_consistency"
    Options = PermutationSelfConsistencyOptions
    options: PermutationSelfConsistencyOptions
    summary = "central (Kemeny) ranking of the rankings read in several candidate orders"

    def _combine(self, per_order: np.ndarray) -> Prediction:
        rankings = np.argsort(-per_order, axis=1, kind="stable")  # best first, per order
        aggregate = kemeny if self.options.aggregation == "kemeny" else borda
        ranking = aggregate(rankings)
        place = np.argsort(ranking)  # each candidate's place in the ranking
        return Prediction(scores=log_softmax(-place), choice=int(ranking[0]))


posdebias_register_calibrators = register_hook(PermutationSelfConsistency)
