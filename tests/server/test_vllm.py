"""The ``openai`` adapter against a real vLLM (CPU build) serving a tiny random-weight Qwen3,
compared with posdebias' own ``qwen3`` adapter (Hugging Face) on the same weights.

Equalities checked: label scores through the server = the qwen3 adapter's (float32, 1e-4; text
multiple choice at N = 3, 4 and 12, where labels "10".."12" are two tokens; both endpoints), and
so are the cloze scores of every option (each option's text as the reply to the question); the
retrieval prompt with images as placeholder text = the transformers forward; ``posdebias evaluate
--adapter openai --base-url URL --model NAME`` on an MMLU-format benchmark = ``posdebias evaluate
--model FOLDER`` (the same choice of every calibrator and of the greedy generated baseline for
every instance and order, scores to 1e-4, the same Acc / RStd / Cons in results.json); a server
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
from vllm_model import transformers_scores

import posdebias
from posdebias.adapters.server import ServerAdapter
from posdebias.cli import main
from posdebias.core.instance import Instance
from posdebias.errors import AdapterError
from posdebias.testing import write_test_images

# One server for the module: under pytest-xdist (`make test`: -n 2 --dist loadgroup) every test
# of this group runs in the same worker, so vLLM starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("vllm")

TOLERANCE = 1e-4
CALIBRATORS = "vanilla,pride,permutation_average,contextual,batch"  # every one without attention
DECODERS = "generated"  # greedy: deterministic on both engines
SRC = Path(posdebias.__file__).resolve().parents[1]

#: An MMLU subject file each (the dataset's CSV layout: question, four options, answer letter).
MMLU = {
    "shapes_test.csv": """\
Which shape has four equal sides?,a circle,a square,a line,a dot,B
What colour is the clear sky at noon?,green,red,blue,black,C
"How many legs does a spider have, counting all of them?",six,eight,four,ten,B
Which of these is a prime number?,four,six,nine,seven,D
What is frozen water called?,ice,steam,sand,glass,A
Which planet is closest to the sun?,Venus,Mercury,Earth,Mars,B
""",
    "facts_test.csv": """\
How many days are in a week?,five,six,seven,eight,C
What is the opposite of hot?,cold,warm,wet,dry,A
Which month comes after May?,April,June,July,March,B
What do you use to write on paper?,a spoon,a pen,a cup,a plate,B
What do bees make?,milk,silk,honey,wool,C
Which animal barks?,a cat,a dog,a cow,a fish,B
""",
}


def served(server, **options) -> ServerAdapter:
    return ServerAdapter(base_url=server.base_url, model=str(server.model), **options)


@pytest.fixture(scope="module")
def hf_adapters(vllm_server):
    """posdebias' own qwen3 adapter on the served folder, one per label set."""
    loaded: dict[str, object] = {}

    def get(label_set: str):
        if label_set not in loaded:
            loaded[label_set] = posdebias.load_adapter(str(vllm_server.model), label_set=label_set)
        return loaded[label_set]

    return get


@pytest.fixture(scope="module")
def questions():
    """Text multiple choice at N = 4, 3 and 12 (labels "10".."12": two tokens each)."""
    return [
        Instance(
            stem="Which shape has four equal sides?",
            texts=("a circle", "a square", "a line", "a dot"),
            target=1,
            id="square",
            task="multiple_choice",
        ),
        Instance(
            stem="What colour is the sky?",
            texts=("green", "red", "blue"),
            target=2,
            id="sky",
            task="multiple_choice",
        ),
        Instance(
            stem="Which month is the seventh?",
            texts=tuple(f"month {k}" for k in range(1, 13)),
            target=6,
            id="month",
            task="multiple_choice",
        ),
    ]


