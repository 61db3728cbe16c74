"""The ``openai`` adapter against servers that lie or misbehave, and URLs and keys that must not
be used or printed. Every case ends in a specific AdapterError / InputError (exit 2 on the
command line, no traceback), never a crash, a hang, a memory blow-up or a wrong number.

The servers are real HTTP servers on 127.0.0.1 that answer what each case needs: impossible
numbers, wrong types, huge or trickling bodies, deep JSON. No vLLM needed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler

import pytest
from local_server import LocalServer

from posdebias.adapters import server as server_module
from posdebias.adapters.hf.generation import GenerationSettings
from posdebias.adapters.server import ServerAdapter
from posdebias.cli import main
from posdebias.core.instance import Instance
from posdebias.errors import AdapterError, ConfigError, InputError

#: (status, headers, body chunks, seconds between chunks)
Reply = tuple[int, dict[str, str], Iterable[bytes], float]


class Hostile(LocalServer):
    """A local HTTP server whose every POST is answered by ``respond(path, body)``."""

    def __init__(self, respond: Callable[[str, dict], Reply]) -> None:
        self.requests: list[tuple[str, dict, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body, dict(self.headers)))
                status, headers, chunks, pause = respond(self.path, body)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:
                    self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for chunk in chunks:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        time.sleep(pause)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped reading, as it should
                self.close_connection = True

            def log_message(self, *args):
                pass

        super().__init__(Handler)


def json_reply(payload: object, status: int = 200) -> Reply:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return status, {"Content-Length": str(len(data))}, [data], 0.0


def prompt_scores(body: dict, last: object = -0.5, count: object = None) -> dict:
    """vLLM's prompt_logprobs answer for the request ``body``: every prompt token scored -1.0,
    the answer's last token scored ``last``; usage.prompt_tokens ``count`` (default right)."""
    tokens = ["<s>", "user", "Q", "assistant"]
    answer = body["messages"][-1]
    if answer["role"] == "assistant":
        tokens += list(answer["content"])
    values: list[object] = [-1.0] * len(tokens)
    if answer["role"] == "assistant":
        values[-1] = last
    entries = [None] + [
        {"7": {"logprob": value, "decoded_token": token}}
        for token, value in zip(tokens[1:], values[1:], strict=True)
    ]
    return {"prompt_logprobs": entries, "usage": {"prompt_tokens": count or len(tokens)}}


def question() -> Instance:
    return Instance(stem="2+2?", texts=("3", "4", "5"), target=1, id="q", task="multiple_choice")


def adapter(url: str, **options) -> ServerAdapter:
    options = {"backoff": 0.01, "timeout": 5, "retries": 0, "label_set": "upper", **options}
    return ServerAdapter(base_url=url, model="m", **options)


def observe_with(respond: Callable[[str, dict], Reply], **options) -> object:
    with Hostile(respond) as server:
        return adapter(server.url, **options).observe(question())


def test_an_honest_server_gives_the_restricted_softmax():
    # the baseline the hostile cases change one thing of
    observation = observe_with(lambda path, body: json_reply(prompt_scores(body)))
    assert observation.label_logprobs.tolist() == pytest.approx([-1.0986123] * 3)


