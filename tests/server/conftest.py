"""A real vLLM server (CPU build) on 127.0.0.1 serving a tiny model the tests build.

The interpreter comes from ``POSDEBIAS_VLLM_PYTHON`` (default: the repository's
``.venv-vllm/bin/python``, which ``make test`` creates). Without it the tests are skipped on a
developer's machine and FAIL in CI (``CI=true``): they must never silently not run there.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 420  # vLLM's first start on 2 busy cores (measured: 30-120 s)


def vllm_python() -> Path:
    configured = os.environ.get("POSDEBIAS_VLLM_PYTHON")
    path = Path(configured) if configured else REPO / ".venv-vllm" / "bin" / "python"
    if not path.is_file():
        message = (
            f"no vLLM interpreter at {path}: run `make vllm-venv` or set POSDEBIAS_VLLM_PYTHON"
        )
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class VllmServer:
    """One vLLM API server process; ``restart`` brings it back on the same port."""

    python: Path
    model: Path
    log: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            # the model runs inside the engine-core process instead of a third process of
            # its own: one Python start fewer per server (measured 6-8 s of its 25-35 s)
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # its IPC sockets and temporary files beside its log, not in the system's /tmp (a
            # killed server leaves its sockets behind)
            "TMPDIR": str(self.log.parent),
            "VLLM_RPC_BASE_PATH": str(self.log.parent),
        }
        env.pop("PYTHONPATH", None)  # the server runs on its own environment only
        command = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "16",
            "--enforce-eager",
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                pytest.fail(f"vLLM exited with {self.process.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as response:
                    if json.loads(response.read())["data"]:
                        return
            except OSError:  # not listening yet
                time.sleep(0.25)
        self.stop()
        pytest.fail(f"vLLM did not answer within {STARTUP_SECONDS} s; log: {self.log}")

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait(timeout=30)
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=30)
        self.process = None


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    python = vllm_python()
    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_model import save_served_model

    folder = tmp_path_factory.mktemp("vllm")
    model = save_served_model(folder / "model")
    server = VllmServer(python=python, model=model, log=folder / "vllm.log")
    started = time.perf_counter()
    server.start()
    print(f"vLLM started in {time.perf_counter() - started:.1f} s")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def start_vllm():
    """Start a vLLM server on another model folder than the session's (stopped after the
    module): ``start_vllm(folder, log)``."""
    servers: list[VllmServer] = []

    def start(model: Path, log: Path) -> VllmServer:
        servers.append(VllmServer(python=vllm_python(), model=model, log=log))
        started = time.perf_counter()
        servers[-1].start()
        print(f"vLLM on {model.name} started in {time.perf_counter() - started:.1f} s")
        return servers[-1]

    yield start
    for server in servers:
        server.stop()
