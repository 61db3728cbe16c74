"""A tiny random-weight Qwen2 text model that vLLM (CPU) and transformers both load.

vLLM's CPU attention needs head_dim >= 32, so the model has 4 heads of 32 (2 KV heads); the
tokenizer is the toy BPE of posdebias' test models with a ChatML template in which an image
item renders as the literal text ``<image>`` (a text model sees a placeholder, not pixels).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHATML_TEXT = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_text_model(seed: int = 0) -> tuple[Any, Any]:
    """(Qwen2ForCausalLM in float32, its tokenizer), identical for one seed."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from posdebias.adapters.tiny import build_tokenizer

    tokenizer = build_tokenizer(
        ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<image>"],
        chat_template=CHATML_TEXT,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        initializer_range=0.2,
        tie_word_embeddings=False,
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval(), tokenizer


def save_text_model(directory: Path, seed: int = 0) -> Path:
    model, tokenizer = build_text_model(seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
