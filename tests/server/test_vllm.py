"""The ``openai`` adapter against a real vLLM (CPU build) serving a tiny random-weight Qwen2.

Equalities checked: label scores = the transformers forward of the same weights (float32, 1e-4,
multi-token labels at N = 12 included, both endpoints); an evaluation through the server = the
same evaluation through the transformers reference (same choices, scores to 1e-4); a server
killed mid-run, then ``--resume``, = an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from vllm_model import TransformersTextAdapter, reference_class

import posdebias
from helpers import build_shapes_benchmark
from posdebias.adapters.server import ServerAdapter
from posdebias.cli import main
from posdebias.core.instance import RetrievalInstance
from posdebias.errors import AdapterError
from posdebias.registry import get_registry
from posdebias.testing import write_test_images

# One server for the module: under pytest-xdist (`make test`: -n 2 --dist loadgroup) every test
# of this group runs in the same worker, so vLLM starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("vllm")

TOLERANCE = 1e-4
CALIBRATORS = "vanilla,pride,permutation_average"
SRC = Path(posdebias.__file__).resolve().parents[1]


def options(server, **extra):
    return {
        "base_url": server.base_url,
        "model": str(server.model),
        "images": "placeholder",
        "image_placeholder": "[image {name}]",
        **extra,
    }


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    files = write_test_images(tmp_path_factory.mktemp("images"), 12)
    return [
        RetrievalInstance(query="a red square", images=tuple(files[:4]), target=1, id="a"),
        RetrievalInstance(query="two blue circles", images=tuple(files[4:8]), target=3, id="b"),
        RetrievalInstance(query="a green line", images=tuple(files), target=10, id="c"),
    ]


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_label_scores_equal_the_transformers_forward(vllm_server, instances, endpoint):
    served = ServerAdapter(
        **options(vllm_server, endpoint=endpoint, tokenizer=str(vllm_server.model))
    )
    reference = TransformersTextAdapter(**options(vllm_server, tokenizer=str(vllm_server.model)))
    got = [o.label_logprobs for o in served.observe_many(instances)]
    want = [o.label_logprobs for o in reference.observe_many(instances)]
    gap = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
    print(f"{endpoint}: max |server - transformers| = {gap:.2e}")
    assert gap < TOLERANCE
    assert [len(g) for g in got] == [4, 4, 12]  # N = 12: labels "10".."12" are two tokens
    for row in got:
        assert abs(np.logaddexp.reduce(row)) < 1e-6  # normalised over the N labels


def test_chat_scores_at_n12_need_the_end_token(vllm_server, instances):
    served = ServerAdapter(**options(vllm_server))  # no tokenizer, no end_token
    with pytest.raises(AdapterError, match="set the adapter option end_token"):
        served.observe_many(instances[2:])
    served = ServerAdapter(**options(vllm_server, end_token="<|im_end|>"))
    reference = TransformersTextAdapter(**options(vllm_server, tokenizer=str(vllm_server.model)))
    gap = np.max(
        np.abs(
            served.observe(instances[2]).label_logprobs
            - reference.observe(instances[2]).label_logprobs
        )
    )
    assert gap < TOLERANCE


def test_top_logprobs_refuses_a_label_outside_the_top_k(vllm_server, instances):
    served = ServerAdapter(**options(vllm_server, scoring="top_logprobs", top_logprobs=2))
    with pytest.raises(AdapterError, match="is not among the top 2 log-probabilities"):
        served.observe_many(instances[:1])


def test_generated_baseline_runs_through_the_server(vllm_server, instances):
    from posdebias.adapters.hf.generation import GenerationSettings

    served = ServerAdapter(**options(vllm_server))
    settings = GenerationSettings(max_new_tokens=4, do_sample=True, num_samples=3)
    first = served.generate_many(instances[:2], settings, seeds=[5, 6])
    again = served.generate_many(instances[:2], settings, seeds=[5, 6], batch_size=2)
    assert [g.texts for g in first] == [g.texts for g in again]  # seeded per instance
    assert all(len(g.texts) == 3 and g.prompt_tokens > 0 for g in first)
    assert all(0 < g.generated_tokens <= 12 for g in first)


def write_config(path: Path, server, name: str = "openai", **extra) -> Path:
    adapter_options = options(server, **extra)
    if name == "openai":
        del adapter_options["model"]  # given by --model, as a user would
    path.write_text(json.dumps({"adapter": {"name": name, "options": adapter_options}}))
    return path


def evaluate_args(server, config: Path, bench: Path, out: Path) -> list[str]:
    return [
        "evaluate",
        "--config",
        str(config),
        "--adapter",
        "openai",
        "--base-url",
        server.base_url,
        "--model",
        str(server.model),
        "--benchmark",
        str(bench),
        "--calibrators",
        CALIBRATORS,
        "--count",
        "4",
        "--out",
        str(out),
    ]


def run_files(out: Path) -> tuple[list[dict], dict[str, np.ndarray], dict]:
    records = sorted(
        (json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()),
        key=lambda record: record["instance_id"],
    )
    for record in records:
        record.pop("fingerprints", None)
    observations = {}
    for line in (out / "observations.jsonl").read_text().splitlines():
        entry = json.loads(line)
        observations[entry["key"]] = np.array(entry["observation"]["label_logprobs"])
    results = json.loads((out / "results.json").read_text())
    metrics = {label: r.get("metrics") for label, r in results["calibrators"].items()}
    return records, observations, metrics


def assert_same_run(a: Path, b: Path) -> float:
    records_a, observations_a, metrics_a = run_files(a)
    records_b, observations_b, metrics_b = run_files(b)
    assert records_a == records_b  # the same choices for every instance, order and method
    assert observations_a.keys() == observations_b.keys()
    gap = max(float(np.max(np.abs(observations_a[k] - observations_b[k]))) for k in observations_a)
    assert gap < TOLERANCE
    assert metrics_a.keys() == metrics_b.keys() == set(CALIBRATORS.split(","))
    return gap


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return build_shapes_benchmark(tmp_path_factory.mktemp("bench"), count=9)


@pytest.fixture(scope="module")
def served_run(vllm_server, bench, tmp_path_factory):
    """One uninterrupted evaluation through the server (CLI, as a user runs it)."""
    folder = tmp_path_factory.mktemp("served")
    config = write_config(folder / "config.json", vllm_server)
    out = folder / "run"
    assert main(evaluate_args(vllm_server, config, bench, out)) == 0
    return out


def test_evaluation_through_the_server_equals_the_transformers_reference(
    vllm_server, bench, served_run, tmp_path
):
    class Reference:
        @posdebias.hookimpl
        def posdebias_register_adapters(self, register):
            register(reference_class())

    get_registry().add_plugin(Reference(), name="reference")
    config = write_config(
        tmp_path / "reference.json",
        vllm_server,
        "transformers_text",
        tokenizer=str(vllm_server.model),
    )
    out = tmp_path / "run"
    args = evaluate_args(vllm_server, config, bench, out)
    args[args.index("openai")] = "transformers_text"
    model_at = args.index("--model")
    del args[model_at : model_at + 2]
    base_at = args.index("--base-url")
    del args[base_at : base_at + 2]
    assert main(args) == 0
    gap = assert_same_run(served_run, out)
    print(f"evaluation: max |server - transformers| = {gap:.2e}")


def test_attention_calibrators_are_refused_before_any_request(vllm_server, bench, tmp_path, capsys):
    config = write_config(tmp_path / "config.json", vllm_server, base_url="http://127.0.0.1:9/v1")
    args = evaluate_args(vllm_server, config, bench, tmp_path / "run")
    args[args.index(CALIBRATORS)] = "vanilla,attention_guided"
    args[args.index("--base-url") + 1] = "http://127.0.0.1:9/v1"  # nothing listens there
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "'attention_guided' needs attention" in err
    assert "returns log-probabilities but no attention" in err
    assert not (tmp_path / "run").exists()


def test_server_killed_mid_run_then_resume_equals_an_uninterrupted_run(
    vllm_server, bench, served_run, tmp_path
):
    config = write_config(tmp_path / "config.json", vllm_server, concurrency=1, retries=2)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-m", "posdebias", *evaluate_args(vllm_server, config, bench, out)]
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log = out / "observations.jsonl"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and run.poll() is None:
            if log.is_file() and len(log.read_text().splitlines()) >= 6:
                break
            time.sleep(0.05)
        assert run.poll() is None, "the run finished before the server could be killed"
        vllm_server.kill()
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
        if vllm_server.process is None:
            vllm_server.start()
    assert run.returncode == 2, err.decode()
    assert b"did not answer after 3 attempts" in err
    assert not (out / "results.json").exists()
    assert main([*evaluate_args(vllm_server, config, bench, out), "--resume"]) == 0
    assert_same_run(served_run, out)


def test_text_multiple_choice_scores_equal_the_transformers_forward(vllm_server):
    from posdebias.core.instance import Instance

    questions = [
        ("Which shape has four equal sides?", ("a circle", "a square", "a line", "a dot")),
        ("What colour is the sky?", ("green", "red", "blue")),
    ]
    instances = [
        Instance(query=q, texts=texts, target=1, id=f"q{i}", task="multiple_choice")
        for i, (q, texts) in enumerate(questions)
    ]
    served = ServerAdapter(**options(vllm_server, label_set="upper", images="content"))
    reference = TransformersTextAdapter(
        **options(vllm_server, label_set="upper", tokenizer=str(vllm_server.model))
    )
    for got, want in zip(
        served.observe_many(instances), reference.observe_many(instances), strict=True
    ):
        assert np.max(np.abs(got.label_logprobs - want.label_logprobs)) < TOLERANCE
