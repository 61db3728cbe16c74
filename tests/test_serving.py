"""The Debiaser in a service: JSON rankings, async micro-batches, threads, several N."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from posdebias._threads import check_threads, default_threads, torch_threads
from posdebias.adapters.families.synthetic import SyntheticAdapter, synthetic_instances
from posdebias.api import Debiaser, Ranking
from posdebias.cli import main
from posdebias.core.instance import Instance
from posdebias.core.observation import Evidence, Prediction
from posdebias.errors import CalibrationError, InputError, ObservationError


class RecordingAdapter(SyntheticAdapter):
    """The simulated model, recording each forward batch's size, the thread count torch had
    during it, and refusing the query ``"boom"`` (a query the model cannot read)."""

    def __init__(self, *, delay: float = 0.0, **options):
        super().__init__(**options)
        self.batches: list[int] = []
        self.threads: list[int] = []
        self.delay = delay

    def observe_many(self, instances, *, batch_size=1):
        import torch

        self.batches.append(len(instances))
        self.threads.append(torch.get_num_threads())
        if any(instance.stem == "boom" for instance in instances):
            raise InputError("the model cannot read the query 'boom'")
        if self.delay:
            time.sleep(self.delay)
        return super().observe_many(instances, batch_size=batch_size)


def _plain(value) -> bool:
    """Only JSON's own Python types, all the way down (no numpy scalar or array)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


# -- JSON -------------------------------------------------------------------------------------


@pytest.mark.parametrize("explain", [False, True])
def test_a_ranking_round_trips_through_json(explain):
    debiaser = Debiaser(SyntheticAdapter(), ["attention_guided", "vanilla", "permutation_average"])
    debiaser.calibrate(synthetic_instances(5, 4, seed=1))
    instance = synthetic_instances(1, 4, seed=2)[0]
    ranking = next(debiaser.rank_many([instance], explain=explain))
    record = ranking.to_dict()
    assert _plain(record)
    text = json.dumps(record)
    back = Ranking.from_dict(json.loads(text))
    assert back.to_dict() == record
    assert json.dumps(back.to_dict()) == text
    assert back.images == tuple(instance.images) and back.target == instance.target
    assert record["choice"] == ranking.choice and record["order"] == ranking.order
    for label in ranking.calibrators:
        assert np.array_equal(back.of(label).scores, ranking.of(label).scores)  # bit for bit
        assert back.of(label).choice == ranking.of(label).choice
    if explain:
        evidence = back.evidence
        assert evidence is not None and evidence.layers == ranking.evidence.layers
        assert np.array_equal(evidence.posterior, ranking.evidence.posterior)
    else:
        assert back.evidence is None and record["predictions"]["vanilla"]["evidence"] is None


def test_text_candidates_and_in_memory_images_serialise():
    from PIL import Image

    debiaser = Debiaser(SyntheticAdapter(), "vanilla")
    ranking = debiaser.rank("Capital of France?", texts=["Rome", "Paris", "Madrid"])
    record = json.loads(json.dumps(ranking.to_dict()))
    assert record["texts"] == ["Rome", "Paris", "Madrid"] and record["images"] == [None] * 3
    assert Ranking.from_dict(record).best_text == ranking.best_text
    pictures = [Image.new("RGB", (4, 4), color) for color in ("red", "green")]
    ranking = debiaser.rank("a red square", pictures)
    record = ranking.to_dict()
    assert all(image.startswith("<Image@") for image in record["images"])  # no pixels in JSON
    json.dumps(record)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("predictions"), r"misses field\(s\) \['predictions'\]"),
        (lambda r: r.update(calibrator="pride"), "'pride' has no entry in its predictions"),
        (lambda r: r.update(target="2"), "target must be an int"),
        (lambda r: r["images"].pop(), "differ in length"),
        (lambda r: r.update(images="abcd"), "images must be a list, got str"),
        (lambda r: r["predictions"]["vanilla"].pop("scores"), r"misses field\(s\) \['scores'\]"),
        (lambda r: r["predictions"]["vanilla"].update(extra=1), r"unknown field\(s\) \['extra'\]"),
        (lambda r: r.update(extra=1), r"ranking record has unknown field\(s\) \['extra'\]"),
        (lambda r: r["predictions"]["vanilla"].update(choice=9), "choice 9 is out of range"),
        (lambda r: r["predictions"]["vanilla"].update(scores=["x"] * 4), "must be numeric"),
    ],
)
def test_a_damaged_ranking_record_is_refused_with_its_fault(change, message):
    ranking = Debiaser(SyntheticAdapter(), "vanilla").rank("q", ["a", "b", "c", "d"])
    record = ranking.to_dict()
    change(record)
    with pytest.raises(ObservationError, match=message):
        Ranking.from_dict(record)
    with pytest.raises(ObservationError, match="must be a JSON object"):
        Ranking.from_dict([record])


