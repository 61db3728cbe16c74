"""Tiny random-weight models of every supported family, built offline in code.

Plugin authors test their adapters the way posdebias tests its own (docs/adapters.md):

    from posdebias.testing import tiny_model_and_processor, write_test_images
    model, processor = tiny_model_and_processor("qwen2_5_vl")
    adapter = posdebias.get_adapter(model, processor)

Nothing here touches the network: tokenizers are BPE models trained in milliseconds on a fixed
corpus (digits split one per token, so labels such as "10" are multi-token as in Qwen), image
processors and configs are constructed directly. Every model is a few hundred kB. The layout of
each family is the real one (special tokens, chat template shape, image-token spans); only the
sizes are small. ``save_tiny_model`` writes a model directory that loads back through
``from_pretrained`` like a hub checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posdebias.errors import InputError

FAMILIES: tuple[str, ...] = (
    "qwen2_5_vl",
    "qwen2_vl",
    "llava_onevision",
    "internvl",
    "llava",
    "qwen3_vl",
    "qwen3_vl_moe",
    "idefics3",
    "smolvlm",
)

_CORPUS = (
    "Given 4 images indexed from 1 to 4, identify the image that best matches the provided "
    "caption. Respond with the index number only and nothing else.",
    "Caption: a photo of a red square on a blue background. Answer:",
    "user assistant system USER ASSISTANT image label",
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth",
    "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z I II III IV V VI VII VIII IX X",
)

# ChatML-style template shared by the Qwen-like families; ``image`` is what one image renders to.
_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}IMAGE"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}USER: {% else %}"
    "ASSISTANT: {% endif %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] != 'user' %}</s>{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def build_tokenizer(
    special_tokens: Sequence[str],
    *,
    chat_template: str,
    eos_token: str,
    pad_token: str,
    bos_token: str | None = None,
    named_tokens: dict[str, str] | None = None,
) -> Any:
    """A small BPE ``PreTrainedTokenizerFast`` with the family's special tokens.

    ``named_tokens`` become tokenizer attributes (``tokenizer.image_token`` and its ``_id``), as
    the real checkpoints' ``extra_special_tokens`` do.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    specials = ["<unk>", *dict.fromkeys(special_tokens)]
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=[chr(code) for code in range(32, 127)],
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        eos_token=eos_token,
        pad_token=pad_token,
        bos_token=bos_token,
        extra_special_tokens=named_tokens or {},
        chat_template=chat_template,
    )


def _text_config(vocab_size: int, **extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention, as the real checkpoints
        "max_position_embeddings": 4096,
        "initializer_range": 0.2,  # larger than real init: peaked attention, varied scores
        **extra,
    }


