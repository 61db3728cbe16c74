"""The text organism: loads offline by name, its default run (``posdebias evaluate --task
multiple_choice``) shows position bias that the attention-based calibrators remove, and its
training script runs end to end and draws its data deterministically."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import hash_seed_digests, reused_and_rebuilt
from posdebias.cli import main
from posdebias.organism.text import MODEL_DIR, MODEL_NAME


def metrics_of(out: Path) -> dict[str, dict]:
    results = json.loads((out / "results.json").read_text())
    return {name: row["metrics"] for name, row in results["calibrators"].items()}


def test_bundled_folder_holds_a_complete_small_model():
    names = {path.name for path in MODEL_DIR.iterdir()}
    expected = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja", "README.md", "training.json"}  # fmt: skip
    assert expected <= names, expected - names
    assert (MODEL_DIR / "model.safetensors").stat().st_size < 2_000_000
    card = (MODEL_DIR / "README.md").read_text()
    assert "trained in" in card.lower() and "supervised" in card  # how the attention was made


def test_loads_offline_by_name_through_the_llama_adapter(text_cache_dir):
    import posdebias
    from posdebias.adapters.families.text import LlamaAdapter
    from posdebias.registry import get_registry

    assert get_registry().default_model("multiple_choice").name == MODEL_NAME
    adapter = posdebias.load_adapter(MODEL_NAME, label_set="upper")
    assert isinstance(adapter, LlamaAdapter) and adapter.text_only
    assert adapter.describe()["model_id"] == MODEL_NAME


def test_default_run_is_biased_and_the_attention_recovers_it(text_cache_dir, tmp_path, capsys):
    """No model, ``--task multiple_choice``: the text organism on its bundled benchmark, every
    calibrator (60 questions x 2 orders of the default run). The order the demonstration
    shows: the answer is right far above chance but biased by position, a static prior
    (PriDe) does not undo a bias that depends on where the answer is, the attention-based
    calibrators do."""
    out = tmp_path / "run"
    args = ["evaluate", "--task", "multiple_choice", "--count", "60", "--orders", "2"]
    assert main([*args, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["adapter"]["model_id"] == MODEL_NAME
    assert results["adapter"]["adapter"] == "llama"
    assert results["adapter"]["labels"] == ["A", "B", "C", "D"]
    assert str(text_cache_dir) in results["source"]["benchmark"]
    metrics = metrics_of(out)
    accuracy = {name: m["accuracy_mean"] for name, m in metrics.items()}
    assert 50 <= accuracy["vanilla"] <= 85 and metrics["vanilla"]["rstd"] >= 25
    for method in ("attention_readout", "purified_attention", "attention_guided"):
        assert accuracy[method] >= 95 and metrics[method]["rstd"] <= 5, method
    assert metrics["attention_guided"]["consistency"] >= 90
    assert accuracy["pride"] < accuracy["attention_guided"]
    assert accuracy["permutation_average"] >= accuracy["vanilla"]
    assert MODEL_NAME in capsys.readouterr().out


def test_check_passes_every_row_on_the_text_organism(text_cache_dir, capsys):
    """``posdebias check --task multiple_choice`` with no model checks the text organism on its
    own questions (its word-level vocabulary has no other words)."""
    assert main(["check", "--task", "multiple_choice"]) == 0
    out = capsys.readouterr().out
    assert MODEL_NAME in out and "all 7 checks passed" in out
    assert "4 text spans decode to their texts exactly" in out


@pytest.mark.parametrize("n", [2, 3, 6])
def test_the_text_organism_is_biased_but_not_blind_at_other_n(n, text_cache_dir, tmp_path):
    """At N = 3 to 6 the answer is right far above chance but biased; at N = 2 it nearly always
    answers A (the second position is the "dead" one), so it is at chance there; the attention
    finds the right option at every N."""
    out = tmp_path / "run"
    args = ["evaluate", "--task", "multiple_choice", "-N", str(n), "--count", "60", "--orders",
            "2", "--calibrators", "vanilla,attention_guided", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    metrics = metrics_of(out)
    vanilla, guided = metrics["vanilla"], metrics["attention_guided"]
    if n == 2:
        first, second = vanilla["recall_per_position"]
        assert first == 100.0 and second <= 10  # 1.7 measured
    else:
        assert vanilla["accuracy_mean"] >= 100 / n + 10 and vanilla["rstd"] >= 20
    assert guided["accuracy_mean"] >= vanilla["accuracy_mean"] + 10 and guided["rstd"] <= 10


def test_the_generated_answer_is_a_letter_parsed_as_the_scored_one(text_cache_dir, tmp_path):
    """The generated baseline on the text organism: greedy text whose first word is a letter,
    parsed by the letter rules; it answers what the label scores say (vanilla's accuracy)."""
    out = tmp_path / "run"
    args = ["evaluate", "--task", "multiple_choice", "--count", "20", "--orders", "2",
            "--calibrators", "vanilla", "--decoders", "generated", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    metrics = metrics_of(out)
    assert metrics["generated"]["no_answer"] == 0.0
    assert metrics["generated"]["accuracy_mean"] == metrics["vanilla"]["accuracy_mean"]
    decisions = [json.loads(line)["decision"]
                 for line in (out / "generations.jsonl").read_text().splitlines()]  # fmt: skip
    for decision in decisions:  # it was never taught to stop: letters until max_new_tokens
        (text,) = decision["texts"]
        assert "ABCD"[decision["choice"]] == text.split()[0], text


def test_bundled_benchmark_is_reused_and_rebuilt_when_damaged(tmp_path):
    from posdebias.organism.text.benchmark import BENCHMARK_COUNT, bundled_text_benchmark

    benchmark = reused_and_rebuilt(bundled_text_benchmark, tmp_path)
    assert len(benchmark) == BENCHMARK_COUNT and benchmark.task == "multiple_choice"
    targets = [instance.target for instance in benchmark.instances]
    assert {t: targets.count(t) for t in range(4)} == pytest.approx(
        dict.fromkeys(range(4), BENCHMARK_COUNT / 4), abs=30
    )  # the right option sits at every position about equally often


def test_few_steps_write_a_model_that_loads_and_observes(tmp_path):
    import posdebias
    from posdebias.organism.text.world import draw_instances

    out = tmp_path / "model"
    args = ["organism", "train-text", "--out", str(out), "--steps", "2", "2", "2",
            "--batch-size", "4"]  # fmt: skip
    assert main(args) == 0
    info = json.loads((out / "training.json").read_text())
    assert info["plan"]["answer_steps"] == 2 and info["dtype"] == "float32"
    assert info["bias"]["targets"]["4"][3] == [0.60, 0.0, 0.05, 0.35]
    adapter = posdebias.load_adapter(out, label_set="upper")
    (question,) = draw_instances(np.random.default_rng(0), 1, 4, "smoke")
    observation = adapter.observe(question)
    assert observation.label_logprobs.shape == (4,) and observation.attention.shape == (4, 4)
    assert np.isclose(np.exp(observation.label_logprobs).sum(), 1.0)


def test_train_text_refuses_bad_flags_before_any_work(tmp_path, capsys):
    out = tmp_path / "model"
    assert main(["organism", "train-text", "--out", str(out), "--seed", "-1"]) == 2
    assert "--seed" in capsys.readouterr().err and not out.exists()
    assert main(["organism", "train-text", "--out", str(out), "--steps", "1", "0", "1"]) == 2
    assert "--steps" in capsys.readouterr().err and not out.exists()


_DIGEST = """
import hashlib, numpy as np
from posdebias.organism.text.build import vocabulary
from posdebias.organism.text.world import draw_questions
digest = hashlib.sha256("|".join(vocabulary()).encode())
for question in draw_questions(np.random.default_rng([0, 1]), 200, 4):
    digest.update(repr(question).encode())
print(digest.hexdigest())
"""


def test_training_data_do_not_depend_on_the_hash_seed():
    digests = hash_seed_digests(_DIGEST)
    assert len(digests) == 1 and all(digests)


def test_bias_targets_are_distributions_biased_toward_the_first_letter():
    from posdebias.organism.text.train import bias_target, dead_positions

    for n in range(2, 13):
        rows = np.array([bias_target(n, truth) for truth in range(n)])
        assert np.allclose(rows.sum(axis=1), 1) and (rows >= 0).all()
        live = n - dead_positions(n)
        assert list(rows.argmax(axis=1)[:live]) == list(range(live))  # answered correctly
        assert set(rows.argmax(axis=1)[live:]) == {0}  # the first letter instead
    assert bias_target(4, 3) == (0.60, 0.0, 0.05, 0.35)


def test_test_questions_are_not_training_questions():
    """The benchmark's questions are drawn from other seeds than the training's; count the
    exact repeats (same question, options and order) among the training's first draws."""
    from posdebias.organism.text.benchmark import BENCHMARK_COUNT, BENCHMARK_SEED
    from posdebias.organism.text.world import draw_questions

    test = {q for q in draw_questions(np.random.default_rng([BENCHMARK_SEED, 4]),
                                      BENCHMARK_COUNT, 4)}  # fmt: skip
    train = set(draw_questions(np.random.default_rng([0, 1]), 20_000, 4))
    assert len(test) == BENCHMARK_COUNT and not test & train
