"""What generation and verification need from a Hugging Face adapter, declared once.

:mod:`~posdebias.adapters.hf.generation` and :mod:`~posdebias.adapters.hf.verify` work on any
object with this shape (:class:`ModelAdapter`), which :class:`~posdebias.adapters.hf.HFAdapter`
is; they never import the adapter module, so the adapter -> generation / verify -> adapter
circle does not exist, and they read nothing private of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from posdebias.adapters.hf.options import HFAdapterOptions
from posdebias.adapters.hf.scoring import LabelPlan, Prefix
from posdebias.adapters.hf.spans import ImageSpan
from posdebias.core.instance import Instance
from posdebias.core.labels import check_candidate_count, get_label_set
from posdebias.core.tasks import TaskTemplate, task_label_set

if TYPE_CHECKING:
    import torch

    from posdebias.adapters.base import SofaSettings


@dataclass
class PreparedBatch:
    """Model inputs of one batch (left padded) with what the probe and the scorer need.

    Attributes:
        inputs: the processor's tensors on the model's device.
        position_ids: explicit prompt positions (padding-independent).
        spans: per row, every token of each candidate (:class:`ImageSpan`: an image's
            tokens, a text's tokens, or both), in candidate order; what the probe reads.
        plan: the label token trie for this N.
        image_spans: per row, every token of each image of the prompt (the stem's first);
            the same as ``spans`` for retrieval.
    """

    inputs: Any
    position_ids: Any
    spans: list[list[ImageSpan]]
    plan: LabelPlan
    image_spans: list[list[ImageSpan]] = field(default_factory=list)


def batch_groups(
    instances: Sequence[Instance], batch_size: int, label_set: str | None
) -> Iterator[list[int]]:
    """Index chunks (at most ``batch_size`` each) of the instances that can share one padded
    batch: the same N and task (one label plan, checked against ``label_set``, None: the
    task's own) and either every prompt with images or none (a batch mixing the two fails in
    some image processors), ordered by N, task, then image-free first, then input order."""
    groups: dict[tuple[int, str, bool], list[int]] = {}
    for index, instance in enumerate(instances):
        key = (instance.n, instance.task, bool(instance.all_images))
        groups.setdefault(key, []).append(index)
    for n, task, with_images in sorted(groups):
        check_candidate_count(n, get_label_set(task_label_set(task, label_set)))
        indices = groups[(n, task, with_images)]
        for start in range(0, len(indices), batch_size):
            yield indices[start : start + batch_size]


def kv_cache(output: Any) -> Any:
    """The KV cache a forward returned (``cache``, or ``past_key_values`` before 5.x), or None."""
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)


#: ``(prefix, logits) -> logits``: what label scoring applies to each step's logits.
LogitsProcessor = Callable[[Prefix, "torch.Tensor"], "torch.Tensor"]


class ModelAdapter(Protocol):
    """A loaded model with its tokenizer, prompt and forward conventions (see the module)."""

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> Any: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def model_id(self) -> str | None: ...

    @property
    def options(self) -> HFAdapterOptions: ...

    @property
    def label_set(self) -> str | None: ...

    @property
    def task_templates(self) -> dict[str, TaskTemplate]: ...

    @property
    def base_task_templates(self) -> dict[str, TaskTemplate]: ...

    @property
    def end_token_id(self) -> int | None: ...

    @property
    def last_logits_only(self) -> dict[str, Any]:
        """Forward keywords that keep only the last position's logits (``{}`` if unsupported)."""

    @property
    def cache_argument(self) -> str:
        """The forward keyword that takes the KV cache (``cache`` or ``past_key_values``)."""

    def prepare_batch(
        self,
        instances: Sequence[Instance],
        *,
        variant: str | None = None,
    ) -> PreparedBatch: ...

    def run_batch(self, batch: PreparedBatch, *, attention: bool = True) -> tuple[Any, Any]: ...

    def model_forward(self, **inputs: Any) -> Any: ...

    def model_code(self, call: str) -> AbstractContextManager[None]:
        """A scope whose exceptions of the model's own code are reported as the model's."""

    def prompt_forward(
        self, batch: PreparedBatch, *, attention: bool = True, sofa: SofaSettings | None = None
    ) -> tuple[Any, Any]:
        """The prompt's forward with the KV cache kept: (output, the probe's masses or None)."""

    def decode_position_ids(self, prompt_positions: Any, length: int) -> Any: ...

    def extended_inputs(self, inputs: dict[str, Any], extra: Any) -> dict[str, Any]: ...

    def decode_inputs(self, prompt_inputs: Any, steps: int) -> dict[str, Any]: ...

    @property
    def cross_attention_layers(self) -> tuple[int, ...]: ...

    def position_problem(self) -> str | None: ...

    def support_problem(self) -> str | None: ...

    def label_logits_processor(self, prompt_ids: Any, mask: Any) -> LogitsProcessor: ...
