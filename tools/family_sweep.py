"""Every image-text family of the installed transformers through `posdebias check`, one by one.

For each ``model_type`` of transformers' image-text-to-text mapping this developer script builds
a tiny random-weight model from transformers' OWN classes, independently of posdebias's test
builders: the family's default config shrunk (few layers, narrow widths, a small vision tower,
small images), its own processor classes, a toy BPE tokenizer holding the special tokens the
processor and config name, and a chat template that writes the processor's image placeholder
(or the family's real image block, where a recipe below gives it). It checks that the model runs
one forward on a two-image prompt, saves it, runs ``posdebias check --model DIR --device cpu``
on the saved folder, and records one verdict per family:

* ``PASS``: every row passes (with the adapter that took it: built in or ``generic``);
* ``refused``: exit 2 with the adapter's refusal, before any row ran (no forward);
* ``FAIL``: the check ran and a row failed (or exited otherwise): a bug to fix;
* ``could not build``: no tiny model of the family could be built offline (the reason).

Usage (slow on a shared CPU: about a minute per family; built models are cached)::

    nice -n 10 python tools/family_sweep.py                      # every family
    nice -n 10 python tools/family_sweep.py --families molmo2,aria --rebuild
    python tools/family_sweep.py --report                        # the last results, as Markdown
    python tools/family_sweep.py --record    # into src/posdebias/data/family_sweep.json, then
    posdebias plugins --families --markdown  # the coverage table of the Adapters page

``--record`` writes the families of the cache's results and keeps the recorded verdicts of the
others (for the same transformers), so a few families swept into a cache of their own
(``--families X,Y --cache DIR``, then ``--record --cache DIR``) replace only their own records.

Models, logs and one result per family (``results/``) go under ``--cache`` (default
/tmp/posdebias-family-sweep).
The recipes are best-effort miniatures: a family whose real chat template writes more around
each image than the recipe does is checked on the simpler layout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from posdebias.testing.tiny.common import build_tokenizer
from posdebias.testing.tiny.gemma4 import GEMMA4_TOKENS

CACHE = Path("/tmp/posdebias-family-sweep")
VERSION = 3  # bump to rebuild every cached model after changing the builders

PASS, REFUSED, FAIL, NOT_BUILT = "PASS", "refused", "FAIL", "could not build"

# -- the toy tokenizer ---------------------------------------------------------------------------

ROLES = ("<|user|>", "<|assistant|>", "<|system|>", "<|end|>", "<|pad|>", "<s>", "</s>")


def toy_tokenizer(specials: list[str], template: str, named: dict[str, str] | None = None) -> Any:
    """The test models' BPE tokenizer (digits one per token) with the roles and ``specials``;
    ``named``: tokenizer attributes (``image_token`` and its ``image_token_id``)."""
    return build_tokenizer(
        list(dict.fromkeys([*ROLES, *specials])),
        chat_template=template,
        eos_token="<|end|>",
        pad_token="<|pad|>",
        bos_token="<s>",
        named_tokens=named,
    )


def chat_template(image: str, *, bos: bool = False) -> str:
    """A chat template that writes ``image`` for every image item (roles as <|role|>)."""
    return (
        ("{{ bos_token }}" if bos else "")
        + "{% for message in messages %}<|{{ message['role'] }}|>\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for item in message['content'] %}{% if item['type'] == 'image' %}"
        + image.replace("{", "{{ '{' }}")
        + "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
        "<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )


#: the widths and depths of every tiny model (a recipe may set others)
WIDTH, FFN, HEADS, HEAD_DIM, LAYERS = 64, 128, 4, 16, 2


# -- recipes ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Recipe:
    """What a family needs beyond the generic shrink (all optional)."""

    #: keyword arguments of ``AutoConfig.for_model`` (before shrinking)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: dotted config attribute -> value, set after shrinking (``text_config.layer_types``)
    set: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the processor class name, where transformers' auto mapping has none
    processor: str | None = None
    #: keyword arguments of the processor class
    processor_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: keyword arguments of each sub-processor (``image_processor``: {...})
    sub_processors: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: what the chat template writes per image (default: the processor's image token)
    image_block: str | None = None
    #: extra special tokens of the tokenizer
    tokens: tuple[str, ...] = ()
    #: tokenizer attribute -> token (``image_token``: "<image>")
    named_tokens: dict[str, str] = dataclasses.field(default_factory=dict)
    #: config attribute -> token whose id it holds (``image_token_index``: "<image>")
    token_ids: dict[str, str] = dataclasses.field(default_factory=dict)
    #: side of the generated square images of the sanity forward
    image_side: int = 56
    #: the family takes one image per prompt (its processor or model refuses more)
    single_image: bool = False
    #: tokens per image before -> after shrinking the images (filled by the builder)
    token_counts: dict[int, int] = dataclasses.field(default_factory=dict)
    #: the model_type whose sub-processors the processor takes (default: the family's own)
    processor_family: str | None = None
    #: why the family cannot be built offline (then nothing is tried)
    not_buildable: str | None = None
    #: a function(config, tokenizer) run before the model is built (vocabulary layouts, ...)
    prepare: Callable[[Any, Any], None] | None = None
    #: a function(model, processor) run after building (weights the default init zeroes, ...)
    finish: Callable[[Any, Any], None] | None = None


def _vq_codes(count: int) -> list[str]:
    """Chameleon / Emu3 names of VQ codes 0..count-1 in the vocabulary (digits as letters)."""
    return [
        "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z" for code in range(count)
    ]


def _vocabulary_map(config: Any, tokenizer: Any) -> None:
    config.vocabulary_map = dict(tokenizer.get_vocab())
    config.image_token_id = config.vocabulary_map["<image>"]


def _apertus_offsets(config: Any, tokenizer: Any) -> None:
    # the image codes, then the audio codes, right after the toy vocabulary
    config.vision_config.codebook_size = config.audio_config.codebook_size = 16
    config.image_token_offset = len(tokenizer)
    config.audio_token_offset = len(tokenizer) + 16
    config.text_config.vocab_size = len(tokenizer) + 32


def _normal(*paths: str) -> Callable[[Any, Any], None]:
    """Re-draw weights the default init leaves at zero (every image would embed the same)."""

    def finish(model: Any, processor: Any) -> None:
        import torch

        with torch.no_grad():
            for path in paths:
                target = model
                for part in path.split("."):
                    target = getattr(target, part)
                target.normal_(0.0, 0.2)

    return finish


_VQ = {  # a VQ-GAN of 32 channels (GroupNorm's 32 groups), 64 px images, 16 codes
    "base_channels": 32,
    "latent_channels": 32,
    "embed_dim": 32,
    "resolution": 64,
    "num_res_blocks": 1,
}

_GEMMA4_TOKENS = GEMMA4_TOKENS

RECIPES: dict[str, Recipe] = {
    # 56 px tiles of 14 px patches, pixel-shuffled 2 x 2: 4 tokens per tile
    "aya_vision": Recipe(
        processor_kwargs={"img_size": 56, "patch_size": 28},
        sub_processors={
            "image_processor": {"crop_to_patches": False, "size": {"height": 56, "width": 56}}
        },
    ),
    "apertus1p5": Recipe(
        set={
            **{f"vision_config.{k}": v for k, v in _VQ.items()},
            "vision_config.channel_multiplier": [1, 2],
            "vision_config.attn_resolutions": [],
            "audio_config.codebook_dim": WIDTH,
            "audio_config.decoder_hidden_size": WIDTH,
            "audio_config.decoder_intermediate_size": FFN,
            "audio_config.decoder_num_layers": 1,
        },
        prepare=_apertus_offsets,
    ),
    # 980 px images (the processor's fixed default) in 140 px patches: 49 patches, 4 queries
    "aria": Recipe(
        set={
            "vision_config.patch_size": 140,
            "projector_patch_to_query_dict": {49: 4, 9: 4},
            "max_value_projector_patch_to_query_dict": 4,
        },
        processor_kwargs={"size_conversion": {490: 4, 980: 4}},
        named_tokens={"image_token": "<|img|>"},
    ),
    "chameleon": Recipe(
        set={f"vq_config.{k}": v for k, v in {**_VQ, "num_embeddings": 16}.items()},
        sub_processors={
            "image_processor": {
                "size": {"shortest_edge": 64},
                "crop_size": {"height": 64, "width": 64},
            }
        },
        processor_kwargs={"image_seq_length": 16},
        tokens=("<image>", "<racm3:break>", "<eoss>", *_vq_codes(16)),
        prepare=_vocabulary_map,
    ),
    "emu3": Recipe(
        set={
            **{f"vq_config.{k}": v for k, v in _VQ.items()},
            "vq_config.codebook_size": 16,
            "vq_config.hidden_size": 128,  # base_channels x the last multiplier
            "vq_config.channel_multiplier": [1, 2, 2, 4],
            "vq_config.attn_resolutions": [],
        },
        sub_processors={"image_processor": {"min_pixels": 32 * 32, "max_pixels": 64 * 64}},
        tokens=(
            "<image>",
            "<|extra_200|>",
            *(f"<|visual token {code:06d}|>" for code in range(16)),
        ),
        named_tokens={
            "image_token": "<image>",
            "boi_token": "<|image start|>",
            "eoi_token": "<|image end|>",
            "image_wrapper_token": "<|image token|>",
            "eof_token": "<|extra_201|>",
        },
        prepare=_vocabulary_map,
    ),
    "gemma3": Recipe(
        image_block="<start_of_image>",
        named_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        token_ids={
            "image_token_index": "<image_soft_token>",
            "image_token_id": "<image_soft_token>",
        },
        set={"mm_tokens_per_image": 4},
        processor_kwargs={"image_seq_length": 4},
        finish=_normal("model.multi_modal_projector.mm_input_projection_weight"),
    ),
    "diffusion_gemma": Recipe(processor_family="gemma4", named_tokens=_GEMMA4_TOKENS),
    "gemma4": Recipe(named_tokens=_GEMMA4_TOKENS),
    # its vision tower is optional in the config: the default config has none
    "gemma4_unified": Recipe(named_tokens=_GEMMA4_TOKENS, config={"vision_config": {}}),
    # every view (the global one and each tile) is 144 learned queries (the model's fixed 12 x 12
    # for views of up to 144 SAM patches): 48 px views counted as 12 x 12 by the processor; the
    # SAM neck's last width is the query encoder's
    "deepseek_ocr2": Recipe(
        set={
            "text_config.mlp_layer_types": ["dense", "sparse"],
            "text_config.num_experts_per_tok": 2,  # None by default
            "vision_config.sam_config.downsample_channels": [32, WIDTH],
        },
        sub_processors={"image_processor": {"size": {"height": 48, "width": 48}, "tile_size": 48}},
        processor_kwargs={"patch_size": 4, "downsample_ratio": 1},
    ),
    # 112 px global views and 56 px tiles (a wide or large image is tiled), both in 14 px
    # patches downsampled 4 x: 4 tokens per view, 1 per tile; the model builds a sliding-window
    # mask whatever its layer types, so the window must be set; the vision MLP's width is
    # recomputed from mlp_ratio when the saved config loads
    "step3p7": Recipe(
        set={
            "text_config.sliding_window": 512,
            "text_config.num_sliding_attention_heads": HEADS,
            "vision_config.mlp_ratio": FFN / WIDTH,
        },
        sub_processors={
            "image_processor": {"size": {"height": 112, "width": 112}, "patch_size": 56}
        },
        tokens=("<patch_start>", "<patch_end>", "<patch_newline>", "<im_start>", "<im_end>"),
    ),
    "fuyu": Recipe(tokens=("|SPEAKER|", "|NEWLINE|")),
    # a 128 px base view in 32 px patches (4 x 4), halved by the window Q-Former; one grid
    "granite4_vision": Recipe(
        set={
            "vision_config.hidden_size": 64,
            "downsample_rate": "1/2",
            "deepstack_layer_map": [[1, 0]],
            "spatial_target_layers": [0, 1, 0, 1],
            "image_grid_pinpoints": [[128, 128]],
            "projector_dropout": 0.0,
        },
        sub_processors={
            "image_processor": {
                "size": {"shortest_edge": 128},
                "crop_size": {"height": 128, "width": 128},
                "image_grid_pinpoints": [[128, 128]],
            }
        },
    ),
    "evolla": Recipe(
        not_buildable="it reads protein sequences, not images: EvollaProcessor "
        "takes a protein tokenizer and no image processor"
    ),
    # the timm FastViT of transformers' own FastVLM tests: 64 px images, stride 8 (8 x 8 tokens)
    "fast_vlm": Recipe(
        processor="LlavaProcessor",
        processor_family="llava",
        config={
            "vision_config": {
                "image_size": 64,
                "patch_size": 8,
                "hidden_size": 32,
                "architecture": "fastvit_mci3",
                "do_pooling": True,
                "global_pool": "avg",
                "model_args": {
                    "inference_mode": True,
                    "layers": (2, 2),
                    "embed_dims": (8, 16),
                    "mlp_ratios": (4, 4),
                    "se_downsamples": (False, False),
                    "downsamples": (False, True),
                    "pos_embs": (None, None),
                    "token_mixers": ("repmixer", "repmixer"),
                    "lkc_use_act": True,
                    "stem_use_scale_branch": False,
                },
            },
            "vision_feature_select_strategy": "full",
            "vision_feature_layer": -1,
        },
        set={"vision_config.hidden_size": 32},
        processor_kwargs={"patch_size": 8, "vision_feature_select_strategy": "full"},
        sub_processors={
            "image_processor": {
                "size": {"shortest_edge": 64},
                "crop_size": {"height": 64, "width": 64},
            }
        },
    ),
    "kosmos-2": Recipe(processor="Kosmos2Processor", single_image=True),
    "kosmos-2.5": Recipe(processor="Kosmos2_5Processor", single_image=True),
    "mistral4": Recipe(
        not_buildable="Mistral4ForCausalLM has no vision tower and transformers maps no "
        "processor to it: a text model listed among the image-text families"
    ),
    "vipllava": Recipe(processor_kwargs={"vision_feature_select_strategy": "default"}),
    # the ViT merger sits after the vision layer insert_layer_id: one the tiny tower has
    "minicpmv4_6": Recipe(set={"insert_layer_id": 0, "vision_config.insert_layer_id": 0}),
    "minimax_m3_vl": Recipe(set={"merged_hidden_size": 4 * WIDTH}),  # 2 x 2 merged patches
    "deepseek_vl": Recipe(processor_kwargs={"num_image_tokens": 16}),  # 64 px, 16 px patches
    "deepseek_vl_hybrid": Recipe(
        set={"high_res_vision_config.global_attn_indexes": [1]},
        sub_processors={
            "image_processor": {
                "size": {"height": 64, "width": 64},
                "high_res_size": {"height": 64, "width": 64},
            }
        },
        processor_kwargs={"num_image_tokens": 16},
    ),
    # the timm Perception Encoder of transformers' own tests, at 56 px (4 x 4 patches), one tile
    "perception_lm": Recipe(
        config={
            "vision_config": {
                "architecture": "vit_pe_core_large_patch14_336",
                "num_classes": 0,
                "global_pool": "",
                "model_args": {
                    "embed_dim": 64,
                    "depth": 2,
                    "num_heads": 4,
                    "img_size": (56, 56),
                    "init_values": 0.1,
                    "ref_feat_shape": (4, 4),
                },
            },
            "projector_pooling_ratio": 1,
        },
        sub_processors={
            "image_processor": {
                "tile_size": 56,
                "max_num_tiles": 1,
                "size": {"height": 56, "width": 56},
            }
        },
        processor_kwargs={"patch_size": 14, "pooling_ratio": 1},
    ),
    "qianfan_ocr": Recipe(
        set={
            "vision_config.image_size": (56, 56),
            "vision_config.patch_size": (14, 14),
            "image_seq_length": 4,  # 4 x 4 patches, pixel-shuffled by 0.5
        },
        sub_processors={"image_processor": {"size": {"height": 56, "width": 56}}},
        processor_kwargs={"image_seq_length": 4},
    ),
    "muse_glimmer": Recipe(set={"out_hidden_size": 4 * WIDTH}),  # 2 x 2 merged patches
    "muse_spark": Recipe(set={"out_hidden_size": 4 * WIDTH}),
    "blip-2": Recipe(single_image=True, image_block=""),  # the processor adds the queries
    "instructblip": Recipe(single_image=True, image_block=""),  # the processor adds the queries
    "instructblipvideo": Recipe(
        single_image=True, image_block=""
    ),  # the processor adds the queries
    "pi0": Recipe(
        not_buildable="a robot action model: its processor takes camera images and "
        "robot states, and the model predicts actions, not text labels"
    ),
}
RECIPES["shieldgemma2"] = dataclasses.replace(RECIPES["gemma3"], single_image=True)


# -- the generic shrink --------------------------------------------------------------------------

_WIDTHS = {
    "hidden_size",
    "embed_dim",
    "d_model",
    "hidden_dim",
    "n_embd",
    "dim",
    "projection_dim",
    "word_embed_proj_dim",
}
_FFNS = {"intermediate_size", "ffn_dim", "mlp_dim", "encoder_ffn_dim", "decoder_ffn_dim"}
_HEADS = {"num_attention_heads", "num_heads", "n_head", "n_heads", "attention_heads"}
_KV_HEADS = {"num_key_value_heads", "num_kv_heads", "n_kv_heads"}
_LAYERS = {"num_hidden_layers", "num_layers", "depth", "n_layers", "encoder_layers"}
_EXPERTS = {"num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"}
_SMALL = {
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "initializer_range": 0.2,
}


def sub_configs(config: Any) -> Iterator[tuple[str, Any]]:
    """The config and every nested config, with their dotted paths ('' for the top)."""
    from transformers import PretrainedConfig

    stack: list[tuple[str, Any]] = [("", config)]
    seen: set[int] = set()
    while stack:
        path, current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield path, current
        for name, value in vars(current).items():
            if isinstance(value, PretrainedConfig):
                stack.append((f"{path}.{name}".lstrip("."), value))


def shrink(config: Any) -> None:
    """Few layers and narrow widths everywhere, keeping each config's proportions."""
    for _, sub in sub_configs(config):
        values = vars(sub)
        heads = next((values[n] for n in _HEADS if isinstance(values.get(n), int)), None)
        for name, value in list(values.items()):
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            if name in _WIDTHS or (name.endswith("_hidden_size") and value > WIDTH):
                setattr(sub, name, WIDTH)
            elif name in _FFNS:
                setattr(sub, name, FFN)
            elif name in _HEADS:
                setattr(sub, name, HEADS)
            elif name in _KV_HEADS:
                setattr(sub, name, HEADS if value == heads else 2)
            elif name == "head_dim":
                setattr(sub, name, HEAD_DIM)
            elif name in _EXPERTS:
                setattr(sub, name, 4)
            elif name in _SMALL:
                setattr(sub, name, _SMALL[name])
        _shrink_layers(sub)
        _shrink_rope(sub)
        _shrink_per_layer_config(sub)
    for _, sub in sub_configs(config):
        for name, value in list(vars(sub).items()):
            if "feature_layer" in name and value is not None:
                setattr(sub, name, _clamp_layers(value))


