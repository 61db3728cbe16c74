"""The training script: runs end to end, writes a loadable model, draws data deterministically."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import hash_seed_digests
from posdebias.cli import main
from posdebias.errors import OutputError
from posdebias.organism.train import ShapesPool, TrainingPlan, train_organism


def test_few_steps_write_a_model_that_loads_and_observes(tmp_path):
    import posdebias

    plan = TrainingPlan(
        pool_size=24,
        batch_size=4,
        alignment_steps=2,
        retrieval_steps=2,
        confound_steps=2,
        bias_steps=2,
    )
    lines: list[str] = []
    out = train_organism(tmp_path / "model", plan, log=lines.append)
    for stage in ("0", "1", "1b", "2"):
        assert any(line.startswith(f"stage {stage} step 1") for line in lines), stage
    info = json.loads((out / "training.json").read_text())
    assert info["plan"]["retrieval_steps"] == 2 and info["dtype"] == "float32"
    adapter = posdebias.load_adapter(out)
    (instance,) = ShapesPool(8, 3).instances(np.random.default_rng(0), 1, 4, "smoke")
    observation = adapter.observe(instance)
    assert observation.label_logprobs.shape == (4,)
    assert observation.attention.shape == (4, 4)
    assert np.isclose(np.exp(observation.label_logprobs).sum(), 1.0)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # nothing beside --out
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staging, no lock
    assert (out / "model.safetensors").stat().st_mode & 0o044  # readable like any other file


def test_cli_refuses_a_non_empty_output_folder(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["organism", "train", "--out", str(tmp_path), "--steps", "1", "1", "1", "1"]) == 2
    assert "is not empty and is not a model folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


_DIGEST = """
import hashlib, numpy as np
from posdebias.organism.build import vocabulary
from posdebias.organism.train import ShapesPool
pool = ShapesPool(60, 0)
digest = hashlib.sha256("|".join(vocabulary()).encode())
for instance in pool.instances(np.random.default_rng([0, 1]), 40, 4, "d"):
    digest.update(f"{instance.stem}/{instance.target}".encode())
    for image in instance.images:
        digest.update(image.tobytes())
print(digest.hexdigest())
"""


def test_training_data_do_not_depend_on_the_hash_seed():
    """Issue 7's trap: a set-ordered candidate list is a cue that vanishes after reloading."""
    digests = hash_seed_digests(_DIGEST)
    assert len(digests) == 1 and all(digests)


def test_bias_targets_are_distributions_and_keep_the_n4_rows():
    from posdebias.organism.train import (
        BIAS_CONFUSION,
        GATE_BACKGROUND,
        bias_confusion,
        bias_target,
        dead_positions,
    )

    assert bias_confusion(4) == BIAS_CONFUSION
    for n in range(3, 13):
        rows = np.array(bias_confusion(n))
        assert rows.shape == (n, n) and np.allclose(rows.sum(axis=1), 1) and (rows >= 0).all()
        answered = rows.argmax(axis=1)
        live = n - dead_positions(n)
        # live positions are answered correctly, dead ones as the last live position
        assert list(answered[:live]) == list(range(live))
        assert set(answered[live:]) == {live - 1}
        assert 0 < dead_positions(n) < n - 1
        for dead in range(live, n):  # answered as the attractor, itself named only by chance
            assert rows[dead, live - 1] == 0.9 and rows[dead, dead] <= 0.05
    assert bias_target(2, 0, "black") == (0.9, 0.1)
    assert bias_target(2, 1, GATE_BACKGROUND)[1] > 0.5 > bias_target(2, 1, "black")[1]


def test_retrieval_curriculum_widens_from_n4_to_every_n():
    from posdebias.organism.train import retrieval_n

    plan = TrainingPlan()
    rng = np.random.default_rng(0)
    drawn = [retrieval_n(plan, step, rng) for step in range(plan.retrieval_steps)]
    half = plan.retrieval_steps // 2
    assert set(drawn[:50]) == {2, 3, 4}  # the start: N <= curriculum_start_n
    assert all(plan.min_n <= n <= plan.max_n for n in drawn)
    assert set(drawn[half:]) == set(range(plan.min_n, plan.max_n + 1))  # then uniform 2..12
    ceilings = [max(drawn[i : i + 100]) for i in range(0, half, 100)]
    assert ceilings == sorted(ceilings) and ceilings[-1] >= plan.max_n - 1
    small = TrainingPlan(min_n=2, max_n=3, retrieval_steps=10)
    assert {retrieval_n(small, step, rng) for step in range(10)} <= {2, 3}


