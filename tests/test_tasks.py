"""The candidate model of every task kind: rotation, symmetry, templates and their text spans."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posdebias import Instance, cyclic_rotations, symmetrized_calibration_set
from posdebias.core.instance import TASK_KINDS
from posdebias.core.labels import get_label_set
from posdebias.core.tasks import (
    DEFAULT_TEMPLATES,
    TaskTemplate,
    candidate_char_spans,
    task_template,
    text_only_messages,
)
from posdebias.errors import ConfigError, InputError
from posdebias.evaluation.runner import observation_key

WORDS = st.text(alphabet="abcdefghij XYZ.,?", min_size=1, max_size=12).filter(str.strip)


@st.composite
def instances(draw: st.DrawFn) -> Instance:
    """An instance of any task kind with distinct candidates of the kind's shape."""
    task = draw(st.sampled_from(TASK_KINDS))
    n = 2 if task == "pairwise_judge" else draw(st.integers(2, 8))
    kind = "image" if task == "retrieval" else draw(st.sampled_from(["text", "image_text"]))
    texts = draw(st.lists(WORDS, min_size=n, max_size=n, unique=True))
    images = [f"img{k}.png" for k in range(n)]
    return Instance(
        stem=draw(WORDS),
        images=tuple(images) if kind != "text" else (),
        texts=tuple(texts) if kind != "image" else (),
        stem_images=("stem.png",) if task == "multiple_choice" and draw(st.booleans()) else (),
        target=draw(st.integers(0, n - 1)),
        id="x",
        task=task,
    )


@settings(max_examples=60, deadline=None)
@given(instances(), st.integers(0, 20))
def test_rotation_keeps_each_candidate_whole_and_tracks_the_truth(instance, shift):
    view = instance.rotated(shift)
    n = instance.n
    for i in range(n):
        old = (i + shift) % n
        assert view.images[i] == instance.images[old]
        assert view.texts[i] == instance.texts[old]
        assert view.candidate_ids[i] == instance.candidate_ids[old]
    assert view.candidate_ids[view.target] == instance.candidate_ids[instance.target]
    assert (view.task, view.stem, view.stem_images) == (
        instance.task,
        instance.stem,
        instance.stem_images,
    )
    back = view.rotated(n - shift % n)
    assert back.texts == instance.texts and back.target == instance.target


@settings(max_examples=40, deadline=None)
@given(instances(), st.integers(1, 3))
def test_symmetrised_set_visits_every_position_for_every_kind(instance, m):
    n = instance.n
    same = [
        Instance(
            stem=instance.stem,
            images=instance.images if instance.candidate_images else (),
            texts=instance.texts if instance.has_texts else (),
            target=(instance.target + k) % n,
            id=f"i{k}",
            task=instance.task,
            stem_images=instance.stem_images,
        )
        for k in range(m)
    ]
    views = symmetrized_calibration_set(same)
    assert np.bincount([view.target for view in views], minlength=n).tolist() == [m] * n
    rotations = cyclic_rotations(instance)
    assert sorted(r.candidate_ids for r in rotations) == sorted(
        tuple(np.roll(instance.candidate_ids, -r).tolist()) for r in range(n)
    )
    assert {r.candidate_ids[r.target] for r in rotations} == {
        instance.candidate_ids[instance.target]
    }


@settings(max_examples=60, deadline=None)
@given(instances(), st.sampled_from(["digits", "upper", "roman", "words"]))
def test_sentinel_rendering_finds_each_candidate_text_exactly(instance, label_set):
    if instance.task == "retrieval":
        return
    template = task_template(instance.task)
    labels = get_label_set(label_set)
    marked = text_only_messages(
        [m for m in template.messages(instance, labels, sentinels=True)]
        if not instance.candidate_images and not instance.stem_images
        else _drop_images(template.messages(instance, labels, sentinels=True))
    )[0]["content"]
    real = text_only_messages(
        [m for m in template.messages(instance, labels)]
        if not instance.candidate_images and not instance.stem_images
        else _drop_images(template.messages(instance, labels))
    )[0]["content"]
    rendered, spans = candidate_char_spans(marked, list(instance.texts))
    assert rendered == real
    for text, span in zip(instance.texts, spans, strict=True):
        assert span is not None and rendered[span[0] : span[1]] == text


def _drop_images(messages):
    return [
        {**m, "content": [item for item in m["content"] if item["type"] == "text"]}
        for m in messages
    ]


def test_default_multiple_choice_prompt_text():
    instance = Instance(stem="2+2?", texts=("3", "4"), target=1, id="q", task="multiple_choice")
    content = text_only_messages(
        DEFAULT_TEMPLATES["multiple_choice"].messages(instance, get_label_set("upper"))
    )[0]["content"]
    assert content == (
        "Answer the following multiple-choice question. Respond with the label (A to B) of the "
        "correct option only and nothing else.\nQuestion: 2+2?\nOptions:\nA. 3\nB. 4\nAnswer:"
    )


