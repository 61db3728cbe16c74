"""The ``openai`` adapter against small real HTTP servers that lack what it needs: clear errors,
retries with backoff, no redirect followed, nothing sent but to base_url. No vLLM needed."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler

import pytest
from local_server import LocalServer

from posdebias.adapters.server import ServerAdapter
from posdebias.core.instance import Instance
from posdebias.errors import AdapterError, ConfigError, InputError


class Server(LocalServer):
    """A local HTTP server answering POSTs with ``respond(path, body) -> (status, payload)``."""

    def __init__(self, respond):
        self.requests: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                status, payload, headers = respond(self.path, body, len(outer.requests))
                data = json.dumps(payload).encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        super().__init__(Handler, threaded=False)


def instance(tmp_path) -> Instance:
    from posdebias.testing import write_test_images

    files = write_test_images(tmp_path, 2)
    return Instance(stem="a cat", images=tuple(files), target=0, id="x")


def adapter(url: str, **options) -> ServerAdapter:
    return ServerAdapter(base_url=url, model="m", backoff=0.01, timeout=5, **options)


def test_a_server_without_log_probabilities_is_a_clear_error(tmp_path):
    answer = {"choices": [{"index": 0, "message": {"content": "1"}}], "usage": {}}
    case = instance(tmp_path)
    with (
        Server(lambda path, body, count: (200, answer, {})) as server,
        pytest.raises(AdapterError, match="returned no log-probabilities"),
    ):
        adapter(server.url).observe(case)


def test_failed_requests_are_retried_with_backoff_then_reported(tmp_path):
    with Server(lambda path, body, count: (503, {"error": {"message": "busy"}}, {})) as server:
        with pytest.raises(AdapterError, match=r"did not answer after 3 attempts \(HTTP 503"):
            adapter(server.url, retries=2).observe(instance(tmp_path))
        assert len(server.requests) == 3


def test_a_client_error_is_not_retried_and_names_the_server_message(tmp_path):
    answer = {"error": {"message": "model 'm' does not exist"}}
    with Server(lambda path, body, count: (404, answer, {})) as server:
        with pytest.raises(AdapterError, match="model 'm' does not exist"):
            adapter(server.url).observe(instance(tmp_path))
        assert len(server.requests) == 1


def test_redirects_are_refused(tmp_path):
    with Server(lambda path, body, count: (200, {}, {})) as elsewhere:
        target = elsewhere.url + "/chat/completions"
        case = instance(tmp_path)
        refused = r"redirects \(HTTP 307\) to .* the redirect is refused"
        with (
            Server(lambda path, body, count: (307, {}, {"Location": target})) as server,
            pytest.raises(AdapterError, match=refused),
        ):
            adapter(server.url).observe(case)
        assert elsewhere.requests == []  # nothing reached the other address


def test_top_logprobs_scores_are_the_restricted_softmax(tmp_path):
    top = [{"token": "1", "logprob": -0.5}, {"token": "2", "logprob": -2.0}]
    answer = {"choices": [{"index": 0, "logprobs": {"content": [{"top_logprobs": top}]}}]}
    with Server(lambda path, body, count: (200, answer, {})) as server:
        scores = adapter(server.url, scoring="top_logprobs").observe(instance(tmp_path))
        (path, body) = server.requests[0]
    assert path == "/v1/chat/completions" and body["top_logprobs"] == 20
    image = body["messages"][0]["content"][0]
    assert image["type"] == "image_url" and image["image_url"]["url"].startswith(
        "data:image/png;base64,"
    )
    expected = [-0.5, -2.0] - __import__("numpy").logaddexp(-0.5, -2.0)
    assert scores.label_logprobs.tolist() == pytest.approx(expected.tolist(), abs=1e-12)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"base_url": "ftp://host/v1"}, "is not an http"),
        ({"base_url": "http://user:pw@host/v1"}, "must not carry"),
        ({"base_url": "http://h/v1", "endpoint": "completions"}, "needs the option tokenizer"),
        ({"base_url": "http://h/v1", "api_key_env": "POSDEBIAS_NO_SUCH_KEY"}, "is not set"),
    ],
)
def test_bad_options_are_refused_before_any_request(options, message):
    with pytest.raises((ConfigError, InputError), match=message):
        ServerAdapter(model="m", **options)


def question() -> Instance:
    return Instance(stem="2+2?", texts=("3", "4", "5"), target=1, id="q", task="multiple_choice")


@pytest.fixture(scope="module")
def qwen3():
    """posdebias' own qwen3 adapter: the prompt the server must be sent."""
    import posdebias
    from posdebias.testing import tiny_model_and_processor

    return posdebias.get_adapter(*tiny_model_and_processor("qwen3"), label_set="upper")