def test_prediction_and_evidence_round_trip_alone():
    evidence = Evidence(label_probabilities=[0.5, 0.5], layers=(1, 3))
    prediction = Prediction(scores=[-1.0, -0.5], evidence=evidence)
    back = Prediction.from_dict(json.loads(json.dumps(prediction.to_dict())))
    assert back.choice == 1 and np.array_equal(back.scores, prediction.scores)
    assert back.evidence.layers == (1, 3) and back.evidence.posterior is None


# -- async ------------------------------------------------------------------------------------


def _calibrated(adapter, **settings) -> Debiaser:
    debiaser = Debiaser(adapter, ["attention_guided", "permutation_average"], **settings)
    debiaser.calibrate(synthetic_instances(5, 4, seed=1))
    return debiaser


def test_concurrent_async_calls_are_answered_in_one_batch_equal_to_one_by_one():
    adapter = RecordingAdapter()
    debiaser = _calibrated(adapter, max_batch=64, max_wait=0.5)
    test = synthetic_instances(16, 4, seed=3)
    alone = [debiaser.rank(i.stem, i.images, explain=k % 2 == 0) for k, i in enumerate(test)]
    adapter.batches.clear()

    async def serve():
        calls = [debiaser.arank(i.stem, i.images, explain=k % 2 == 0) for k, i in enumerate(test)]
        return await asyncio.gather(*calls)

    together = asyncio.run(serve())
    # one forward for the 16 queries: each query's 4 rotations (the first is the query itself)
    assert adapter.batches == [16 * 4]
    assert [r.to_dict() for r in together] == [r.to_dict() for r in alone]


def test_micro_batches_are_bounded_in_size_and_a_lone_query_does_not_wait_for_company():
    adapter = RecordingAdapter()
    debiaser = Debiaser(adapter, "vanilla", max_batch=4, max_wait=0.5)
    test = synthetic_instances(10, 4, seed=3)

    async def serve():
        return await debiaser.arank_many(test)

    rankings = asyncio.run(serve())
    assert adapter.batches == [4, 4, 2]  # at most max_batch per forward, in arrival order
    assert [r.id for r in rankings] == [i.id for i in test]
    adapter.batches.clear()
    debiaser = Debiaser(adapter, "vanilla", max_batch=4, max_wait=0.0)

    async def one():
        return await debiaser.arank(test[0].stem, test[0].images)

    assert asyncio.run(one()).order == rankings[0].order and adapter.batches == [1]