@pytest.mark.parametrize(
    ("lie", "message"),
    [
        ({"last": float("nan")}, "cannot use: 'NaN is no number JSON allows'"),
        ({"last": float("inf")}, "cannot use: 'Infinity is no number JSON allows'"),
        ({"last": float("-inf")}, "cannot use: '-Infinity is no number JSON allows'"),
        ({"last": 1e999}, "cannot use: 'Infinity is no number JSON allows'"),
        ({"last": 5.0}, "a log-probability must be a finite number <= 0, got 5.0"),
        ({"last": 1e308}, "a log-probability must be a finite number <= 0, got 1e+308"),
        ({"last": -1e308}, "a log-probability must be at least -1e+12 (sums of scores stay"),
        ({"last": -1e13}, "must be at least -1e+12"),
        ({"last": "abc"}, "logprob: Input should be a valid number"),
        ({"last": None}, "logprob: Input should be a valid number"),
        ({"count": -3}, "usage.prompt_tokens: Input should be greater than or equal to 0"),
        ({"count": True}, "usage.prompt_tokens: Input should be a valid integer"),
        ({"count": 10**6}, "says the prompt has 1000000 tokens but scored"),
        ({"count": "7"}, "usage.prompt_tokens: Input should be a valid integer"),
    ],
)
def test_impossible_prompt_scores_are_refused_naming_the_number(lie, message):
    # NaN, infinities and positive log-probabilities used to become wrong scores (a positive
    # one silently) or an internal error; token counts of the wrong type were taken as ints
    with pytest.raises(AdapterError) as caught:
        observe_with(lambda path, body: json_reply(prompt_scores(body, **lie)))
    assert (
        "sent prompt log-probabilities posdebias cannot use" in str(caught.value)
        or "does not describe this prompt" in str(caught.value)
        or "answered with JSON posdebias cannot use" in str(caught.value)  # NaN: no JSON number
    )
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            {"prompt_logprobs": [None, "x", 5], "usage": {"prompt_tokens": 3}},
            "prompt_logprobs.1: Input should be a valid dictionary",
        ),
        (
            {"prompt_logprobs": [None, {"7": {"decoded_token": "x"}}], "usage": {}},
            "prompt_logprobs.1.7.logprob: Field required",
        ),
        (
            b'{"prompt_logprobs": [null, {"7": {"logprob": NaN}}], "usage": {}}',
            "NaN is no number JSON allows",
        ),
        ({"prompt_logprobs": [None, {"7": {"logprob": -1.0}}]}, "usage: Field required"),
        ({"prompt_logprobs": "all", "usage": {}}, "prompt_logprobs: Input should be a valid list"),
        (b"[" * 100_000 + b"]" * 100_000, "answered with JSON nested too deeply"),
        (b"<html>hello</html>", "answered with no JSON"),
        (b'{"a": "\xff"}', "answered with no JSON"),
        (b"[1, 2, 3]", "answered [1, 2, 3], no object"),
    ],
)
def test_answers_of_the_wrong_shape_are_refused_not_crashed_on(payload, message):
    # each of these was a KeyError, a TypeError or a RecursionError (exit 1) before
    with pytest.raises(AdapterError, match="server 'http://127.0.0.1") as caught:
        observe_with(lambda path, body: json_reply(payload))
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("top", "message"),
    [
        ([{"token": "A", "logprob": float("nan")}], "NaN is no number JSON allows"),
        ([{"token": "A", "logprob": float("-inf")}], "-Infinity is no number JSON allows"),
        ([{"token": "A", "logprob": -1e400}], "-Infinity is no number JSON allows"),
        ([{"token": "A", "logprob": 0.7}], "finite number <= 0, got 0.7"),
        ([{"token": "A", "logprob": -1e308}], "must be at least -1e+12"),
        ([{"token": "A", "logprob": 1e308}], "finite number <= 0, got 1e+308"),
        ([{"tok": "A"}], "top_logprobs.0.token: Field required"),
        ("x", "top_logprobs: Input should be a valid list"),
    ],
)
def test_impossible_top_logprobs_are_refused(top, message):
    def respond(path, body):
        return json_reply(
            {"choices": [{"index": 0, "logprobs": {"content": [{"top_logprobs": top}]}}]}
        )

    with pytest.raises(
        AdapterError, match="(sent a chat answer|answered with JSON) posdebias cannot use"
    ) as caught:
        observe_with(respond, scoring="top_logprobs")
    assert message in str(caught.value)


def test_a_repeated_top_token_keeps_its_best_entry():
    # two vocabulary entries may decode to the same text; the list is best first
    top = [
        {"token": "A", "logprob": -0.5},
        {"token": "B", "logprob": -1.0},
        {"token": "A", "logprob": -9.0},
        {"token": "C", "logprob": -2.0},
    ]
    reply = {"choices": [{"index": 0, "logprobs": {"content": [{"top_logprobs": top}]}}]}
    observation = observe_with(lambda path, body: json_reply(reply), scoring="top_logprobs")
    import numpy as np

    expected = np.array([-0.5, -1.0, -2.0]) - np.logaddexp.reduce([-0.5, -1.0, -2.0])
    assert observation.label_logprobs.tolist() == pytest.approx(expected.tolist())


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            {"choices": [{"index": "x", "message": {"content": "A"}}], "usage": {}},
            "choices.0.index: Input should be a valid integer",
        ),
        ({"choices": [None]}, "choices.0: Input should be a valid dictionary (got None)"),
        (
            {
                "choices": [{"index": 0, "message": {"content": "A"}}],
                "usage": {"completion_tokens": "many"},
            },
            "usage.completion_tokens: Input should be a valid integer",
        ),
        (
            {
                "choices": [
                    {"index": 0, "message": {"content": "A"}},
                    {"index": 0, "message": {"content": "B"}},
                ]
            },
            "returned 2 choices (indices [0]), asked for 1",
        ),
        ({"choices": [{"index": 3, "message": {"content": "A"}}]}, "indices [3]), asked for 1"),
        ({"choices": []}, "choices: List should have at least 1 item"),
    ],
)
def test_generated_answers_of_the_wrong_shape_are_refused(payload, message):
    settings = GenerationSettings(max_new_tokens=2)
    with (
        Hostile(lambda path, body: json_reply(payload)) as server,
        pytest.raises(AdapterError) as e,
    ):
        adapter(server.url).generate_many([question()], settings)
    caught = e
    assert message in str(caught.value)
    assert "_ChatChoice" not in str(caught.value)  # no private class name reaches a user


