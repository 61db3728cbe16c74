"""Builders of synthetic observations for the calibrator tests (no model involved)."""

from __future__ import annotations

import numpy as np

from posdebias import Observation
from posdebias.core.observation import log_softmax


def random_observation(
    rng: np.random.Generator, n: int, layers: int, target: int | None
) -> Observation:
    return Observation(
        label_logprobs=log_softmax(rng.normal(scale=2.0, size=n)),
        attention=rng.random((layers, n)) * rng.random((layers, 1)) + 1e-3,
        target=target,
    )


def calibration_set(rng: np.random.Generator, n: int, layers: int, m: int) -> list[Observation]:
    """M*N observations whose truth visits every position M times."""
    return [random_observation(rng, n, layers, index % n) for index in range(m * n)]


def prompt_text(messages) -> str:
    """The text of chat messages, whether their content is a string or a list of parts."""
    return "".join(
        item if isinstance(item, str) else item.get("text", "")
        for message in messages
        for item in (
            message["content"] if isinstance(message["content"], list) else [message["content"]]
        )
    )


def top_two_gap(scores: np.ndarray) -> float:
    ordered = np.sort(scores)
    return float(ordered[-1] - ordered[-2])


def build_shapes_benchmark(directory, *, count: int = 12, n: int = 4, seed: int = 0):
    """A real shapes benchmark on disk, built through `posdebias build` (images under
    ``directory/shapes``, the benchmark in ``directory/bench``)."""
    from pathlib import Path

    from posdebias.cli import main

    directory = Path(directory)
    out = directory / "bench"
    args = [
        "build",
        "--source",
        "shapes",
        "--root",
        str(directory / "shapes"),
        "--setting",
        "random",
        "-N",
        str(n),
        "--count",
        str(count),
        "--seed",
        str(seed),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    return out


#: ``python -m posdebias`` without the figures of a run's report or a study: the same entry point
#: (``posdebias/__main__.py``) in a fresh process, for a subprocess whose test reads none of
#: them (drawing them is most of a small run's time; tests/conftest.py does the same in this
#: process). report.md is still written, without the figures' links.
POSDEBIAS_WITHOUT_FIGURES = (
    "import runpy\n"
    "import posdebias.evaluation.report as report, posdebias.evaluation.sweep as sweep\n"
    "report.REPORT_FIGURES = ()\n"
    "sweep.figure_files = lambda *_: {}\n"
    "runpy.run_module('posdebias', run_name='__main__', alter_sys=True)\n"
)


def posdebias_command() -> list[str]:
    """The command line of ``python -m posdebias`` drawing no figure (the arguments follow)."""
    import sys

    return [sys.executable, "-c", POSDEBIAS_WITHOUT_FIGURES]


def without_figures_path(folder) -> str:
    """A PYTHONPATH whose module ``posdebias_without_figures`` is :func:`posdebias_command`'s
    program (written into ``folder``), the caller's path after it: for a launcher that takes a
    module (``accelerate launch -m posdebias_without_figures``)."""
    import os
    from pathlib import Path

    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "posdebias_without_figures.py").write_text(POSDEBIAS_WITHOUT_FIGURES)
    paths = [str(folder), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return os.pathsep.join(p for p in paths if p)


def run_cli_with_file_size_limit(args, limit: int, *, cwd=None):
    """`posdebias ARGS` in a subprocess whose files cannot grow beyond ``limit`` bytes.

    RLIMIT_FSIZE makes the kernel refuse a write past the limit (EFBIG; SIGXFSZ is ignored), the
    way a full disk refuses one: an honest out-of-space failure at the OS level, for one
    process, without a special file system.
    """
    import subprocess
    import sys

    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))\n"
        "from posdebias.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def build_from_options(kind, root, out, **options):
    """`build_benchmark` from flat options, as the command line maps its flags into a
    BuildConfig (source options into ``source``, CLIP options into ``adversarial``)."""
    from posdebias.benchmarks.build import build_benchmark
    from posdebias.benchmarks.config import build_config_from

    flags = {"source": kind, "root": root, "out": out, **options}
    return build_benchmark(build_config_from({}, flags, "build options"))


