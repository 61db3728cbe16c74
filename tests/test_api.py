"""The Debiaser library API and the `rank` command on the simulated model."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

import posdebias
from posdebias import get_calibrator
from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
from posdebias.api import Debiaser
from posdebias.cli import main
from posdebias.core.instance import Instance
from posdebias.core.symmetry import cyclic_rotations
from posdebias.errors import CalibrationError, InputError


def test_calibrate_save_load_rank(tmp_path):
    adapter = SyntheticAdapter()
    debiaser = Debiaser(adapter)
    state = debiaser.calibrate(synthetic_instances(5, 4, seed=11))
    assert state.calibrator == "attention_guided" and state.num_observations == 20
    path = debiaser.save(tmp_path / "cal.json")

    loaded = Debiaser.load(path, adapter)
    test = synthetic_instances(40, 4, seed=12)
    vanilla_right = guided_right = 0
    for instance in test:
        prediction = loaded.rank(instance.stem, instance.images)
        assert np.isclose(prediction.probabilities.sum(), 1.0)
        # the same answer as the calibrator on the observation of the instance itself
        observation = adapter.observe(instance)
        expected = loaded.calibrator.predict(observation, loaded.state).choice
        assert prediction.choice == expected
        guided_right += prediction.choice == instance.target
        vanilla_right += int(np.argmax(observation.label_logprobs)) == instance.target
    assert guided_right > vanilla_right


def test_rank_needs_calibration_and_matching_n():
    adapter = SyntheticAdapter()
    debiaser = Debiaser(adapter)
    with pytest.raises(CalibrationError, match="not calibrated"):
        debiaser.rank("q", ["a", "b", "c", "d"])
    debiaser.calibrate(synthetic_instances(2, 4))
    with pytest.raises(
        CalibrationError,
        match=r"'attention_guided' was fitted for N=4 candidates, but this query has N=3: .* "
        r"Calibrate with instances of N=3 as well: Debiaser.calibrate\(instances\)",
    ):
        debiaser.rank("q", ["a", "b", "c"])


def test_permutation_average_debiaser_runs_the_rotations():
    debiaser = Debiaser(SyntheticAdapter(), "permutation_average")
    debiaser.calibrate(synthetic_instances(1, 4))
    images = [f"img{k}" for k in range(4)]
    chosen = debiaser.rank("q", images).choice
    rotated = images[1:] + images[:1]
    assert rotated[debiaser.rank("q", rotated).choice] == images[chosen]


def test_rank_command(tmp_path, capsys):
    states = tmp_path / "cal.json"
    assert (
        main(
            [
                "calibrate",
                "--adapter",
                "synthetic",
                "--calibrators",
                "attention_guided",
                "--out",
                str(states),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "rank",
                "--calibration",
                str(states),
                "--adapter",
                "synthetic",
                "a red circle",
                "a.png",
                "b.png",
                "c.png",
                "d.png",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    # the printed distribution is the Debiaser's own, and the mark sits on its argmax
    images = ["a.png", "b.png", "c.png", "d.png"]
    adapter = posdebias.get_registry().create_adapter("synthetic")
    expected = Debiaser.load(states, adapter).rank("a red circle", images)
    rows = {line.split("│")[2].strip(): line for line in out.splitlines() if ".png" in line}
    assert list(rows) == images
    for image, probability in zip(images, expected.probabilities, strict=True):
        assert f"{probability:.4f}" in rows[image]
    assert out.count("<- chosen") == 1 and "<- chosen" in rows[images[expected.choice]]
    assert expected.choice == int(np.argmax(expected.probabilities))
    assert "posterior" not in out
    command = ["rank", "--calibration", str(states), "--adapter", "synthetic", "--explain"]
    assert main([*command, "a red circle", *images]) == 0
    out = capsys.readouterr().out
    for column in ("model", "attention", "posterior", "bias removed"):
        assert column in out


def test_rank_poses_text_candidates_as_the_task_its_state_was_fitted_on(tmp_path, capsys):
    """`posdebias rank` took images only; a text state's options are ranked as the API does."""
    states = tmp_path / "states"
    calibrate = ["calibrate", "--task", "multiple_choice", "--count", "4",
                 "--calibrators", "attention_guided", "--out", str(states)]  # fmt: skip
    assert main(calibrate) == 0
    capsys.readouterr()
    question, options = "Which is the capital of France?", ["Berlin", "Paris", "[red]Rome", "Oslo"]
    command = ["rank", "--calibration", str(states), "--model", "posdebias/text-organism"]
    assert main([*command, question, *options]) == 0
    out = capsys.readouterr().out
    adapter = posdebias.load_adapter("posdebias/text-organism")
    expected = Debiaser.load(states, adapter).rank(question, texts=options)
    assert Debiaser.load(states, adapter).fitted_task() == "multiple_choice"
    rows = {line.split("│")[2].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert list(rows) == options
    header = next(line for line in out.splitlines() if "position" in line)
    assert header.split("┃")[2].strip() == "option"  # the task's own noun
    for option, probability in zip(options, expected.probabilities, strict=True):
        assert f"{probability:.4f}" in rows[option]
    assert "<- chosen" in rows[options[expected.choice]] and "image" not in out
    # another task's prompt is not the one the state was fitted with
    assert main([*command, "--task", "rerank", question, *options]) == 2
    assert "fitted on multiple_choice queries, and this one is posed as rerank" in (
        capsys.readouterr().err
    )


def test_rank_of_a_text_task_says_when_its_arguments_name_files(tmp_path, capsys, monkeypatch):
    """A text task poses each argument as its own text: arguments that name files (images or a
    passage were perhaps meant) are ranked as their paths, and a warning says so, naming each
    one by position; texts that are no file (also ones no file system can hold) get none."""
    from posdebias.testing import write_test_images

    states = tmp_path / "states"
    calibrate = ["calibrate", "--task", "multiple_choice", "--count", "4",
                 "--calibrators", "vanilla", "--out", str(states)]  # fmt: skip
    assert main(calibrate) == 0
    monkeypatch.chdir(tmp_path)
    images = [p.name for p in write_test_images(tmp_path, 2, size=8)]
    (tmp_path / "[red]passage.txt").write_text("a passage")
    command = ["rank", "--calibration", str(states), "--model", "posdebias/text-organism", "Q?"]
    capsys.readouterr()
    plain = ["Berlin", "x" * 5000, "Oslo", "/" + "y" * 300]
    assert main([*command, *plain]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*command, "Berlin", images[0], "[red]passage.txt", images[1]]) == 0
    out, err = capsys.readouterr()
    flat = " ".join(err.split())
    assert (
        f"options 2 ('{images[0]}'), 3 ('[red]passage.txt'), 4 ('{images[1]}') name files" in flat
    )
    assert "multiple_choice poses every argument as its own text: the path is ranked" in flat
    assert images[0] in out and "[red]passage.txt" in out  # ranked as the texts given
    assert main([*command, "Berlin", "Paris", images[1], "Oslo"]) == 0
    assert f"warning: option 3 ('{images[1]}') names a file, but multiple_choice" in " ".join(
        capsys.readouterr().err.split()
    )