def test_a_huge_answer_is_cut_without_reading_it(monkeypatch):
    # a body of 10^10 bytes used to be read whole (16 GB of memory before the kernel stepped in)
    monkeypatch.setattr(server_module, "MAX_RESPONSE_BYTES", 1 << 20)

    def endless(path, body):
        return 200, {"Content-Type": "application/json"}, iter(lambda: b"null," * 20_000, None), 0

    def declared(path, body):
        size = str(server_module.MAX_RESPONSE_BYTES + 1)
        return 200, {"Content-Length": size}, [b"{}"], 0.0

    for respond in (endless, declared):
        started = time.monotonic()
        with pytest.raises(AdapterError, match="sent an answer of more than 1 MiB"):
            observe_with(respond)
        assert time.monotonic() - started < 30


def test_an_answer_cut_off_mid_body_is_retried_not_read_as_malformed():
    # a server killed mid-answer closed the connection after part of its declared length: that
    # was "answered with no JSON" (not retried); it is a transport failure, retried like one
    answers = iter([b'{"prompt_lo', None])

    def dying_then_honest(path, body):
        part = next(answers, None)
        if part is not None:
            return 200, {"Content-Length": "400"}, [part], 0.0
        return json_reply(prompt_scores(body))

    observation = observe_with(dying_then_honest, retries=1)
    assert observation.label_logprobs.tolist() == pytest.approx([-1.0986123] * 3)

    def always_dying(path, body):
        return 200, {"Content-Length": "400"}, [b'{"prompt_lo'], 0.0

    with pytest.raises(AdapterError) as caught:
        observe_with(always_dying, retries=1)
    assert "did not answer after 2 attempts (the answer was cut off after 11 of 400 bytes)" in str(
        caught.value
    )


@pytest.mark.parametrize("length", ["\xb2", "1" * 5000, "-5", "12 34", "0x10"])
def test_a_content_length_that_is_no_plain_number_is_not_trusted(length):
    # '\xb2' passes str.isdigit() but not int(): that was an internal error (exit 1); 5,000
    # digits overflow int()'s digit limit. The body's own end counts (the size cap still holds)
    def respond(path, body):
        data = json.dumps(prompt_scores(body)).encode()
        return 200, {"Content-Length": length, "Connection": "close"}, [data], 0.0

    observation = observe_with(respond)
    assert observation.label_logprobs.tolist() == pytest.approx([-1.0986123] * 3)


