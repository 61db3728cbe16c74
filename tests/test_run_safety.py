"""Never a stale or mixed result; never destroy what we did not make.

Each class of problem is tried in several variants through the real CLI (and real processes
where the problem is about processes): run identity and changed calibrators, the run lock, the
observation cache key, saved calibration states, duplicate images through path aliases,
resumption after the last record, foreign output folders, the shapes root, leftovers of killed
writers, multi-file outputs on a full disk, corrupt results, and runs that failed early.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import (
    build_shapes_benchmark,
    line_count,
    main_without_latency,
    posdebias_command,
    run_cli_with_file_size_limit,
    running_cli,
)
from helpers import cli_run as cli
from posdebias.core.state import CalibrationState
from posdebias.evaluation.results import EvaluationResults

SIM = ("evaluate", "--adapter", "synthetic")


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (to prove nothing changed)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def timeless(folder: Path) -> dict:
    payload = json.loads((folder / "results.json").read_text())
    payload.pop("timing")
    return payload


def observation_lines(run: Path) -> int:
    return (run / "observations.jsonl").read_text().count("\n")


# -- 2. run identity: a changed calibrator is predicted again, never reused -----------------


def _config(tmp_path: Path, name: str, calibrators: list[dict]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        json.dumps(
            {"adapter": {"name": "synthetic"}, "count": 15, "orders": 2, "calibrators": calibrators}
        )
    )
    return path


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # options changed behind a label
        (
            {"name": "attention_guided", "label": "ag", "options": {"top_k": 1}},
            {"name": "attention_guided", "label": "ag", "options": {"top_k": 4}},
        ),
        # another calibrator class behind the same label
        ({"name": "pride", "label": "x"}, {"name": "vanilla", "label": "x"}),
        # options of an unlabelled calibrator
        (
            {"name": "permutation_average", "options": {"average": "prob"}},
            {"name": "permutation_average", "options": {"average": "log"}},
        ),
    ],
)
def test_resume_with_a_changed_calibrator_predicts_it_again(tmp_path, capsys, before, after):
    run, fresh = tmp_path / "run", tmp_path / "fresh"
    old = _config(tmp_path, "old", [{"name": "vanilla"}, before])
    new = _config(tmp_path, "new", [{"name": "vanilla"}, after])
    assert cli(capsys, "evaluate", "--config", old, "--out", run)[0] == 0
    forwards = observation_lines(run)
    code, err = cli(capsys, "evaluate", "--config", new, "--out", run, "--resume")
    assert code == 0, err
    assert observation_lines(run) == forwards  # predicted from cached observations
    assert cli(capsys, "evaluate", "--config", new, "--out", fresh)[0] == 0
    resumed, expected = timeless(run), timeless(fresh)
    assert resumed["calibrators"] == expected["calibrators"]
    label = after.get("label", after["name"])
    assert resumed["calibrators"][label]["name"] == after["name"]


def test_a_changed_saved_state_is_predicted_again(tmp_path, capsys):
    """--calibration with another state file: the records of the old state are not reused."""
    states = tmp_path / "states"
    assert cli(capsys, "calibrate", "--adapter", "synthetic", "--out", states)[0] == 0
    other = tmp_path / "other"
    assert cli(capsys, "calibrate", "--adapter", "synthetic", "--seed", "3", "--out", other)[0] == 0
    run, fresh = tmp_path / "run", tmp_path / "fresh"
    args = [*SIM, "--calibrators", "attention_guided", "--count", "15", "--orders", "2"]
    assert cli(capsys, *args, "--calibration", states, "--out", run)[0] == 0
    assert cli(capsys, *args, "--calibration", other, "--out", run, "--resume")[0] == 0
    assert cli(capsys, *args, "--calibration", other, "--out", fresh)[0] == 0
    assert timeless(run)["calibrators"] == timeless(fresh)["calibrators"]


def test_what_defines_the_observations_still_refuses_a_resume(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, *SIM, "--count", "6", "--orders", "2", "--out", run)[0] == 0
    for change, shown in (
        (("--seed", "1"), "seed: 0 there, 1 now"),
        (("--count", "7"), "count: 6 there, 7 now"),
        (("-N", "5"), "source.n: 4 there, 5 now"),
    ):
        args = [*SIM, "--count", "6", "--orders", "2", *change, "--out", run, "--resume"]
        code, err = cli(capsys, *args)
        assert code == 2 and "different configuration" in err and shown in err, err


# -- 2. one process per run directory ------------------------------------------------------


def _slow_run(tmp_path: Path, run: Path) -> subprocess.Popen:
    config = tmp_path / "slow.yaml"
    config.write_text(
        "adapter: {name: synthetic, options: {latency: 0.01}}\ncount: 100\norders: 3\n"
    )
    return running_cli(
        ["evaluate", "--config", config, "--out", run],
        lambda: line_count(run / "records.jsonl") >= 2,
    )


@pytest.mark.slow
def test_a_second_process_on_a_run_directory_is_refused_with_the_holders_pid(tmp_path, capsys):
    run = tmp_path / "run"
    process = _slow_run(tmp_path, run)
    try:
        before = (run / "records.jsonl").read_text().count("\n")
        for args in (
            [*SIM, "--config", tmp_path / "slow.yaml", "--out", run, "--resume"],
            [*SIM, "--seed", "3", "--out", run, "--resume"],
            [*SIM, "--count", "5", "--out", run],  # without --resume
        ):
            code, err = cli(capsys, *args)
            assert code == 2, err
            assert f"in use by another posdebias process (pid {process.pid})" in err
        lines = (run / "records.jsonl").read_text().splitlines()
        assert len(lines) >= before  # the holder went on writing; nobody else did
        assert len({json.loads(line)["instance_id"] for line in lines[:-1]}) == len(lines[:-1])
    finally:
        process.kill()
        process.wait()
    # the kernel released the lock of the killed holder: the next process resumes
    resume = [*SIM, "--config", tmp_path / "slow.yaml", "--out", run, "--resume"]
    assert main_without_latency(resume) == 0, capsys.readouterr().err


# -- 2. the observation cache key covers every input of the forward pass --------------------


def test_the_cache_key_changes_with_every_input_and_not_with_path_aliases(tmp_path):
    from posdebias.core.instance import Instance
    from posdebias.evaluation.runner import observation_key
    from posdebias.testing import write_test_images

    images = write_test_images(tmp_path / "images", 4)
    base = Instance("a red square", tuple(map(str, images[:3])), 0, "i")
    key = observation_key(base)
    other_file = tmp_path / "images" / "copy.png"
    variants = {
        "caption": Instance("a blue square", base.images, 0, "i"),
        "order": base.permuted([1, 0, 2]),
        "image": Instance("a red square", (*base.images[:2], str(images[3])), 0, "i"),
        "id": Instance("a red square", base.images, 0, "j"),
    }
    for what, variant in variants.items():
        assert observation_key(variant) != key, what
    # another file's content under the same name is another input
    shutil.copy(images[3], other_file)
    same_name = Instance("a red square", (*base.images[:2], str(other_file)), 0, "i")
    first = observation_key(same_name)
    shutil.copy(images[2], other_file)
    os.utime(other_file, ns=(1, 1))
    assert observation_key(same_name) != first
    # aliases of the same files are the same input
    alias = tuple(str(Path(p).parent / "." / Path(p).name) for p in base.images)
    assert observation_key(Instance("a red square", alias, 0, "i")) == key
    (tmp_path / "linked").symlink_to(tmp_path / "images")
    linked = tuple(str(tmp_path / "linked" / Path(p).name) for p in base.images)
    assert observation_key(Instance("a red square", linked, 0, "i")) == key
    (tmp_path / "images").rename(tmp_path / "moved")  # a moved folder: the same files
    moved = tuple(str(tmp_path / "moved" / Path(p).name) for p in base.images)
    assert observation_key(Instance("a red square", moved, 0, "i")) == key


def test_captions_differing_between_calibration_and_test_are_observed_apart(tmp_path, capsys):
    """A calibration benchmark with the test's ids and images but other captions: the test
    views get observations of their own captions (vanilla equals the run without the clash)."""
    from posdebias.evaluation.runner import ObservationCache, observe_cached

    class Counting:
        name = "counting"

        def __init__(self):
            self.seen = []

        def observe_many(self, instances, batch_size=1):
            from posdebias.adapters.families.synthetic import SyntheticAdapter

            self.seen += [i.stem for i in instances]
            return SyntheticAdapter().observe_many(instances)

    from posdebias.adapters.families.synthetic import synthetic_instances
    from posdebias.core.instance import Instance

    adapter, cache = Counting(), ObservationCache()
    test = synthetic_instances(3, 4, seed=0, prefix="t")
    recaptioned = [Instance(i.stem + " again", i.images, i.target, i.id) for i in test]
    observe_cached(adapter, recaptioned, cache)
    observe_cached(adapter, test, cache)
    assert len(adapter.seen) == 6 and len(cache) == 6
    observe_cached(adapter, test, cache)
    assert len(adapter.seen) == 6  # the same inputs again: served from the cache


# -- 2. saved calibration states are checked on load -----------------------------------------


def _edited_state(states: Path, label: str, **changes) -> None:
    path = states / f"{label}.json"
    payload = json.loads(path.read_text())
    payload.update(changes)
    path.write_text(json.dumps(payload))


def test_saved_states_made_for_other_options_are_refused(tmp_path, capsys):
    states = tmp_path / "states"
    assert cli(capsys, "calibrate", "--adapter", "synthetic", "--out", states)[0] == 0
    config = tmp_path / "c.yaml"
    for options, shown in (
        ({"top_k": 1}, "top_k"),
        ({"layer_range": [0, 2]}, "layer_range"),
    ):
        config.write_text(
            json.dumps({"calibrators": [{"name": "attention_guided", "options": options}]})
        )
        args = [*SIM, "--config", config, "--calibration", states, "--count", "3"]
        code, err = cli(capsys, *args, "--out", tmp_path / "run")
        assert code == 2 and "fitted with other options" in err and shown in err, err
        assert not (tmp_path / "run").exists()  # refused before the run directory exists


def test_saved_states_of_another_prompt_are_refused(tmp_path):
    from posdebias import get_calibrator
    from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
    from posdebias.errors import CalibrationError
    from posdebias.evaluation.runner import fit_calibrators

    state = fit_calibrators(
        SyntheticAdapter(),
        {"p": get_calibrator("pride")},
        synthetic_instances(2, 4),
        metadata={"prompt_hash": "aaa", "model_id": "m"},
    )["p"]
    state.check_compatible(prompt_hash="aaa", model_id="m")
    with pytest.raises(CalibrationError, match="fitted with another prompt"):
        state.check_compatible(prompt_hash="bbb", model_id="m")
    with pytest.raises(CalibrationError, match="fitted on model 'm', not 'n'") as caught:
        state.check_compatible(prompt_hash="aaa", model_id="n")
    # each door names its own way to say the transfer is meant, and no other door's
    error = caught.value
    assert str(error).endswith("pass transfer=True to Debiaser.load (or Debiaser.use_states).")
    assert error.message_for("cli").endswith("pass --calibration-transfer.")
    assert error.message_for("harness").endswith(
        "pass calibration_transfer=True in the model arguments."
    )
    assert "`posdebias calibrate`, or calibration=<a benchmark" in error.message_for("harness")
    for door in ("cli", "harness"):
        assert "Debiaser" not in error.message_for(door)
    assert "config" not in error.message_for("cli")  # `rank` has no config file
    assert "posdebias calibrate" not in str(error)


def test_a_state_of_another_model_needs_the_transfer_flag(tmp_path, capsys):
    states = tmp_path / "states"
    assert cli(capsys, "calibrate", "--adapter", "synthetic", "--out", states)[0] == 0
    _edited_state(states, "attention_guided", model_id="org/other-checkpoint")
    args = [*SIM, "--calibrators", "vanilla,attention_guided", "--calibration", states]
    args += ["--count", "5", "--orders", "2"]
    code, err = cli(capsys, *args, "--out", tmp_path / "refused")
    assert code == 2 and "fitted on model 'org/other-checkpoint', not 'synthetic'" in err
    assert "--calibration-transfer" in err and not (tmp_path / "refused").exists()
    # said on purpose: by flag, or by config key; recorded in results.json
    config = tmp_path / "t.yaml"
    config.write_text("calibration_transfer: true\n")
    for extra, out in ((["--calibration-transfer"], "flag"), (["--config", config], "key")):
        code, err = cli(capsys, *args, *extra, "--out", tmp_path / out)
        assert code == 0, err
        results = EvaluationResults.load(tmp_path / out / "results.json")
        assert results.settings.calibration_transfer is True
        saved = results.calibrators["attention_guided"].calibration
        assert saved is not None
        assert saved.model_dump() == {
            "source": "saved",
            "model_id": "org/other-checkpoint",
            "transfer": True,
        }
        vanilla = results.calibrators["vanilla"].calibration
        assert vanilla is not None and vanilla.source in ("saved", "fitted")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"calibrators": [{"name": "attention_guided", "options": {"top_k": 1}}]},
            {"attention_guided": {"top_k": 1}},
        ),
        (
            {"calibrators": {"pride": {}, "attention_guided": {"top_k": 2, "tau": 0.5}}},
            {"pride": {}, "attention_guided": {"top_k": 2, "tau": 0.5}},
        ),
        (
            {"calibrators": [{"name": "attention_guided", "label": "k3", "options": {"top_k": 3}}]},
            {"k3": {"top_k": 3}},
        ),
    ],
)
def test_calibrate_with_a_config_keeps_its_calibrators_and_options(
    tmp_path, capsys, config, expected
):
    file = tmp_path / "c.yaml"
    file.write_text(json.dumps({"adapter": {"name": "synthetic"}, **config}))
    out = tmp_path / "states"
    code, err = cli(capsys, "calibrate", "--config", file, "--out", out)
    assert code == 0, err
    assert sorted(p.stem for p in out.glob("*.json")) == sorted(expected)
    for label, options in expected.items():
        saved = CalibrationState.load(out / f"{label}.json").options
        assert {key: saved[key] for key in options} == options
    # the flag still wins over the config
    flagged = tmp_path / "flagged"
    assert (
        cli(capsys, "calibrate", "--config", file, "--calibrators", "pride", "--out", flagged)[0]
        == 0
    )
    assert [p.stem for p in flagged.glob("*.json")] == ["pride"]


# -- 2. duplicate images are found on the resolved files ------------------------------------


@pytest.mark.parametrize("alias", ["./{0}", "{d}//{f}", "{d}/./{f}", "{d}/../{d}/{f}", "link.png"])
def test_the_same_image_twice_through_a_path_alias_is_refused(tmp_path, capsys, alias):
    bench = build_shapes_benchmark(tmp_path, count=8, n=3)
    root = Path(json.loads((bench / "manifest.json").read_text())["root"])
    lines = (bench / "benchmark.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    first = record["images"][0]
    folder, name = first.split("/")
    if alias == "link.png":
        (root / folder / "link.png").symlink_to(root / first)
        record["images"][1] = f"{folder}/link.png"
    else:
        record["images"][1] = alias.format(first, d=folder, f=name)
    if record["target"] == 1:
        record["target"] = 2
    lines[0] = json.dumps(record, sort_keys=True, separators=(",", ":"))
    (bench / "benchmark.jsonl").write_text("\n".join(lines) + "\n")
    manifest = json.loads((bench / "manifest.json").read_text())
    import hashlib

    manifest["benchmark_sha256"] = hashlib.sha256(
        (bench / "benchmark.jsonl").read_bytes()
    ).hexdigest()
    (bench / "manifest.json").write_text(json.dumps(manifest))
    code, err = cli(capsys, *SIM, "--benchmark", bench, "--out", tmp_path / "run")
    if alias.startswith("{d}/../"):
        assert code == 2 and "must be relative to the root" in err, err
    else:
        assert code == 2, err
        assert "are the same file; each candidate must be a different image" in err
    assert not (tmp_path / "run").exists()


# -- 2. a run killed after its last record resumes to the uninterrupted files --------------


@pytest.mark.slow
def test_a_run_stopped_after_its_last_record_resumes_to_the_same_files(tmp_path, capsys):
    """The state of a run killed after its last record (every record written, no results):
    resumed in a fresh process, results.json equals an uninterrupted run's, labels included."""
    from posdebias.testing import save_tiny_model

    model = save_tiny_model("llava", tmp_path / "model")
    bench = build_shapes_benchmark(tmp_path, count=8, n=3)
    args = ["evaluate", "--model", model, "--benchmark", bench, "--calibrators", "vanilla,pride"]
    args += ["--orders", "1", "--calibration-count", "2"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert cli(capsys, *args, "--out", whole)[0] == 0
    assert cli(capsys, *args, "--out", cut)[0] == 0
    for name in ("results.json", "report.md"):
        (cut / name).unlink()
    shutil.rmtree(cut / "figures")
    result = subprocess.run(
        [*posdebias_command(), *map(str, args), "--out", str(cut), "--resume"],  # no figures
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert timeless(cut) == timeless(whole)
    assert timeless(cut)["adapter"]["labels"] == ["1", "2", "3"]
    assert (cut / "run.json").read_bytes() == (whole / "run.json").read_bytes()


# -- 3. --out: a folder that is not ours is refused -----------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        {"notes.txt": "mine"},
        {"report.md": "my report", "results.json": "{}"},  # our file names, not our run
        {"figures/plot.png": "png"},
        {"states/mine.json": "{}"},
    ],
)
def test_out_on_a_folder_that_is_not_a_run_is_refused(tmp_path, capsys, content):
    out = tmp_path / "mine"
    for name, text in content.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    before = tree(out)
    code, err = cli(capsys, *SIM, "--count", "3", "--out", out)
    assert code == 2 and "is not empty and is not a posdebias run directory" in err, err
    assert tree(out) == before and sorted(p.name for p in out.iterdir()) == sorted(
        {name.split("/")[0] for name in content}
    )


