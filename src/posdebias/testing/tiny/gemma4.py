"""Tiny random-weight test models of the family of
:class:`~posdebias.adapters.families.gemma4.Gemma4Adapter`, built offline in code (toy vocabulary
only): KV-shared layers, per-layer input embeddings and bidirectional image blocks, as in the
checkpoints."""

from __future__ import annotations

from typing import Any

from posdebias.testing.tiny.common import build_tokenizer, chat_template, lm_config, tiny_vision

MODEL_TYPES = ("gemma4",)

# Gemma 4's turn format; an image renders as the image token, which the processor expands.
_TEMPLATE = chat_template(
    start="{{ bos_token }}",
    turn="<|turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n",
    end="<turn|>\n",
    generation="<|turn>model\n",
    image="<|image|>",
)

#: Gemma 4's named special tokens (tokenizer attributes, as the checkpoints' extra_special_tokens)
GEMMA4_TOKENS = {
    "image_token": "<|image|>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "audio_token": "<|audio|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
}
#: The tiny model's layers: sliding-window (S) and global (F), the last two reuse the keys and
#: values of the last non-shared layer of their kind (KV sharing, as Gemma 4 E2B / E4B).
TINY_LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2
TINY_KV_SHARED_LAYERS = 2
#: Shorter than a prompt of two images (about 150 tokens): the sliding layers, shared ones
#: included, see the last images only, and a cached label step must keep the window right.
TINY_SLIDING_WINDOW = 96


def tiny_model(model_type: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.gemma4 import (
        Gemma4AudioFeatureExtractor,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )

    named = dict(GEMMA4_TOKENS)
    tokenizer = build_tokenizer(
        ["<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", *named.values()],
        chat_template=_TEMPLATE,
        eos_token="<turn|>",
        pad_token="<pad>",
        bos_token="<bos>",
        named_tokens=named,
    )
    # The checkpoints: 16 px patches pooled 3 x 3, 280 soft tokens per image at most. Here
    # 4 px patches and the smallest budget (70 soft tokens): every image is resized to fit it.
    patch, pooling, soft_tokens = 4, 3, 70
    image_kwargs = {"patch_size": patch, "pooling_kernel_size": pooling}
    processor = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(**image_kwargs, max_soft_tokens=soft_tokens),
        tokenizer=tokenizer,
        video_processor=Gemma4VideoProcessor(**image_kwargs, max_soft_tokens=soft_tokens),
        chat_template=_TEMPLATE,
        image_seq_length=soft_tokens,
    )
    ids = tokenizer.convert_tokens_to_ids
    text = {
        "model_type": "gemma4_text",
        **lm_config(tokenizer, num_hidden_layers=len(TINY_LAYER_TYPES), head_dim=16),
        "global_head_dim": 32,
        "layer_types": TINY_LAYER_TYPES,
        "sliding_window": TINY_SLIDING_WINDOW,
        "num_kv_shared_layers": TINY_KV_SHARED_LAYERS,
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": len(tokenizer),
        "use_bidirectional_attention": "vision",
    }
    vision = tiny_vision(
        num_key_value_heads=2,
        head_dim=16,
        patch_size=patch,
        pooling_kernel_size=pooling,
        position_embedding_size=256,
    )
    config = AutoConfig.for_model(
        model_type,
        text_config=text,
        vision_config=vision,
        boi_token_id=ids("<|image>"),
        eoi_token_id=ids("<image|>"),
        image_token_id=ids("<|image|>"),
        boa_token_id=ids("<|audio>"),
        eoa_token_index=ids("<audio|>"),
        audio_token_id=ids("<|audio|>"),
        video_token_id=ids("<|video|>"),
    )
    return AutoModelForImageTextToText.from_config(config), processor