def _clamp_layers(value: Any) -> Any:
    """Vision feature layer indices that exist in a tower of LAYERS layers (LAYERS + 1 hidden
    states); a list keeps its length, so the projector's input width stays the config's."""
    if isinstance(value, list | tuple):
        return [_clamp_layers(item) for item in value]
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    return max(value, -(LAYERS + 1)) if value < 0 else min(value, LAYERS)


def _shrink_per_layer_config(sub: Any) -> None:
    """A heterogeneous config's per-layer overrides of the layers the tiny model keeps (Gemma 4
    unified's wider global heads), narrowed like the rest."""
    overrides = sub.to_dict().get("per_layer_config") if hasattr(sub, "to_dict") else None
    depth = next((vars(sub)[n] for n in _LAYERS if isinstance(vars(sub).get(n), int)), None)
    if not isinstance(overrides, dict) or not overrides or depth is None:
        return
    narrow = {"head_dim": 2 * HEAD_DIM, "num_key_value_heads": 2}
    sub.per_layer_config = {
        int(layer): {name: narrow.get(name, value) for name, value in change.items()}
        for layer, change in overrides.items()
        if int(layer) < depth
    }


def _shrink_rope(sub: Any) -> None:
    """Multimodal RoPE sections that add up to the narrower heads' rotary half."""
    for name in ("rope_parameters", "rope_scaling"):
        rope = vars(sub).get(name)
        if not isinstance(rope, dict) or not isinstance(rope.get("mrope_section"), list):
            continue
        section = rope["mrope_section"]
        target = int(HEAD_DIM * float(rope.get("partial_rotary_factor", 1.0))) // 2
        scaled = [max(1, round(part * target / sum(section))) for part in section]
        scaled[0] += target - sum(scaled)
        rope["mrope_section"] = scaled


