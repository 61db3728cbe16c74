"""Every wait of the ``openai`` adapter has a whole deadline, and an answer that names another
model than the one asked for is warned about and recorded, or refused.

The servers are real sockets on 127.0.0.1 that write what each case needs byte by byte (a
status line, headers, a body, an error), slower than any per-read timeout could notice.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import warnings

import pytest
from local_server import LocalServer

from posdebias.adapters.server import ServerAdapter
from posdebias.core.instance import Instance
from posdebias.errors import AdapterError, PosdebiasPluginWarning


class Trickler:
    """A TCP server on 127.0.0.1 that reads a request and writes ``reply`` in pieces of
    ``step`` bytes, ``pause`` seconds apart, to every connection; stopped by ``with``."""

    def __init__(self, reply: bytes, *, step: int = 1, pause: float = 0.5) -> None:
        self.reply, self.step, self.pause = reply, step, pause
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.stopped = threading.Event()
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(1)
            try:
                conn.recv(65536)
                for start in range(0, len(self.reply), self.step):
                    if self.stopped.is_set():
                        return
                    conn.sendall(self.reply[start : start + self.step])
                    self.stopped.wait(self.pause)
            except OSError:
                return  # the client gave up, as it should

    def __enter__(self) -> Trickler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()
        self.listener.close()


def question() -> Instance:
    return Instance(stem="2+2?", texts=("3", "4", "5"), target=1, id="q", task="multiple_choice")


def adapter(url: str, **options) -> ServerAdapter:
    options = {"backoff": 0.01, "timeout": 2, "retries": 1, "label_set": "upper", **options}
    return ServerAdapter(base_url=url, model="m", **options)


BODY = b'{"choices": []}'
HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n"


@pytest.mark.parametrize(
    ("reply", "step", "pause"),
    [
        (HEADERS + BODY, 1, 0.5),  # the headers, one byte every 0.5 s
        (b"HTTP/1.1 200 " + b"O" * 200, 1, 0.3),  # a status line that never ends
        (HEADERS + b" " * 200 + BODY, 1, 0.3),  # a body that trickles (with a length)
        (b"HTTP/1.1 500 Oops\r\nContent-Length: 400\r\n\r\n" + b"x" * 400, 2, 0.3),  # error body
        (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 100, 9, 0.4),  # header lines without end
    ],
)
def test_a_server_that_trickles_any_part_of_its_answer_hits_the_whole_deadline(reply, step, pause):
    # headers one byte every 0.5 s hung the run: timeout 3, retries 1 still waiting at 45 s. Each
    # pause is shorter than the deadline of 1 s, so only a deadline on the whole answer stops it.
    started = time.monotonic()
    with Trickler(reply, step=step, pause=pause) as server:
        with pytest.raises(AdapterError) as caught:
            adapter(server.url, timeout=1).observe(question())
        elapsed = time.monotonic() - started
        assert server.connections == 2  # one try and one retry, each cut at its deadline
    assert "did not answer after 2 attempts (no complete answer within the timeout of 1 s)" in (
        str(caught.value)
    )
    assert elapsed < 2 * 1 + 3  # two deadlines and the backoff, with room for a slow machine


def test_a_server_that_falls_silent_hits_the_deadline_too():
    with Trickler(b"H", step=1, pause=30) as server:
        started = time.monotonic()
        with pytest.raises(AdapterError, match="within the timeout of 1 s|timed out"):
            adapter(server.url, timeout=1, retries=0).observe(question())
        assert time.monotonic() - started < 4


def scores(body: dict, model: object) -> bytes:
    tokens = ["<s>", "user", "Q", "assistant"]
    answer = body["messages"][-1]
    if answer["role"] == "assistant":
        tokens += list(answer["content"])
    entries = [None] + [{"7": {"logprob": -1.0, "decoded_token": t}} for t in tokens[1:]]
    payload = {"prompt_logprobs": entries, "usage": {"prompt_tokens": len(tokens)}}
    if model is not None:
        payload["model"] = model
    return json.dumps(payload).encode()


class Named(LocalServer):
    """A local HTTP server whose answers say they come from ``model``."""

    def __init__(self, model: object) -> None:
        from http.server import BaseHTTPRequestHandler

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                data = scores(body, model)
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        super().__init__(Handler)


@pytest.mark.parametrize("model", [None, "m"])
def test_an_answer_from_the_requested_model_is_used_quietly(model):
    with Named(model) as server, warnings.catch_warnings():
        warnings.simplefilter("error")
        served = adapter(server.url)
        served.observe(question())
    assert "served_models" not in served.describe(3)


@pytest.mark.parametrize("model", ["gpt-evil-other", "m-2024-08-06", "M", "m "])
def test_an_answer_from_another_model_is_warned_about_once_and_recorded(model):
    # such answers were used silently and results.json named only the requested model
    with Named(model) as server:
        served = adapter(server.url)
        with pytest.warns(PosdebiasPluginWarning) as caught:
            served.observe(question())
            served.observe(question())
    assert len(caught) == 1
    assert f"answered as model {model!r}, not the requested 'm'" in str(caught[0].message)
    assert served.describe(3)["served_models"] == [model]


@pytest.mark.parametrize("model", ["gpt-evil-other", "m-2024-08-06"])
def test_other_model_refuse_stops_at_the_first_such_answer(model):
    refused = f"answered as model '{model}', not the requested"
    with Named(model) as server, pytest.raises(AdapterError, match=refused):
        adapter(server.url, other_model="refuse").observe(question())


@pytest.mark.parametrize("model", [7, True, ["m"], "", {"name": "m"}, "x" * 5000])
def test_a_model_field_that_is_no_name_is_refused(model):
    with Named(model) as server, pytest.raises(AdapterError, match="which is no model name"):
        adapter(server.url).observe(question())