@pytest.mark.parametrize(
    ("task", "texts", "files", "noun"),
    [
        ("pairwise_judge", ["plum", "stone"], [1], "answer"),
        ("rerank", ["plum", "stone", "car", "cloud"], [0, 2], "passages"),
        ("rerank", ["plum", "stone", "car", "cloud"], [3], "passage"),
    ],
)
def test_rank_says_when_arguments_name_files_in_each_text_tasks_own_words(
    tmp_path, capsys, monkeypatch, task, texts, files, noun
):
    """The judge's answers and the reranker's passages, as the options above: arguments that
    name files are ranked as their paths, and the warning names them in the task's noun."""
    import warnings

    from posdebias.testing import write_test_images

    adapter = posdebias.load_adapter("posdebias/text-organism")
    fruits = ["apple", "banana", "cherry", "grape", "lemon", "mango"]
    others = ["stone", "car", "cloud", "chair", "river", "shoe", "hammer", "brick"]
    stem = "Which of these is a fruit?"
    fitting = [
        Instance(stem=stem, texts=(fruit, *others[k : k + len(texts) - 1]), target=0,
                 id=f"i{k}", task=task)
        for k, fruit in enumerate(fruits)
    ]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Debiaser(adapter, "pride").calibrate(fitting).save(tmp_path / "state.json")
    monkeypatch.chdir(tmp_path)
    names = [p.name for p in write_test_images(tmp_path, len(texts), size=8)]
    given = [names[k] if k in files else text for k, text in enumerate(texts)]
    command = ["rank", "--calibration", "state.json", "--model", "posdebias/text-organism", stem]
    capsys.readouterr()
    assert main([*command, *texts]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*command, *given]) == 0
    out, err = capsys.readouterr()
    named = ", ".join(f"{k + 1} ('{names[k]}')" for k in files)
    verb = "name files" if len(files) > 1 else "names a file"
    assert (
        f"warning: {noun} {named} {verb}, but {task} poses every argument as its own text"
        in " ".join(err.split())
    )
    assert all(names[k] in out for k in files)  # ranked as the texts given