def test_out_on_an_empty_folder_or_our_own_run_is_accepted(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(capsys, *SIM, "--count", "3", "--out", empty)[0] == 0
    assert cli(capsys, *SIM, "--count", "3", "--out", empty, "--resume")[0] == 0
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err = cli(capsys, *SIM, "--count", "3", "--out", blocker)
    assert code == 2 and "is a file" in err and blocker.read_text() == "x"


@pytest.mark.parametrize(
    "link", ["records.jsonl", "observations.jsonl", "run.json", "states/vanilla.json"]
)
def test_a_run_directory_whose_files_are_links_is_refused(tmp_path, capsys, link):
    out = tmp_path / "run"
    assert cli(capsys, *SIM, "--calibrators", "vanilla", "--count", "3", "--out", out)[0] == 0
    (out / "results.json").unlink()
    target = tmp_path / "precious.txt"
    target.write_text("do not touch\npartial")  # no final newline: a 'torn tail'
    (out / link).unlink()
    (out / link).symlink_to(target)
    args = [*SIM, "--calibrators", "vanilla", "--count", "3", "--out", out, "--resume"]
    code, err = cli(capsys, *args)
    assert code == 2 and "symbolic link" in err, err
    assert target.read_text() == "do not touch\npartial"


# -- 1. labels that become file names ----------------------------------------------------------


@pytest.mark.parametrize(
    "label",
    ["../../escape", "/tmp/abs", "a/b", "..", ".hidden", "x" * 65, "a b", "é", "a.", "ok\n", "a\n"],
)
def test_unsafe_calibrator_labels_are_refused(tmp_path, capsys, label):
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({"calibrators": [{"name": "vanilla", "label": label}]}))
    before = sorted(p.name for p in tmp_path.iterdir())
    for command in (
        [*SIM, "--config", config, "--count", "3", "--out", tmp_path / "run"],
        ["calibrate", "--adapter", "synthetic", "--config", config, "--out", tmp_path / "st"],
    ):
        code, err = cli(capsys, *command)
        assert code == 2 and "a label names a file" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_safe_labels_name_their_state_files(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    labels = ["ag-k1", "ag.k2", "AG_3"]
    config.write_text(
        json.dumps({"calibrators": [{"name": "attention_guided", "label": x} for x in labels]})
    )
    code, err = cli(capsys, *SIM, "--config", config, "--count", "3", "--out", tmp_path / "run")
    assert code == 0, err
    assert sorted(p.stem for p in (tmp_path / "run" / "states").iterdir()) == sorted(labels)


# -- 3. the shapes root: regenerate only what we made ---------------------------------------


def _shapes(root: Path, out: Path, *extra) -> list:
    return [
        "build",
        "--source",
        "shapes",
        "--root",
        root,
        "--setting",
        "random",
        "-N",
        "3",
        "--count",
        "6",
        "--out",
        out,
        *extra,
    ]


def test_rebuilding_shapes_with_other_settings_never_deletes_user_files(tmp_path, capsys):
    root = tmp_path / "R"
    assert cli(capsys, *_shapes(root, tmp_path / "b1"))[0] == 0
    assert (root / ".posdebias-shapes.json").is_file()
    assert stat.S_IMODE(root.stat().st_mode) == 0o777 & ~_umask()
    for intruder in ("notes.txt", "images/mine.jpg", "annotations/extra.json", "sub/x"):
        (root / intruder).parent.mkdir(parents=True, exist_ok=True)
        (root / intruder).write_text("mine")
        before = tree(root)
        code, err = cli(capsys, *_shapes(root, tmp_path / "b2", "--shapes-seed", "9"))
        assert "not part of the shapes dataset" in err and intruder.split("/")[0] in err, err
        assert code == 2
        assert tree(root) == before and not (tmp_path / "b2").exists()
        (root / intruder).unlink()
        if intruder == "sub/x":
            (root / "sub").rmdir()
    # only our files left: regenerated; the first benchmark now says its images changed
    assert cli(capsys, *_shapes(root, tmp_path / "b2", "--shapes-seed", "9"))[0] == 0
    code, err = cli(
        capsys, *SIM, "--benchmark", tmp_path / "b1", "--count", "2", "--calibration-count", "2"
    )
    assert code == 2 and "regenerated with other settings" in err and "seed 0 -> 9" in err, err
    # the same settings again: reused, user files beside it are fine
    (root / "notes.txt").write_text("mine")
    assert cli(capsys, *_shapes(root, tmp_path / "b3", "--shapes-seed", "9"))[0] == 0
    assert (root / "notes.txt").read_text() == "mine"


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def test_a_foreign_folder_is_never_a_shapes_root(tmp_path, capsys):
    root = tmp_path / "photos"
    root.mkdir()
    (root / "cat.png").write_text("x")
    code, err = cli(capsys, *_shapes(root, tmp_path / "b"))
    assert code == 2 and "is not a shapes dataset" in err
    assert tree(root) == {"cat.png": b"x"}


def test_build_out_on_a_foreign_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("x")
    code, err = cli(capsys, *_shapes(tmp_path / "R", out))
    assert code == 2 and "not a benchmark folder" in err
    assert tree(out) == {"thesis.tex": b"x"}


# -- 3. leftovers of killed writers are removed by the next owner ----------------------------


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_leftovers_of_killed_writers_are_cleaned_by_the_next_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, *SIM, "--calibrators", "vanilla", "--count", "3", "--out", run)[0] == 0
    dead = _dead_pid()
    leftovers = [
        run / f".results.json.{dead}.abc123.tmp",
        run / "figures" / f".files.{dead}.x1.staging" / "confusion.png",
        run / "states" / f".vanilla.json.{dead}.q.tmp",
    ]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * 1000)
    alive = run / f".results.json.{os.getpid()}.live.tmp"  # a live writer's file is kept
    alive.write_text("x")
    foreign = run / ".report.md.k3j2h1g0.tmp"  # a name without a pid is not ours: kept
    foreign.write_text("x")
    code, err = cli(
        capsys, *SIM, "--calibrators", "vanilla", "--count", "3", "--out", run, "--resume"
    )
    assert code == 0, err
    assert not any(p.exists() for p in leftovers)
    assert not (run / "figures" / f".files.{dead}.x1.staging").exists()
    assert alive.exists() and foreign.exists()


