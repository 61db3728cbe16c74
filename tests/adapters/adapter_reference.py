"""Independent references for the adapter tests: eager attention maps and full re-forwards."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from posdebias.adapters.attention import language_model_attention
from posdebias.adapters.hf import HFAdapter, PreparedBatch
from posdebias.adapters.hf.spans import span_matrix
from posdebias.registry.manager import get_registry
from posdebias.testing import tiny_model_and_processor

_PAIRS: dict[str, tuple] = {}


def tiny_pair(family: str) -> tuple:
    """One (model, processor) per family and process; adapters install the probe on it (a
    no-op for outputs), so tests share it instead of rebuilding."""
    if family not in _PAIRS:
        _PAIRS[family] = tiny_model_and_processor(family, seed=0)
    return _PAIRS[family]


def fresh_model(family: str, implementation: str):
    """A second copy of the session's tiny model (same seed, same weights), untouched by the
    probe, with ``implementation`` for its language model; ``sdpa`` on a language model without
    it (Gemma 2's soft-capped logits) gives its eager attention, transformers' own."""
    model, _ = tiny_model_and_processor(family, seed=0)
    adapter_class = get_registry().adapter_for_model_type(model.config.model_type) or HFAdapter
    key = adapter_class.text_config_key  # None: the model's own config is the language model's
    try:
        model.set_attn_implementation(language_model_attention(model, key, implementation))
    except ValueError:
        if implementation != "sdpa":
            raise
        model.set_attn_implementation(language_model_attention(model, key, "eager"))
    return model


def forward(family: str, model, **inputs):
    """The model's forward as the family's adapter runs it (``HFAdapter.own_forward``: the
    model itself, except where transformers' own forward cannot run, see docs/adapters.md)."""
    adapter_class = get_registry().adapter_for_model_type(model.config.model_type) or HFAdapter
    return adapter_class.own_forward(SimpleNamespace(model=model), **inputs)


def language_model(model):
    """The language model (decoder) module of a conditional-generation model."""
    inner = getattr(model, "model", None)
    found = getattr(inner, "language_model", None) or getattr(inner, "text_model", None)
    if found is None and hasattr(inner, "embed_tokens_extend"):  # Phi-4-multimodal: the
        return inner.layers  # decoder layers (its embedding layer holds the vision tower)
    return found or model.language_model  # Idefics3 / SmolVLM: text_model


def eager_masses(family: str, batch: PreparedBatch) -> torch.Tensor:
    """[B, L, N] head-mean attention mass of the last row, from eager ``output_attentions``:
    one row per softmax-attention layer (transformers returns attention maps only for them,
    in layer order)."""
    model = fresh_model(family, "eager")
    inputs = dict(batch.inputs)
    with torch.no_grad():
        output = forward(
            family, model, **inputs, position_ids=batch.position_ids, output_attentions=True
        )
    length = batch.inputs["input_ids"].shape[1]
    maps = list(output.attentions)
    spans = span_matrix(batch.spans, length).double()
    cross = getattr(model.config.get_text_config(), "cross_attention_layers", None)
    if cross:  # Mllama: one map per layer; the rows are the cross-attention layers'
        maps = [maps[layer] for layer in sorted(cross)]
        spans = encoder_span_matrix(model, batch).double()
    rows = [layer[:, :, -1, :].double().mean(dim=1) for layer in maps]
    return torch.stack([torch.bmm(row[:, None, :], spans)[:, 0] for row in rows], dim=1)


def encoder_span_matrix(model, batch: PreparedBatch) -> torch.Tensor:
    """[B, S, N] for Mllama's cross-attention keys: the vision encoder's tokens, image by image,
    each image its tiles x (patches + class token), as the model concatenates them."""
    pixels = batch.inputs["pixel_values"]  # [B, images, tiles, channels, height, width]
    vision = model.config.vision_config
    per_image = pixels.shape[2] * ((vision.image_size // vision.patch_size) ** 2 + 1)
    matrix = torch.zeros(pixels.shape[0], pixels.shape[1] * per_image, pixels.shape[1])
    for image in range(pixels.shape[1]):
        matrix[:, image * per_image : (image + 1) * per_image, image] = 1.0
    return matrix


def score_tolerance(adapter: HFAdapter) -> float:
    """Agreement required between cached label scores and full re-forwards: 1e-5, and 1e-3 for
    language models with linear-attention layers. transformers' Gated DeltaNet kernels compute
    in float32 whatever the model's dtype, and the chunked kernel of a prompt pass and the
    recurrent kernel of a decoding step round differently: about 2e-5 on the tiny Qwen3.5 (the
    same with the model in float64), 2e-4 on the tiny Qwen3.5-MoE, whose router turns the
    difference into different expert weights. No tighter agreement exists to test; the
    attention masses are still held to 1e-5."""
    types = getattr(adapter.model.config.get_text_config(), "layer_types", None) or ()
    return 1e-3 if "linear_attention" in types else 1e-5


def reforward_scores(adapter: HFAdapter, batch: PreparedBatch) -> torch.Tensor:
    """[N] restricted label log-probabilities of a one-row batch by full forwards of
    prompt + label tokens (no KV cache, positions computed by the model itself). Labels whose
    paths feed the same tokens share one forward (twelve digits: two forwards, not twelve)."""
    inputs = dict(batch.inputs)
    prompt = inputs["input_ids"]
    length = prompt.shape[1]
    totals = []
    forwards: dict[tuple, torch.Tensor] = {}
    for path in batch.plan.paths:
        if path[:-1] not in forwards:
            extra = torch.tensor([list(path[:-1])], dtype=prompt.dtype)
            # the label tokens as the model's own generation feeds them (PaliGemma: suffixes)
            full = adapter.extended_inputs(dict(inputs), extra)
            with torch.no_grad():
                # the rows that predict the label's tokens (the prompt's last on), in float64
                logits = adapter.model_forward(**full).logits[0, length - 1 :]
                forwards[path[:-1]] = logits.double()
        logits = forwards[path[:-1]]
        total = torch.zeros((), dtype=torch.float64)
        for depth, token in enumerate(path):
            valid = list(batch.plan.options[path[:depth]])
            restricted = torch.log_softmax(logits[depth, valid], dim=-1)
            total = total + restricted[valid.index(token)]
        totals.append(total)
    scores = torch.stack(totals)
    return scores - torch.logsumexp(scores, dim=0)


def shared_and_repeated_samples(adapter: HFAdapter, instances: list) -> tuple[list, list]:
    """The tokens of 4 seeded samples per instance (a left-padded batch of the instances),
    decoded over one shared copy of the prompt's keys and values, and with the cache repeated
    per sample (the plain way): the two must be equal."""
    from posdebias.adapters import GenerationSettings

    settings = GenerationSettings(
        max_new_tokens=6, do_sample=True, temperature=1.0, num_samples=4, stop_at_eos=False
    )
    seeds = list(range(3, 3 + len(instances)))
    shared = adapter.generate_many(instances, settings, batch_size=2, seeds=seeds)
    plain = adapter.generate_many(
        instances,
        GenerationSettings(**{**settings.__dict__, "share_prefix": False}),
        batch_size=2,
        seeds=seeds,
    )
    return [g.tokens for g in shared], [g.tokens for g in plain]


def seeded_model(config, seed: int = 0):
    """``config``'s model with weights drawn from ``seed``, the global RNG left as it was: drawn
    from whatever earlier tests left in the RNG, the model a test checked depended on the order
    the tests ran in (and with it whether its greedy answer met the end token)."""
    from transformers import AutoModelForImageTextToText

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForImageTextToText.from_config(config).eval()


def greedy_generate(model, inputs: dict, steps: int) -> list[int]:
    """The new tokens of transformers' own greedy ``generate`` of one row: up to ``steps``,
    fewer where it stops at an end-of-sequence token. (Kept going with ``min_new_tokens``, it
    bans that token, so wherever a random model's best next token is the end it picks another
    one than the adapter does.) Compare with the adapter's tokens cut to this length."""
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=steps, do_sample=False)
    tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
    ends = model.generation_config.eos_token_id
    assert len(tokens) == steps or tokens[-1] in (ends if isinstance(ends, list) else [ends])
    return tokens


def tiny_granite4_vision() -> tuple:
    """A tiny Granite 4 Vision from its real classes: 128 px images in 32 px patches, a window
    Q-Former halving each side, DeepStack features injected at the first language layer."""
    from transformers import AutoConfig
    from transformers.models.granite4_vision import Granite4VisionProcessor
    from transformers.models.llava_next import LlavaNextImageProcessor

    from posdebias.testing.tiny.common import LLAVA_TEMPLATE, text_config
    from posdebias.testing.tiny.llava import llava_tokenizer

    tokenizer = llava_tokenizer()
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": 128},
        crop_size={"height": 128, "width": 128},
        image_grid_pinpoints=[[128, 128]],
    )
    processor = Granite4VisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=32,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        downsample_rate="1/2",
        chat_template=LLAVA_TEMPLATE,
    )
    ids = tokenizer.convert_tokens_to_ids
    text = text_config(len(tokenizer), num_key_value_heads=4, eos_token_id=ids("</s>"))
    config = AutoConfig.for_model(
        "granite4_vision",
        text_config={"model_type": "granite4_vision_text", **text, "pad_token_id": ids("<pad>")},
        vision_config={"model_type": "clip_vision_model", "hidden_size": 64,
                       "intermediate_size": 128, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": 128, "patch_size": 32},
        qformer_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "encoder_hidden_size": 64},
        image_token_index=ids("<image>"),
        image_grid_pinpoints=[[128, 128]],
        downsample_rate="1/2",
        deepstack_layer_map=[[1, 0]],
        spatial_target_layers=[0, 1, 0, 1],
        projector_dropout=0.0,
    )  # fmt: skip
    return seeded_model(config), processor


def tiny_chameleon() -> tuple:
    """A tiny Chameleon from its real classes: a flat config (no text sub-config: the model's own
    config is its language model's) beside a VQ-GAN of 16 codes; each 64 px image becomes 16
    image tokens whose embeddings are the codes' vocabulary entries."""
    from transformers import AutoConfig
    from transformers.models.chameleon import ChameleonImageProcessor, ChameleonProcessor

    from posdebias.testing import build_tokenizer
    from posdebias.testing.tiny.common import LLAVA_TEMPLATE, text_config

    # the VQ codes' names in the vocabulary: "IMGIMG", the code's digits as letters, "Z"
    codes = ["IMGIMG" + "".join(chr(65 + int(d)) for d in str(code)) + "Z" for code in range(16)]
    tokenizer = build_tokenizer(
        ["<s>", "</s>", "<pad>", "<image>", "<racm3:break>", "<eoss>", *codes],
        chat_template=LLAVA_TEMPLATE,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
        named_tokens={"image_token": "<image>"},
    )
    image_processor = ChameleonImageProcessor(
        size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}
    )
    processor = ChameleonProcessor(image_processor, tokenizer, image_seq_length=16)
    processor.chat_template = LLAVA_TEMPLATE
    vocabulary = dict(tokenizer.get_vocab())
    vq = {"embed_dim": 32, "num_embeddings": 16, "base_channels": 32, "latent_channels": 32,
          "resolution": 64, "num_res_blocks": 1}  # fmt: skip
    config = AutoConfig.for_model(
        "chameleon",
        **text_config(len(tokenizer), num_key_value_heads=4),
        vq_config=vq,
        vocabulary_map=vocabulary,
        image_token_id=vocabulary["<image>"],
        bos_token_id=vocabulary["<s>"],
        eos_token_id=vocabulary["</s>"],
        pad_token_id=vocabulary["<pad>"],
    )
    return seeded_model(config), processor


