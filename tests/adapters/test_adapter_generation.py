"""The generation path and the SoFA mask on tiny random-weight models of real families."""

from __future__ import annotations

import math

import pytest
import torch
from adapter_reference import (
    fresh_model,
    greedy_generate,
    shared_and_repeated_samples,
    tiny_granite4_vision,
    tiny_pair,
)

from posdebias import get_adapter
from posdebias.adapters import GenerationSettings
from posdebias.adapters.attention.sofa import SofaSettings, sofa_attention
from posdebias.core.instance import Instance
from posdebias.core.labels import get_label_set
from posdebias.core.tasks import (
    ANSWER_ONLY,
    DEFAULT_TEMPLATES,
    PROMPT_VARIANTS,
    RETRIEVAL_WORDINGS,
    task_template,
    task_variant,
)
from posdebias.errors import AdapterError, ConfigError

GENERATING = ("llava", "qwen2_5_vl", "mllama")  # mllama: cross-attention, no shared prefix


def adapter_for(family: str, **options):
    model, processor = tiny_pair(family)
    return get_adapter(model, processor, **options)


@pytest.mark.parametrize("family", GENERATING)
def test_greedy_tokens_equal_transformers_generate(family, make_instances):
    """Our loop (explicit positions, shared cache) reproduces model.generate token for token,
    alone and in a left-padded batch."""
    adapter = adapter_for(family)
    instances = make_instances(2, 3)
    settings = GenerationSettings(max_new_tokens=6, stop_at_eos=False)
    batched = adapter.generate_many(instances, settings, batch_size=2)
    reference = fresh_model(family, "sdpa")
    for index, instance in enumerate(instances):
        expected = greedy_generate(reference, adapter.prepare_batch([instance]).inputs, 6)
        (tokens,) = batched[index].tokens  # one greedy sample
        assert tokens[: len(expected)] == expected
        assert batched[index].forward_passes == 6
        assert batched[index].generated_tokens == 6


def test_a_language_model_that_keeps_no_cache_of_its_own_generates_with_one(make_instances):
    """Granite 4 Vision's language model fills a cache it is given but makes none: generation
    hands it one and equals transformers' generate token for token, in a left-padded batch."""
    model, processor = tiny_granite4_vision()
    adapter = get_adapter(model, processor)
    instances = make_instances(2, 3)
    settings = GenerationSettings(max_new_tokens=5, stop_at_eos=False)
    batched = adapter.generate_many(instances, settings, batch_size=2)
    for index, instance in enumerate(instances):
        expected = greedy_generate(model, adapter.prepare_batch([instance]).inputs, 5)
        (tokens,) = batched[index].tokens  # one greedy sample
        assert len(tokens) == 5 and tokens[: len(expected)] == expected


@pytest.mark.parametrize("family", GENERATING)
def test_sampling_is_seeded_and_independent_of_the_batch(family, make_instances):
    adapter = adapter_for(family)
    instances = make_instances(3, 2)
    settings = GenerationSettings(
        max_new_tokens=5, do_sample=True, temperature=1.5, num_samples=3, stop_at_eos=False
    )
    one = adapter.generate_many(instances, settings, batch_size=1, seeds=[7, 8, 9])
    three = adapter.generate_many(instances, settings, batch_size=3, seeds=[7, 8, 9])
    assert [g.tokens for g in one] == [g.tokens for g in three]
    other = adapter.generate_many(instances, settings, batch_size=3, seeds=[1, 2, 3])
    assert [g.tokens for g in other] != [g.tokens for g in one]
    # samples of one instance differ from each other (own generators)
    assert len({tuple(t) for t in one[0].tokens}) > 1


def test_sampling_can_inherit_the_checkpoints_generation_config(make_instances):
    """As the authors' generate(do_sample=True, temperature=0.7, top_k=40): the checkpoint's
    other sampling settings apply too. Qwen2.5-VL checkpoints set top_p 0.001, which keeps
    only the most likely token, so every sample is the greedy text."""
    from posdebias.adapters.hf.generation import generation_config_warpers

    adapter = adapter_for("llava")
    adapter.model.generation_config.top_p = 0.001
    instances = make_instances(2, 3)
    own = GenerationSettings(
        max_new_tokens=4, do_sample=True, temperature=1.5, num_samples=6, stop_at_eos=False
    )
    inherited = GenerationSettings(**{**own.__dict__, "sampling_config": "generation_config"})
    greedy = adapter.generate_many(
        instances, GenerationSettings(max_new_tokens=4, stop_at_eos=False)
    )
    sampled = adapter.generate_many(instances, own, seeds=[3, 4])
    kept = adapter.generate_many(instances, inherited, seeds=[3, 4])
    for plain, free, narrow in zip(greedy, sampled, kept, strict=True):
        assert narrow.tokens == plain.tokens * 6  # top_p 0.001: only the top token survives
        assert len({tuple(t) for t in free.tokens}) > 1  # own settings ignore top_p
    warpers = generation_config_warpers(
        adapter.model, GenerationSettings(do_sample=True, temperature=0.7, top_k=40)
    )
    names = [type(w).__name__ for w in warpers]
    assert names == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"]
    assert warpers[0].temperature == 0.7 and warpers[1].top_k == 40 and warpers[2].top_p == 0.001
    with pytest.raises(ConfigError, match="sampling_config"):
        GenerationSettings(sampling_config="mine")  # type: ignore[arg-type]


