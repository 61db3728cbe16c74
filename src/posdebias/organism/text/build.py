"""The text organism's architecture and tokenizer, built in code (no download).

A real ``LlamaForCausalLM``, only small: 4 layers, width 64, 4 heads; a word-level vocabulary of
the default multiple-choice prompt's words, the letters A to Z and the world's words (so every
option is one token and every letter label one token). Its prompt is posdebias's default
``multiple_choice`` template, rendered by a LLaVA-1.5-style chat template (``USER: ...
ASSISTANT:``) and read by the ``llama`` adapter, the path of any Llama checkpoint.
"""

from __future__ import annotations

from typing import Any

from posdebias.core.labels import get_label_set
from posdebias.core.tasks import DEFAULT_TEMPLATES
from posdebias.organism.build import CHAT_TEMPLATE
from posdebias.organism.text.world import CATEGORIES, question_text
from posdebias.organism.training import word_tokenizer, words_of

SPECIAL_TOKENS = ("<unk>", "<pad>", "<s>", "</s>")

#: The most options a question of the organism may have (the letters it knows, A to Z).
MAX_OPTIONS = 26


def vocabulary() -> list[str]:
    """Special tokens, then every word of the prompt (at every N), the chat template, the
    letters and the world, sorted."""
    template = DEFAULT_TEMPLATES["multiple_choice"]
    letters = get_label_set("upper")
    texts = [
        " ".join(
            (
                template.instruction.format(
                    n=n, range=letters.range_text(n), first="A", last=letters.labels(n)[-1]
                ),
                template.stem.format(question="", query=""),
                template.query,
            )
        )
        for n in range(2, MAX_OPTIONS + 1)
    ]
    texts += ["USER: ASSISTANT:", " ".join(letters.labels(MAX_OPTIONS))]
    texts += [question_text(category) for category in CATEGORIES]
    texts += [" ".join(words) for words in CATEGORIES.values()]
    return [*SPECIAL_TOKENS, *(word for word in words_of(texts) if word not in SPECIAL_TOKENS)]


def build_tokenizer() -> Any:
    """A word-level ``PreTrainedTokenizerFast`` with the chat template."""
    return word_tokenizer(vocabulary(), chat_template=CHAT_TEMPLATE)


def build_config(tokenizer: Any) -> Any:
    """The Llama config: 4 layers x 64 wide, 4 heads, MLP 256, untied embeddings."""
    from transformers import AutoConfig

    ids = tokenizer.convert_tokens_to_ids
    return AutoConfig.for_model(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=ids("<s>"),
        eos_token_id=ids("</s>"),
        pad_token_id=ids("<pad>"),
        tie_word_embeddings=False,
    )


def build_untrained(seed: int) -> tuple[Any, Any]:
    """A freshly initialised organism (float32, eager attention: training reads every
    attention row) and its tokenizer."""
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = build_tokenizer()
    config = build_config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.set_attn_implementation("eager")
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model, tokenizer