def _shrink_layers(sub: Any) -> None:
    values = vars(sub)
    depth = next((values[n] for n in _LAYERS if isinstance(values.get(n), int)), None)
    per_layer = [  # layer_types, mlp_layer_types, a stage list (depths, ...): one per layer
        name
        for name, value in values.items()
        if isinstance(value, list | tuple) and len(value) == depth and depth > 1
    ]
    count = LAYERS
    for name in per_layer:  # the shortest prefix that holds every kind of each list
        if not name.endswith("layer_types"):
            continue
        kinds = values[name]
        count = max(count, *(kinds.index(kind) + 1 for kind in set(kinds)))
    for name in per_layer:
        setattr(sub, name, values[name][:count])
    for name in _LAYERS & set(values):
        if isinstance(values[name], int) and not isinstance(values[name], bool):
            setattr(sub, name, count)


def set_dotted(config: Any, dotted: str, value: Any) -> None:
    *path, name = dotted.split(".")
    target = config
    for part in path:
        target = getattr(target, part)
    setattr(target, name, value)


# -- building one family -------------------------------------------------------------------------


def processor_class(model_type: str, recipe: Recipe) -> Any:
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    name = recipe.processor or PROCESSOR_MAPPING_NAMES.get(model_type)
    if name is None:
        raise BuildError("transformers maps no processor class to this model_type")
    return getattr(transformers, name)