def max_gap(got, want) -> float:
    return max(
        float(np.max(np.abs(g.label_logprobs - w.label_logprobs)))
        for g, w in zip(got, want, strict=True)
    )


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_cloze_scores_equal_the_hf_adapter(vllm_server, hf_adapters, questions, endpoint):
    from posdebias.adapters import ReplyRequest

    server = served(vllm_server, endpoint=endpoint, tokenizer=str(vllm_server.model))
    requests = [
        ReplyRequest(message=q.stem, reply=text, source=q.id)
        for q in questions
        for text in q.texts
        if text is not None
    ]
    got = server.score_replies(requests)
    want = hf_adapters("upper").score_replies(requests, batch_size=4)
    assert [g.tokens for g in got] == [w.tokens for w in want]
    gap = max(abs(g.logprob - w.logprob) for g, w in zip(got, want, strict=True))
    assert gap < TOLERANCE, gap


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_label_scores_equal_the_hf_adapter(vllm_server, hf_adapters, questions, endpoint):
    server = served(
        vllm_server, endpoint=endpoint, tokenizer=str(vllm_server.model), label_set="digits"
    )
    got = server.observe_many(questions)
    gap = max_gap(got, hf_adapters("digits").observe_many(questions))
    print(f"{endpoint}: max |server - qwen3 adapter| = {gap:.2e}")
    assert gap < TOLERANCE
    assert [len(o.label_logprobs) for o in got] == [4, 3, 12]
    for observation in got:
        assert abs(np.logaddexp.reduce(observation.label_logprobs)) < 1e-6  # over the N labels


@pytest.mark.parametrize(("endpoint", "tie"), [("chat", "C"), ("completions", "T")])
def test_a_judges_tie_label_scores_as_on_the_hf_adapter(vllm_server, endpoint, tie):
    """The tie label is scored as a third label through the server: the two answers'
    log-probabilities and the tie label's three-way log-probability equal the local adapter's."""
    pairs = [
        Instance(
            stem="Which reply answers 'What is two plus two?' better?",
            texts=(first, second),
            target=target,
            id=f"pair{k}",
            task="pairwise_judge",
        )
        for k, (first, second, target) in enumerate(
            [("Four.", "Five.", 0), ("It is 22.", "The sum is 4.", 1)]
        )
    ]
    pairs += [pair.permuted([1, 0]) for pair in pairs]
    options = {"task_prompt": {"tie_label": tie}}
    server = served(vllm_server, endpoint=endpoint, tokenizer=str(vllm_server.model), **options)
    local = posdebias.load_adapter(str(vllm_server.model), label_set="upper", **options)
    got, want = server.observe_many(pairs), local.observe_many(pairs)
    assert max_gap(got, want) < TOLERANCE
    for g, w in zip(got, want, strict=True):
        assert g.tie_logprob is not None and w.tie_logprob is not None
        assert abs(g.tie_logprob - w.tie_logprob) < TOLERANCE
        assert g.tie_logprob < 0 and abs(np.logaddexp.reduce(g.label_logprobs)) < 1e-6
    # without the option, the same pairs carry no tie score, as before
    assert all(o.tie_logprob is None for o in served(vllm_server).observe_many(pairs[:1]))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_retrieval_with_placeholder_images_equals_the_transformers_forward(
    vllm_server, tmp_path, endpoint
):
    files = write_test_images(tmp_path, 12)
    instances = [
        Instance(stem="a red square", images=tuple(files[:4]), target=1, id="a"),
        Instance(stem="a green line", images=tuple(files), target=10, id="c"),
    ]
    server = served(
        vllm_server,
        endpoint=endpoint,
        tokenizer=str(vllm_server.model),
        images="placeholder",
        image_placeholder="[image {name}]",
    )
    got = [o.label_logprobs for o in server.observe_many(instances)]
    want = transformers_scores(server, vllm_server.model, instances)
    gap = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))
    print(f"{endpoint}: max |server - transformers| = {gap:.2e}")
    assert gap < TOLERANCE


def test_chat_scores_at_n12_need_the_end_token(vllm_server, hf_adapters, questions):
    month = questions[2:]
    with pytest.raises(AdapterError, match="set the adapter option end_token"):
        served(vllm_server, label_set="digits").observe_many(month)  # no tokenizer, no end_token
    server = served(vllm_server, label_set="digits", end_token="<|im_end|>")
    assert max_gap(server.observe_many(month), hf_adapters("digits").observe_many(month)) < (
        TOLERANCE
    )


def test_top_logprobs_refuses_a_label_outside_the_top_k(vllm_server, questions):
    server = served(vllm_server, label_set="upper", scoring="top_logprobs", top_logprobs=2)
    with pytest.raises(AdapterError, match="is not among the top 2 log-probabilities"):
        server.observe_many(questions[:1])


def test_sampled_generations_through_the_server_are_seeded_per_instance(vllm_server, questions):
    from posdebias.adapters.hf.generation import GenerationSettings

    server = served(vllm_server, label_set="upper")
    settings = GenerationSettings(max_new_tokens=4, do_sample=True, num_samples=3)
    first = server.generate_many(questions[:2], settings, seeds=[5, 6])
    again = server.generate_many(questions[:2], settings, seeds=[5, 6], batch_size=2)
    assert [g.texts for g in first] == [g.texts for g in again]
    assert all(len(g.texts) == 3 and g.prompt_tokens > 0 for g in first)
    assert all(0 < g.generated_tokens <= 12 for g in first)