def test_staging_folders_of_a_killed_shapes_build_are_cleaned(tmp_path, capsys):
    dead = _dead_pid()
    stale = tmp_path / f".R.{dead}.abcd.staging"
    (stale / "images").mkdir(parents=True)
    (stale / "images" / "000001.png").write_bytes(b"\0" * 4096)
    live = tmp_path / f".R.{os.getpid()}.live.staging"
    live.mkdir()
    foreign = tmp_path / ".R.backup"  # not our name pattern: kept
    foreign.mkdir()
    assert cli(capsys, *_shapes(tmp_path / "R", tmp_path / "b"))[0] == 0
    assert not stale.exists() and live.exists() and foreign.exists()


@pytest.mark.parametrize("command", ["lmms-eval-task", "lm-eval-task"])
@pytest.mark.parametrize("below", [False, True])
def test_a_task_writer_given_a_file_as_its_folder_says_so(tmp_path, capsys, command, below):
    """It said "File exists. Choose another output location or free space."."""
    bench = build_shapes_benchmark(tmp_path / "b", count=6, n=3)
    taken = tmp_path / "f.txt"
    taken.write_text("mine")
    out = taken / "sub" if below else taken
    code, err = cli(capsys, command, "--benchmark", bench, "--out", out, "--name", "t")
    expected = "a part of the path is a file, not a folder" if below else "a file stands where"
    assert code == 2 and expected in err and "free space" not in err, err
    assert taken.read_text() == "mine"


