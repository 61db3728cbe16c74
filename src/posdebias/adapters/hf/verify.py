"""No silent wrong scores: the adapter's label scores against the model's OWN forward.

An adapter passes explicit position ids (so a left-padded row computes what it would alone) and
scores multi-token labels with cached decoding steps. Both are only right if the adapter
reproduces the positions the model computes for itself: a family with multimodal RoPE run
through 1-D positions still runs, and its scores are silently wrong. So the first batch an
adapter observes with a model is checked against the reference that needs no knowledge of the
family: the model's own forward of one unpadded prompt (and of prompt + label prefix for
multi-token labels), without ``position_ids`` and without a cache. The verdict is cached per
model and adapter class; a mismatch raises :class:`AdapterError` naming the family and the fix.

Cost, per model load: through ``observe_many`` the adapter's scores come from the first batch
itself, so the check adds the reference alone: ONE prompt forward (plus one per multi-token
label prefix, e.g. one more for digits with N >= 10). ``posdebias evaluate`` verifies before it
writes anything (:meth:`HFAdapter.verify`), which adds the adapter's own pass of that prompt too:
two prompt forwards. docs/performance.md measures both.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from posdebias.adapters.hf.model import ModelAdapter, PreparedBatch
from posdebias.adapters.hf.scoring import restricted_scores
from posdebias.core.instance import Instance
from posdebias.errors import AdapterError

if TYPE_CHECKING:
    import torch


FLOAT32_TOLERANCE = 1e-4
HALF_TOLERANCE = 5e-2  # bfloat16 / float16: a cached step rounds differently from a full forward

# model -> {adapter class: None (verified) or the error message}
_VERDICTS: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()


def score_tolerance(dtype: Any) -> float:
    """Largest |score difference| accepted for a model of ``dtype``."""
    import torch

    return FLOAT32_TOLERANCE if dtype in (torch.float32, torch.float64) else HALF_TOLERANCE


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|, in float64 on the CPU: the figure every comparison with a reference uses."""
    import torch

    return float(torch.max(torch.abs(a.double().cpu() - b.double().cpu())))


def reference_scores(adapter: ModelAdapter, instance: Instance) -> torch.Tensor:
    """[N] float64 restricted label scores from the model's own forwards (no position ids, no
    cache) of the prompt alone and of prompt + each multi-token label prefix."""
    import torch

    batch = adapter.prepare_batch([instance])
    inputs = dict(batch.inputs)
    prompt = inputs["input_ids"]
    step_logits: dict[tuple[int, ...], torch.Tensor] = {}
    # the same label scoring as the adapter's (raw, or after generation-config processors)
    processed = adapter.label_logits_processor(prompt, inputs["attention_mask"])
    with torch.inference_mode():
        for prefix in ((), *batch.plan.steps):
            full = dict(inputs)
            if prefix:
                extra = torch.tensor([list(prefix)], dtype=prompt.dtype, device=prompt.device)
                full = adapter.extended_inputs(full, extra)
            output = adapter.model_forward(**full, use_cache=False, **adapter.last_logits_only)
            step_logits[prefix] = processed(prefix, output.logits[:, -1]).double().cpu()
    return restricted_scores(batch.plan, step_logits, torch.float64)[0]


def mismatch_message(adapter: ModelAdapter, difference: float, tolerance: float) -> str:
    """The error of a failed verification: what differs, the likely cause, what to do."""
    model_type = getattr(adapter.model.config, "model_type", "?")
    cause = adapter.position_problem() or (
        "the adapter's position ids or its cached decoding steps are not the model's own"
    )
    return (
        f"the {adapter.name!r} adapter's label scores differ from the model's own forward by "
        f"{difference:.3g} (tolerance {tolerance:g}) on model_type {model_type!r}: {cause}. "
        "posdebias stops instead of computing wrong scores. Use an adapter for this family "
        "(`posdebias plugins` lists which adapter each model_type gets; the Adapters page of "
        "the documentation shows how to write one) and run `posdebias check --model "
        f"{adapter.model_id or 'MODEL'}`"
    )


def refuse_unsupported(adapter: ModelAdapter) -> None:
    """Stop at once when the adapter knows it cannot reproduce this model's positions."""
    problem = adapter.support_problem()
    if problem is not None:
        model_type = getattr(adapter.model.config, "model_type", "?")
        raise AdapterError(
            f"the {adapter.name!r} adapter cannot score model_type {model_type!r}: {problem}. "
            "It refuses instead of guessing; use an adapter for this family (`posdebias "
            "plugins`; the Adapters page of the documentation shows how to write one) and run "
            f"`posdebias check --model {adapter.model_id or 'MODEL'}`"
        )


def _verdicts(adapter: ModelAdapter) -> tuple[dict[str, str | None], str]:
    key = f"{type(adapter).__module__}.{type(adapter).__qualname__}"
    return _VERDICTS.setdefault(adapter.model, {}), key


def _known(adapter: ModelAdapter) -> bool:
    """Whether this model and adapter class were verified (raises the cached failure)."""
    verdicts, key = _verdicts(adapter)
    if key not in verdicts:
        return False
    message = verdicts[key]
    if message is not None:
        raise AdapterError(message)
    return True


def _judge(adapter: ModelAdapter, scores: torch.Tensor, reference: torch.Tensor) -> None:
    verdicts, key = _verdicts(adapter)
    difference = max_difference(scores, reference)
    tolerance = score_tolerance(getattr(adapter.model, "dtype", None))
    if difference <= tolerance:
        verdicts[key] = None
        return
    verdicts[key] = mismatch_message(adapter, difference, tolerance)
    raise AdapterError(verdicts[key])


def verify_instance(adapter: ModelAdapter, instance: Instance) -> None:
    """Verify before any observation (``posdebias evaluate`` does, before it writes anything):
    the adapter's scores of ``instance`` alone against the model's own forward (cached)."""
    refuse_unsupported(adapter)
    if _known(adapter):
        return
    scores, _ = adapter.run_batch(adapter.prepare_batch([instance]), attention=False)
    _judge(adapter, scores[0], reference_scores(adapter, instance))


def verify_first_batch(
    adapter: ModelAdapter,
    instances: Sequence[Instance],
    batch: PreparedBatch,
    scores: torch.Tensor,
) -> None:
    """Compare one unpadded row of the first batch with the model's own forward (cached)."""
    import torch

    if _known(adapter):
        return
    mask = batch.inputs["attention_mask"]
    row = int(torch.nonzero(mask.bool().all(dim=1))[0, 0])  # the longest row has no padding
    _judge(adapter, scores[row], reference_scores(adapter, instances[row]))


def forget_verdicts(model: Any) -> None:
    """Drop the cached verdicts of ``model`` (after changing its weights or configuration)."""
    _VERDICTS.pop(model, None)