def test_states_of_several_tasks_pose_a_query_as_the_task_of_its_n(tmp_path, capsys):
    """A folder of states fitted on pairs (N = 2) and on four options (N = 4): each query is
    posed as its N's task; a query of neither is refused naming both tasks."""
    import warnings

    adapter = posdebias.load_adapter("posdebias/text-organism")
    fruits = ["apple", "banana", "cherry", "grape", "lemon", "mango", "pear", "plum"]
    others = ["stone", "car", "cloud", "chair", "river", "shoe", "hammer", "brick"]
    stem = "Which of these is a fruit?"
    pairs = [Instance(stem=stem, texts=(f, o), target=0, id=f"p{k}", task="pairwise_judge")
             for k, (f, o) in enumerate(zip(fruits, others, strict=True))]  # fmt: skip
    options = [Instance(stem=stem, texts=(o, f, others[k - 1], others[k - 2]), target=1,
                        id=f"m{k}", task="multiple_choice")
               for k, (f, o) in enumerate(zip(fruits, others, strict=True))]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = Debiaser(adapter, "pride")
        fitted.calibrate([*pairs, *options])
    fitted.save(tmp_path / "mixed")
    loaded = Debiaser.load(tmp_path / "mixed", adapter)
    assert (loaded.fitted_task(2), loaded.fitted_task(4), loaded.fitted_task()) == (
        "pairwise_judge", "multiple_choice", None)  # fmt: skip
    posed = loaded.rank(stem, texts=["plum", "stone"], task="pairwise_judge")
    assert np.allclose(
        loaded.rank(stem, texts=["plum", "stone"]).probabilities, posed.probabilities
    )
    with pytest.raises(CalibrationError, match="fitted on multiple_choice queries, and this one "
                       "is posed as rerank"):  # fmt: skip
        loaded.rank(stem, texts=["plum", "stone", "car", "cloud"], task="rerank")
    command = ["rank", "--calibration", str(tmp_path / "mixed"),
               "--model", "posdebias/text-organism"]  # fmt: skip
    assert main([*command, stem, "plum", "stone"]) == 0
    assert "answer" in capsys.readouterr().out  # the judge's noun
    assert main([*command, stem, "plum", "stone", "car"]) == 2
    err = capsys.readouterr().err
    assert "fitted on multiple_choice and pairwise_judge" in err and "--task" in err


def test_rank_with_a_state_from_another_adapter_is_refused(tmp_path, capsys):
    state = Debiaser(SyntheticAdapter()).calibrate(synthetic_instances(2, 4))
    path = state.with_metadata(adapter="llava").save(tmp_path / "cal.json")
    assert (
        main(
            ["rank", "--calibration", str(path), "--adapter", "synthetic", "q", "a", "b", "c", "d"]
        )
        == 2
    )
    assert "made with adapter 'llava', not 'synthetic'" in capsys.readouterr().err


# -- calibrators that need no fit, several calibrators, rank_many, evidence ---------------------


class CountingAdapter(SyntheticAdapter):
    """The simulated model, counting the views it is asked to observe (calls and sizes)."""

    def __init__(self, **options):
        super().__init__(**options)
        self.calls: list[int] = []

    def observe_many(self, instances, *, batch_size=1):
        self.calls.append(len(instances))
        return super().observe_many(instances, batch_size=batch_size)


