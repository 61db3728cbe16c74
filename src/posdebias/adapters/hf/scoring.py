"""Restricted label scoring: s_j = log P(c_j | x), normalised over the N labels.

docs/method.md, "Observations": a label of several tokens (``"10"`` is ``"1" "0"`` for Qwen) scores
the joint log-probability of its tokens, each step a softmax RESTRICTED to the tokens valid there:
step 1 the first tokens of all N labels; later steps the continuations of that prefix, plus the
end-of-answer token where a shorter label may stop (``"1"`` vs ``"10"``). The valid tokens form a
trie; a step with one valid token contributes log 1 = 0 and needs no model call, so only the
root (the prompt pass) and every prefix node with two or more options need logits. Each such
prefix costs one cached decoding step that feeds the prefix tokens on top of the prompt's KV
cache, after which the cache is rewound; the scores then sum to probability 1 exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from posdebias.errors import AdapterError

if TYPE_CHECKING:
    import torch

Prefix = tuple[int, ...]


@dataclass(frozen=True)
class LabelPlan:
    """The token paths of N labels and the decoding steps they need.

    Attributes:
        paths: per label, its tokens plus the end token where another label continues it.
        options: valid next tokens after each prefix (``()`` is the prompt).
        steps: non-empty prefixes that need a decoding step (two or more options), shortest
            first, in a deterministic order.
    """

    paths: tuple[Prefix, ...]
    options: dict[Prefix, tuple[int, ...]]
    steps: tuple[Prefix, ...]


def plan_labels(
    label_tokens: Sequence[Sequence[int]], end_token: int | None, labels: Sequence[str] = ()
) -> LabelPlan:
    """Build the trie of label token paths (see the module docstring)."""
    raw = [tuple(tokens) for tokens in label_tokens]
    names = list(labels) or [str(tokens) for tokens in raw]
    for index, tokens in enumerate(raw):
        if not tokens:
            raise AdapterError(f"label {names[index]!r} tokenizes to nothing")
        for other in range(index):
            if raw[other] == tokens:
                raise AdapterError(
                    f"labels {names[other]!r} and {names[index]!r} tokenize identically "
                    f"({list(tokens)}); the tokenizer cannot tell them apart, use another label set"
                )
    paths = []
    for tokens in raw:
        continued = any(len(o) > len(tokens) and o[: len(tokens)] == tokens for o in raw)
        if continued:
            if end_token is None:
                raise AdapterError(
                    "a label is a prefix of another (e.g. '1' and '10') and the model has no "
                    "end-of-answer token; set the adapter option end_token"
                )
            tokens = (*tokens, end_token)
        paths.append(tokens)
    options: dict[Prefix, set[int]] = {}
    for path in paths:
        for depth in range(len(path)):
            options.setdefault(path[:depth], set()).add(path[depth])
    ordered = {prefix: tuple(sorted(tokens)) for prefix, tokens in options.items()}
    steps = tuple(
        sorted((p for p, o in ordered.items() if p and len(o) > 1), key=lambda p: (len(p), p))
    )
    return LabelPlan(paths=tuple(paths), options=ordered, steps=steps)


def restricted_scores(
    plan: LabelPlan, step_logits: dict[Prefix, torch.Tensor], dtype: torch.dtype | None = None
) -> torch.Tensor:
    """[B, N] log-probabilities of the labels from the logits at the root and every step.

    ``step_logits[prefix]`` is [B, vocab] (``()`` = the prompt's last position); computed in
    ``dtype`` (default float32; verify.py's reference is float64).
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    log_probs: dict[Prefix, dict[int, torch.Tensor]] = {}
    for prefix, valid in plan.options.items():
        if len(valid) == 1:
            continue
        logits = step_logits[prefix][:, list(valid)].to(dtype)
        restricted = torch.log_softmax(logits, dim=-1)
        log_probs[prefix] = {token: restricted[:, i] for i, token in enumerate(valid)}
    batch = step_logits[()].shape[0]
    columns = []
    for path in plan.paths:
        total = torch.zeros(batch, dtype=dtype, device=step_logits[()].device)
        for depth, token in enumerate(path):
            table = log_probs.get(path[:depth])
            if table is not None:
                total = total + table[token]
        columns.append(total)
    scores = torch.stack(columns, dim=1)
    # The trie makes the N path probabilities sum to 1; renormalise away float rounding only.
    return scores - torch.logsumexp(scores, dim=1, keepdim=True)


def score_labels(
    plan: LabelPlan,
    prompt_logits: torch.Tensor,
    decode: Callable[[Prefix], torch.Tensor],
) -> torch.Tensor:
    """[B, N] restricted label scores; ``decode(prefix)`` runs one cached decoding step and
    returns the [B, vocab] logits after the prefix (called once per entry of ``plan.steps``)."""
    steps = {prefix: decode(prefix) for prefix in plan.steps}
    return restricted_scores(plan, {(): prompt_logits, **steps})