# -- whole evaluations through the command line ---------------------------------------------


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """A multiple-choice benchmark built from MMLU-format CSV files."""
    folder = tmp_path_factory.mktemp("mmlu")
    for name, text in MMLU.items():
        (folder / name).write_text(text)
    out = folder / "bench"
    args = ["build", "--task", "multiple_choice", "--source", "mmlu", "--data", str(folder)]
    assert main([*args, "--out", str(out)]) == 0
    return out


def evaluate_args(server, bench: Path, out: Path, *, config: Path | None = None) -> list[str]:
    """The command a user runs against a server (``config``: extra adapter options)."""
    args = ["evaluate", "--adapter", "openai", "--base-url", server.base_url]
    args += ["--model", str(server.model), *common_args(bench, out)]
    return [*args, "--config", str(config)] if config else args


def common_args(bench: Path, out: Path) -> list[str]:
    return [
        "--benchmark", str(bench), "--calibrators", CALIBRATORS, "--decoders", DECODERS,
        "--count", "4", "--calibration-count", "2", "--orders", "2", "--out", str(out),
    ]  # fmt: skip


def run_files(out: Path) -> tuple[list[dict], dict[str, np.ndarray], dict, dict]:
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
    generations = {}
    for line in (out / "generations.jsonl").read_text().splitlines():
        entry = json.loads(line)
        decision = entry["decision"]
        # The toy tokenizer has no decoder: vLLM's incremental detokeniser and transformers'
        # decode put different spaces between the same tokens.
        texts = [" ".join(text.split()) for text in decision["texts"]]
        generations[entry["key"]] = (decision["choice"], decision["answers"], texts)
    results = json.loads((out / "results.json").read_text())
    metrics = {label: r["metrics"] for label, r in results["calibrators"].items()}
    return records, observations, generations, metrics


def assert_same_run(a: Path, b: Path) -> float:
    records_a, observations_a, generations_a, metrics_a = run_files(a)
    records_b, observations_b, generations_b, metrics_b = run_files(b)
    assert records_a == records_b  # the same choice for every instance, order and row
    assert observations_a.keys() == observations_b.keys()
    gap = max(float(np.max(np.abs(observations_a[k] - observations_b[k]))) for k in observations_a)
    assert gap < TOLERANCE
    assert generations_a == generations_b and generations_a
    assert metrics_a.keys() == {*CALIBRATORS.split(","), *DECODERS.split(",")}
    assert metrics_a == metrics_b  # Acc, RStd, Cons, intervals, confusion: all of them
    return gap


@pytest.fixture(scope="module")
def served_run(vllm_server, bench, tmp_path_factory):
    """One uninterrupted evaluation through the server, as a user runs it."""
    out = tmp_path_factory.mktemp("served") / "run"
    assert main(evaluate_args(vllm_server, bench, out)) == 0
    return out


def test_evaluation_through_the_server_equals_the_hf_adapter(
    vllm_server, bench, served_run, tmp_path
):
    out = tmp_path / "run"
    assert main(["evaluate", "--model", str(vllm_server.model), *common_args(bench, out)]) == 0
    adapters = [json.loads((r / "results.json").read_text())["adapter"] for r in (served_run, out)]
    assert [a["adapter"] for a in adapters] == ["openai", "qwen3"]
    assert adapters[0]["labels"] == adapters[1]["labels"] == ["A", "B", "C", "D"]
    assert adapters[0]["prompt_hash"] == adapters[1]["prompt_hash"]
    assert not [key for a in adapters for key in a if "image" in key]  # a text run's records
    gap = assert_same_run(served_run, out)
    print(f"evaluation: max |server - qwen3 adapter| = {gap:.2e}")


def test_attention_calibrators_are_refused_before_any_request(vllm_server, bench, tmp_path, capsys):
    args = evaluate_args(vllm_server, bench, tmp_path / "run")
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
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"adapter": {"options": {"concurrency": 1, "retries": 2}}}))
    out = tmp_path / "run"
    args = evaluate_args(vllm_server, bench, out, config=config)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    command = [sys.executable, "-m", "posdebias", *args]
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
    assert main([*args, "--resume"]) == 0
    assert_same_run(served_run, out)