# -- 3. multi-file outputs appear together or not at all -------------------------------------


def test_build_on_a_full_disk_leaves_neither_file(tmp_path, capsys):
    root = tmp_path / "R"
    assert cli(capsys, *_shapes(root, tmp_path / "first"))[0] == 0  # images exist already
    sizes = {p.name: p.stat().st_size for p in (tmp_path / "first").iterdir() if p.is_file()}
    # a limit the benchmark file fits in but the manifest does not, and one neither fits in
    assert sizes["benchmark.jsonl"] < sizes["manifest.json"]
    for limit in (sizes["benchmark.jsonl"] + 10, sizes["benchmark.jsonl"] // 2):
        out = tmp_path / f"out{limit}"
        result = run_cli_with_file_size_limit(_shapes(root, out), limit)
        assert result.returncode == 2, result.stderr
        assert "cannot write" in result.stderr and "Traceback" not in result.stderr
        assert not (out / "benchmark.jsonl").exists() and not (out / "manifest.json").exists()
        assert [p.name for p in out.iterdir() if not p.name.startswith(".posdebias")] == []


def test_calibrate_on_a_full_disk_leaves_no_state_file(tmp_path, capsys):
    first = tmp_path / "first"
    assert cli(capsys, "calibrate", "--adapter", "synthetic", "--out", first)[0] == 0
    sizes = sorted(p.stat().st_size for p in first.glob("*.json"))
    assert len(sizes) == 4  # the calibrators that fit: pride and the three attention ones
    limit = sizes[0] + 10  # the smallest state fits, the largest does not
    assert limit < sizes[-1]
    out = tmp_path / "states"
    result = run_cli_with_file_size_limit(
        ["calibrate", "--adapter", "synthetic", "--out", out], limit
    )
    assert result.returncode == 2 and "cannot write" in result.stderr, result.stderr
    assert list(out.glob("*.json")) == []
    assert [p.name for p in out.iterdir() if not p.name.startswith(".posdebias")] == []


@pytest.mark.figures("png")
def test_report_on_a_corrupt_results_file_writes_nothing(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    with monkeypatch.context() as undone:  # the figures of the last report are what is read
        undone.setattr("posdebias.evaluation.report.REPORT_FIGURES", ())
        assert cli(capsys, *SIM, "--count", "5", "--orders", "2", "--out", run)[0] == 0
    good = json.loads((run / "results.json").read_text())
    shutil.rmtree(run / "figures")
    (run / "report.md").unlink()

    def confusion_3x3(payload):
        payload["calibrators"]["vanilla"]["metrics"]["confusion"] = [[1, 2, 3]] * 3

    def recall_short(payload):
        payload["calibrators"]["pride"]["metrics"]["recall_per_position"] = [50.0]

    def divergence_wrong(payload):
        payload["divergence"]["raw_attention"] = [[0.5]]

    def no_calibrators(payload):
        payload["calibrators"] = {}

    def accuracy_below_zero(payload):
        payload["calibrators"]["vanilla"]["metrics"]["accuracy_mean"] = -5.0

    def rstd_absurd(payload):  # its row blew the table past its width
        payload["calibrators"]["pride"]["metrics"]["rstd"] = 1e300

    def selection_over_100(payload):
        payload["calibrators"]["pride"]["metrics"]["selection_rate"][0] = 100.5

    def interval_absurd(payload):
        payload["statistics"]["rows"]["pride"]["accuracy"]["high"] = 1e300

    def p_value_over_1(payload):
        payload["statistics"]["comparisons"][0]["p_value"] = 3.0

    damages = (confusion_3x3, recall_short, divergence_wrong, no_calibrators, accuracy_below_zero,
               rstd_absurd, selection_over_100, interval_absurd, p_value_over_1, None)  # fmt: skip
    for damage in damages:
        payload = json.loads(json.dumps(good))
        if damage is None:
            text = json.dumps(payload)[:-40]  # truncated JSON
        else:
            damage(payload)
            text = json.dumps(payload)
        (run / "results.json").write_text(text)
        before = tree(run)
        code, err = cli(capsys, "report", run)
        assert code == 2 and "is not a valid posdebias results file" in err, err
        assert "nothing was written" in err
        assert tree(run) == before and not (run / "figures").exists()
    (run / "results.json").write_text(json.dumps(good))
    assert cli(capsys, "report", run)[0] == 0 and (run / "figures" / "confusion.png").exists()


# -- 3. an error found late never blocks the corrected command --------------------------------


def test_input_errors_are_found_before_the_run_directory_exists(tmp_path, capsys):
    corrupt = tmp_path / "broken.json"
    corrupt.write_text("{not json")
    empty = tmp_path / "empty-states"
    empty.mkdir()
    for args, message in (
        (["--calibration", corrupt], "is not valid JSON"),
        (["--calibration", empty], "holds no calibration state"),
        (["--calibration", tmp_path / "missing.json"], "does not exist"),
        (["--benchmark", tmp_path / "nope"], "does not exist"),
        (["--calibrators", "nope"], "unknown calibrator"),
    ):
        out = tmp_path / "run"
        code, err = cli(capsys, *SIM, "--count", "3", *args, "--out", out)
        assert code == 2 and message in err, err
        assert not out.exists()


@pytest.mark.parametrize("corrected", ["same configuration", "another configuration"])
def test_a_run_that_failed_before_its_first_record_can_be_started_again(
    tmp_path, capsys, corrected
):
    """A corrupt image is found by the forward pass, after the run directory exists: the
    corrected command then runs, with or without --resume, and nothing is deleted by hand."""
    from posdebias.testing import save_tiny_model

    model = save_tiny_model("llava", tmp_path / "model")
    bench = build_shapes_benchmark(tmp_path, count=8, n=3)
    root = Path(json.loads((bench / "manifest.json").read_text())["root"])
    images = sorted((root / "images").glob("*.png"))
    saved = {p: p.read_bytes() for p in images}
    for path in images:
        path.write_bytes(b"not a png")
    out = tmp_path / "run"
    args = ["evaluate", "--model", model, "--benchmark", bench, "--calibrators", "vanilla"]
    args += ["--orders", "1", "--calibration-count", "2", "--out", out]
    code, err = cli(capsys, *args)
    assert code == 2 and "cannot be read as an image" in err, err
    assert (
        (out / "run.json").exists() and not (out / "records.jsonl").stat().st_size
        if (out / "records.jsonl").exists()
        else True
    )
    for path, data in saved.items():
        path.write_bytes(data)
    if corrected == "another configuration":
        args = [*args, "--seed", "4"]
    code, err = cli(capsys, *args)
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["seed"] == (
        4 if "another" in corrected else 0
    )
    # a run with records is protected again
    code, err = cli(capsys, *args)
    assert code == 2 and "--resume" in err


def test_the_library_and_rank_compare_a_loaded_state_with_the_model(tmp_path, capsys):
    from posdebias.adapters.families.synthetic import SyntheticAdapter
    from posdebias.api import Debiaser
    from posdebias.errors import CalibrationError

    states = tmp_path / "states"
    assert cli(capsys, "calibrate", "--adapter", "synthetic", "--out", states)[0] == 0
    _edited_state(states, "pride", model_id="org/other-checkpoint")
    with pytest.raises(CalibrationError, match="fitted on model 'org/other-checkpoint'"):
        Debiaser.load(states / "pride.json", SyntheticAdapter())
    loaded = Debiaser.load(states / "pride.json", SyntheticAdapter(), transfer=True)
    assert loaded.state.model_id == "org/other-checkpoint"


@pytest.mark.parametrize(
    "failing",
    [
        # CLIP weights refused after the new shapes would have been generated
        ("--shapes-seed", "5", "--setting", "adversarial", "--clip-pretrained", "/no/such.pt"),
        # too few images for the instances asked (found after generation)
        ("--shapes-images", "3", "-N", "4", "--count", "6"),
    ],
)
def test_a_failed_build_never_replaces_the_shared_shapes_root(tmp_path, capsys, failing):
    """Data loss: a build with other shapes settings that then fails leaves the root that
    other benchmarks are built on as it was, and they still load."""
    root = tmp_path / "R"
    assert cli(capsys, *_shapes(root, tmp_path / "b1"))[0] == 0
    before = tree(root)
    code, err = cli(capsys, *_shapes(root, tmp_path / "b2", *failing))
    assert code == 2, err
    assert tree(root) == before and not (tmp_path / "b2").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".R.")] == []
    assert (
        cli(
            capsys, *SIM, "--benchmark", tmp_path / "b1", "--count", "2", "--calibration-count", "2"
        )[0]
        == 0
    )