@pytest.mark.parametrize(("name", "views"), [("vanilla", 1), ("permutation_average", 4)])
def test_calibrators_without_fit_rank_at_once_and_calibrate_observes_nothing(name, views):
    adapter = CountingAdapter()
    debiaser = Debiaser(adapter, name)
    instance = synthetic_instances(1, 4, seed=3)[0]
    ranking = debiaser.rank(instance.stem, instance.images)
    assert adapter.calls == [views]
    observation = adapter.observe(instance)
    rotations = adapter.observe_many(list(cyclic_rotations(instance)))
    state = debiaser.calibrator.fit([], n=4)
    expected = debiaser.calibrator.predict(
        observation, state, rotations=rotations if views > 1 else None
    )
    assert np.allclose(ranking.scores, expected.scores)
    adapter.calls.clear()
    state = debiaser.calibrate(synthetic_instances(5, 4, seed=4))
    assert adapter.calls == [] and state.calibrator == name and state.num_observations == 0
    assert state.label_set == ["1", "2", "3", "4"] and state.adapter == "synthetic"
    # the trivial state follows N: the same debiaser ranks 6 images too
    assert len(debiaser.rank("q", [f"i{k}" for k in range(6)]).probabilities) == 6


def test_ranking_maps_back_to_the_callers_images_best_first():
    debiaser = Debiaser(SyntheticAdapter(), "vanilla")
    images = [f"synthetic://x/{k}" for k in range(5)]
    ranking = debiaser.rank("the image synthetic://x/3", images)
    probabilities = ranking.probabilities
    assert ranking.order[0] == ranking.choice and sorted(ranking.order) == list(range(5))
    assert list(probabilities[ranking.order]) == sorted(probabilities, reverse=True)
    assert ranking.ranked_images == [images[k] for k in ranking.order]
    assert ranking.best == images[ranking.choice] and ranking.images == tuple(images)
    assert ranking.evidence is None  # only on request


def test_evidence_explains_the_attention_guided_decision():
    adapter = SyntheticAdapter()
    debiaser = Debiaser(adapter)
    debiaser.calibrate(synthetic_instances(5, 4, seed=11))
    instance = synthetic_instances(1, 4, seed=12)[0]
    ranking = debiaser.rank(instance.stem, instance.images, explain=True)
    evidence = ranking.evidence
    observation = adapter.observe(instance)
    assert np.allclose(evidence.label_probabilities, np.exp(observation.label_logprobs))
    assert np.isclose(evidence.posterior.sum(), 1) and np.isclose(
        evidence.attention_readout.sum(), 1
    )
    assert len(evidence.layers) == 2 and all(0 <= layer < 8 for layer in evidence.layers)
    # the calibrated scores are the label scores with the expected bias removed
    corrected = observation.label_logprobs - evidence.expected_bias
    assert np.allclose(ranking.scores, corrected - np.logaddexp.reduce(corrected))
    # the expected bias is the posterior-weighted bias matrix
    assert np.allclose(
        evidence.expected_bias, evidence.posterior @ debiaser.state.bias_matrix_array
    )
    assert set(evidence.to_dict()) == {
        "label_probabilities",
        "attention_readout",
        "layers",
        "posterior",
        "expected_bias",
    }


def test_several_calibrators_share_one_forward_pass_and_match_single_ones():
    calibration = synthetic_instances(5, 4, seed=21)
    names = ["attention_guided", "vanilla", "pride", "permutation_average"]
    adapter = CountingAdapter()
    both = Debiaser(adapter, names)
    both.calibrate(calibration)
    assert adapter.calls == [20]  # the rotations of the calibration set, observed once
    adapter.calls.clear()
    test = synthetic_instances(6, 4, seed=22)
    rankings = list(both.rank_many(test, batch_size=3))
    assert adapter.calls == [12, 12]  # 3 queries x 4 rotations per batch, shared by all four
    for name in names:
        single = Debiaser(SyntheticAdapter(), name)
        single.calibrate(calibration)
        for ranking, instance in zip(rankings, test, strict=True):
            alone = single.rank(instance.stem, instance.images)
            assert np.allclose(ranking.of(name).scores, alone.scores)
    assert rankings[0].calibrators == names and rankings[0].calibrator == "attention_guided"
    assert rankings[0].target == test[0].target and rankings[0].id == test[0].id
    with pytest.raises(InputError, match="no prediction of calibrator 'sofa'"):
        rankings[0].of("sofa")


