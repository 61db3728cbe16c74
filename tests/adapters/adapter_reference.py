"""Independent references for the adapter tests: eager attention maps and full re-forwards."""

from __future__ import annotations

import torch

from posdebias.adapters.hf import HFAdapter, PreparedBatch
from posdebias.adapters.spans import span_matrix
from posdebias.testing import tiny_model_and_processor

_PAIRS: dict[str, tuple] = {}


def tiny_pair(family: str) -> tuple:
    """One (model, processor) per family and process; adapters install the probe on it (a
    no-op for outputs), so tests share it instead of rebuilding."""
    if family not in _PAIRS:
        _PAIRS[family] = tiny_model_and_processor(family, seed=0)
    return _PAIRS[family]


def fresh_model(family: str, implementation: str):
    """A second copy of the session's tiny model (same seed, same weights), untouched by the
    probe, with ``implementation`` for its language model."""
    model, _ = tiny_model_and_processor(family, seed=0)
    model.set_attn_implementation({"text_config": implementation})
    return model


def eager_masses(family: str, batch: PreparedBatch) -> torch.Tensor:
    """[B, L, N] head-mean attention mass of the last row, from eager ``output_attentions``."""
    model = fresh_model(family, "eager")
    with torch.no_grad():
        output = model(**batch.inputs, position_ids=batch.position_ids, output_attentions=True)
    length = batch.inputs["input_ids"].shape[1]
    spans = span_matrix(batch.spans, length).double()
    rows = [layer[:, :, -1, :].double().mean(dim=1) for layer in output.attentions]
    return torch.stack([torch.bmm(row[:, None, :], spans)[:, 0] for row in rows], dim=1)


def reforward_scores(adapter: HFAdapter, batch: PreparedBatch) -> torch.Tensor:
    """[N] restricted label log-probabilities of a one-row batch by full forwards of
    prompt + label tokens (no KV cache, positions computed by the model itself)."""
    inputs = dict(batch.inputs)
    prompt = inputs["input_ids"]
    length = prompt.shape[1]
    totals = []
    for path in batch.plan.paths:
        extra = torch.tensor([list(path[:-1])], dtype=prompt.dtype)
        full = dict(inputs)
        full["input_ids"] = torch.cat([prompt, extra], dim=1)
        full["attention_mask"] = torch.ones_like(full["input_ids"])
        if "mm_token_type_ids" in full:
            zeros = torch.zeros_like(extra, dtype=full["mm_token_type_ids"].dtype)
            full["mm_token_type_ids"] = torch.cat([full["mm_token_type_ids"], zeros], dim=1)
        with torch.no_grad():
            logits = adapter.model(**full).logits[0].double()
        total = torch.zeros((), dtype=torch.float64)
        for depth, token in enumerate(path):
            valid = list(batch.plan.options[path[:depth]])
            restricted = torch.log_softmax(logits[length - 1 + depth, valid], dim=-1)
            total = total + restricted[valid.index(token)]
        totals.append(total)
    scores = torch.stack(totals)
    return scores - torch.logsumexp(scores, dim=0)
