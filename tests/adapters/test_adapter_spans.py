"""Image-token spans per family, and the span finder's failure modes."""

from __future__ import annotations

import itertools
import re

import pytest
from adapter_reference import tiny_pair

from posdebias import get_adapter
from posdebias.adapters.hf.spans import (
    ImageSpan,
    SpanTokens,
    check_spans,
    find_image_spans,
    find_marked_spans,
    span_matrix,
)
from posdebias.errors import AdapterError
from posdebias.testing.check import check_instances

IMG, START, END = 7, 5, 6


def test_marker_delimited_runs():
    ids = [1, START, IMG, IMG, END, START, IMG, IMG, IMG, END, 2]
    spans = find_image_spans(ids, SpanTokens(IMG, START, END), 2)
    assert spans == [ImageSpan.of(1, 5), ImageSpan.of(5, 10)]


def test_touching_runs_are_split_by_processor_counts():
    ids = [0, 0, IMG, IMG, IMG, IMG, IMG, 3]
    spans = find_image_spans(ids, SpanTokens(IMG), 2, tokens_per_image=[2, 3])
    assert spans == [ImageSpan.of(2, 4), ImageSpan.of(4, 7)]
    with pytest.raises(AdapterError, match="found 1 runs of image tokens .* for 2 images: runs"):
        find_image_spans(ids, SpanTokens(IMG), 2)


def test_marked_blocks_hold_everything_between_their_markers():
    tile_label = 9  # text the processor wrote inside the block (a tile's label) is the image's
    ids = [1, START, tile_label, IMG, IMG, END, 2, START, IMG, END, 3]
    assert find_marked_spans(ids, START, END, 2, "test") == [
        ImageSpan.of(1, 6),
        ImageSpan.of(7, 10),
    ]
    with pytest.raises(AdapterError, match="found 2 image starts and 2 image ends for 3 images"):
        find_marked_spans(ids, START, END, 3, "test")
    with pytest.raises(AdapterError, match="found 2 image starts and 2 image ends out of order"):
        find_marked_spans([START, END, END, START], START, END, 2, "test")
    with pytest.raises(AdapterError, match="found 2 image starts and 1 image ends"):
        find_marked_spans([START, IMG, START, IMG, END], START, END, 2, "test")


def test_span_count_mismatch_fails_loudly():
    ids = [START, IMG, END, 4, START, IMG, END]
    with pytest.raises(AdapterError, match="found 2 runs of image tokens .* for 3 images"):
        find_image_spans(ids, SpanTokens(IMG, START, END), 3)
    with pytest.raises(AdapterError, match="expanded 2 images into 5 tokens"):
        find_image_spans(ids, SpanTokens(IMG), 2, tokens_per_image=[2, 3])


def test_tiled_images_are_named_as_the_likely_cause():
    """Five runs per image (four tiles and a global view), found by the default span finder."""
    tile = [START, IMG, IMG, END, 3]
    ids = [1] + tile * 5 * 4 + [2]
    with pytest.raises(AdapterError) as error:
        find_image_spans(ids, SpanTokens(IMG, START, END), 4)
    assert (
        "found 20 runs of image tokens (token id 7) for 4 images: does this family split "
        "images into tiles" in str(error.value)
    )
    with pytest.raises(AdapterError, match="found 0 runs .* no image tokens"):
        find_image_spans([1, 2, 3], SpanTokens(IMG), 2)


def test_marked_blocks_open_at_any_start_marker_and_group_views_per_image():
    """Several start markers, and images of two blocks back to back (Molmo 2's views)."""
    views = [1, START, IMG, END, 9, IMG, IMG, END, START, IMG, END, 8, IMG, END, 2]
    spans = find_marked_spans(views, {START, 9, 8}, END, 2, "two views", blocks_per_image=2)
    assert spans == [ImageSpan.of(1, 8), ImageSpan.of(8, 14)]
    with pytest.raises(AdapterError, match=r"2 image ends for 2 images of 2 blocks each \(x\)"):
        find_marked_spans([START, IMG, END, START, IMG, END], START, END, 2, "x",
                          blocks_per_image=2)  # fmt: skip
    with pytest.raises(AdapterError, match=r"blocks of image 1 \(x\) are not back to back"):
        find_marked_spans([START, IMG, END, 3, START, IMG, END], START, END, 1, "x",
                          blocks_per_image=2)  # fmt: skip