def test_a_build_that_cannot_write_its_files_restores_the_shapes_root(tmp_path, capsys):
    """The benchmark folder is refused at the very end (another process holds it): the new
    shapes dataset swapped in for it is taken out again and the old one restored."""
    from posdebias._io import DirectoryLock

    root = tmp_path / "R"
    assert cli(capsys, *_shapes(root, tmp_path / "b1"))[0] == 0
    before = tree(root)
    (tmp_path / "b2").mkdir()
    with DirectoryLock(tmp_path / "b2"):
        code, err = cli(capsys, *_shapes(root, tmp_path / "b2", "--shapes-seed", "7"))
    assert code == 2 and "in use by another posdebias process" in err, err
    assert tree(root) == before and not (tmp_path / "b2" / "benchmark.jsonl").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".R.")] == []
    assert (
        cli(
            capsys, *SIM, "--benchmark", tmp_path / "b1", "--count", "2", "--calibration-count", "2"
        )[0]
        == 0
    )


def test_build_out_below_a_file_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "afile").write_text("mine")
    for out in (tmp_path / "afile" / "b", tmp_path / "afile"):
        code, err = cli(capsys, *_shapes(tmp_path / "R", out))
        assert code == 2 and ("cannot create output directory" in err or "is a file" in err), err
        assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize(
    ("made_by", "used_by"),
    [("pride", "attention_guided"), ("attention_guided", "vanilla,pride"), ("vanilla", "pride")],
)
def test_a_calibration_file_of_another_calibrator_is_refused(tmp_path, capsys, made_by, used_by):
    """Regression: never silently ignored (and a fresh state fitted in its place)."""
    states = tmp_path / "states"
    assert cli(capsys, "calibrate", "--adapter", "synthetic", "--calibrators", made_by,
               "--out", states)[0] == 0  # fmt: skip
    path = states / f"{made_by}.json"
    out = tmp_path / "run"
    code, err = cli(capsys, *SIM, "--calibration", path, "--calibrators", used_by,
                    "--count", "2", "--out", out)  # fmt: skip
    assert code == 2
    assert f"holds a state fitted by calibrator '{made_by}', but this run has no" in err
    assert not out.exists()