def test_samples_share_one_prefill(make_instances):
    """num_samples expands the KV cache after ONE prompt pass of the instances."""
    adapter = adapter_for("llava")
    instances = make_instances(2, 3)
    shapes = []
    hook = adapter.model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["inputs_embeds"].shape[:2])),
        with_kwargs=True,
    )
    try:
        settings = GenerationSettings(
            max_new_tokens=4, do_sample=True, num_samples=10, top_k=5, stop_at_eos=False
        )
        generated = adapter.generate_many(instances, settings, batch_size=2)
    finally:
        hook.remove()
    prompt_length = shapes[0][1]
    assert shapes[0] == (2, prompt_length)  # one prefill of 2 rows, not 20
    assert shapes[1:] == [(20, 1)] * 3  # then 3 decoding steps over 20 rows
    assert all(len(g.texts) == 10 and g.forward_passes == 4 for g in generated)
    assert all(g.generated_tokens == 40 for g in generated)


def test_stop_strings_and_token_limits(make_instances):
    adapter = adapter_for("llava")
    instances = make_instances(2, 2)
    free = adapter.generate_many(instances, GenerationSettings(max_new_tokens=8))
    for generation in free:
        assert 0 <= generation.token_counts[0] <= 8
    text = free[0].texts[0]
    if len(text) > 2:
        stop = text[1:3]
        cut = adapter.generate_many(
            instances[:1], GenerationSettings(max_new_tokens=8, stop=(stop,))
        )[0]
        assert stop not in cut.texts[0] and text.startswith(cut.texts[0])
        assert cut.generated_tokens <= free[0].generated_tokens


def test_invalid_settings_are_clear_errors():
    with pytest.raises(ConfigError, match="do_sample"):
        GenerationSettings(num_samples=3)
    with pytest.raises(ConfigError, match="temperature"):
        GenerationSettings(temperature=0)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        GenerationSettings(max_new_tokens=0)


def test_simulated_model_cannot_run_sofa():
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances

    adapter = SyntheticAdapter()
    settings = GenerationSettings(sofa=SofaSettings())
    with pytest.raises(Exception, match="SoFA needs a real model"):
        adapter.generate_many(synthetic_instances(1, 4), settings)


def test_prompt_variants():
    base = DEFAULT_TEMPLATES["retrieval"]
    labels = get_label_set("digits")
    paper = RETRIEVAL_WORDINGS
    request = ANSWER_ONLY["retrieval"]
    instruction = task_variant("retrieval", base, "instruction").instruction
    assert paper["instruction"].request in instruction and instruction.endswith(request)
    cot = task_variant("retrieval", base, "cot")
    assert request not in cot.instruction and paper["cot"].request in cot.instruction
    assert cot.query.endswith("Answer: <think>")
    assert task_variant("retrieval", base, "plain") == base
    digests = {task_variant("retrieval", base, name).digest() for name in PROMPT_VARIANTS}
    assert len(digests) == len(PROMPT_VARIANTS)
    query = Instance(stem="a cat", images=tuple(f"{k}.png" for k in range(4)), id="q")
    text = cot.messages(query, labels)[0]["content"][-1]["text"]
    assert "(a single integer from 1 to 4)" in text
    worded = task_variant("retrieval", base, "cot", "words")
    assert (
        "(one of first to fourth)"
        in worded.messages(query, get_label_set("words"))[0]["content"][-1]["text"]
    )
    with pytest.raises(ConfigError, match="unknown prompt variant"):
        task_variant("retrieval", base, "loud")
    organism_like = task_template(
        "retrieval", {"instruction": "", "image_prefix": "{label}", "separator": ""}
    )
    assert task_variant("retrieval", organism_like, "instruction").instruction == (
        paper["instruction"].request
    )


def test_rendered_chat_holds_the_paper_text_after_the_images(make_instances):
    adapter = adapter_for("qwen2_5_vl")
    instance = make_instances(1, 3)[0]
    rendered = adapter.render(instance, variant="self_consistency")
    paper = (
        "Given 3 images indexed from 1 to 3, identify the image that best matches the provided "
        "caption.\nPlease think step by step to analyze the content of the images. After your "
        'reasoning, provide the final answer in the exact format: "The answer is <index>".\n'
        f"Caption: {instance.stem}\nAnswer:"
    )
    assert paper in rendered
    assert rendered.rindex("<|vision_end|>") < rendered.index(paper)