def _qwen_vl(family: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.qwen2_5_vl import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl import (
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    tokenizer = build_tokenizer(
        [
            "<|im_start|>",
            "<|im_end|>",
            "<|endoftext|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ],
        chat_template=_CHATML.replace("IMAGE", "<|vision_start|><|image_pad|><|vision_end|>"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        named_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"},
    )
    # 56 x 56 pixels -> 4 x 4 patches of 14 -> 2 x 2 merged tokens per image.
    image_processor = Qwen2VLImageProcessor(
        size={"shortest_edge": 56 * 56, "longest_edge": 56 * 56}
    )
    processor_class = Qwen2_5_VLProcessor if family == "qwen2_5_vl" else Qwen2VLProcessor
    processor = processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 64,
        "window_size": 56,
        "fullatt_block_indexes": [1],
    }
    if family == "qwen2_vl":
        vision = {
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "mlp_ratio": 2,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        }
    config = AutoConfig.for_model(
        family,
        text_config=_text_config(
            len(tokenizer),
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]},
            bos_token_id=None,
            eos_token_id=ids("<|im_end|>"),
            pad_token_id=ids("<|endoftext|>"),
        ),
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    return AutoModelForImageTextToText.from_config(config), processor


def _tiny_vision(**extra: Any) -> dict[str, Any]:
    return {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "patch_size": 14,
        **extra,
    }


def _llava_onevision(family: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.llava_onevision import (
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    tokenizer = build_tokenizer(
        ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<image>", "<video>"],
        chat_template=_CHATML.replace("IMAGE", "<image>"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        named_tokens={"image_token": "<image>", "video_token": "<video>"},
    )
    size = 28  # 2 x 2 patches of 14 -> 4 tokens + 1 image-newline per image in multi-image mode
    pinpoints = [[size, size], [size, 2 * size], [2 * size, size], [2 * size, 2 * size]]
    image_processor = LlavaOnevisionImageProcessor(
        size={"height": size, "width": size}, image_grid_pinpoints=pinpoints
    )
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(size={"height": size, "width": size}),
        num_image_tokens=(size // 14) ** 2,
        vision_feature_select_strategy="full",
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    config = AutoConfig.for_model(
        family,
        text_config={
            "model_type": "qwen2",
            **_text_config(len(tokenizer), eos_token_id=ids("<|im_end|>")),
            "pad_token_id": ids("<|endoftext|>"),
        },
        vision_config={"model_type": "siglip_vision_model", **_tiny_vision(image_size=size)},
        image_token_index=ids("<image>"),
        video_token_index=ids("<video>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=pinpoints,
    )
    return AutoModelForImageTextToText.from_config(config), processor


def _internvl(family: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.got_ocr2 import GotOcr2ImageProcessor
    from transformers.models.internvl import InternVLProcessor, InternVLVideoProcessor

    tokenizer = build_tokenizer(
        [
            "<|im_start|>",
            "<|im_end|>",
            "<|endoftext|>",
            "<img>",
            "</img>",
            "<IMG_CONTEXT>",
            "<video>",
        ],
        chat_template=_CHATML.replace("IMAGE", "<IMG_CONTEXT>\n"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        named_tokens={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
    )
    # The real checkpoints: 448 px tiles, patch 14, pixel shuffle 0.5 -> 256 tokens per tile.
    # Here 56 px tiles -> (56 / 14)^2 * 0.25 = 4 tokens per tile, same code path.
    size = 56
    seq_length = (size // 14) ** 2 // 4
    image_processor = GotOcr2ImageProcessor(
        size={"height": size, "width": size}, crop_to_patches=False, max_patches=1
    )
    processor = InternVLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=InternVLVideoProcessor(size={"height": size, "width": size}),
        image_seq_length=seq_length,
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    config = AutoConfig.for_model(
        family,
        text_config={
            "model_type": "qwen2",
            **_text_config(len(tokenizer), eos_token_id=ids("<|im_end|>")),
            "pad_token_id": ids("<|endoftext|>"),
        },
        vision_config=_tiny_vision(image_size=[size, size], patch_size=[14, 14]),
        image_token_id=ids("<IMG_CONTEXT>"),
        image_seq_length=seq_length,
    )
    return AutoModelForImageTextToText.from_config(config), processor


def _llava(family: str) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForImageTextToText, CLIPImageProcessor
    from transformers.models.llava import LlavaProcessor

    tokenizer = build_tokenizer(
        ["<s>", "</s>", "<pad>", "<image>"],
        chat_template=_LLAVA_TEMPLATE,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        named_tokens={"image_token": "<image>"},
    )
    size = 28  # 2 x 2 patches of 14 (+ CLS, dropped by the "default" feature strategy)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=tokenizer.chat_template,
    )
    ids = tokenizer.convert_tokens_to_ids
    config = AutoConfig.for_model(
        family,
        text_config={
            "model_type": "llama",
            **_text_config(len(tokenizer), eos_token_id=ids("</s>"), bos_token_id=ids("<s>")),
            "pad_token_id": ids("<pad>"),
        },
        vision_config={
            "model_type": "clip_vision_model",
            **_tiny_vision(image_size=size, projection_dim=32),
        },
        image_token_index=ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
    )
    return AutoModelForImageTextToText.from_config(config), processor


def _from_adapter(module: str, cls: str) -> Callable[[str], tuple[Any, Any]]:
    """The builder of an adapter module's tiny model (``Adapter.tiny_model``)."""

    def build(family: str) -> tuple[Any, Any]:
        import importlib

        return getattr(importlib.import_module(module), cls).tiny_model(family)

    return build


# Shared by the builders that live next to their adapters.
CHATML = _CHATML
text_config = _text_config
tiny_vision = _tiny_vision

_BUILDERS: dict[str, Callable[[str], tuple[Any, Any]]] = {
    "qwen2_5_vl": _qwen_vl,
    "qwen2_vl": _qwen_vl,
    "llava_onevision": _llava_onevision,
    "internvl": _internvl,
    "llava": _llava,
    "qwen3_vl": _from_adapter("posdebias.adapters.qwen3_vl", "Qwen3VLAdapter"),
    "qwen3_vl_moe": _from_adapter("posdebias.adapters.qwen3_vl", "Qwen3VLAdapter"),
    "idefics3": _from_adapter("posdebias.adapters.idefics3", "Idefics3Adapter"),
    "smolvlm": _from_adapter("posdebias.adapters.idefics3", "Idefics3Adapter"),
}


def tiny_model_and_processor(family: str, *, seed: int = 0) -> tuple[Any, Any]:
    """A random-weight float32 model (eval mode, SDPA attention) and its processor.

    ``seed`` fixes the weights, so two calls give identical models.
    """
    import torch

    if family not in _BUILDERS:
        raise InputError(f"no tiny test model for family {family!r}; known: {', '.join(_BUILDERS)}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, processor = _BUILDERS[family](family)
    model.set_attn_implementation("sdpa")
    return model.eval(), processor


def save_tiny_model(family: str, directory: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny model of ``family`` (weights, config, processor) to ``directory``.

    The directory loads back with ``from_pretrained`` / :func:`posdebias.load_adapter`, exactly
    as a downloaded checkpoint would.
    """
    model, processor = tiny_model_and_processor(family, seed=seed)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def write_test_images(
    directory: str | Path, count: int, *, size: int = 48, seed: int = 0
) -> list[Path]:
    """``count`` distinct small RGB PNG files (random noise, seeded) in ``directory``."""
    import numpy as np
    from PIL import Image

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for index in range(count):
        pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        file = path / f"image_{index:03d}.png"
        Image.fromarray(pixels).save(file)
        files.append(file)
    return files


def check_adapter(adapter: Any, instances: Any = None, **options: Any) -> Any:
    """Run ``posdebias check`` on an adapter: see :func:`posdebias.adapters.check.check_adapter`.

    In a plugin's test suite::

        report = check_adapter(posdebias.get_adapter(model, processor))
        assert report.passed, report.summary()
    """
    from posdebias.adapters.check import check_adapter as run_checks

    return run_checks(adapter, instances, **options)