# -- calibrate and organism train write through the same run-directory layer ------------------

CAL = ("calibrate", "--adapter", "synthetic")


@pytest.mark.parametrize(
    "kind", ["foreign file", "state as a link", "marker-less subfolder", "a json of yours"]
)
def test_calibrate_out_that_is_not_a_folder_of_states_is_refused_before_any_fit(
    tmp_path, capsys, kind
):
    out = tmp_path / "states"
    out.mkdir()
    outside = tmp_path / "outside.json"
    outside.write_text("do not touch")
    if kind == "foreign file":
        (out / "notes.txt").write_text("mine")
        message = "is not empty and is not a folder of calibration states"
    elif kind == "state as a link":
        (out / "pride.json").symlink_to(outside)
        message = "symbolic link"
    elif kind == "a json of yours":
        (out / "pride.json").write_text('{"mine": true}')  # named like a state, not one
        message = "pride.json exists and is not a calibration state"
    else:
        (out / "sub").mkdir()
        message = "is not empty and is not a folder of calibration states"
    before, started = tree(tmp_path), time.perf_counter()
    code, err = cli(capsys, *CAL, "--out", out)
    assert code == 2 and message in err, err
    assert tree(tmp_path) == before and outside.read_text() == "do not touch"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        {"foreign file": ["notes.txt"], "marker-less subfolder": ["sub"]}.get(kind, ["pride.json"])
    )
    assert time.perf_counter() - started < 30