def test_prompt_variant_adapter_option(make_instances):
    plain = adapter_for("llava")
    cot = adapter_for("llava", prompt_variant="cot")
    instance = make_instances(1, 2)[0]
    assert "step by step" in cot.render(instance) and "step by step" not in plain.render(instance)
    assert "<think>" in cot.render(instance)
    assert cot.describe()["prompt_hash"] != plain.describe()["prompt_hash"]
    with pytest.raises(ConfigError, match="prompt variant"):
        adapter_for("llava", prompt_variant="loud")


def causal_allowed(mask, length):
    """Boolean [B, T, T] 'may attend' from whatever mask a layer received (None = causal)."""
    if mask is None:
        return torch.ones(length, length, dtype=torch.bool).tril()[None]
    if mask.dtype == torch.bool:
        return mask[:, 0]
    return mask[:, 0] > float("-inf")


@pytest.mark.parametrize("within_candidate", [False, True])
@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl", "internvl"])
def test_sofa_mask_differs_from_causal_exactly_in_later_image_blocks(
    family, within_candidate, make_instances
):
    """Opened: image i -> later image j blocks; with within_candidate also the masked (later)
    entries of each image's own block. Every other entry is the causal mask."""
    adapter = adapter_for(family)
    instances = make_instances(2, 3)  # two rows: left padding in the batch
    batch = adapter.prepare_batch(instances)
    length = batch.inputs["input_ids"].shape[1]
    plain: dict[int, object] = {}
    with sofa_attention(SofaSettings(sigma=1.0, layer_stride=99, first_layer=99), capture=plain):
        adapter.run_batch(batch, attention=False)  # SoFA on no layer: the causal masks
    opened: dict[int, object] = {}
    settings = SofaSettings(sigma=0.25, layer_stride=2, within_candidate=within_candidate)
    with sofa_attention(settings, capture=opened) as run:
        scores, _ = adapter.run_batch(batch, attention=False)
    assert sorted(opened) == list(range(adapter.num_layers))
    assert run.changed_layers == {layer for layer in opened if layer % 2 == 0}
    for layer, mask in opened.items():
        causal = causal_allowed(plain[layer], length).expand(2, length, length)
        if layer % 2:
            assert mask is plain[layer] or torch.equal(
                causal_allowed(mask, length).expand(2, length, length), causal
            )
            continue
        values = mask[:, 0].float()
        expected = torch.where(causal, 0.0, float("-inf"))
        for row, spans in enumerate(batch.spans):
            for i, span_i in enumerate(spans):  # one run per image in these families
                for span_j in spans[i + 1 :]:
                    rows, keys = slice(span_i.start, span_i.end), slice(span_j.start, span_j.end)
                    expected[row, rows, keys] = math.log(0.25)
                if within_candidate:
                    own = slice(span_i.start, span_i.end)
                    block = expected[row, own, own].clone()
                    assert torch.isneginf(block).any()  # an image of several tokens
                    expected[row, own, own] = block.masked_fill(
                        torch.isneginf(block), math.log(0.25)
                    )
        padding_rows = torch.isneginf(expected).all(dim=-1)
        expected[padding_rows] = 0.0  # padding rows see everything (never read)
        assert torch.equal(values, expected)
    assert torch.isfinite(scores).all()
    baseline, _ = adapter.run_batch(batch, attention=False)
    assert not torch.allclose(scores, baseline)  # the opened blocks change the answer scores


def test_sofa_without_effect_is_refused():
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.decoders import Sofa

    with pytest.raises(AdapterError, match="SoFA mask taking effect"):
        Sofa().decide(SyntheticAdapter(), synthetic_instances(2, 4), seeds=[0, 1])


@pytest.mark.parametrize("family", GENERATING)
def test_shared_prefix_decoding_equals_repeating_the_cache(family, make_instances):
    """Samples decoded over one copy of the prompt's keys and values draw the same tokens as
    with the cache repeated per sample (the plain way), in a left-padded batch."""
    shared, plain = shared_and_repeated_samples(adapter_for(family), make_instances(2, 3))
    assert shared == plain


@pytest.mark.parametrize("label_set", ["digits", "upper", "words"])
def test_generated_decoder_parses_what_the_model_wrote(label_set, make_instances):
    """A random tiny model writes junk: every decision is exactly the parser's reading of its
    text, and no valid label means no answer (None), never a guess."""
    from posdebias.core.answers import AnswerParser
    from posdebias.decoders import ChainOfThought, Generated

    adapter = adapter_for("llava", label_set=label_set)
    views = make_instances(3, 3)
    for decoder in (Generated(max_new_tokens=6), ChainOfThought(max_new_tokens=10)):
        decisions = decoder.decide(adapter, views, batch_size=2, seeds=[0, 1, 2])
        for view, decision in zip(views, decisions, strict=True):
            parser = AnswerParser(label_set, view.n, decoder.options.parse)
            assert decision.answers == [parser.parse(text) for text in decision.texts]
            assert decision.choice == decision.answers[0]
            assert decision.generated_tokens <= decoder.options.max_new_tokens