def test_a_span_is_the_union_of_its_runs():
    span = ImageSpan(((2, 4), (6, 7)))
    assert (span.start, span.end, len(span)) == (2, 7, 3)
    assert span.positions() == [2, 3, 6]
    assert ImageSpan.from_positions([6, 2, 3]) == span
    matrix = span_matrix([[span, ImageSpan.of(8, 10)], [(0, 1), (1, 2)]], 10)
    assert matrix[0, :, 0].tolist() == [0, 0, 1, 1, 0, 0, 1, 0, 0, 0]
    assert matrix[0, :, 1].tolist() == [0] * 8 + [1, 1]
    assert matrix[1, :2].tolist() == [[1, 0], [0, 1]]  # plain (start, end) pairs still work
    for bad in (((3, 3),), ((4, 6), (2, 3)), ((2, 5), (4, 6)), ()):
        with pytest.raises(AdapterError, match="image span"):
            ImageSpan(bad)


def test_span_rules_name_what_is_wrong():
    ids = [1, IMG, IMG, 2, IMG, IMG, 3]
    good = [ImageSpan.of(1, 3), ImageSpan.of(4, 6)]
    assert check_spans(good, ids, {IMG}, 2).startswith("2 spans in order, 2 tokens each")
    with pytest.raises(AdapterError, match="gave 1 image spans for 2 images"):
        check_spans(good[:1], ids, {IMG}, 2)
    with pytest.raises(AdapterError, match="out of prompt order"):
        check_spans(good[::-1], ids, {IMG}, 2)
    with pytest.raises(AdapterError, match="overlap"):
        check_spans([ImageSpan.of(1, 5), ImageSpan.of(4, 6)], ids, {IMG}, 2)
    with pytest.raises(AdapterError, match="1 image tokens belong to no image span .* 5"):
        check_spans([ImageSpan.of(1, 3), ImageSpan.of(4, 5)], ids, {IMG}, 2)
    with pytest.raises(AdapterError, match="ends after the prompt"):
        check_spans([ImageSpan.of(1, 3), ImageSpan.of(4, 9)], ids, {IMG}, 2)


def _decoded_spans(adapter, batch, row=0):
    ids = batch.inputs["input_ids"][row].tolist()
    return [
        adapter.tokenizer.convert_ids_to_tokens([ids[t] for t in s.positions()])
        for s in batch.spans[row]
    ]


_FAKE = "<fake_token_around_image>"
_MOLMO_VIEW = ["<im_patch>", "<im_patch>", "<im_col>"] * 2 + ["<im_end>"]
#: Every span of the 48 px test images, token for token, where a family's layout fixes it.
_EXACT_SPANS = {
    # one contiguous run for all images: 2 x 2 patch tokens + 1 image-newline each
    "llava_onevision": ["<image>"] * 5,
    "llava": ["<image>"] * 4,
    # the images' runs touch (no text between them): split by the processor's counts
    "paligemma": ["<image>"] * 4,
    # four crops and the whole image, 3 latents each; the edge markers are no image's
    "idefics2": ["<image>"] * 3 + [_FAKE, "<image>", "<image>", "<image>"] * 4,
    # a low-resolution view then a high-resolution view, 2 x 2 patches, rows closed by a column
    "molmo2": ["<low_res_im_start>", *_MOLMO_VIEW, "<im_start>", *_MOLMO_VIEW],
    # a 48 px image fits one 56 px tile: the global view only (tiles: the next test)
    "aya_vision": ["<|START_OF_IMG|>", "TILE_GLOBAL", *["<|IMG_PATCH|>"] * 4, "<|END_OF_IMG|>"],
    # 32 px per merged token: 2 rows of 2, a break after row 1, the end
    "mistral3": ["[IMG]", "[IMG]", "[IMG_BREAK]", "[IMG]", "[IMG]", "[IMG_END]"],
    # one 56 px tile: its 4 patch tokens and line break between the markers
    "cohere2_vision": [
        "<|START_OF_IMG|>", *["<|IMG_PATCH|>"] * 4, "<|IMG_LINE_BREAK|>", "<|END_OF_IMG|>"
    ],
    # one 56 px view: its 4 visual atoms between the indicators
    "ovis2": ["<IMG_START>", *["<IMG_ATOM>"] * 4, "<IMG_GRID>", "<IMG_END>"],
}  # fmt: skip
#: Families whose span is a start marker (or markers), a run of one token, an end marker.
_MARKED_RUNS = {
    "qwen2_5_omni": (["<|vision_bos|>"], "<|IMAGE|>", "<|vision_eos|>"),  # before "qwen"
    "qwen": (["<|vision_start|>"], "<|image_pad|>", "<|vision_end|>"),
    "internvl": (["<img>"], "<IMG_CONTEXT>", "</img>"),
    "glm4v": (["<|begin_of_image|>"], "<|image|>", "<|end_of_image|>"),
    "kimi_k25": (["<|media_begin|>", "image", "<|media_content|>"], "<|media_pad|>",
                 "<|media_end|>"),
    "paddleocr_vl": (["<|IMAGE_START|>"], "<|IMAGE_PLACEHOLDER|>", "<|IMAGE_END|>"),
}  # fmt: skip
_TOUCHING = {"llava_onevision", "paligemma"}