def test_calibrate_into_a_folder_in_use_is_refused_with_the_holders_pid(tmp_path, capsys):
    from posdebias._io import DirectoryLock

    out = tmp_path / "states"
    assert cli(capsys, *CAL, "--calibrators", "pride", "--out", out)[0] == 0
    before = tree(out)
    with DirectoryLock(out):  # another open file: flock refuses it even in this process
        code, err = cli(capsys, *CAL, "--calibrators", "pride", "--seed", "4", "--out", out)
    assert code == 2 and f"in use by another posdebias process (pid {os.getpid()})" in err
    assert tree(out) == before
    assert cli(capsys, *CAL, "--calibrators", "pride", "--seed", "4", "--out", out)[0] == 0
    assert tree(out) != before  # a folder of ours: the state was replaced


def test_calibrate_clears_a_killed_writers_leftovers_in_its_folder(tmp_path, capsys):
    out = tmp_path / "states"
    stale = out / f".files.{_dead_pid()}.x1.staging"
    stale.mkdir(parents=True)
    (stale / "pride.json").write_text("half")
    assert cli(capsys, *CAL, "--calibrators", "pride", "--out", out)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == [".posdebias.lock", "pride.json"]


@pytest.mark.parametrize("kind", ["trained model", "foreign file", "link", "file"])
def test_organism_train_refuses_an_out_it_would_write_over_before_training(tmp_path, capsys, kind):
    out = tmp_path / "model"
    outside = tmp_path / "outside"
    outside.write_text("do not touch")
    if kind == "file":
        out.write_text("mine")
    else:
        out.mkdir()
    if kind == "trained model":
        (out / "training.json").write_text("{}")
        (out / "model.safetensors").write_text("weights")
    elif kind == "foreign file":
        (out / "notes.txt").write_text("mine")
    elif kind == "link":
        (out / "config.json").symlink_to(outside)
    before, started = tree(tmp_path), time.perf_counter()
    code, err = cli(capsys, "organism", "train", "--out", out, "--steps", "1", "1", "1", "1")
    assert code == 2, err
    expected = {
        "trained model": "already holds a trained model",
        "foreign file": "is not empty and is not a model folder",
        "link": "symbolic link",
        "file": "is a file",
    }[kind]
    assert expected in err, err
    assert tree(tmp_path) == before and outside.read_text() == "do not touch"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert time.perf_counter() - started < 30  # refused before the training started