def test_a_bad_query_fails_only_its_own_call():
    adapter = RecordingAdapter()
    debiaser = _calibrated(adapter, max_batch=8, max_wait=0.5)
    good = synthetic_instances(3, 4, seed=4)

    async def serve():
        calls = [debiaser.arank(i.stem, i.images) for i in good]
        calls.insert(1, debiaser.arank("boom", good[0].images))
        calls.append(debiaser.arank("q", ["a", "b", "c"]))  # N=3: no calibration for it
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(serve())
    assert isinstance(answers[1], InputError) and "'boom'" in str(answers[1])
    assert isinstance(answers[4], CalibrationError) and "fitted for N=4" in str(answers[4])
    for answer, instance in zip([answers[0], *answers[2:4]], good, strict=True):
        assert isinstance(answer, Ranking)
        assert answer.to_dict() == debiaser.rank(instance.stem, instance.images).to_dict()


def test_the_event_loop_keeps_running_while_the_model_works():
    debiaser = Debiaser(RecordingAdapter(delay=0.3), "vanilla", max_wait=0.0)
    ticks = []

    async def serve():
        async def ticker():
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = len(ticks)
        ranking = await debiaser.arank("q", ["a", "b", "c", "d"])
        task.cancel()
        return ranking, len(ticks) - before

    ranking, during = asyncio.run(serve())
    assert ranking.choice in range(4)
    assert during >= 5  # the loop ticked through the 0.3 s forward (a blocked loop: 0)


def test_one_debiaser_serves_several_event_loops_and_threads():
    debiaser = _calibrated(SyntheticAdapter(), max_wait=0.01)
    test = synthetic_instances(8, 4, seed=5)
    expected = [r.to_dict() for r in debiaser.rank_many(test)]

    def in_a_loop(instances):
        return asyncio.run(debiaser.arank_many(instances))

    with ThreadPoolExecutor(4) as pool:
        loops = [pool.submit(in_a_loop, test[k::2]) for k in range(2)]
        synced = [pool.submit(lambda i: next(debiaser.rank_many([i])), i) for i in test]
        got = [f.result().to_dict() for f in synced]
        halves = [[r.to_dict() for r in f.result()] for f in loops]
    assert got == expected
    assert halves[0] == expected[0::2] and halves[1] == expected[1::2]


def test_settings_of_the_async_path_are_checked():
    for settings, message in (
        ({"max_batch": 0}, "batch_size must be a whole number from 1"),
        ({"max_wait": -1}, "max_wait must be a number of seconds from 0 to 1.0, got -1"),
        ({"max_wait": "soon"}, "max_wait must be a number of seconds"),
        ({"threads": 0}, "threads must be a whole number from 1"),
    ):
        with pytest.raises(InputError, match=message):
            Debiaser(SyntheticAdapter(), "vanilla", **settings)


# -- threads ----------------------------------------------------------------------------------


def test_the_debiaser_runs_torch_on_its_threads_and_restores_them(torch_threads_elsewhere):
    import torch

    before = torch_threads_elsewhere
    adapter = RecordingAdapter()
    Debiaser(adapter, "vanilla", threads=1).rank("q", ["a", "b", "c", "d"])
    Debiaser(adapter, "vanilla").rank("q", ["a", "b", "c", "d"])
    assert adapter.threads == [1, default_threads()]
    assert torch.get_num_threads() == before
    with torch_threads(1, user=True):  # a count the user chose holds over the default
        Debiaser(adapter, "vanilla").rank("q", ["a", "b", "c", "d"])
    assert adapter.threads[-1] == 1 and torch.get_num_threads() == before


def test_a_count_the_user_chose_holds_over_a_presets_and_the_default(torch_threads_elsewhere):
    from posdebias._threads import available_cpus
    from posdebias.evaluation.config import EvaluateConfig
    from posdebias.evaluation.preset import Preset, ResolvedConfig

    preset = ResolvedConfig(EvaluateConfig(), Preset(model="m", threads=1))
    with preset.threads() as count:
        assert count == 1
    with ResolvedConfig(EvaluateConfig()).threads() as count:
        assert count == default_threads()
    for chosen in {1, available_cpus()}:
        plain = ResolvedConfig(EvaluateConfig())
        with torch_threads(chosen, user=True), preset.threads() as count, plain.threads() as other:
            assert count == other == chosen