def test_family_spans_cover_exactly_each_image(family, make_instances):
    adapter = get_adapter(*tiny_pair(family))
    instances = make_instances(2, 4)
    batch = adapter.prepare_batch(instances)
    for row in range(2):
        spans = batch.spans[row]
        assert len(spans) == 4
        ids = batch.inputs["input_ids"][row].tolist()
        image_positions = {i for i, t in enumerate(ids) if t == adapter.tokens.image}
        covered = {t for span in spans for t in span.positions()}
        assert image_positions <= covered
        assert all(a.end <= b.start for a, b in itertools.pairwise(spans))  # ordered, disjoint
    tokens = _decoded_spans(adapter, batch)
    marked = next((v for k, v in _MARKED_RUNS.items() if family.startswith(k)), None)
    if family in _EXACT_SPANS:
        assert all(t == _EXACT_SPANS[family] for t in tokens)
    elif marked is not None:
        starts, inner, end = marked
        assert all(t[: len(starts)] == starts and t[-1] == end for t in tokens)
        assert all(set(t[len(starts) : -1]) == {inner} for t in tokens)
        if family == "internvl":
            assert all(t.count(inner) == 4 for t in tokens)
    elif family in ("idefics3", "smolvlm"):
        # 48 px images -> 2 x 2 tiles + the global view; the newlines between rows of tiles
        # are not the image's, so each span is the union of 3 runs.
        assert all(len(span.runs) == 3 for span in batch.spans[0])
        tile = [_FAKE, "<row_1_col_1>", *["<image>"] * 4]
        glob = [_FAKE, "<global-img>", *["<image>"] * 4]
        for t in tokens:
            assert t[:6] == tile and t[-7:] == [*glob, _FAKE]
            assert "\n" not in t and t.count("<image>") == 5 * 4
    if family in _TOUCHING:
        assert all(a.end == b.start for a, b in itertools.pairwise(batch.spans[0]))


def test_aya_vision_spans_hold_every_tile_with_its_label():
    """A wide or tall image becomes two tiles and the global view; the tile labels the
    processor writes (``TILE_1``: a marker token, then text) lie inside the image's block."""
    adapter = get_adapter(*tiny_pair("aya_vision"))
    instance = check_instances(4, multi_token_n=None)[0]  # 56x56, 84x56, 56x112, 112x84 px
    batch = adapter.prepare_batch([instance])
    tokens = _decoded_spans(adapter, batch)
    patches = ["<|IMG_PATCH|>"] * 4
    view = ["TILE_GLOBAL", *patches, "<|END_OF_IMG|>"]
    tiles = ["TILE", "_", "1", *patches, "TILE", "_", "2", *patches]
    assert [t[1:] == view for t in tokens] == [True, False, False, True]  # square: one tile
    for tiled in tokens[1:3]:  # 84 x 56 and 56 x 112: two tiles, then the global view
        assert tiled == ["<|START_OF_IMG|>", *tiles, *view]