# -- a full disk before the lock is written -------------------------------------------------------


def _writing_commands(tmp_path: Path, capsys, out: Path) -> dict[str, list]:
    """Every command that writes a folder, each into its own folder under ``out``."""
    bench = build_shapes_benchmark(tmp_path / "inputs", count=6, n=2)
    capsys.readouterr()
    shapes = tmp_path / "inputs" / "shapes"
    sweep = ["sweep", "tau", "--values", "1", "--adapter", "synthetic", "--count", "2"]
    tasks = out / "l"
    return {
        "evaluate": [*SIM, "--count", "2", "--out", out / "e"],
        "sweep": [*sweep, "--calibrators", "attention_guided", "--out", out / "s"],
        "build": ["build", "--source", "shapes", "--root", shapes, "-N", "2", "--out", out / "b"],
        "calibrate": [*CAL, "--out", out / "c"],
        "calibrate one file": [*CAL, "--calibrators", "pride", "--out", out / "c.json"],
        "lmms-eval-task": ["lmms-eval-task", "--benchmark", bench, "--name", "t", "--out", tasks],
        "lm-eval-task": ["lm-eval-task", "--benchmark", bench, "--name", "t", "--out", out / "m"],
        "organism train": ["organism", "train", "--out", out / "o", "--steps", "1", "1", "1", "1"],
    }


def test_a_full_disk_before_the_lock_is_written_is_exit_2(tmp_path, capsys):
    """On a real full file system (a filled tmpfs): every command that writes a folder stops
    with exit 2 naming the disk, writes nothing elsewhere, and leaves no file of its own."""
    from helpers import full_file_system

    with full_file_system(tmp_path) as full:
        if full is None:
            pytest.skip("mounting a tmpfs needs root; the RLIMIT_FSIZE variant runs instead")
        commands = _writing_commands(tmp_path, capsys, full)
        inputs = tree(tmp_path / "inputs")
        for name, args in commands.items():
            code, err = cli(capsys, *args)
            assert code == 2 and "the disk is full" in err, (name, err)
            leftovers = [p for p in full.rglob("*") if p.is_file() and p.name != "filler"]
            assert {p.name for p in leftovers} <= {".posdebias.lock"}, (name, leftovers)
            assert all(p.stat().st_size == 0 for p in leftovers)
        assert tree(tmp_path / "inputs") == inputs


def test_a_file_size_limit_of_zero_before_the_lock_is_exit_2(tmp_path, capsys):
    """The same without a special file system: the kernel refuses every write (EFBIG)."""
    out = tmp_path / "out"
    commands = _writing_commands(tmp_path, capsys, out)
    inputs = tree(tmp_path / "inputs")
    for name in ("evaluate", "calibrate", "organism train"):
        result = run_cli_with_file_size_limit(commands[name], 0)
        assert result.returncode == 2, (name, result.stderr)
        assert "cannot write" in result.stderr and "refuses a larger file" in result.stderr
        assert "Traceback" not in result.stderr
        assert [p for p in out.rglob("*") if p.is_file() and p.stat().st_size] == []
    assert tree(tmp_path / "inputs") == inputs


@pytest.mark.slow
def test_a_disk_that_fills_while_the_trained_model_is_written_is_exit_2(tmp_path):
    """safetensors reports a full disk as its own error, not an OSError: still exit 2, and the
    half-written model is gone (the staging folder inside --out)."""
    from helpers import full_file_system
    from posdebias.errors import OutputError
    from posdebias.organism.train import TrainingPlan, train_organism

    with full_file_system(tmp_path, size="256k", fill=False) as small:
        if small is None:
            pytest.skip("mounting a tmpfs needs root")
        plan = TrainingPlan(  # one step of each of the four stages
            pool_size=24,
            batch_size=4,
            alignment_steps=1,
            retrieval_steps=1,
            confound_steps=1,
            bias_steps=1,
        )
        with pytest.raises(OutputError, match="cannot write the model to .*No space left"):
            train_organism(small / "model", plan, log=lambda line: None)
        assert [p.name for p in (small / "model").iterdir()] == [".posdebias.lock"]
        assert [p.name for p in small.iterdir()] == ["model"]


@pytest.mark.parametrize("name", ["report.md", "figures"])
def test_report_never_replaces_a_link_where_it_writes(tmp_path, capsys, name):
    run = tmp_path / "run"
    assert cli(capsys, *SIM, "--count", "5", "--orders", "2", "--out", run)[0] == 0
    target = tmp_path / "theirs"
    target.write_text("theirs\n")
    path = run / name
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(target)
    code, err = cli(capsys, "report", run)
    assert code == 2 and "is a symbolic link; posdebias does not write through links" in err
    assert path.is_symlink() and target.read_text() == "theirs\n"