def test_image_options_and_stem_images_become_image_items_in_order():
    instance = Instance(
        stem="Which one?",
        images=("a.png", None),
        texts=("a cat", "a dog"),
        stem_images=("s1.png", "s2.png"),
        id="q",
        task="multiple_choice",
    )
    content = DEFAULT_TEMPLATES["multiple_choice"].messages(instance, get_label_set("upper"))[0][
        "content"
    ]
    kinds = [item["type"] for item in content]
    assert kinds[:2] == ["image", "image"]
    assert kinds.count("image") == 3
    image_at = kinds.index("image", 2)
    assert content[image_at - 1]["text"] == "A. " and content[image_at + 1]["text"] == "a cat"


def test_a_template_can_pose_the_retrieval_prompt():
    """candidates_first with bare image candidates gives the retrieval prompt's content."""
    template = TaskTemplate(
        instruction=DEFAULT_TEMPLATES["retrieval"].instruction,
        stem="Caption: {question}",
        candidate="{image}{text}",
        candidate_separator="",
        query="Answer:",
        layout="candidates_first",
    )
    images = ("a.png", "b.png", "c.png")
    as_mcq = Instance(stem="a red circle", images=images, id="q", task="multiple_choice")
    as_retrieval = Instance(stem="a red circle", images=images, id="q")
    retrieval = DEFAULT_TEMPLATES["retrieval"].messages(as_retrieval, get_label_set("digits"))
    assert template.messages(as_mcq, get_label_set("digits")) == retrieval


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"stem": "no stem here"}, "never shows the stem"),
        ({"candidate": "{label}"}, "put {text}"),
        ({"candidate": "{text} {image}"}, "before {text}"),
        ({"instruction": "{caption.__class__}"}, "unknown placeholder"),
        ({"candidate": "{label:>999} {text}"}, "wider than"),
    ],
)
def test_bad_task_templates_are_named(fields, message):
    with pytest.raises(ConfigError, match=message):
        task_template("multiple_choice", fields)


def test_sentinel_dropped_or_copied_by_a_template_is_an_error():
    with pytest.raises(ConfigError, match="dropped the text of candidates"):
        candidate_char_spans("no sentinels", ["a", "b"])
    with pytest.raises(ConfigError, match="more than once"):
        candidate_char_spans("\ue0000\ue001 \ue0000\ue001", ["a", "b"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"texts": ("a", "b", "c"), "task": "pairwise_judge"}, "2 answers"),
        ({"texts": ("a", "a")}, "duplicate options"),
        ({"texts": ("a", "a"), "task": "rerank"}, "duplicate passages"),
        ({"texts": ("a",), "task": "rerank"}, "at least 2 passages"),
        ({"texts": ("a", "  ")}, "text is empty"),
        ({"texts": ("a", "b"), "task": "retrieval"}, "image candidates only"),
        ({"texts": ("a", "b"), "task": "ranking"}, "unknown task"),
        ({"images": ("a.png", None), "texts": ("x", None)}, "neither an image nor a text"),
    ],
)
def test_invalid_candidate_instances(fields, message):
    base = {"stem": "q", "id": "i", "task": "multiple_choice"}
    with pytest.raises(InputError, match=message):
        Instance(**{**base, **fields})


def test_retrieval_instances_and_their_cache_keys_are_unchanged():
    instance = Instance(stem="q", images=("a.png", "b.png"), target=0, id="i")
    assert instance.task == "retrieval" and instance.texts == (None, None)
    # the key of earlier versions: id + sha256 of caption and image identities
    import hashlib

    digest = hashlib.sha256(b"q\x1fa.png\x1fb.png").hexdigest()
    assert observation_key(instance) == f"i#{digest[:32]}"


def test_cache_keys_of_text_candidates_follow_the_texts_and_the_task():
    base = Instance(stem="q", texts=("a", "b"), id="i", task="multiple_choice")
    other_text = Instance(stem="q", texts=("a", "c"), id="i", task="multiple_choice")
    other_task = Instance(stem="q", texts=("a", "b"), id="i", task="rerank")
    keys = {observation_key(x) for x in (base, other_text, other_task)}
    assert len(keys) == 3
    assert observation_key(base.rotated(1)) != observation_key(base)


def test_texts_holding_the_sentinel_characters_are_refused():
    instance = Instance(stem="q \ue0001\ue001", texts=("a", "b"), id="i", task="rerank")
    with pytest.raises(InputError, match="private-use characters"):
        task_template("rerank").messages(instance, get_label_set("digits"), sentinels=True)


def test_the_sentinel_characters_are_refused_before_a_run():
    # they were refused (as a config error) only when the instance was scored, mid-run
    import posdebias
    from posdebias.testing import tiny_model_and_processor

    adapter = posdebias.get_adapter(*tiny_model_and_processor("qwen3"))
    clean = Instance(stem="q", texts=("a", "b"), id="i", task="rerank")
    marked = Instance(stem="q", texts=("a", "b \ue001"), id="j", task="rerank")
    with pytest.raises(InputError, match="instance 'j' holds the private-use characters"):
        adapter.check_instances([clean, marked])
