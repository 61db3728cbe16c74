"""The shared Hugging Face machinery; this module's ``__all__`` IS the surface a family plugin
may import (docs/plugins.md: what semantic versioning covers).

A family adapter subclasses :class:`HFAdapter` and overrides only what its model does
differently: the span tokens (:class:`SpanTokens`), the image spans (:class:`ImageSpan`, with
:func:`find_image_spans` / :func:`find_closed_spans` / :func:`find_marked_spans` for the
common layouts), positions or the forward. The modules below (``adapter``, ``spans``,
``scoring``, ``prompt``, ``options``, ``generation``, ``verify``, ``cache``, ``layers``) are the
implementation; import from here.
"""

from posdebias.adapters.hf.adapter import BatchingUnsafe, HFAdapter, PreparedBatch
from posdebias.adapters.hf.options import HFAdapterOptions
from posdebias.adapters.hf.prompt import PROMPT_VARIANTS, PromptOptions
from posdebias.adapters.hf.spans import (
    ImageSpan,
    SpanTokens,
    as_span,
    check_spans,
    find_closed_spans,
    find_image_spans,
    find_marked_spans,
    span_matrix,
)
from posdebias.adapters.hf.text import HFTextAdapter

__all__ = [
    "PROMPT_VARIANTS",
    "BatchingUnsafe",
    "HFAdapter",
    "HFAdapterOptions",
    "HFTextAdapter",
    "ImageSpan",
    "PreparedBatch",
    "PromptOptions",
    "SpanTokens",
    "as_span",
    "check_spans",
    "find_closed_spans",
    "find_image_spans",
    "find_marked_spans",
    "span_matrix",
]
