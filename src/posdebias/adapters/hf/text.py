"""Text-only language models through the same machinery: the tokenizer is the processor.

A text model's prompt holds no image; its candidates are texts (options, answers, passages),
each span found from the tokenizer's offset mapping of the rendered prompt
(:meth:`HFAdapter.text_spans`). The chat template renders the message content as one string
(text chat templates expect a string), and the prompt is tokenised without adding special
tokens: the template writes the BOS itself, as ``apply_chat_template(tokenize=True)`` does.

A text model also scores a text as its whole reply to a question (cloze, replies.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from posdebias.adapters.base import ReplyRequest
from posdebias.adapters.hf import replies
from posdebias.adapters.hf.adapter import HFAdapter
from posdebias.adapters.hf.replies import reply_tokens
from posdebias.errors import AdapterError


class HFTextAdapter(HFAdapter):
    """Base of the text-only families (Qwen3, Llama 3, Gemma 3, Mistral, Phi-3, OLMo 2)."""

    name: ClassVar[str] = "hf_text"
    text_config_key: ClassVar[str | None] = None
    text_only: ClassVar[bool] = True
    prompt_special_tokens: ClassVar[bool] = False

    def processor_inputs(self, texts: list[str], images: list[list[Any]]) -> Any:
        if any(images):
            raise AdapterError(f"{self.name} reads text only; the prompt holds images")
        return self.tokenizer(
            texts,
            padding=True,
            padding_side="left",
            return_tensors="pt",
            add_special_tokens=self.prompt_special_tokens,
        )

    def reply_problem(self) -> str | None:
        return None

    def check_replies(self, requests: Sequence[ReplyRequest]) -> None:
        for request in requests:
            reply_tokens(self, request)

    score_replies = replies.score_replies  # each reply's log-probability given its prompt