def tiny_step3p7() -> tuple:
    """A tiny Step 3.7 from its real classes: each image a 112 px global view (4 tokens) after
    its tiles (56 px, 1 token each), which the processor cuts from a large or wide image and
    writes as ``<patch_start><im_patch><patch_end>``, a ``<patch_newline>`` after each row of
    tiles, then ``<im_start>`` + the view's tokens + ``<im_end>``."""
    from transformers import AutoConfig
    from transformers.models.step3p7 import Step3p7ImageProcessor, Step3p7Processor

    from posdebias.testing import build_tokenizer
    from posdebias.testing.tiny.common import LLAVA_TEMPLATE, text_config

    markers = ["<patch_start>", "<patch_end>", "<patch_newline>", "<im_start>", "<im_end>"]
    template = LLAVA_TEMPLATE.replace("<image>", "<im_patch>")
    tokenizer = build_tokenizer(
        ["<s>", "</s>", "<pad>", "<im_patch>", *markers],
        chat_template=template,
        eos_token="</s>",
        pad_token="<pad>",
        bos_token="<s>",
    )
    image_processor = Step3p7ImageProcessor(size={"height": 112, "width": 112}, patch_size=56)
    processor = Step3p7Processor(image_processor, tokenizer, chat_template=template)
    ids = tokenizer.convert_tokens_to_ids
    text = text_config(len(tokenizer), num_hidden_layers=2, head_dim=16, sliding_window=512,
                       mlp_layer_types=["dense", "dense"], pad_token_id=ids("<pad>"),
                       eos_token_id=ids("</s>"))  # fmt: skip
    config = AutoConfig.for_model(
        "step3p7",
        text_config=text,
        vision_config={"hidden_size": 32, "mlp_ratio": 2.0, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "image_size": 56, "patch_size": 14},
        image_token_id=ids("<im_patch>"),
    )  # fmt: skip
    return seeded_model(config), processor