def sub_processor(model_type: str, attribute: str, kwargs: dict[str, Any]) -> Any:
    """The family's default image / video / feature processor."""
    import transformers
    from transformers.models.auto.feature_extraction_auto import FEATURE_EXTRACTOR_MAPPING_NAMES
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES

    mappings = {
        "image_processor": IMAGE_PROCESSOR_MAPPING_NAMES,
        "video_processor": VIDEO_PROCESSOR_MAPPING_NAMES,
        "feature_extractor": FEATURE_EXTRACTOR_MAPPING_NAMES,
        "audio_processor": FEATURE_EXTRACTOR_MAPPING_NAMES,
    }
    kind = next(k for k in mappings if k in attribute)
    names = mappings[kind].get(model_type)
    if names is None:
        raise BuildError(f"transformers maps no {kind} class to this model_type")
    if isinstance(names, dict):
        name = names.get("torchvision") or next(iter(names.values()))
    else:
        name = names if isinstance(names, str) else names[0]
    return getattr(transformers, name)(**kwargs)


class BuildError(Exception):
    """The family cannot be built this way (the message says why)."""


def build(model_type: str) -> tuple[Any, Any]:
    """A tiny random-weight model and its processor from transformers' own classes."""
    import torch
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    recipe = RECIPES.get(model_type, Recipe())
    if recipe.not_buildable:
        raise BuildError(recipe.not_buildable)
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **recipe.config)
    shrink(config)
    for dotted, value in recipe.set.items():
        set_dotted(config, dotted, value)

    cls = processor_class(model_type, recipe)
    subs = {
        attribute: sub_processor(
            recipe.processor_family or model_type,
            attribute,
            recipe.sub_processors.get(attribute, {}),
        )
        for attribute in cls.get_attributes()
        if "tokenizer" not in attribute
    }
    tokenizers = [attribute for attribute in cls.get_attributes() if "tokenizer" in attribute]
    side = small_images(subs.get("image_processor"), config, recipe)
    kwargs = {**processor_kwargs(cls, config, recipe.token_counts), **recipe.processor_kwargs}
    # first pass: which tokens does the processor name? then the tokenizer that has them all
    named = dict(recipe.named_tokens)
    processor = None
    for _ in range(24):
        probe = toy_tokenizer([*recipe.tokens, *named.values()], chat_template("<image>"), named)
        try:
            processor = cls(**dict.fromkeys(tokenizers, probe), **subs, **kwargs)
            break
        except AttributeError as exc:  # the processor reads a token the tokenizer must name
            missing = re.search(r"has no attribute '?(\w+_token)(?:_id)?'?", str(exc))
            if not missing or missing.group(1) in named:
                raise
            named[missing.group(1)] = f"<{missing.group(1).removesuffix('_token')}>"
    if processor is None:
        raise BuildError("the processor kept asking for more tokenizer attributes")
    tokens = [*recipe.tokens, *named.values(), *named_tokens(processor)]
    placeholder = getattr(processor, "image_placeholder_token", None) or getattr(
        getattr(processor, "image_token", None), "content", None
    )
    image = recipe.image_block
    if image is None:
        image = placeholder or getattr(processor, "image_token", None) or "<image>"
    tokenizer = toy_tokenizer(tokens, chat_template(image), named)
    processor = cls(**dict.fromkeys(tokenizers, tokenizer), **subs, **kwargs)
    processor.chat_template = tokenizer.chat_template
    recipe.image_side = side

    align_token_ids(config, processor, tokenizer, recipe)
    for _, sub in sub_configs(config):
        for name, value in list(vars(sub).items()):
            if name.startswith("vocab_size") and isinstance(value, int) and value > len(tokenizer):
                setattr(sub, name, len(tokenizer))
    if recipe.prepare is not None:
        recipe.prepare(config, tokenizer)
    model_class = getattr(transformers, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type])
    model = model_class(config).eval()
    if recipe.finish is not None:
        recipe.finish(model, processor)
    return model, processor