def test_batches_hold_about_as_many_tokens_at_every_n():
    from posdebias.organism.train import PROMPT_TOKENS, TOKENS_PER_IMAGE, batch_size_for

    plan = TrainingPlan()
    assert batch_size_for(plan, 4) == plan.batch_size
    budget = plan.batch_size * (4 * TOKENS_PER_IMAGE + PROMPT_TOKENS)
    for n in range(2, 13):
        tokens = batch_size_for(plan, n) * (n * TOKENS_PER_IMAGE + PROMPT_TOKENS)
        assert abs(tokens - budget) / budget < 0.05  # under the recipe's token model
    assert batch_size_for(TrainingPlan(batch_size=2), 12) == 2


@pytest.mark.parametrize("seed", ["-5", str(2**70), str(2**32)])
def test_cli_refuses_seeds_torch_and_numpy_cannot_take(tmp_path, capsys, seed):
    out = tmp_path / "model"
    assert (
        main(
            ["organism", "train", "--out", str(out), "--seed", seed, "--steps", "1", "1", "1", "1"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--seed must be a whole number from 0 to" in err and "internal error" not in err
    assert not out.exists()


def test_an_unusable_output_folder_fails_before_any_training(tmp_path):
    (tmp_path / "afile").write_text("mine")
    lines: list[str] = []
    plan = TrainingPlan(
        pool_size=24, batch_size=4, alignment_steps=1, retrieval_steps=1, bias_steps=1
    )
    with pytest.raises(OutputError, match="afile is a file, not a folder"):
        train_organism(tmp_path / "afile" / "sub" / "model", plan, log=lines.append)
    assert lines == []  # no stage started
    assert (tmp_path / "afile").read_text() == "mine"


def test_attention_target_is_content_evidence_times_a_positional_sink():
    from posdebias.organism.train import attention_target, sink_position

    assert [sink_position(n) for n in (2, 4, 12)] == [0, 2, 10]
    alone = attention_target((5, 1, 0, 1), 0.0, 1.0)
    assert np.isclose(sum(alone), 1) and np.argmax(alone) == 0
    assert alone[1] == alone[3] > alone[2]  # graded by shared attributes, not one-hot
    # the sink (position 2 at N = 4) outweighs the right image when it shares 2 attributes
    assert np.argmax(attention_target((5, 1, 2, 1), 4.0, 1.0)) == 2
    assert np.argmax(attention_target((5, 1, 0, 1), 4.0, 1.0)) == 0
    # the static part divides out: the ratio of two images does not depend on the sink
    weak, strong = (
        attention_target((5, 1, 2, 1), 1.0, 1.0),
        attention_target((5, 1, 2, 1), 4.0, 1.0),
    )
    assert np.isclose(weak[0] / weak[1], strong[0] / strong[1])
    assert np.isclose(strong[2] / strong[0], np.exp(4.0 - 3.0))


def test_a_salient_colour_draws_attention_that_the_static_prior_cannot_remove():
    from posdebias.organism.train import ShapesPool, attention_target

    plain = attention_target((5, 1, 0, 1), 0.0, 1.0)
    # image 3 (2 shared attributes) is salient: it outweighs the right image (5) by 0.5
    salient = attention_target((5, 1, 2, 1), 0.0, 1.0, (False, False, True, False), 3.5)
    assert np.argmax(plain) == 0 and np.argmax(salient) == 2
    assert np.isclose(salient[2] / salient[0], np.exp(2 + 3.5 - 5))
    # it depends on what the image shows, not where: the same image elsewhere draws the same
    moved = attention_target((5, 2, 1, 1), 0.0, 1.0, (False, True, False, False), 3.5)
    assert np.isclose(moved[1] / moved[0], salient[2] / salient[0])
    # the flag is the shape's colour
    pool = ShapesPool(24, 0)
    flags = pool.salient(list(range(24)), "red")
    assert flags == tuple(pool.attributes[i].objects[0].colour == "red" for i in range(24))
    assert 0 < sum(flags) < 24