def full_file_system(base, *, size: str = "64k", fill: bool = True):
    """A context: a tmpfs of ``size`` mounted at ``base/full`` and (``fill``) filled to the last
    byte (a real full disk: writes fail with ENOSPC, creating empty files and folders still
    works), or None where this process may not mount one (not root)."""
    import contextlib
    import subprocess
    from pathlib import Path

    @contextlib.contextmanager
    def mounted():
        mount = Path(base) / "full"
        mount.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
        )
        if done.returncode != 0:
            mount.rmdir()
            yield None
            return
        try:
            if fill:
                with contextlib.suppress(OSError), open(mount / "filler", "wb") as handle:
                    while True:
                        handle.write(b"\0" * 4096)
                        handle.flush()
            yield mount
        finally:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)

    return mounted()


def hash_seed_digests(script: str) -> set[str]:
    """The outputs of ``script`` (printing a digest of generated data) under three
    PYTHONHASHSEED values: one element when the data never depend on set or hash order."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src"
    digests = set()
    for hash_seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(src)}
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        digests.add(result.stdout.strip())
    return digests


def reused_and_rebuilt(build, folder) -> object:
    """``build(4, folder)`` (a bundled benchmark) twice, then after truncating its JSONL as a
    crash would: the second call reuses the folder untouched, the third rebuilds the same
    bytes; returns the loaded benchmark."""
    from posdebias.benchmarks.files import load_benchmark

    first = build(4, folder)
    manifest = first / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    assert build(4, folder) == first and manifest.stat().st_mtime_ns == stamp
    lines = (first / "benchmark.jsonl").read_text()
    (first / "benchmark.jsonl").write_text(lines[: len(lines) // 2])  # truncated by a crash
    assert build(4, folder) == first
    assert (first / "benchmark.jsonl").read_text() == lines  # the same bytes again
    return load_benchmark(first)


def cli_run(capsys, *args) -> tuple[int, str]:
    """``posdebias ARGS`` in this process: (exit code, stderr), never a traceback or an
    internal error."""
    from posdebias.cli import main

    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return code, err


def line_count(path) -> int:
    """Lines of a log file (0 while it does not exist)."""
    return path.read_text().count("\n") if path.exists() else 0


def running_cli(args, until, *, timeout: float = 120):
    """`posdebias ARGS` in a real subprocess, returned once ``until()`` holds (e.g. a log has
    grown to some lines); the test fails if the process ends first or the time runs out. The
    one home of the kill-and-resume tests' start."""
    import signal
    import subprocess
    import sys
    import time

    import pytest

    process = subprocess.Popen(
        [sys.executable, "-m", "posdebias", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # a shell without job control (CI, `cmd &`) starts children with SIGINT ignored; the
        # tests are about what the CLI does on an interrupt, so the child gets the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + timeout
    while not until():
        if process.poll() is not None:
            pytest.fail(f"posdebias {args[0]} ended early: {process.stderr.read()}")
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail(f"posdebias {args[0]} did not get there in {timeout} s")
        time.sleep(0.02)
    return process


def interrupted_cli(args, until, sig=None) -> tuple[int, str]:
    """Run `posdebias ARGS` until ``until()`` holds, then send ``sig`` (default SIGKILL, as a
    crash would): (its return code, its stderr)."""
    import signal

    process = running_cli(args, until)
    process.send_signal(signal.SIGKILL if sig is None else sig)
    _, err = process.communicate(timeout=60)
    return process.returncode, err


def main_without_latency(args) -> int:
    """`posdebias ARGS` in this process, the simulated model's ``latency`` not slept. The
    latency of a kill-and-resume test's config is there so that its subprocess can be stopped
    mid-run; nothing a run writes depends on it but the seconds it records, which those tests
    leave out, so the in-process runs of the same config (the reference, the resume) skip it."""
    import time
    from types import SimpleNamespace

    import pytest

    from posdebias.adapters.families import synthetic
    from posdebias.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(synthetic, "time", SimpleNamespace(perf_counter=time.perf_counter,
                                                         sleep=lambda _seconds: None))  # fmt: skip
        return main([str(arg) for arg in args])


def flat(value, prefix=""):
    """{"a.b.0": number}: nested metrics as one flat mapping pytest.approx can compare."""
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()
        }
    if isinstance(value, list):
        return {
            k: v for i, item in enumerate(value) for k, v in flat(item, f"{prefix}{i}.").items()
        }
    return {prefix.rstrip("."): value}