_TOKEN_COUNT = re.compile(r"image_tokens|seq_len|num_patches|tokens_per_image|query_tokens")


def _small_size(current: dict[str, Any], side: int) -> dict[str, Any]:
    """An image processor's ``size`` for ``side`` px images, in the keys it uses."""
    keys = {key for key, value in current.items() if value is not None}
    edges = {"shortest_edge", "longest_edge"} <= keys and current["longest_edge"] > 4096
    if edges:  # Qwen2-VL style: the edges are pixel counts
        return {"shortest_edge": side * side // 4, "longest_edge": side * side}
    if "max_pixels" in keys:
        return {"min_pixels": side * side // 4, "max_pixels": side * side}
    if {"height", "width"} <= keys:
        return {"height": side, "width": side}
    if {"max_height", "max_width"} <= keys:
        return {"max_height": side, "max_width": side}
    if {"shortest_edge", "longest_edge"} <= keys:
        return {"shortest_edge": side, "longest_edge": side}
    if "shortest_edge" in keys:
        return {"shortest_edge": side}
    if "longest_edge" in keys:
        return {"longest_edge": side}
    return current


def small_images(image_processor: Any, config: Any, recipe: Recipe) -> int:
    """Make the image processor emit small images (a few patches a side) and the vision config
    expect them; returns the side of the test images."""
    patch = 14
    for _, sub in sub_configs(config):
        if isinstance(vars(sub).get("patch_size"), int):
            patch = sub.patch_size
            break
    side = 4 * patch
    given = recipe.sub_processors.get("image_processor", {})
    if image_processor is not None:  # the processor's patching is the vision tower's
        for ours, theirs in (("patch_size", "patch_size"), ("merge_size", "spatial_merge_size"),
                             ("temporal_patch_size", "temporal_patch_size")):  # fmt: skip
            if ours in given:  # the recipe's (Step 3.7's patch_size is its tiles' side)
                continue
            wanted = next((vars(sub)[theirs] for _, sub in sub_configs(config)
                           if isinstance(vars(sub).get(theirs), int)), None)  # fmt: skip
            if isinstance(getattr(image_processor, ours, None), int) and wanted is not None:
                setattr(image_processor, ours, wanted)
    size = getattr(image_processor, "size", None)
    if "image_processor" in recipe.sub_processors:
        size = None  # the recipe sized the images
    if size is not None:
        current = dict(vars(size) if dataclasses.is_dataclass(size) else size)
        new = _small_size(current, side)
        image_processor.size = type(size)(**new) if dataclasses.is_dataclass(size) else new
    crop = getattr(image_processor, "crop_size", None)
    if crop and "image_processor" not in recipe.sub_processors:
        square = {"height": side, "width": side}
        image_processor.crop_size = (
            type(crop)(**square) if dataclasses.is_dataclass(crop) else square
        )
    counts = {}  # tokens per image before -> after (a vision tower of image_size / patch_size)
    for _, sub in sub_configs(config):
        values = vars(sub)
        if isinstance(values.get("image_size"), int):
            patch_size = (
                values.get("patch_size") if isinstance(values.get("patch_size"), int) else 0
            )
            if patch_size:
                counts[(values["image_size"] // patch_size) ** 2] = (side // patch_size) ** 2
            sub.image_size = side
    for _, sub in sub_configs(config):
        for name, value in list(vars(sub).items()):
            if _TOKEN_COUNT.search(name) and isinstance(value, int) and value in counts:
                setattr(sub, name, counts[value])
    recipe.token_counts = counts
    return side


def processor_kwargs(cls: Any, config: Any, counts: dict[int, int]) -> dict[str, Any]:
    """Processor arguments the config answers (``patch_size``, the feature strategy, ...)."""
    import inspect

    parameters = set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs", "args"}
    found: dict[str, Any] = {}
    for _, sub in sub_configs(config):
        for name in parameters - set(found):
            value = vars(sub).get(name)
            if value is not None and not name.endswith(("processor", "tokenizer", "template")):
                found[name] = value
    for name in parameters:
        default = inspect.signature(cls.__init__).parameters[name].default
        if _TOKEN_COUNT.search(name) and isinstance(default, int) and default in counts:
            found.setdefault(name, counts[default])
    if "num_additional_image_tokens" in parameters:
        vision = getattr(config, "vision_config", None)
        found["num_additional_image_tokens"] = int("clip" in getattr(vision, "model_type", ""))
    return found


_TOKEN_ATTRIBUTE = re.compile(r"^(?:[a-z0-9_]*_)?token$")


def named_tokens(processor: Any) -> list[str]:
    """Special-looking token strings the processor holds (``image_token``, ``boi_token``, ...)."""
    found = []
    for name, value in vars(processor).items():
        value = getattr(value, "content", value)  # an AddedToken
        if _TOKEN_ATTRIBUTE.match(name) and isinstance(value, str) and value:
            found.append(value)
    return found


def align_token_ids(config: Any, processor: Any, tokenizer: Any, recipe: Recipe) -> None:
    """Point the config's token ids at the toy tokenizer's tokens."""
    unknown = tokenizer.unk_token_id
    ids = tokenizer.convert_tokens_to_ids
    for _, sub in sub_configs(config):
        for name, value in list(vars(sub).items()):
            if name in recipe.token_ids:
                setattr(sub, name, ids(recipe.token_ids[name]))
                continue
            match = re.fullmatch(r"(.+?)_(?:token_id|token_index|id|index)", name)
            if not match or isinstance(value, bool) or not isinstance(value, int | None):
                continue
            stem = match.group(1).removesuffix("_token")
            if stem in ("bos", "eos", "pad", "decoder_start", "sep", "cls") and value is not None:
                own = getattr(tokenizer, f"{stem}_token_id", None)
                setattr(sub, name, own if own is not None else tokenizer.pad_token_id)
                continue
            candidate = getattr(processor, f"{stem}_token_id", None)
            if not isinstance(candidate, int):
                token = getattr(processor, f"{stem}_token", None)
                token = getattr(token, "content", token)  # an AddedToken
                if not isinstance(token, str):
                    token = getattr(tokenizer, f"{stem}_token", None)
                candidate = ids(token) if isinstance(token, str) else None
            if isinstance(candidate, int) and candidate != unknown:
                setattr(sub, name, candidate)
            elif value is not None and value >= len(tokenizer):
                setattr(sub, name, tokenizer.pad_token_id)  # never written by the processor


# -- the sanity forward, saving, checking ------------------------------------------------------


def images(count: int, side: int) -> list[Any]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    return [
        Image.fromarray(rng.integers(0, 256, size=(side, side + 14 * k, 3), dtype=np.uint8))
        for k in range(count)
    ]


def sanity_forward(model: Any, processor: Any, recipe: Recipe) -> int:
    """One forward of the model on a two-image prompt (one image for a single-image family);
    the prompt's length."""
    import torch

    count = 1 if recipe.single_image else 2
    content = [*[{"type": "image"}] * count, {"type": "text", "text": "Which?"}]
    messages = [{"role": "user", "content": content}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[images(count, recipe.image_side)], return_tensors="pt")
    with torch.inference_mode():
        model(**inputs)
    return int(inputs["input_ids"].shape[1])


def build_family(model_type: str, folder: Path) -> dict[str, Any]:
    """Build, sanity-check and save one family (run in a child process). A model whose own
    forward fails on the two-image prompt is saved all the same: the generic adapter may refuse
    it before any forward, which is a verdict; otherwise it counts as not built."""
    import torch

    torch.set_num_threads(1)
    recipe = RECIPES.get(model_type, Recipe())
    started = time.time()
    try:
        model, processor = build(model_type)
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
    except BuildError as exc:
        return {"built": False, "reason": str(exc)}
    except Exception as exc:
        return {"built": False, "reason": _error(exc)}
    result: dict[str, Any] = {
        "built": True,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    try:
        result["two_image_prompt_tokens"] = sanity_forward(model, processor, recipe)
    except Exception as exc:
        result["forward_error"] = _error(exc)
    result["seconds"] = round(time.time() - started, 1)
    return result


def _error(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1]
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
    return f"{reason} (at {Path(where.filename).name}:{where.lineno})"


def run_check(folder: Path, timeout: int) -> dict[str, Any]:
    """``posdebias check`` on the saved model: the verdict, the adapter and the rows."""
    command = [
        sys.executable,
        "-m",
        "posdebias",
        "check",
        "--model",
        str(folder),
        "--device",
        "cpu",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.time()
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return {"verdict": FAIL, "detail": f"posdebias check ran over {timeout} s"}
    output = done.stdout + done.stderr
    rows = [
        (status, name)
        for name, status in re.findall(
            r"^[│|]\s*([^│|]+?)\s*[│|]\s*(PASS|FAIL|SKIP)\s*[│|]", output, re.M
        )
    ]
    adapter = re.search(r"adapter '([^']+)'", output)
    result: dict[str, Any] = {
        "exit": done.returncode,
        "adapter": adapter.group(1) if adapter else None,
        "rows": [f"{status} {name}" for status, name in rows],
        "seconds": round(time.time() - started, 1),
        "output": output[-4000:],
    }
    if done.returncode == 0 and rows and all(status != FAIL for status, _ in rows):
        result["verdict"] = PASS
        result["detail"] = f"adapter {result['adapter']!r}"
    elif done.returncode == 2 and not rows and "cannot load" in output:
        result["verdict"] = NOT_BUILT  # the saved tiny model does not load back
        result["detail"] = "posdebias cannot load the saved model: " + _refusal(output)
    elif done.returncode == 2 and not rows and "Traceback" not in output:
        result["verdict"] = REFUSED  # a clear error before any row ran: no forward
        result["detail"] = _refusal(output)
    else:
        result["verdict"] = FAIL
        failed = [f"{s} {n}" for s, n in rows if s == FAIL]
        result["detail"] = "; ".join(failed) or output.strip().splitlines()[-1][:300]
    return result


def _refusal(output: str) -> str:
    match = re.search(r"cannot score model_type '[^']+': (.*?)\. It refuses", output, re.S)
    errors = re.findall(r"^error: (.*)", output, re.M | re.S)
    text = match.group(1) if match else errors[-1] if errors else output.strip()
    return " ".join(text.split())[:300]


# -- the sweep -----------------------------------------------------------------------------------


def families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return sorted(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)


def sweep_one(model_type: str, cache: Path, *, rebuild: bool, timeout: int) -> dict[str, Any]:
    folder = cache / "models" / model_type
    stamp = folder / "build.json"
    built: dict[str, Any] | None = None
    if stamp.exists() and not rebuild:
        built = json.loads(stamp.read_text())
        if built.get("version") != VERSION:
            built = None
    if built is None:
        done = subprocess.run(
            [sys.executable, __file__, "--build-one", model_type, "--cache", str(cache)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if stamp.exists():
            built = json.loads(stamp.read_text())
        else:
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            built = {"built": False, "reason": f"the builder crashed: {tail[0][:300]}"}
    if not built["built"]:
        problem = config_refusal(model_type)
        if problem is not None:  # what `posdebias check` refuses from any checkpoint's config
            detail = (
                f"{problem} (from the config and model class; the tiny model: {built['reason']})"
            )
            return {"model_type": model_type, "verdict": REFUSED, "detail": detail}
        return {"model_type": model_type, "verdict": NOT_BUILT, "detail": built["reason"]}
    checked = run_check(folder, timeout)
    if checked["verdict"] != REFUSED and "forward_error" in built:
        reason = f"the tiny model's own forward fails: {built['forward_error']}"
        return {"model_type": model_type, "build": built, **checked, "verdict": NOT_BUILT,
                "detail": reason}  # fmt: skip
    return {"model_type": model_type, "build": built, **checked}


def config_refusal(model_type: str) -> str | None:
    """The generic adapter's refusal from the family's default config and model class alone
    (what the coverage table says), or None; a built-in family is never refused."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    from posdebias.adapters.families.generic import structural_problem
    from posdebias.registry import get_registry

    adapter = get_registry().adapter_for_model_type(model_type)
    if adapter is not None and adapter.name != "generic":
        return None
    model_class = getattr(transformers, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type])
    try:
        config = AutoConfig.for_model(model_type)
    except Exception:
        return None
    return structural_problem(config, model_class)


def write_stamp(model_type: str, cache: Path) -> None:
    folder = cache / "models" / model_type
    result = build_family(model_type, folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "build.json").write_text(json.dumps({"version": VERSION, **result}, indent=1))


def load_results(store: Path) -> list[dict[str, Any]]:
    """The last result of every family of this transformers that has one, in table order."""
    found = {path.stem: path for path in store.glob("*.json")} if store.exists() else {}
    return [json.loads(found[name].read_text()) for name in families() if name in found]


def markdown(results: list[dict[str, Any]]) -> str:
    """The verdicts as a Markdown table, with the counts above it."""
    counts: dict[str, int] = {}
    for row in results:
        key = row["verdict"]
        if key == PASS:
            key = "PASS (generic)" if row.get("adapter") == "generic" else "PASS (built in)"
        counts[key] = counts.get(key, 0) + 1
    order = ("PASS (built in)", "PASS (generic)", REFUSED, FAIL, NOT_BUILT)
    summary = ", ".join(f"{counts.get(key, 0)} {key}" for key in order)
    lines = [f"{len(results)} families: {summary}.", "", "| model_type | verdict | detail |"]
    lines.append("|---|---|---|")
    for row in results:
        detail = str(row.get("detail", "")).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{row['model_type']}` | {row['verdict']} | {detail} |")
    return "\n".join(lines) + "\n"


RECORD = Path(__file__).parents[1] / "src" / "posdebias" / "data" / "family_sweep.json"


def record(results: list[dict[str, Any]], cache: Path) -> None:
    """Write the verdicts of the families the generic adapter takes where the coverage table
    reads them (for the installed transformers). The families swept into this cache replace
    their records; the other families' records of the same transformers are kept, so a sweep of
    a few families (``--families X --cache DIR``) records them alone."""
    import transformers

    from posdebias.registry import get_registry

    registry = get_registry()
    records: dict[str, dict[str, str]] = {}
    if RECORD.exists():
        kept = json.loads(RECORD.read_text(encoding="utf-8"))
        if kept.get("transformers") == transformers.__version__:
            current = set(families())
            records = {k: v for k, v in kept["families"].items() if k in current}
    swept = {row["model_type"] for row in results}
    for name in swept:
        records.pop(name, None)
    for row in results:
        adapter = registry.adapter_for_model_type(row["model_type"])
        if (adapter is not None and adapter.name != "generic") or config_refusal(row["model_type"]):
            continue  # built in, or refused from the config: the table says so without a sweep
        detail = str(row.get("detail", ""))
        detail = detail.replace(str(cache / "models" / row["model_type"]), "the model folder")
        detail = detail.split(". Known adapter families")[0]  # the loader's advice
        records[row["model_type"]] = {"verdict": row["verdict"], "detail": detail}
    records = dict(sorted(records.items()))
    text = json.dumps({"transformers": transformers.__version__, "families": records}, indent=1)
    RECORD.write_text(text + "\n", encoding="utf-8")
    print(f"recorded {len(records)} families in {RECORD} ({len(swept)} from {cache})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", help="comma-separated model types (default: all)")
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--rebuild", action="store_true", help="rebuild cached models")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per step")
    parser.add_argument("--report", action="store_true", help="print the last results")
    parser.add_argument(
        "--record", action="store_true", help="write the last results for the coverage table"
    )
    parser.add_argument("--build-one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    if args.build_one:
        write_stamp(args.build_one, args.cache)
        return 0
    store = args.cache / "results"
    if args.report:
        print(markdown(load_results(store)), end="")
        return 0
    if args.record:
        record(load_results(store), args.cache)
        return 0
    chosen = args.families.split(",") if args.families else families()
    unknown = sorted(set(chosen) - set(families()))
    if unknown:
        parser.error(f"not image-text families of this transformers: {', '.join(unknown)}")
    store.mkdir(parents=True, exist_ok=True)
    for model_type in chosen:
        result = sweep_one(model_type, args.cache, rebuild=args.rebuild, timeout=args.timeout)
        (store / f"{model_type}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
        print(f"{model_type}: {result['verdict']} - {result.get('detail', '')}"[:240], flush=True)
    print(markdown([r for r in load_results(store) if r["model_type"] in chosen]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