def test_default_threads_leave_room_on_a_shared_machine(monkeypatch):
    from posdebias._threads import available_cpus

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert default_threads() == max(1, available_cpus() // 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    assert default_threads() == max(1, available_cpus() // 2)
    with pytest.raises(InputError, match="threads must be a whole number from 1 to"):
        check_threads(available_cpus() + 1)


@pytest.mark.parametrize(
    "command",
    [
        ["evaluate", "--adapter", "synthetic", "--out", "run"],
        ["calibrate", "--adapter", "synthetic", "--out", "states.json"],
        ["rank", "--calibration", "states.json", "--adapter", "synthetic", "q", "a", "b"],
        ["sweep", "n", "--adapter", "synthetic", "--out", "sweep"],
        ["check", "--adapter", "synthetic"],
    ],
    ids=lambda command: command[0],
)
@pytest.mark.parametrize("threads", ["0", "100000"])
def test_commands_that_run_a_model_refuse_a_bad_thread_count(
    command, threads, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--threads", threads]) == 2
    err = capsys.readouterr().err
    assert "--threads must be a whole number from 1 to" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_threads_flag_sets_torch_threads_for_the_run(
    tmp_path, capsys, monkeypatch, torch_threads_elsewhere
):
    import torch

    seen = []
    original = SyntheticAdapter.observe_many

    def observe_many(self, instances, *, batch_size=1):
        seen.append(torch.get_num_threads())
        return original(self, instances, batch_size=batch_size)

    monkeypatch.setattr(SyntheticAdapter, "observe_many", observe_many)
    before = torch_threads_elsewhere
    assert main(["evaluate", "--adapter", "synthetic", "--count", "3", "--threads", "1"]) == 0
    assert seen and set(seen) == {1} and torch.get_num_threads() == before


# -- several N --------------------------------------------------------------------------------


def test_one_calibration_serves_several_n_and_names_them_for_another(tmp_path):
    debiaser = Debiaser(SyntheticAdapter(), ["attention_guided", "vanilla"])
    state = debiaser.calibrate(
        [*synthetic_instances(5, 4, seed=1), *synthetic_instances(5, 3, seed=2, prefix="three")]
    )
    assert state.n == 4 and debiaser.calibrated_n == [3, 4]
    assert debiaser.states_for(3)["attention_guided"].n == 3
    three, four = synthetic_instances(1, 3, seed=7)[0], synthetic_instances(1, 4, seed=7)[0]
    rankings = [debiaser.rank(i.stem, i.images) for i in (three, four)]
    assert [len(r.probabilities) for r in rankings] == [3, 4]
    with pytest.raises(CalibrationError, match=r"fitted for N=3, N=4 candidates, but this query "):
        debiaser.rank("q", ["a", "b", "c", "d", "e"])
    folder = debiaser.save(tmp_path / "states")
    assert sorted(p.name for p in folder.iterdir()) == [
        "attention_guided.n3.json",
        "attention_guided.n4.json",
        "vanilla.n3.json",
        "vanilla.n4.json",
    ]
    loaded = Debiaser.load(folder, SyntheticAdapter())
    assert loaded.calibrated_n == [3, 4] and list(loaded.calibrators) == [
        "attention_guided",
        "vanilla",
    ]
    for instance, ranking in zip((three, four), rankings, strict=True):
        assert loaded.rank(instance.stem, instance.images).to_dict() == ranking.to_dict()


def test_calibrators_that_need_no_fit_serve_any_n():
    debiaser = Debiaser(SyntheticAdapter(), ["vanilla", "permutation_average"])
    for n in (2, 3, 6):
        assert len(debiaser.rank("q", [f"i{k}" for k in range(n)]).probabilities) == n


def test_instances_of_several_tasks_rank_in_one_async_batch():
    adapter = RecordingAdapter()
    debiaser = Debiaser(adapter, "vanilla", max_wait=0.5)
    mcq = Instance("Capital?", texts=("Rome", "Paris", "Oslo"), id="m", task="multiple_choice")

    async def serve():
        return await asyncio.gather(
            debiaser.arank("q", ["a", "b", "c", "d"]),
            debiaser.arank(mcq.stem, texts=list(mcq.texts)),
        )

    retrieval, options = asyncio.run(serve())
    assert adapter.batches == [2] and options.texts == mcq.texts and len(retrieval.order) == 4


def test_ranking_from_threads_equals_sequential_on_a_real_model():
    """The organism (a real small LLaVA) answered from 8 threads at once, as a sync endpoint
    of a web framework would: the answers are the sequential ones, exactly."""
    import posdebias
    from posdebias.benchmarks import load_benchmark
    from posdebias.organism import bundled_benchmark

    adapter = posdebias.load_adapter("posdebias/organism")
    items = load_benchmark(bundled_benchmark(4)).instances
    debiaser = Debiaser(adapter, ["attention_guided", "vanilla"], threads=1)
    debiaser.calibrate(items[:5])
    test = items[5:21]
    sequential = [debiaser.rank(i.stem, list(i.images)).to_dict() for i in test]
    barrier = threading.Barrier(8)

    def rank(instance):
        if instance.id in {t.id for t in test[:8]}:
            barrier.wait(timeout=60)
        return debiaser.rank(instance.stem, list(instance.images)).to_dict()

    with ThreadPoolExecutor(8) as pool:
        concurrent = list(pool.map(rank, test))
    assert concurrent == sequential


# -- the web service of docs/api.md, under a real server -------------------------------------


def _service_example() -> str:
    from test_doc_examples import EXAMPLES

    (example,) = [e for e in EXAMPLES if e.marker == "service"]
    assert example.page == "docs/api.md"
    return example.body


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_fastapi_example_answers_concurrent_requests_as_sequential_ones(tmp_path):
    """docs/api.md's service under uvicorn on 127.0.0.1, asked by a real HTTP client: 16
    concurrent requests get the answers of 16 sequential ones; a refused query is a 400 with
    the reason; the server is stopped by the test."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    from posdebias.benchmarks import load_benchmark
    from posdebias.organism import bundled_benchmark

    (tmp_path / "app.py").write_text(_service_example(), encoding="utf-8")
    port = _free_port()
    source = str(Path(__file__).parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": source, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    items = load_benchmark(bundled_benchmark(4)).instances[5:21]
    bodies = [{"query": i.stem, "images": [str(p) for p in i.images]} for i in items]
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(f"{base}/health", timeout=2).json() == {"ok": True}:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=60) as client:
            sequential = [client.post("/rank", json=body).json() for body in bodies]

        async def concurrently():
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                answers = await asyncio.gather(*(client.post("/rank", json=b) for b in bodies))
                return [answer.json() for answer in answers]

        together = asyncio.run(concurrently())
        with httpx.Client(base_url=base, timeout=60) as client:
            refused = client.post("/rank", json={"query": "q", "images": ["a.png", "b.png"]})
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert len(together) == len(sequential) == 16
    for alone, batched, item in zip(sequential, together, bodies, strict=True):
        assert batched["images"] == alone["images"] == item["images"]
        for key in ("id", "query", "calibrator", "choice", "order", "texts", "target"):
            assert batched[key] == alone[key], key
        for label, prediction in alone["predictions"].items():
            other = batched["predictions"][label]
            assert other["choice"] == prediction["choice"]
            assert other["ranking"] == prediction["ranking"]
            assert np.allclose(other["scores"], prediction["scores"], rtol=0, atol=1e-5)
        assert Ranking.from_dict(batched).to_dict() == batched
    assert refused.status_code == 400
    assert "fitted for N=4 candidates, but this query has N=2" in refused.json()["error"]
    assert server.returncode is not None
