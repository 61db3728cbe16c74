"""Cloze scoring: a text scored as the model's whole reply to a user message.

The message (a question alone: no options, no labels) is posed with the chat template and its
generation prompt, the reply's tokens follow it (tokenised in context, as a label's are:
:meth:`HFAdapter.label_tokens`), and their log-probabilities over the FULL vocabulary are
summed: ``log P(reply | message) = sum_t log P(r_t | message, r_<t)``. One forward per
(message, reply) pair, left padded with explicit positions so that a row sees exactly what it
would see alone; only the logits of the last positions, where the replies are, are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from posdebias._inputs import excerpt
from posdebias.adapters.base import ReplyRequest, ReplyScore
from posdebias.adapters.hf.prompt import refuse_joined_control_tokens
from posdebias.adapters.hf.verify import refuse_unsupported
from posdebias.errors import AdapterError, InputError

if TYPE_CHECKING:
    from posdebias.adapters.hf.adapter import HFAdapter


def reply_prompt(adapter: HFAdapter, message: str) -> str:
    """The prompt of one user message: the chat template's text with its generation prompt."""
    return adapter.chat_text([{"role": "user", "content": message}])


def reply_tokens(adapter: HFAdapter, request: ReplyRequest) -> tuple[list[int], list[int]]:
    """(prompt tokens, reply tokens) of one request, refused when the joined text would hold
    one of the model's special tokens that neither the template nor the data holds alone."""
    prompt = reply_prompt(adapter, request.message)
    reply = adapter.options.answer_prefix + request.reply
    if adapter.control_tokens is not None:
        neutral = reply_prompt(adapter, "x") + adapter.options.answer_prefix + "x"
        refuse_joined_control_tokens(
            f"instance {excerpt(request.source)} (cloze)",
            prompt + reply,
            neutral,
            adapter.control_tokens,
            adapter.model_id or adapter.name,
        )
    tokens = adapter.tokenizer(prompt, add_special_tokens=adapter.prompt_special_tokens)
    answer = adapter.label_tokens(prompt, request.reply)
    if not answer:
        raise InputError(
            f"instance {excerpt(request.source)}: the reply {excerpt(request.reply)} is no token "
            "of this tokenizer; cloze has nothing to score"
        )
    return list(tokens["input_ids"]), answer


def score_replies(
    adapter: HFAdapter, requests: Sequence[ReplyRequest], *, batch_size: int = 1
) -> list[ReplyScore]:
    """:meth:`posdebias.adapters.base.Adapter.score_replies` for a Hugging Face model."""
    if batch_size < 1:
        raise InputError(f"batch_size must be at least 1, got {batch_size}")
    refuse_unsupported(adapter)
    encoded = [reply_tokens(adapter, request) for request in requests]
    sums = [
        total
        for start in range(0, len(encoded), batch_size)
        for total in _score_batch(adapter, encoded[start : start + batch_size])
    ]
    return [
        ReplyScore(logprob=total, tokens=len(answer), characters=len(request.reply))
        for (_, answer), total, request in zip(encoded, sums, requests, strict=True)
    ]


def _score_batch(adapter: HFAdapter, rows: list[tuple[list[int], list[int]]]) -> list[float]:
    """The summed reply log-probabilities of one padded batch of (prompt, reply) token rows."""
    import torch

    pad = adapter.tokenizer.pad_token_id
    if pad is None:
        raise AdapterError(f"the tokenizer of {adapter.model_id} has no pad token")
    full = [prompt + answer for prompt, answer in rows]
    length = max(len(row) for row in full)
    ids = torch.tensor([[pad] * (length - len(row)) + row for row in full], dtype=torch.long)
    mask = torch.tensor([[0] * (length - len(row)) + [1] * len(row) for row in full])
    with adapter.model_code("position ids"):  # a family's may ask the model's own code
        positions = adapter.prompt_position_ids({"attention_mask": mask})
    # the logits at position p predict token p + 1: a reply of r tokens at the end of its row
    # is predicted by the r positions before the last; keep the last (longest r) + 1
    keep = max(len(answer) for _, answer in rows) + 1
    kept: dict[str, Any] = {"logits_to_keep": keep} if adapter.last_logits_only else {}
    device = adapter.device
    with torch.inference_mode():
        output = adapter.model_forward(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            use_cache=False,
            **kept,
        )
        logits = output.logits[:, -keep:, :].float()
        log_probs = torch.log_softmax(logits, dim=-1)
    totals = []
    for row, (_, answer) in enumerate(rows):
        first = keep - 1 - len(answer)  # the position before the reply's first token
        steps = torch.arange(first, keep - 1)
        chosen = log_probs[row, steps, torch.tensor(answer)]
        totals.append(float(chosen.double().sum().item()))
    return totals