@pytest.mark.parametrize(
    "text",
    [
        "User:<image><image>Caption: x<end_of_utterance>\nAssistant:",  # touching images
        "User: <image> a <image>\nb<end_of_utterance>\nAssistant:",
        "<image>word<image>",  # a closing marker touching a word gets a space
    ],
)
def test_idefics2_replacements_are_the_processors_expansion(text, monkeypatch):
    """Idefics2's processor reports no replacement offsets; the adapter's, applied to the
    prompt, give exactly the text the processor tokenises (so text candidates land on their
    characters and tokens)."""
    from posdebias.adapters.hf.spans import expand_replacements

    adapter = get_adapter(*tiny_pair("idefics2"))
    tokenizer = adapter.tokenizer
    tokenised: list[str] = []
    call = type(tokenizer).__call__

    def recording(self, text=None, *args, **kwargs):  # the processor's own tokeniser call
        tokenised.extend([text] if isinstance(text, str) else text)
        return call(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", recording)
    images = [image.convert("RGB") for image in check_instances(2, multi_token_n=None)[0].images]
    inputs = adapter.processor(text=[text], images=[images], return_tensors="pt")
    expanded, _ = expand_replacements(text, [], adapter.replacements(text))
    assert tokenised == [expanded]
    assert call(tokenizer, expanded)["input_ids"] == inputs["input_ids"][0].tolist()


@pytest.mark.parametrize("family", ["idefics3", "smolvlm", "cohere2_vision"])
def test_tiled_family_without_its_adapter_says_what_it_found(family, make_instances):
    adapter = get_adapter(*tiny_pair(family), adapter="generic")
    model_calls = [0]
    adapter.model.register_forward_pre_hook(lambda *a: model_calls.__setitem__(0, 1))
    with pytest.raises(AdapterError) as error:  # found by the processor dry run, no forward
        adapter.observe(make_instances(1, 4)[0])
    message = str(error.value)
    assert f"cannot score model_type {family!r}" in message
    assert "splits images into tiles with text between them" in message
    assert re.search(r"\(\d+ runs of image tokens for 2 images\)", message)
    assert "a family adapter must say which tokens belong to each image" in message
    assert model_calls[0] == 0


@pytest.mark.parametrize(
    ("family", "markers", "image", "counts", "runs"),
    [
        # <IMG_START> global view <IMG_GRID> tiles (<IMG_COL> / <IMG_ROW> between) <IMG_END>
        ("ovis2", ("<IMG_START>", "<IMG_END>"), "<IMG_ATOM>", [4, 12, 12, 20], 12),
        # <|START_OF_IMG|> (patches <|IMG_LINE_BREAK|>) per tile and thumbnail <|END_OF_IMG|>
        ("cohere2_vision", ("<|START_OF_IMG|>", "<|END_OF_IMG|>"), "<|IMG_PATCH|>",
         [4, 12, 12, 12], 10),
    ],
)  # fmt: skip
def test_a_tiled_image_is_one_block_between_its_markers(family, markers, image, counts, runs):
    """Images of 56x56, 84x56, 56x112 and 112x84 px: the larger ones are split into tiles, so
    the image tokens form more runs than there are images; each image's span is its whole block
    from its start marker to its end marker, one run, every tile and separator included."""
    from posdebias.testing.check import check_instances

    adapter = get_adapter(*tiny_pair(family))
    batch = adapter.prepare_batch([check_instances(4, multi_token_n=None)[0]])
    ids = batch.inputs["input_ids"][0].tolist()
    image_id = adapter.tokenizer.convert_tokens_to_ids(image)
    assert len(ImageSpan.from_positions(t for t, i in enumerate(ids) if i == image_id).runs) == runs
    tokens = _decoded_spans(adapter, batch)
    assert all(len(span.runs) == 1 for span in batch.spans[0])
    assert all((t[0], t[-1]) == markers for t in tokens)
    assert [t.count(image) for t in tokens] == counts  # 4 tokens per tile or view


def test_ovis2_image_placeholder_is_only_text():
    """The chat template's <image> is no token: the processor replaces the text."""
    adapter = get_adapter(*tiny_pair("ovis2"))
    assert "<image>" not in adapter.tokenizer.get_vocab()
    assert adapter.image_token == "<IMG_ATOM>"


def test_internvl_real_checkpoint_layout_has_256_tokens_per_tile(image_files):
    """The processor configured as InternVL3-hf (448 px, image_seq_length 256)."""
    from transformers.models.got_ocr2 import GotOcr2ImageProcessor
    from transformers.models.internvl import InternVLProcessor

    tiny = tiny_pair("internvl")[1]
    processor = InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(
            size={"height": 448, "width": 448}, crop_to_patches=False
        ),
        tokenizer=tiny.tokenizer,
        video_processor=tiny.video_processor,
        image_seq_length=256,
        chat_template=tiny.chat_template,
    )
    from PIL import Image

    images = [Image.open(path).convert("RGB") for path in image_files[:3]]
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}] * 3 + [{"type": "text", "text": "x"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    inputs = processor(text=[text], images=[images], return_tensors="pt")
    tokens = SpanTokens(
        processor.image_token_id, processor.start_image_token_id, processor.end_image_token_id
    )
    spans = find_image_spans(inputs["input_ids"][0], tokens, 3)
    assert [len(span) for span in spans] == [258, 258, 258]


def test_template_without_image_placeholders_fails_clearly(make_instances):
    from posdebias.testing import tiny_model_and_processor

    model, processor = tiny_model_and_processor("llava")
    processor.chat_template = (
        "{% for m in messages %}{% for item in m['content'] %}{% if item['type'] == 'text' %}"
        "{{ item['text'] }}{% endif %}{% endfor %}{% endfor %}ASSISTANT:"
    )
    adapter = get_adapter(model, processor)
    with pytest.raises(AdapterError, match="image"):
        adapter.observe(make_instances(1, 2)[0])
