"""Helpers of the harness tests: lmms-eval (required in CI), a shapes benchmark the organism
was not trained on, and an lmms-eval command line that never reaches the network."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: `make test` installs the [lmms-eval] extra: in CI a missing lmms-eval is a failure, not a skip.
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
HAS_LMMS_EVAL = importlib.util.find_spec("lmms_eval") is not None
HARNESSES_PAGE = Path(__file__).parents[2] / "docs" / "harnesses.md"

#: The Done-means comparison of both harnesses: the bundled organism's 40 test items rotated 4
#: ways, as a generated-answer and a multiple-choice group, with these calibrator rows.
CALIBRATORS = ("vanilla", "attention_guided")
GROUPS = {"shapes_gen": "generate_until", "shapes_mc": "multiple_choice"}
ORGANISM_ARGS = (
    "pretrained=posdebias/organism,calibrators=vanilla+attention_guided,calibration=task"
)


def page_blocks(page: Path = HARNESSES_PAGE) -> list[tuple[str, str, str]]:
    """(marker, language, body) of every fenced block of ``page``, so tests run what it shows."""
    pattern = re.compile(
        r"^(?:<!-- example: (?P<marker>[^\n]*?) -->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```",
        re.S | re.M,
    )
    text = page.read_text(encoding="utf-8")
    return [(m["marker"] or "", m["lang"], m["body"]) for m in pattern.finditer(text)]


def require_lmms_eval() -> None:
    """Skip without lmms-eval on a developer machine; fail loudly in CI."""
    if HAS_LMMS_EVAL:
        return
    message = "lmms-eval is not installed: pip install -e '.[lmms-eval]' (make test does)"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def build_organism_benchmark(out: Path, *, count: int, seed: int = 0) -> Path:
    """A random N=4 shapes benchmark in the organism's shape space (new images, seed 7)."""
    from posdebias.benchmarks.build import build_benchmark
    from posdebias.benchmarks.config import BuildConfig, ShapesSource
    from posdebias.organism.build import IMAGE_SIZE, shape_space

    build_benchmark(
        BuildConfig(
            source=ShapesSource(
                root=out / "pool",
                images=max(3 * count, 40),
                seed=7,
                image_size=IMAGE_SIZE,
                space=shape_space(),
            ),
            out=out / "bench",
            setting="random",
            n=4,
            count=count,
            seed=seed,
        )
    )
    return out / "bench"


def write_task_module(benchmark: Path, out: Path, name: str, *flags: str) -> Any:
    """``posdebias lmms-eval-task`` for ``benchmark`` into ``out`` as task ``name``, then its
    written module imported as lmms-eval imports it (its folder on the path)."""
    from posdebias.cli import main

    args = ["lmms-eval-task", "--benchmark", str(benchmark), "--out", str(out), "--name", name]
    assert main([*args, *flags]) == 0
    spec = importlib.util.spec_from_file_location(f"{name}_posdebias", out / f"{name}_posdebias.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(out))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(out))
    return module


def offline_env(tmp: Path) -> dict[str, str]:
    """The environment of an lmms-eval run: no network, caches and temporary files inside
    ``tmp`` (accelerate's torchelastic folders too), one thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "POSDEBIAS_"))}
    env.update(
        HF_HOME=str(tmp / "hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        POSDEBIAS_CACHE_DIR=str(tmp / "posdebias-cache"),
        TMPDIR=str(tmp),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_MODE="disabled",
        PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
    )
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_lmms_eval(
    tmp: Path, model_args: str, tasks: str, include: Path, *, processes: int = 1
) -> dict:
    """``lmms-eval --model posdebias`` as a user runs it; returns the results JSON and the
    sample records per task (``samples``)."""
    out = tmp / "out"
    args = [
        "--model",
        "posdebias",
        "--model_args",
        model_args,
        "--tasks",
        tasks,
        "--include_path",
        str(include),
        "--batch_size",
        "16",
        "--output_path",
        str(out),
        "--log_samples",
        "--verbosity",
        "WARNING",
    ]
    if processes == 1:
        command = [str(Path(sys.executable).parent / "lmms-eval"), *args]
    else:
        command = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--cpu",
            "--num_processes",
            str(processes),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(free_port()),
            "-m",
            "lmms_eval",
            *args,
        ]
    done = subprocess.run(
        command, env=offline_env(tmp), capture_output=True, text=True, timeout=900, cwd=tmp
    )
    found = list(out.rglob("*_results.json"))
    # lmms-eval 0.7.3 logs an evaluation error and still exits 0: no results file then
    assert done.returncode == 0 and len(found) == 1, done.stdout[-4000:] + done.stderr[-4000:]
    (results_file,) = found
    results = json.loads(results_file.read_text())
    samples = {}
    for file in out.rglob("*_samples_*.jsonl"):
        task = file.stem.split("_samples_", 1)[1]
        samples[task] = [json.loads(line) for line in file.read_text().splitlines() if line]
    results["samples_by_task"] = samples
    results["stdout"] = done.stdout
    return results


HAS_LM_EVAL = importlib.util.find_spec("lm_eval") is not None


def require_lm_eval() -> None:
    """Skip without lm-eval on a developer machine; fail loudly in CI (`make test` installs
    the [lm-eval] extra)."""
    if HAS_LM_EVAL:
        return
    message = "lm-eval is not installed: pip install -e '.[lm-eval]' (make test does)"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def run_lm_eval(
    tmp: Path, model_args: str, tasks: str, include: Path, *extra: str, processes: int = 1
) -> dict:
    """``posdebias lm-eval --model posdebias`` as a user runs it (lm-eval's own command line;
    several processes: ``accelerate launch -m posdebias lm-eval``); returns the results JSON,
    the sample records per task and the printed output."""
    out = tmp / "out"
    command = [str(Path(sys.executable).parent / "posdebias")]
    if processes > 1:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--cpu"]
        command += ["--num_processes", str(processes), "--num_machines", "1"]
        command += ["--mixed_precision", "no", "--dynamo_backend", "no"]
        command += ["--main_process_port", str(free_port()), "-m", "posdebias"]
    command += ["lm-eval", "--model", "posdebias"]
    command += ["--model_args", model_args, "--tasks", tasks, "--include_path", str(include)]
    command += ["--output_path", str(out), "--log_samples", *extra]
    done = subprocess.run(
        command, env=offline_env(tmp), capture_output=True, text=True, timeout=900, cwd=tmp
    )
    found = list(out.rglob("results_*.json"))
    assert done.returncode == 0 and len(found) == 1, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads(found[0].read_text())
    samples = {}
    for file in out.rglob("samples_*.jsonl"):
        task = file.stem.removeprefix("samples_").rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in file.read_text().splitlines() if line]
    results["samples_by_task"] = samples
    results["stdout"] = done.stdout
    return results