def test_messages_hold_the_prompt_the_hf_adapters_render(tmp_path, qwen3):
    # A text-only content goes as one string: a server rendering a text-only chat template
    # would join a list's items with its own separator (vLLM: a newline).
    server = adapter("http://127.0.0.1:9/v1", label_set="upper")
    assert server.messages(question()) == qwen3.messages_for(question())
    assert isinstance(server.messages(question())[0]["content"], str)
    case = instance(tmp_path)
    placeholder = adapter(
        "http://127.0.0.1:9/v1", images="placeholder", image_placeholder="<{name}>"
    ).messages(case)[0]["content"]
    assert placeholder.startswith("<image_000.png><image_001.png>Given 2 images")
    parts = adapter("http://127.0.0.1:9/v1").messages(case)[0]["content"]
    assert [part["type"] for part in parts] == ["image_url", "image_url", "text"]
    assert parts[2]["text"] == placeholder.removeprefix("<image_000.png><image_001.png>")


def test_task_prompt_replaces_fields_as_for_the_hf_adapters(qwen3):
    # one field, as the Hugging Face adapters take it (a whole template was required: a user
    # writing only candidate got "instruction: Field required")
    import posdebias
    from posdebias.testing import tiny_model_and_processor

    fields = {"candidate": "({label}) {text}", "candidate_separator": " "}
    server = adapter("http://127.0.0.1:9/v1", label_set="upper", task_prompt=fields)
    local = posdebias.get_adapter(
        *tiny_model_and_processor("qwen3"), label_set="upper", task_prompt=fields
    )
    assert server.messages(question()) == local.messages_for(question())
    assert "(A) 3 (B) 4 (C) 5" in server.messages(question())[0]["content"]
    with pytest.raises(ConfigError, match="never shows the candidate"):
        adapter("http://127.0.0.1:9/v1", task_prompt={"candidate": "{label}"})
    # a misspelt field reads the same from either adapter, without pydantic's own wording
    for make in (
        lambda: adapter("http://127.0.0.1:9/v1", task_prompt={"candidat": "x"}),
        lambda: posdebias.get_adapter(
            *tiny_model_and_processor("qwen3"), task_prompt={"candidat": "x"}
        ),
    ):
        with pytest.raises(ConfigError) as caught:
            make()
        assert "task_prompt: unknown field 'candidat'; the fields: instruction" in str(caught.value)
        assert "validation error" not in str(caught.value)


def test_a_prompt_variant_of_a_task_instance_is_posed_as_by_the_hf_adapters(qwen3):
    # The generated baselines' variants rewrite every task's template (in its own words); the
    # server is sent exactly the messages the Hugging Face adapters pose, and the answer is
    # parsed as a letter. A retrieval template handed to a task instance is still refused.
    from posdebias.adapters.hf.generation import GenerationSettings
    from posdebias.core.tasks import TEXT_WORDINGS

    settings = GenerationSettings(max_new_tokens=2, prompt_variant="instruction")
    answer = {"choices": [{"index": 0, "message": {"content": "B"}}], "usage": {}}
    with Server(lambda path, body, count: (200, answer, {})) as server:
        server_adapter = adapter(server.url, label_set="upper")
        (generated,) = server_adapter.generate_many([question()], settings)
        ((path, body),) = server.requests
    assert path.endswith("chat/completions")
    assert generated.texts == ["B"]
    posed = qwen3.messages_for(question(), variant="instruction")
    assert body["messages"] == server_adapter.messages(question(), variant="instruction")
    assert body["messages"][0]["content"] == posed[0]["content"]
    assert TEXT_WORDINGS["instruction"].request.split("{")[0] in posed[0]["content"]


def test_a_prompt_whose_tokens_change_under_the_answer_is_a_clear_error():
    # As a chat template does that writes an empty thinking block in its generation prompt but
    # not before a final assistant turn: the continued prompt is not the prompt + the label.
    def respond(path, body, count):
        tokens = ["<s>", "user", "2+2?", "assistant", "<think>", "</think>"]
        last = body["messages"][-1]
        if last["role"] == "assistant":
            tokens = [*tokens[:4], last["content"]]
        entries = [None, *({"7": {"logprob": -1.0, "decoded_token": t}} for t in tokens[1:])]
        return 200, {"prompt_logprobs": entries, "usage": {"prompt_tokens": len(tokens)}}, {}

    with Server(respond) as server, pytest.raises(AdapterError) as caught:
        adapter(server.url, label_set="upper").observe(question())
    assert "tokens of the prompt change when the answer 'A' follows it" in str(caught.value)
    assert "use endpoint completions with the option tokenizer" in str(caught.value)
