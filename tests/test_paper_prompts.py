"""The prompt baselines are the paper's prompts word for word (its Appendix E, Table 9), with N
and the caption substituted; the earlier posdebias wordings stay available by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from posdebias.core.instance import Instance
from posdebias.core.labels import get_label_set
from posdebias.core.tasks import DEFAULT_TEMPLATES, TaskTemplate, adapter_templates, task_variant

INTRO = (
    "Given {N} images indexed from 1 to {N}, identify the image that best matches the provided "
    "caption."
)
#: The paper's prompts, literally (the text after the images; "{N}" and "{caption}" substituted
#: by the test). Each ends "Answer: " with the trailing space of the paper.
PAPER = {
    "plain": INTRO + " Respond with the index number only and nothing else.\n"
    "Caption: {caption}\nAnswer: ",
    "instruction": INTRO + " Please note that the provided images have been randomly shuffled, "
    "so it is essential to consider them fairly and without bias. Analyze the visual content "
    "objectively and do not be influenced by the order of the images. Respond with the index "
    "number only and nothing else.\nCaption: {caption}\nAnswer: ",
    "cot": INTRO + "\nPlease think step by step. First, write your reasoning inside <think> and "
    "</think> tags. Then, after the closing </think> tag, output only the final answer index (a "
    "single integer from 1 to {N}).\nCaption: {caption}\nAnswer: <think>",
    "self_consistency": INTRO + "\nPlease think step by step to analyze the content of the "
    'images. After your reasoning, provide the final answer in the exact format: "The answer '
    'is <index>".\nCaption: {caption}\nAnswer: ',
}
CAPTION = "A dog on a red sofa."


def text_after_images(template: TaskTemplate, n: int) -> str:
    images = tuple(f"image{k}.png" for k in range(n))
    query = Instance(stem=CAPTION, images=images, task="retrieval", id="q")
    content = template.messages(query, get_label_set("digits"))[0]["content"]
    assert [item["type"] for item in content] == ["image"] * n + ["text"]  # images first
    return content[-1]["text"]


def expected(variant: str, n: int) -> str:
    return PAPER[variant].replace("{N}", str(n)).replace("{caption}", CAPTION)


def variant(template: TaskTemplate, name: str) -> TaskTemplate:
    return task_variant("retrieval", template, name)


RETRIEVAL = DEFAULT_TEMPLATES["retrieval"]


def reference_templates(name: str = "plain", label_set: str | None = None):
    """The retrieval template as configured and under the prompt variant ``name``, as an
    adapter builds them under the reference protocol (its option ``answer_space``)."""
    configured, varied = adapter_templates(None, None, name, label_set, answer_space=True)
    return configured["retrieval"], varied["retrieval"]


@pytest.mark.parametrize("n", [2, 4, 12])
@pytest.mark.parametrize("name", list(PAPER))
def test_reference_protocol_renders_the_paper_prompt_word_for_word(name, n):
    configured, plain = reference_templates()
    assert text_after_images(plain, n) == expected("plain", n)
    assert text_after_images(variant(configured, name), n) == expected(name, n)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("name", list(PAPER))
def test_default_protocol_is_the_paper_prompt_without_the_trailing_space(name, n):
    text = text_after_images(variant(RETRIEVAL, name), n)
    paper = expected(name, n)
    assert text == (paper if name == "cot" else paper.removesuffix(" "))


def test_earlier_wordings_are_kept_by_name():
    old_instruction = variant(RETRIEVAL, "posdebias_instruction")
    assert old_instruction.instruction.endswith(
        "The order of the images is arbitrary: judge each image by its content only, never by "
        "its position in the list."
    )
    old_cot = variant(RETRIEVAL, "posdebias_cot")
    assert old_cot.query == "Caption: {caption}\nLet's think step by step."
    assert "Respond with the index number only" not in old_cot.instruction


def test_decoders_use_the_paper_prompts_and_limits_by_default():
    from posdebias.decoders import ChainOfThought, Generated, Instruction, SelfConsistency

    assert Generated().settings().prompt_variant is None  # the adapter's (plain) prompt
    assert Instruction().settings().prompt_variant == "instruction"
    cot = ChainOfThought()
    assert (cot.settings().prompt_variant, cot.options.max_new_tokens) == ("cot", 1024)
    assert cot.options.parse == "last"
    sc = SelfConsistency()
    settings = sc.settings()
    assert settings.prompt_variant == "self_consistency"
    assert (settings.max_new_tokens, settings.num_samples) == (512, 10)
    assert (settings.temperature, settings.top_k) == (0.7, 40)
    assert sc.options.parse == "answer_is"


@pytest.mark.parametrize("name", list(PAPER))
@pytest.mark.parametrize("label_set", [None, "digits"])
def test_reference_protocol_on_an_adapter_prompt_variant(name, label_set):
    """The adapter's own prompt variant under the reference protocol is the paper's prompt too
    (the chain of thought ends "<think>", no space after it), whether the adapter names the
    digit labels or leaves the task's own (digits) to apply."""
    _, varied = reference_templates(name, label_set)
    assert text_after_images(varied, 4) == expected(name, 4)


def test_the_reference_protocol_sets_the_option_not_the_adapter():
    """The run passes the protocol's prompt to the adapter as its option answer_space (no
    attribute of the adapter is rewritten after it is made); an explicit option wins."""
    from posdebias.evaluation.config import load_config
    from posdebias.evaluation.job import build_adapter

    model = Path(__file__).resolve().parents[1] / "src" / "posdebias" / "organism" / "model"
    for protocol, options, spaced in (
        ("reference", {}, True),
        ("default", {}, False),
        ("default", {"answer_space": True}, True),
        ("reference", {"answer_space": False}, False),
    ):
        config = load_config(
            None,
            model=str(model),
            protocol=protocol,
            adapter={"name": None, "options": options},
        )
        adapter = build_adapter(config)
        assert adapter.task_templates["retrieval"].query.endswith(" ") is spaced, protocol
        assert adapter.describe()["prompt"]["query"].endswith(" ") is spaced
