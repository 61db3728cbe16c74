"""The training script: runs end to end, writes a loadable model, draws data deterministically."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from posdebias.cli import main
from posdebias.organism.train import ShapesPool, TrainingPlan, train_organism

SRC = Path(__file__).resolve().parents[2] / "src"


def test_few_steps_write_a_model_that_loads_and_observes(tmp_path):
    import posdebias

    plan = TrainingPlan(
        pool_size=24, batch_size=4, alignment_steps=2, retrieval_steps=2, bias_steps=2
    )
    lines: list[str] = []
    out = train_organism(tmp_path / "model", plan, log=lines.append)
    assert any(line.startswith("stage 2 step 1") for line in lines)
    info = json.loads((out / "training.json").read_text())
    assert info["plan"]["retrieval_steps"] == 2 and info["dtype"] == "float16"
    adapter = posdebias.load_adapter(out)
    (instance,) = ShapesPool(8, 3).instances(np.random.default_rng(0), 1, 4, "smoke")
    observation = adapter.observe(instance)
    assert observation.label_logprobs.shape == (4,)
    assert observation.attention.shape == (4, 4)
    assert np.isclose(np.exp(observation.label_logprobs).sum(), 1.0)
    assert not list(tmp_path.glob(".model.*"))  # the staging folder is gone
    assert (out / "model.safetensors").stat().st_mode & 0o044  # readable like any other file


def test_cli_refuses_a_non_empty_output_folder(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["organism", "train", "--out", str(tmp_path), "--steps", "1", "1", "1"]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


_DIGEST = """
import hashlib, numpy as np
from posdebias.organism.build import vocabulary
from posdebias.organism.train import ShapesPool
pool = ShapesPool(60, 0)
digest = hashlib.sha256("|".join(vocabulary()).encode())
for instance in pool.instances(np.random.default_rng([0, 1]), 40, 4, "d"):
    digest.update(f"{instance.query}/{instance.target}".encode())
    for image in instance.images:
        digest.update(image.tobytes())
print(digest.hexdigest())
"""


def test_training_data_do_not_depend_on_the_hash_seed():
    """Issue 7's trap: a set-ordered candidate list is a cue that vanishes after reloading."""
    digests = set()
    for hash_seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(SRC)}
        result = subprocess.run(
            [sys.executable, "-c", _DIGEST], env=env, capture_output=True, text=True, check=True
        )
        digests.add(result.stdout.strip())
    assert len(digests) == 1 and all(digests)