def test_rank_many_streams_in_order_and_batch_size_changes_nothing():
    debiaser = Debiaser(SyntheticAdapter(), ["attention_guided", "permutation_average"])
    debiaser.calibrate(synthetic_instances(5, 4, seed=1))
    test = synthetic_instances(7, 4, seed=2)
    pulled = []

    def queries():
        for instance in test:
            pulled.append(instance.id)
            yield (instance.stem, list(instance.images))

    stream = debiaser.rank_many(queries(), batch_size=2)
    first = next(stream)
    assert len(pulled) == 2  # lazily: one batch read, one batch answered
    rest = list(stream)
    one_by_one = [debiaser.rank(i.stem, i.images) for i in test]
    eight = list(debiaser.rank_many(test, batch_size=8))
    for got in ([first, *rest], eight):
        assert [r.query for r in got] == [i.stem for i in test]
        for ranking, alone in zip(got, one_by_one, strict=True):
            for name in ("attention_guided", "permutation_average"):
                assert np.allclose(ranking.of(name).scores, alone.of(name).scores)
    assert list(debiaser.rank_many([])) == []


@pytest.mark.parametrize("calibrators", [["vanilla"], ["permutation_average"]])
def test_queries_sharing_an_id_are_answered_each_by_its_own_content(calibrators):
    """rank_many observed each (id, candidates) once per batch: the second of two questions
    named "x" over the same options got the first one's answer."""
    debiaser = Debiaser(posdebias.load_adapter("posdebias/text-organism"), calibrators)
    options = ("a red circle", "a blue square", "a green star", "a yellow moon")
    stems = ("Which is red?", "Which is a star?")
    queries = [Instance(id="x", stem=s, texts=options, task="multiple_choice") for s in stems]
    together = list(debiaser.rank_many(queries, batch_size=2))
    alone = [debiaser.rank(s, texts=list(options), task="multiple_choice") for s in stems]
    for got, want in zip(together, alone, strict=True):
        assert np.allclose(got.scores, want.scores, atol=1e-5)
    assert not np.allclose(together[0].scores, together[1].scores, atol=1e-3)


def test_rank_many_rejects_what_is_not_a_query():
    debiaser = Debiaser(SyntheticAdapter(), "vanilla")
    for bad in (["a caption"], [("caption", "one.png")], [42]):
        with pytest.raises(InputError, match="Instance|list of image references"):
            list(debiaser.rank_many(bad))
    with pytest.raises(InputError, match="batch_size must be a whole number from 1 to 4,096"):
        list(debiaser.rank_many([], batch_size=0))


def test_save_and_load_several_calibrators(tmp_path):
    debiaser = Debiaser(SyntheticAdapter(), ["attention_guided", "pride"])
    debiaser.calibrate(synthetic_instances(3, 4, seed=5))
    folder = debiaser.save(tmp_path / "states")
    assert sorted(p.name for p in folder.iterdir()) == ["attention_guided.json", "pride.json"]
    loaded = Debiaser.load(folder, SyntheticAdapter())
    instance = synthetic_instances(1, 4, seed=6)[0]
    for name in ("attention_guided", "pride"):
        assert np.allclose(
            loaded.rank(instance.stem, instance.images).of(name).scores,
            debiaser.rank(instance.stem, instance.images).of(name).scores,
        )


def test_library_errors_give_library_advice_and_the_cli_keeps_cli_advice(tmp_path, capsys):
    debiaser = Debiaser(SyntheticAdapter())
    debiaser.calibrate(synthetic_instances(2, 4))
    with pytest.raises(CalibrationError) as caught:
        debiaser.rank("q", ["a", "b", "c"])
    assert "Debiaser.calibrate(instances)" in str(caught.value)
    assert "posdebias" not in str(caught.value)
    assert "`posdebias calibrate`" in caught.value.message_for("cli")
    with pytest.raises(CalibrationError, match=r"Debiaser\.calibrate\(instances\) and Debiaser"):
        Debiaser.load(tmp_path / "missing.json", SyntheticAdapter())
    path = debiaser.save(tmp_path / "cal.json")
    assert (
        main(["rank", "--calibration", str(path), "--adapter", "synthetic", "q", "a", "b", "c"])
        == 2
    )
    err = capsys.readouterr().err
    assert "`posdebias calibrate`" in err and "Debiaser" not in err


