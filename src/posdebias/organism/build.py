"""The organism's architecture, tokenizer, processor and prompt, all built in code (no download).

A real ``LlavaForConditionalGeneration`` (CLIP vision tower + two-layer GELU projector + Llama
language model), only small: 32 x 32 pixel input, patch 16, so 4 image tokens per image; a
word-level vocabulary of the prompt's words, the shapes grammar's words and the numbers 0 to 26
(whole words, so every digit label up to the label set's capacity is one token).

Its prompt shows the image's label before each image (``1<image>2<image>...``), then the paper's
query (``Caption: ...`` / ``Answer:``): with no index marker before the images, the spike of
issue 7 learned nothing in its time budget. The layout is the retrieval task's template with
its own fields (``posdebias_prompt.json`` in the model folder) rendered by the processor's chat
template, so the LLaVA adapter needs no special case for it.
"""

from __future__ import annotations

from typing import Any

from posdebias.benchmarks.shapes import ShapeSpace
from posdebias.core.labels import MAX_CANDIDATES, get_label_set
from posdebias.core.tasks import task_template
from posdebias.organism.training import word_tokenizer, words_of

#: Pixels the shapes are rendered at (benchmark and training); the processor resizes to 32.
IMAGE_SIZE = 64
VISION_SIZE = 32
PATCH_SIZE = 16

SPECIAL_TOKENS = ("<unk>", "<pad>", "<s>", "</s>", "<image>")
IMAGE_TOKEN = "<image>"

#: LLaVA-1.5's conversation format ("USER: ... ASSISTANT:"), with images as ``<image>``.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% elif message['role'] == 'system' %}{% else %}"
    "ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}<image>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}</s>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)

#: The trained layout: label k right before image k, then the caption and the answer cue.
#: the paper's instruction is left out: it would double the sequence (and the training time)
#: and carries nothing the organism could use.
PROMPT = task_template(
    "retrieval", {"instruction": "", "separator": "", "candidate": "{label}{image}{text}"}
)


def shape_space() -> ShapeSpace:
    """The organism's world: one shape per image, all other attributes as the bundled default."""
    return ShapeSpace(min_objects=1, max_objects=1)


def vocabulary() -> list[str]:
    """Special tokens, then every word of the prompt, chat template and shapes grammar, sorted.

    Built from sorted lists only, so the token ids never depend on hash seeds.
    """
    digits = get_label_set("digits")
    values = {"n": 4, "range": digits.range_text(4), "first": "1", "last": "4"}
    texts = [
        PROMPT.instruction.format(**values),
        PROMPT.query.format(**values, caption=""),
        "USER: ASSISTANT:",
        " ".join(str(number) for number in range(MAX_CANDIDATES + 1)),
        " ".join(shape_space().vocabulary()),
    ]
    return [*SPECIAL_TOKENS, *(word for word in words_of(texts) if word not in SPECIAL_TOKENS)]


def build_tokenizer() -> Any:
    """A word-level ``PreTrainedTokenizerFast`` (a run of digits is one word: ``12`` is a label)."""
    return word_tokenizer(
        vocabulary(), chat_template=CHAT_TEMPLATE, named_tokens={"image_token": IMAGE_TOKEN}
    )


def build_processor() -> Any:
    """``LlavaProcessor``: CLIP preprocessing to 32 x 32, ``<image>`` expanded to 4 tokens."""
    from transformers import CLIPImageProcessor
    from transformers.models.llava import LlavaProcessor

    tokenizer = build_tokenizer()
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": VISION_SIZE},
        crop_size={"height": VISION_SIZE, "width": VISION_SIZE},
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=CHAT_TEMPLATE,
    )


def build_config(tokenizer: Any) -> Any:
    """The LLaVA config: CLIP 2 x 64 wide, projector 64 -> 128 -> 128, Llama 4 x 128 wide."""
    from transformers import AutoConfig

    ids = tokenizer.convert_tokens_to_ids
    return AutoConfig.for_model(
        "llava",
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": 128,
            "intermediate_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "max_position_embeddings": 512,
            "bos_token_id": ids("<s>"),
            "eos_token_id": ids("</s>"),
            "pad_token_id": ids("<pad>"),
            "tie_word_embeddings": False,
        },
        vision_config={
            "model_type": "clip_vision_model",
            "image_size": VISION_SIZE,
            "patch_size": PATCH_SIZE,
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "projection_dim": 64,
        },
        image_token_index=ids(IMAGE_TOKEN),
        image_seq_length=(VISION_SIZE // PATCH_SIZE) ** 2,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=False,
    )


def build_untrained(seed: int) -> tuple[Any, Any]:
    """A freshly initialised organism (float32, SDPA attention) and its processor."""
    import torch
    from transformers import LlavaForConditionalGeneration

    processor = build_processor()
    config = build_config(processor.tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    model.set_attn_implementation("sdpa")
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    return model, processor