def test_a_trickling_answer_times_out_as_a_whole():
    # one byte every 0.2 s never trips a socket timeout; the request's timeout is for the answer
    def trickle(path, body):
        return 200, {"Content-Type": "application/json"}, (b" " for _ in range(500)), 0.2

    started = time.monotonic()
    with pytest.raises(AdapterError, match=r"no complete answer within the timeout of 1 s"):
        observe_with(trickle, timeout=1, retries=1)
    assert time.monotonic() - started < 15


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:8000/go od/v1", "holds a space or a control character"),
        ("http://127.0.0.1:8000/v1\nHost: evil", "holds a space or a control character"),
        ("http://127.0.0.1:99999/v1", "is not a valid URL (Port out of range"),
        ("http://127.0.0.1:abc/v1", "is not a valid URL (Port could not be cast"),
        ("http://[::1/v1", "is not a valid URL"),
        ("file:///etc/passwd", "is not an http(s) URL"),
        ("gopher://127.0.0.1/v1", "is not an http(s) URL"),
        ("http:///v1", "is not an http(s) URL"),
    ],
)
def test_urls_that_cannot_be_requested_are_refused_before_any_request(url, message):
    # spaces, newlines and bad ports used to reach http.client: InvalidURL, exit 1
    with pytest.raises(ConfigError) as caught:
        adapter(url)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("url", "secret", "shown"),
    [
        ("http://alice:s3cretpw@127.0.0.1:8000/v1", "s3cretpw", "'http://***@127.0.0.1:8000/v1'"),
        ("http://sk-abc123@127.0.0.1:8000/v1", "sk-abc123", "'http://***@127.0.0.1:8000/v1'"),
        ("http://127.0.0.1:8000/v1?api_key=s3cret", "s3cret", "'http://127.0.0.1:8000/v1?***'"),
        ("ftp://bob:hunter2@host/v1", "hunter2", "'ftp://***@host/v1'"),
        ("http://bob:hunter2@host:99999/v1", "hunter2", "'http://***@host:99999/v1'"),
    ],
)
def test_credentials_in_a_url_are_refused_and_never_printed(url, secret, shown, tmp_path, capsys):
    # the refusal quoted the whole URL, password and all
    code = main(["evaluate", "--adapter", "openai", "--base-url", url, "--model", "m"])
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err
    assert secret not in captured.out + captured.err
    assert f"base_url {shown}" in captured.err


def test_an_api_key_no_header_can_carry_is_refused_before_any_request(monkeypatch):
    # a key ending in a newline (a copied line) gave "answered with no JSON", and a key with
    # CRLF could add headers; the key itself is never printed
    for key in ("sk-secret\n", "sk-secret\r\nX-Evil: 1", "sk secret", "sk-sécret"):
        monkeypatch.setenv("POSDEBIAS_TEST_KEY", key)
        with Hostile(lambda path, body: json_reply(prompt_scores(body))) as server:
            with pytest.raises(InputError) as caught:
                adapter(server.url, api_key_env="POSDEBIAS_TEST_KEY").observe(question())
            assert server.requests == []
        assert "the API key in the environment variable 'POSDEBIAS_TEST_KEY' holds" in str(
            caught.value
        )
        assert "secret" not in str(caught.value) and "sécret" not in str(caught.value)


def test_a_good_key_is_sent_as_a_bearer_token_and_to_the_server_only(monkeypatch):
    monkeypatch.setenv("POSDEBIAS_TEST_KEY", "sk-good")
    with Hostile(lambda path, body: json_reply(prompt_scores(body))) as server:
        adapter(server.url, api_key_env="POSDEBIAS_TEST_KEY").observe(question())
        assert {headers["Authorization"] for _, _, headers in server.requests} == {"Bearer sk-good"}


def test_proxies_from_the_environment_are_not_used(monkeypatch):
    # a proxy in the environment would see every prompt and the key
    with Hostile(lambda path, body: json_reply({"error": "proxied"}, 502)) as proxy:
        for variable in ("http_proxy", "HTTP_PROXY", "https_proxy", "all_proxy", "ALL_PROXY"):
            monkeypatch.setenv(variable, proxy.url.removesuffix("/v1"))
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        with Hostile(lambda path, body: json_reply(prompt_scores(body))) as server:
            adapter(server.url).observe(question())
            assert server.requests
        assert proxy.requests == []


def test_a_lying_server_on_the_command_line_is_exit_2_with_its_message(tmp_path, capsys):
    # the whole path: build a question file, evaluate through the server, one clear line
    data = tmp_path / "questions.jsonl"
    rows = [
        {"id": f"q{i}", "question": f"Question {i}?", "options": ["a", "b", "c"], "answer": 1}
        for i in range(4)
    ]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert (
        main(["build", "--source", "mcq", "--data", str(data), "--out", str(tmp_path / "b")]) == 0
    )
    capsys.readouterr()
    with Hostile(lambda path, body: json_reply(prompt_scores(body, last=5.0))) as server:
        code = main(
            [
                "evaluate", "--adapter", "openai", "--base-url", server.url, "--model", "m",
                "--benchmark", str(tmp_path / "b"), "--calibrators", "vanilla", "--count", "2",
                "--calibration-count", "1", "--orders", "1", "--out", str(tmp_path / "run"),
            ]
        )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "internal error" not in err
    assert "a log-probability must be a finite number <= 0, got 5.0" in err
    assert not (tmp_path / "run" / "results.json").exists()