def test_rank_names_its_own_flag_for_a_state_of_another_model(tmp_path, capsys):
    """`rank` refuses a state fitted on another model with the flag it takes (it reads no
    config file); with the flag the state ranks."""
    debiaser = Debiaser(SyntheticAdapter(), ["pride"])
    debiaser.calibrate(synthetic_instances(2, 4))
    path = debiaser.save(tmp_path / "cal.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_id": "someone/else"}))
    command = ["rank", "--calibration", str(path), "--adapter", "synthetic", "q", "a", "b", "c"]
    capsys.readouterr()
    assert main([*command, "d"]) == 2
    err = capsys.readouterr().err
    assert "fitted on model 'someone/else'" in err
    assert err.rstrip().endswith("pass --calibration-transfer.")
    assert "config" not in err and "Debiaser" not in err
    assert main([*command, "d", "--calibration-transfer"]) == 0


def test_labelled_calibrators_refuse_unlabelled_instances_with_advice():
    unlabelled = [replace(i, target=None) for i in synthetic_instances(2, 4)]
    with pytest.raises(InputError, match="have no target.*fits without them") as refused:
        Debiaser(SyntheticAdapter(), ["attention_guided", "label_free"]).calibrate(unlabelled)
    # the calibrators named are those that fit without targets (purified_attention needs them)
    said = str(refused.value)
    assert "(pride, label_free, contextual, batch)" in said
    assert "purified_attention" not in said and "attention_guided']" in said
    state = Debiaser(SyntheticAdapter(), "label_free").calibrate(unlabelled)
    assert state.diagnostics["attention_informative"] is True


def test_options_with_several_calibrators_are_refused():
    with pytest.raises(InputError, match="apply to one calibrator given by name"):
        Debiaser(SyntheticAdapter(), ["vanilla", "pride"], top_k=1)
    with pytest.raises(InputError, match="given twice"):
        Debiaser(SyntheticAdapter(), ["vanilla", "vanilla"])
    labelled = Debiaser(
        SyntheticAdapter(),
        {"k1": get_calibrator("attention_guided", top_k=1), "k2": "attention_guided"},
    )
    assert list(labelled.calibrators) == ["k1", "k2"]


def test_calibrators_with_different_orders_share_the_views_they_have_in_common():
    adapter = CountingAdapter()
    cyclic = get_calibrator("permutation_average")
    shuffled = get_calibrator("permutation_average", permutations="random", count=6)
    both = Debiaser(adapter, {"cyclic": cyclic, "random": shuffled, "vanilla": "vanilla"})
    test = synthetic_instances(3, 4, seed=31)
    rankings = list(both.rank_many(test, batch_size=3))
    orders = {tuple(p) for c in (cyclic, shuffled) for p in c.permutations(4)}
    assert adapter.calls == [3 * len(orders)]  # each distinct order observed once per query
    for label, calibrator in (("cyclic", cyclic), ("random", shuffled)):
        alone = Debiaser(SyntheticAdapter(), calibrator)
        for ranking, instance in zip(rankings, test, strict=True):
            expected = alone.rank(instance.stem, instance.images).scores
            assert np.allclose(ranking.of(label).scores, expected)


def test_one_string_of_texts_is_refused_not_split_into_letters():
    """``texts="abcd"`` posed four one-letter candidates."""
    debiaser = Debiaser(SyntheticAdapter(), "vanilla")
    with pytest.raises(posdebias.errors.InputError, match="got one string; pass texts"):
        debiaser.rank("Which is a colour?", texts="abcd", task="multiple_choice")
    with pytest.raises(posdebias.errors.InputError, match=r"an Instance \(any task\)"):
        list(debiaser.rank_many([5]))
