"""PaliGemma: a bidirectional prefix, answer tokens outside it, 1-indexed positions, and (in
PaliGemma 2's Gemma 2 language model) attention logits soft-capped in every layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from adapter_reference import fresh_model, shared_and_repeated_samples, tiny_pair

from posdebias import get_adapter
from posdebias.adapters.hf import HFAdapter
from posdebias.adapters.hf.scoring import restricted_scores
from posdebias.testing import tiny_model_and_processor


def test_labels_are_scored_as_generate_appends_the_answer(make_instances):
    """N = 10 ("10" after "1"): the adapter's scores equal those from transformers' generate
    forced along each label prefix (its own token types: 1 for every generated token, its
    positions, its cache); the label tokens read as part of the bidirectional prefix (token
    type 0) give other scores, so the answer's token type matters."""
    adapter = get_adapter(*tiny_pair("paligemma"))
    instance = make_instances(1, 10)[0]
    batch = adapter.prepare_batch([instance])
    assert batch.plan.steps, "N = 10 digits need a decoding step"
    observed = torch.tensor(adapter.observe(instance).label_logprobs)
    model = fresh_model("paligemma", "eager")
    length = batch.inputs["input_ids"].shape[1]
    vocabulary = list(range(model.config.text_config.vocab_size))
    generated, as_prefix = {}, {}
    for prefix in ((), *batch.plan.steps):

        def allowed(row, ids, prefix=prefix):
            step = ids.shape[-1] - length
            return [prefix[step]] if step < len(prefix) else vocabulary

        with torch.no_grad():
            out = model.generate(
                **batch.inputs,
                max_new_tokens=len(prefix) + 1,
                do_sample=False,
                prefix_allowed_tokens_fn=allowed,
                output_logits=True,
                return_dict_in_generate=True,
            )
            generated[prefix] = out.logits[len(prefix)][:1].double()
            extra = torch.tensor([list(prefix)], dtype=torch.long)
            inside = HFAdapter.extended_inputs(adapter, dict(batch.inputs), extra)  # types 0
            as_prefix[prefix] = model(**inside).logits[:1, -1].double()
    expected = restricted_scores(batch.plan, generated, torch.float64)[0]
    assert torch.max(torch.abs(observed - expected)) < 1e-5
    wrong = restricted_scores(batch.plan, as_prefix, torch.float64)[0]
    assert torch.max(torch.abs(observed - wrong)) > 1e-3


def test_positions_count_from_one_and_no_training_labels_reach_the_model(make_instances):
    adapter = get_adapter(*tiny_pair("paligemma"))
    batch = adapter.prepare_batch(make_instances(2, 3))
    assert "labels" not in batch.inputs  # a forward given them computes a loss (and fails)
    mask = batch.inputs["attention_mask"].bool()
    assert not mask[0].all() and mask[1].all()  # row 0 is left padded
    for row in range(2):
        real = batch.position_ids[row][mask[row]].tolist()
        assert real == list(range(1, len(real) + 1))
    assert set(batch.inputs["token_type_ids"].unique().tolist()) == {0}  # the prompt: prefix


def test_the_prompt_is_the_processors_layout_without_a_chat_template(make_instances):
    """No chat template (as the checkpoints): the images' placeholders, then the text; the
    processor puts the BOS after the last image."""
    model, processor = tiny_pair("paligemma")
    assert not processor.chat_template
    adapter = get_adapter(model, processor)
    instance = make_instances(1, 3)[0]
    assert adapter.render(instance).startswith("<image><image><image>Given 3 images")
    ids = adapter.prepare_batch([instance]).inputs["input_ids"][0].tolist()
    tokens = adapter.tokenizer.convert_ids_to_tokens(ids)
    assert tokens[:13] == ["<image>"] * 12 + ["<bos>"]


def test_the_soft_cap_changes_the_attention_the_probe_reads(make_instances):
    """PaliGemma 2 caps every layer's attention logits (Gemma 2); SDPA has no cap, so the
    posdebias attention function computes capped layers itself. Without the cap the tiny
    model's attention differs, so the probe = eager agreement of `posdebias check` (whose
    eager attention caps) shows the cap is applied."""
    instance = make_instances(1, 4)[0]
    capped = get_adapter(*tiny_pair("paligemma")).observe(instance)
    model, processor = tiny_model_and_processor("paligemma")  # its own copy: the layers change
    for layer in model.model.language_model.layers:
        layer.self_attn.attn_logit_softcapping = None
    uncapped = get_adapter(model, processor).observe(instance)
    assert np.abs(capped.attention - uncapped.attention).max() > 1e-2


def test_shared_prefix_decoding_caps_the_logits_too(make_instances):
    """Samples decoded over one copy of the prompt's keys (full-attention layers only, where
    the cache can be shared) draw the tokens of the plain repeated cache."""
    from transformers import AutoModelForImageTextToText

    model, processor = tiny_model_and_processor("paligemma")
    config = model.config
    config.text_config.layer_types = ["full_attention"] * config.text_config.num_hidden_layers
    config.text_config.sliding_window = None
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config).eval()
    shared, plain = shared_and_repeated_samples(get_adapter(model, processor), make_instances(2, 3))
    assert shared == plain


def test_image_multiple_choice_passes_check_with_the_texts_moved_by_the_bos():
    """Text candidates: their characters move with the BOS the processor inserts after the
    last image, so each text span decodes to exactly its text."""
    from posdebias.testing import check_adapter
    from posdebias.testing.check import PASS, check_instances

    adapter = get_adapter(*tiny_pair("paligemma"), label_set="upper")
    report = check_adapter(adapter, check_instances(task="multiple_choice"))
    assert all(result.status == PASS for result in report.results), report.summary()
    assert "decode to their texts exactly" in report["candidate spans"].figure


def test_the_generic_adapter_refuses_the_bidirectional_prefix_before_any_forward(make_instances):
    """Even given a chat template, the generic adapter sees the token types PaliGemma's forward
    takes (all 0: the whole prompt is a prefix) and stops before the first forward."""
    from posdebias.adapters.families.paligemma import PROMPT_FORMAT
    from posdebias.errors import AdapterError

    model, processor = tiny_model_and_processor("paligemma")
    processor.chat_template = PROMPT_FORMAT
    calls = [0]
    model.register_forward_pre_hook(lambda *a, **k: calls.__setitem__(0, calls[0] + 1))
    adapter = get_adapter(model, processor, adapter="generic")
    with pytest.raises(AdapterError, match="bidirectional attention blocks"):
        adapter.observe(make_instances(1, 3)[0])
    assert calls[0] == 0
