"""Models behind an OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp's server, hosted APIs).

Servers export no attention, but they do export log-probabilities, and every method that needs
no attention (vanilla, PriDe, permutation averaging, the generated baselines) works from those
alone. This adapter turns a server's log-probabilities into the same restricted label scores as
the Hugging Face adapters (scoring.py): s_j = log P(c_j | x), a softmax over the N labels only,
a label of several tokens scored as the joint probability of its tokens along the label trie.

Two ways to get the numbers (``scoring``):

* ``echo`` (exact): each label is appended to the prompt and the server scores the prompt's own
  tokens. On ``/completions`` that is the standard ``echo`` + ``logprobs`` (token offsets find
  the label's tokens); on ``/chat/completions`` it is vLLM's ``prompt_logprobs`` with the label
  as a continued assistant message. One request per label, plus one per label that another
  label continues (``"1"`` vs ``"10"``: the end-of-answer token is scored after it).
* ``top_logprobs``: one request per instance, the first answer token's top-k log-probabilities.
  For servers that offer nothing else (hosted chat APIs); every label must be one token and
  among the top k, otherwise the adapter stops and says so.

Requests run concurrently (at most ``concurrency`` at once), each with a timeout, retried with
exponential backoff on connection failures, 429 and 5xx. Nothing is sent anywhere but
``base_url``: proxies from the environment are not used and redirects are refused.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import math
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar
from urllib.parse import urlsplit

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from posdebias._inputs import MAX_FILE_MAGNITUDE, MiB, excerpt, loads_json
from posdebias._markers import register_hook
from posdebias.adapters.base import (
    Adapter,
    Generation,
    ReplyRequest,
    ReplyScore,
    sample_seed,
    split_tie,
)
from posdebias.adapters.hf.adapter import load_image
from posdebias.adapters.hf.prompt import (
    PromptOptions,
    check_answer_joins,
    check_instance_prompts,
    check_template_control_tokens,
    control_tokens,
    message_texts,
    neutral_instance,
    neutral_prompts,
    posed_messages,
    refuse_joined_control_tokens,
    template_fields,
)
from posdebias.adapters.hf.scoring import plan_labels, restricted_scores
from posdebias.core.instance import Instance
from posdebias.core.labels import check_candidate_count, get_label_set
from posdebias.core.observation import Observation, log_softmax
from posdebias.core.tasks import (
    TEXT_TASKS,
    joined_text_messages,
    scored_labels,
)
from posdebias.errors import (
    AdapterError,
    InputError,
    PosdebiasPluginWarning,
    validation_problems,
)

if TYPE_CHECKING:
    from posdebias.adapters.hf.generation import GenerationSettings

#: Why this adapter has no attention (named when a calibrator that needs it is refused).
NO_ATTENTION = (
    "an OpenAI-compatible server returns log-probabilities but no attention weights (vLLM, "
    "SGLang and hosted APIs do not export them)"
)


class ServerOptions(PromptOptions):
    """Options of the ``openai`` adapter (``adapter.options`` in a config file; the prompt
    options are :class:`PromptOptions`'s)."""

    base_url: str = Field(description="the server's API root, e.g. http://127.0.0.1:8000/v1")
    model: str = Field(description="the served model's name (as /v1/models lists it)")
    endpoint: Literal["chat", "completions"] = Field(
        default="chat",
        description="chat: /chat/completions (server renders the chat template, images as "
        "content parts); completions: /completions on a prompt rendered with the local "
        "tokenizer's chat template (text only)",
    )
    scoring: Literal["echo", "top_logprobs"] = Field(
        default="echo",
        description="echo: exact label log-probabilities by scoring each label continuation; "
        "top_logprobs: the first token's top-k only (servers that offer nothing else)",
    )
    top_logprobs: int = Field(default=20, ge=1, le=100, description="k of scoring top_logprobs")
    tokenizer: str | None = Field(
        default=None,
        description="local tokenizer folder whose chat template renders the prompt (endpoint "
        "completions) and whose eos token ends labels",
    )
    images: Literal["content", "placeholder"] = Field(
        default="content",
        description="content: images as image_url content parts (base64 PNG); placeholder: "
        "each image as the text image_placeholder (a text model: it sees no pixels)",
    )
    image_placeholder: str = Field(
        default="<image>",
        description="the text of each image with images: placeholder; {name} is the image "
        "file's name (so a text model can tell images apart)",
    )

    concurrency: int = Field(default=8, ge=1, le=256, description="requests in flight at most")
    timeout: float = Field(default=120.0, gt=0, le=86_400, description="seconds per request")
    retries: int = Field(default=4, ge=0, le=20, description="retries of a failed request")
    backoff: float = Field(
        default=0.5, ge=0, le=600, description="first retry delay, doubled each time"
    )
    api_key_env: str | None = Field(
        default=None, description="environment variable holding the API key (Bearer token)"
    )
    other_model: Literal["warn", "refuse"] = Field(
        default="warn",
        description="an answer that names another model than the one asked for: warn (once "
        "per name) and record it in results.json (adapter.served_models), or refuse it",
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        shown = redacted_url(value)
        if any(not ch.isprintable() or ch.isspace() for ch in value):
            raise ValueError(
                f"base_url {shown} holds a space or a control character; give the API root "
                "as one URL, e.g. http://127.0.0.1:8000/v1"
            )
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 (a port out of range or not a number raises here)
        except ValueError as exc:
            raise ValueError(f"base_url {shown} is not a valid URL ({exc})") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"base_url {shown} is not an http(s) URL; give the API root, e.g. "
                "http://127.0.0.1:8000/v1"
            )
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(
                f"base_url {shown} must not carry a query, fragment or credentials "
                "(put the key in the variable named by api_key_env)"
            )
        return value.rstrip("/")


def redacted_url(value: str) -> str:
    """``value`` quoted for a message with anything secret in it hidden: the user name and
    password (``http://***@host``) and the query (``?***``), which may hold an API key."""
    text = str(value)
    scheme, separator, rest = text.partition("://")
    if separator:
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            authority = "***@" + authority.rpartition("@")[2]
        text = f"{scheme}://{authority}{slash}{path}"
    if "?" in text:
        text = text.split("?", 1)[0] + "?***"
    return excerpt(text)


#: The largest answer read from a server: prompt log-probabilities of a 100,000-token prompt
#: take about 10 MiB; a server that sends more is refused instead of filling the memory.
MAX_RESPONSE_BYTES = 64 * MiB
_CHUNK = 1 << 16


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects would send the request (and its key) elsewhere than base_url: refuse them."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        raise urllib.error.HTTPError(
            req.full_url, code, f"redirect to {newurl} refused", headers, fp
        )


class _Slow(Exception):
    """The answer took longer than the request's timeout (a retryable failure)."""


class _Deadline:
    """One request's whole deadline: connecting, the status line and headers, and the body.

    A socket timeout bounds each wait for a byte, not the request: a server that sends its
    headers one byte every 0.5 s would never trip a timeout of 3 s. At the deadline a timer
    shuts the request's sockets down, which ends any read blocked on them.
    """

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def watch(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)
        return sock

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def handlers(self) -> list[urllib.request.BaseHandler]:
        """urllib handlers whose connections register their sockets with this deadline."""
        deadline = self

        def watched(base: type[http.client.HTTPConnection]) -> Any:
            class Connection(base):  # type: ignore[valid-type, misc]
                def __init__(self, *args: Any, **kwargs: Any) -> None:
                    super().__init__(*args, **kwargs)
                    self._create_connection = lambda *a, **k: deadline.watch(
                        socket.create_connection(*a, **k)
                    )

            return Connection

        plain, secure = watched(http.client.HTTPConnection), watched(http.client.HTTPSConnection)

        class Plain(urllib.request.HTTPHandler):
            def http_open(self, req: Any) -> Any:
                return self.do_open(plain, req)

        class Secure(urllib.request.HTTPSHandler):
            def https_open(self, req: Any) -> Any:
                return self.do_open(secure, req, context=self._context)  # type: ignore[attr-defined]

        return [Plain(), Secure()]


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _CutShort(Exception):
    """The connection closed before the answer's declared length arrived (a server that stopped
    or restarted mid-answer: a retryable failure, not a malformed answer)."""


def _api_key(variable: str) -> str:
    """The key in the environment variable ``variable``: set, and a header can hold it."""
    key = os.environ.get(variable)
    if not key:
        raise InputError(
            f"api_key_env names {variable!r}, but that environment variable is not set"
        )
    if not all(ch.isascii() and ch.isprintable() and not ch.isspace() for ch in key):
        raise InputError(
            f"the API key in the environment variable {variable!r} holds a space, a control "
            "character (a newline?) or a non-ASCII character, which no HTTP header can carry; "
            "set it to the key alone"
        )
    return key


class ServerClient:
    """POSTs JSON to one server: bounded timeouts, retries with backoff, no proxy, no redirect,
    answers of at most :data:`MAX_RESPONSE_BYTES`, read within the timeout."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        #: the model names the server's answers gave other than the one asked for
        self.served_models: set[str] = set()
        self._served_lock = threading.Lock()
        self._headers = {"Content-Type": "application/json"}
        if options.api_key_env:
            self._headers["Authorization"] = f"Bearer {_api_key(options.api_key_env)}"

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.options.base_url}/{path}"
        data = json.dumps(body).encode()
        problem = ""
        attempts = self.options.retries + 1
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.options.backoff * 2 ** (attempt - 1))
            deadline = _Deadline(self.options.timeout)
            with deadline:  # the whole attempt: connect, headers, body, an error's body
                raw, problem = self._attempt(url, data, deadline)
            if raw is not None:
                payload = _json_object(raw, url)
                self._check_model(payload, url)
                return payload
        raise AdapterError(
            f"server {excerpt(url)} did not answer after {attempts} attempt"
            f"{'s' if attempts > 1 else ''} ({problem}); is it running at that address?"
        )

    def _attempt(self, url: str, data: bytes, deadline: _Deadline) -> tuple[bytes | None, str]:
        """(the answer's bytes, "") of one attempt, or (None, why it may be retried)."""
        request = urllib.request.Request(url, data=data, headers=self._headers, method="POST")
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), _NoRedirect(), *deadline.handlers()
        )
        slow = f"no complete answer within the timeout of {self.options.timeout:g} s"
        try:
            with opener.open(request, timeout=self.options.timeout) as response:
                return self._read(response, url, deadline), ""
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                where = exc.headers.get("Location", "") if exc.headers else ""
                raise AdapterError(
                    f"server {excerpt(url)} redirects (HTTP {exc.code}) to {excerpt(where)}; "
                    "the redirect is refused (requests go to base_url only): give the final "
                    "address as base_url"
                ) from None
            problem = f"HTTP {exc.code}: {_error_detail(exc)}"
            if deadline.expired:  # the error's body trickled past the deadline
                return None, slow
            if exc.code == 429 or exc.code >= 500:
                return None, problem
            raise AdapterError(f"server {excerpt(url)} refused the request ({problem})") from None
        except _Slow:
            return None, slow
        except _CutShort as exc:
            return None, slow if deadline.expired else str(exc)
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            return None, slow if deadline.expired else excerpt(
                str(getattr(exc, "reason", exc)), 200
            )
        except http.client.HTTPException as exc:  # a broken status line or headers
            why = excerpt(str(exc) or type(exc).__name__)
            return None, slow if deadline.expired else f"not an HTTP answer ({why})"

    def _check_model(self, payload: dict[str, Any], url: str) -> None:
        """An answer naming another model than the one asked for is refused, or warned about
        once per name and recorded (``served_models``), as the option ``other_model`` says."""
        served = payload.get("model")
        if served is None or served == self.options.model:
            return
        if not isinstance(served, str) or not served or len(served) > 1000:
            raise AdapterError(
                f"server {excerpt(url)} answered with model {excerpt(served)}, which is no "
                "model name"
            )
        message = (
            f"server {excerpt(url)} answered as model {excerpt(served)}, not the requested "
            f"{excerpt(self.options.model)}"
        )
        if self.options.other_model == "refuse":
            raise AdapterError(
                f"{message}; give the served model's name as model (see /v1/models), or set "
                "the adapter option other_model: warn to accept such answers"
            )
        with self._served_lock:
            new = served not in self.served_models
            self.served_models.add(served)
        if new:
            warnings.warn(
                f"{message}; its answers are used and results.json records the name "
                "(adapter.served_models); set other_model: refuse to stop instead",
                PosdebiasPluginWarning,
                stacklevel=2,
            )

    def _read(self, response: Any, url: str, watch: _Deadline) -> bytes:
        """The answer's bytes, refused beyond :data:`MAX_RESPONSE_BYTES` and read within the
        request's deadline (a server that trickles bytes would otherwise never time out)."""
        deadline = watch.end
        declared = _declared_length(response)
        if declared is not None and declared > MAX_RESPONSE_BYTES:
            raise _too_large(url)
        chunks, size = [], 0
        while chunk := response.read1(_CHUNK):  # what has arrived: a deadline can cut in
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise _too_large(url)
            if time.monotonic() > deadline:
                raise _Slow
            chunks.append(chunk)
        if watch.expired:  # the deadline shut the socket: what arrived is not the answer
            raise _Slow
        if declared is not None and size < declared:
            raise _CutShort(f"the answer was cut off after {size} of {declared} bytes")
        return b"".join(chunks)


def _declared_length(response: Any) -> int | None:
    """The answer's ``Content-Length`` as a number of bytes, or None where it is absent or not
    a plain ASCII number (then the body's own end counts; the size cap still holds)."""
    declared = response.headers.get("Content-Length") if response.headers else None
    if declared is None or not re.fullmatch(r"[0-9]{1,20}", declared.strip()):
        return None
    return int(declared)


def _too_large(url: str) -> AdapterError:
    return AdapterError(
        f"server {excerpt(url)} sent an answer of more than {MAX_RESPONSE_BYTES // MiB} MiB; "
        "posdebias stops reading there (is base_url the API root of an OpenAI-compatible "
        "server?)"
    )


def _json_object(raw: bytes, url: str) -> dict[str, Any]:
    try:
        payload = loads_json(raw.decode("utf-8"))
    except RecursionError:
        raise AdapterError(f"server {excerpt(url)} answered with JSON nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise AdapterError(f"server {excerpt(url)} answered with no JSON") from None
    except ValueError as exc:  # NaN, Infinity, 1e999, an integer of 5,000 digits
        raise AdapterError(
            f"server {excerpt(url)} answered with JSON posdebias cannot use: "
            f"{excerpt(str(exc), 120)}"
        ) from None
    if not isinstance(payload, dict):
        raise AdapterError(f"server {excerpt(url)} answered {excerpt(payload)}, no object")
    return payload


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read(64 * 1024).decode("utf-8", errors="replace")
    except Exception:  # the body is only a courtesy
        text = ""
    try:
        message = json.loads(text).get("error", {})
        text = message.get("message", text) if isinstance(message, dict) else str(message)
    except (ValueError, AttributeError, RecursionError):
        pass
    return excerpt(text or exc.reason, 300)


# -- what a server answers, checked before any number is used ----------------------------------

#: A log-probability may exceed 0 by float rounding at most this much (it is then 0).
_ROUNDING = 1e-4


def _logprob(value: float) -> float:
    if not math.isfinite(value) or value > _ROUNDING:
        raise ValueError(f"a log-probability must be a finite number <= 0, got {value!r}")
    if value < -MAX_FILE_MAGNITUDE:  # finite, but a reply's sum of such scores is not
        raise ValueError(
            f"a log-probability must be at least {-MAX_FILE_MAGNITUDE:g} (sums of scores stay "
            f"finite), got {value!r}"
        )
    return min(value, 0.0)


LogProb = Annotated[float, AfterValidator(_logprob)]
Count = Annotated[int, Field(strict=True, ge=0, le=10**9)]


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Usage(_Answer):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None


class _PromptToken(_Answer):
    logprob: LogProb
    decoded_token: str | None = None


class _PromptScores(_Answer):
    """vLLM's ``prompt_logprobs`` on /chat/completions: one {token id: entry} per prompt token
    (None for the first), the scored token only."""

    prompt_logprobs: list[dict[str, _PromptToken] | None] = Field(min_length=1)
    usage: _Usage


class _CompletionLogprobs(_Answer):
    tokens: list[str] | None = None
    token_logprobs: list[LogProb | None] | None = None
    top_logprobs: list[dict[str, LogProb] | None] | None = None


class _TopEntry(_Answer):
    token: str
    logprob: LogProb


class _ContentEntry(_Answer):
    top_logprobs: list[_TopEntry] = Field(default_factory=list)


class _ChatLogprobs(_Answer):
    content: list[_ContentEntry] | None = None


class _Message(_Answer):
    content: str | None = None


class _Choice(_Answer):
    index: Count = 0


class _ChatChoice(_Choice):
    message: _Message | None = None
    logprobs: _ChatLogprobs | None = None


class _CompletionChoice(_Choice):
    text: str | None = None
    logprobs: _CompletionLogprobs | None = None


class _ChatAnswer(_Answer):
    choices: list[_ChatChoice] = Field(min_length=1)
    usage: _Usage | None = None


class _CompletionAnswer(_Answer):
    choices: list[_CompletionChoice] = Field(min_length=1)
    usage: _Usage | None = None


_Parsed = TypeVar("_Parsed", bound=_Answer)


def _parse(model: type[_Parsed], payload: dict[str, Any], base_url: str, what: str) -> _Parsed:
    """``payload`` read as ``model``; an answer with a wrong type, a missing field or an
    impossible number (NaN, a positive log-probability) is an :class:`AdapterError` naming
    the first problems, never a crash or a wrong score."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        # pydantic names our private models ("... or instance of _ChatChoice"): not the user's
        problems = [re.sub(r" or instance of _\w+", "", p) for p in validation_problems(exc)]
        raise AdapterError(
            f"server {excerpt(base_url)} sent {what} posdebias cannot use: "
            + "; ".join(problems[:3])
            + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
        ) from None


TokenScores = list[tuple[str, float]]  # (token text, log-probability) of appended tokens


class ServerAdapter(Adapter):
    """Label scores (and generated texts) from an OpenAI-compatible server; see the module doc."""

    name: ClassVar[str] = "openai"
    Options = ServerOptions
    provides_attention: ClassVar[bool] = False
    image_options: ClassVar[tuple[str, ...]] = ("images", "image_placeholder")
    no_attention_reason: ClassVar[str] = NO_ATTENTION
    summary: ClassVar[str] = "a model behind an OpenAI-compatible server (vLLM, SGLang, ...)"

    def __init__(self, **options: Any) -> None:
        self.options: ServerOptions = self.parse_options(options)  # type: ignore[assignment]
        opts = self.options
        self.label_set = opts.label_set
        self.prompt_variant = opts.prompt_variant
        #: every task's template as configured, and under the prompt variant
        self.base_task_templates, self.task_templates = opts.templates()
        # a tie label that is also an answer's label: refused now, not at the first request
        scored_labels(
            "pairwise_judge",
            self.task_templates["pairwise_judge"],
            self.labels_for(2, "pairwise_judge"),
        )
        self.client = ServerClient(opts)
        self.tokenizer = _local_tokenizer(opts.tokenizer) if opts.tokenizer else None
        #: the model's special tokens, which no question or option may hold (known from the
        #: local tokenizer only: a server's own tokenizer is not visible)
        self.control_tokens = control_tokens(self.tokenizer) if self.tokenizer else None
        check_template_control_tokens(
            self.base_task_templates,
            self.control_tokens,
            opts.model,
            [("answer_prefix", opts.answer_prefix)]
            + (
                [("image_placeholder", opts.image_placeholder)]
                if opts.images == "placeholder"
                else []
            ),
            opts.label_set,
        )
        if self.control_tokens is not None:  # the prompt's end, the prefix and each label
            # the retrieval prompt's images render locally only as placeholders
            posed = self.task_templates if opts.images == "placeholder" else TEXT_TASKS
            check_answer_joins(
                neutral_prompts(posed, self.render, self.labels_for),
                opts.answer_prefix,
                self.control_tokens,
                opts.model,
            )
        if opts.endpoint == "completions" and self.tokenizer is None:
            raise InputError(
                "endpoint completions sends a rendered prompt, so it needs the option tokenizer "
                "(a local folder with the model's tokenizer and chat template); or use "
                "endpoint chat, where the server renders the chat template"
            )
        end = opts.end_token
        if end is None and self.tokenizer is not None:
            end = self.tokenizer.eos_token
        self.end_text: str | None = end

    @classmethod
    def create(cls, **options: Any) -> ServerAdapter:
        return cls(**options)

    @property
    def num_layers(self) -> None:
        return None

    # -- prompts ---------------------------------------------------------------------------

    def check_instances(self, instances: Sequence[Instance]) -> None:
        templates = [text for _, text in template_fields(self.task_templates)]
        if self.options.images == "placeholder":
            templates.append(self.options.image_placeholder)
        for instance in instances:
            check_instance_prompts(
                self,
                instance,
                self.options.model,
                self._checked_text,
                self._placeholders(instance),
                template_texts=templates,
            )

    def _placeholders(self, instance: Instance) -> list[tuple[str, str]]:
        """(where, text) of each image's placeholder text with images: placeholder (it shows
        the image's file name, which is data like a caption); none when images are sent."""
        if self.options.images != "placeholder":
            return []
        return [
            (f"image {number}'s placeholder text", self._placeholder(image))
            for number, image in enumerate(instance.all_images, start=1)
        ]

    def _placeholder(self, image: Any) -> str:
        return self.options.image_placeholder.replace("{name}", _name(image))

    def messages(
        self,
        instance: Instance,
        *,
        variant: str | None = None,
    ) -> list:
        """OpenAI chat messages of one instance (any task): the template's text and image
        items, images as base64 PNG ``image_url`` parts (or the placeholder text); adjacent
        texts joined, a text-only content as one string (the prompt the Hugging Face adapters
        render, whatever separator the server would join a list's items with). ``variant``:
        a prompt variant of the configured templates, as the Hugging Face adapters pose it."""
        if self.control_tokens is not None:  # before any image is read and encoded
            self._checked_text(instance, variant)
        return joined_text_messages(self._posed(instance, variant))

    def _posed(
        self,
        instance: Instance,
        variant: str | None = None,
        *,
        encode: bool = True,
        names: bool = True,
    ) -> list:
        """The messages before joining, each field checked for special tokens; ``encode=False``
        leaves images sent as content unread, ``names=False`` shows ``x`` for file names."""
        raw = posed_messages(
            self,
            instance,
            self.options.model,
            variant=variant,
            shown=self._placeholders(instance),
        )
        return self._with_images(raw, instance, names=names, encode=encode)

    def _checked_text(
        self,
        instance: Instance,
        variant: str | None = None,
    ) -> str:
        """The prompt's text as the local tokenizer's chat template writes it (images as the
        template's image items, or the placeholder text), refused if the data complete one of
        the model's special tokens where fields meet (:func:`refuse_joined_control_tokens`,
        against the same prompt with neutral data and file names). Called only where the
        local tokenizer's special tokens are known (``control_tokens``)."""

        def text(shown: Instance, names: bool) -> str:
            messages = joined_text_messages(self._posed(shown, variant, encode=False, names=names))
            try:
                return self._chat_text(messages)
            except AdapterError:  # a template that cannot show image items: the texts, joined
                return "".join(message_texts(messages))

        rendered = text(instance, names=True)
        neutral = text(neutral_instance(instance), names=False)
        refuse_joined_control_tokens(
            f"instance {excerpt(instance.id)}",
            rendered,
            neutral,
            self.control_tokens,
            self.options.model,
        )
        return rendered

    def _with_images(
        self, raw: list[dict], instance: Instance, *, names: bool, encode: bool
    ) -> list:
        """``raw`` with each image item as a base64 PNG ``image_url`` part (left as it is
        without ``encode``), or the placeholder text (showing the image's file name, or ``x``
        without ``names``)."""
        images = iter(instance.all_images)

        def part(item: dict) -> dict:
            if item["type"] != "image":
                return item
            if self.options.images == "placeholder":
                image = next(images)
                return {"type": "text", "text": self._placeholder(image if names else "x")}
            if encode:
                url = _data_url(next(images), instance.id)
                return {"type": "image_url", "image_url": {"url": url}}
            return item

        return [
            message
            if isinstance(content := message["content"], str)
            else {**message, "content": [part(item) for item in content]}
            for message in raw
        ]

    def render(
        self,
        instance: Instance,
        *,
        variant: str | None = None,
    ) -> str:
        """The completion prompt: the local tokenizer's chat template + generation prompt."""
        if instance.all_images and self.options.images == "content":
            raise InputError(
                "endpoint completions takes text only and these instances show images; use "
                "endpoint chat (images as content parts) or images: placeholder"
            )
        return self._chat_text(self.messages(instance, variant=variant))

    def _chat_text(self, messages: list) -> str:
        """The local tokenizer's chat template of ``messages`` with its generation prompt."""
        assert self.tokenizer is not None  # its callers run with a local tokenizer only
        try:
            return str(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=False
                )
            )
        except Exception as exc:  # jinja errors come in many types
            raise AdapterError(f"the local chat template cannot render the prompt: {exc}") from exc

    # -- label scores ----------------------------------------------------------------------

    def observe_many(
        self, instances: Sequence[Instance], *, batch_size: int = 1
    ) -> list[Observation]:
        """Observations in order; every request of every instance shares one bounded pool, so
        ``batch_size`` does not change results (nor, much, the speed)."""
        for instance in instances:
            check_candidate_count(instance.n, get_label_set(self.label_set_for(instance.task)))
        with ThreadPoolExecutor(max_workers=self.options.concurrency) as pool:
            if self.options.scoring == "top_logprobs":
                rows = list(pool.map(self._top_k_scores, instances))
            else:
                rows = self._echo_scores_all(instances, pool)
        if instances:
            self._last_n, self._last_task = instances[-1].n, instances[-1].task
        return [_observation(row, instance) for row, instance in zip(rows, instances, strict=True)]

    def _echo_scores_all(self, instances: Sequence[Instance], pool: Any) -> list[Any]:
        """Each prompt alone (its token count), then every label after it, then the end token
        after the labels that another label continues; the restricted softmax per instance."""
        # each instance's labels before its context, which reads its images: labels refused first
        prepared = [(self.scored_answers(i), self._context(i)) for i in instances]
        bases = list(pool.map(lambda item: self._score_prompt(item[1]), prepared))
        jobs = [(i, label) for i, (labels, _) in enumerate(prepared) for label in labels]

        def continuation(job: tuple[int, str], with_end: bool = False) -> TokenScores:
            index, label = job
            answer = label + ((self.end_text or "") if with_end else "")
            return self._continuation(prepared[index][1], bases[index], answer)

        first = list(pool.map(continuation, jobs))
        scored: list[dict[str, TokenScores]] = [{} for _ in instances]
        for (index, label), tokens in zip(jobs, first, strict=True):
            scored[index][label] = tokens
        plans = [self._plan(labels, scored[i]) for i, (labels, _) in enumerate(prepared)]
        ending = [
            (index, label)
            for index, (labels, _) in enumerate(prepared)
            for label, path in zip(labels, plans[index][0].paths, strict=True)
            if len(path) > len(scored[index][label])
        ]
        ended = list(pool.map(lambda job: continuation(job, with_end=True), ending))
        for (index, label), tokens in zip(ending, ended, strict=True):
            scored[index][label] = tokens
        return [
            _restricted_from_paths(plan, vocabulary, [scored[i][label] for label in labels])
            for i, ((labels, _), (plan, vocabulary)) in enumerate(zip(prepared, plans, strict=True))
        ]

    def scored_answers(self, instance: Instance) -> list[str]:
        """The answers scored for ``instance`` as the model writes them (answer prefix + label):
        its N labels, then a judge's tie label (as the local adapters score it)."""
        labels = self.labels_for(instance.n, instance.task)
        template = self.task_templates.get(instance.task or "")
        return [
            self.options.answer_prefix + label
            for label in scored_labels(instance.task, template, labels)
        ]

    def _context(self, instance: Instance, variant: str | None = None) -> Any:
        """What a request poses ``instance`` with: its chat messages (endpoint chat), or the
        prompt the local chat template renders (endpoint completions)."""
        if self.options.endpoint == "chat":
            return self.messages(instance, variant=variant)
        return self.render(instance, variant=variant)

    def _post(self, context: Any, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with ``context`` (messages or a prompt) POSTed to the endpoint's path."""
        if self.options.endpoint == "chat":
            return self.client.post("chat/completions", {**body, "messages": context})
        return self.client.post("completions", {**body, "prompt": context})

    def _plan(self, labels: list[str], scored: dict[str, TokenScores]) -> tuple[Any, dict]:
        """The label trie over token texts (numbered in first-seen order)."""
        vocabulary: dict[str, int] = {}
        tokens = [
            [vocabulary.setdefault(text, len(vocabulary)) for text, _ in scored[label]]
            for label in labels
        ]
        end = None
        if self.end_text is not None:
            end = vocabulary.setdefault(self.end_text, len(vocabulary))
        try:
            plan = plan_labels(tokens, end, labels)
        except AdapterError as exc:
            if self.end_text is None and "end-of-answer" in str(exc):
                raise AdapterError(
                    "a label is a prefix of another (e.g. '1' and '10'), so the end-of-answer "
                    "token must be scored after it: set the adapter option end_token (e.g. "
                    "'<|im_end|>') or tokenizer (a local folder; its eos token is used)"
                ) from None
            raise
        return plan, vocabulary

    def _request(self, context: Any, answer: str | None) -> tuple[list[str], list[float | None]]:
        """The server's tokens and their log-probabilities for the prompt (+ ``answer``)."""
        opts = self.options
        body: dict[str, Any] = {"model": opts.model, "max_tokens": 1, "temperature": 0}
        texts: list[str]
        numbers: list[float | None]
        if opts.endpoint == "completions":
            payload = self._post(context + (answer or ""), {**body, "echo": True, "logprobs": 0})
            completion = _parse(_CompletionAnswer, payload, opts.base_url, "a completion")
            logprobs = completion.choices[0].logprobs
            if logprobs is None or logprobs.tokens is None:
                raise AdapterError(_no_logprobs(opts.base_url, "completions"))
            texts, numbers = list(logprobs.tokens), list(logprobs.token_logprobs or [])
            if len(numbers) != len(texts):
                raise AdapterError(
                    f"server {excerpt(opts.base_url)} sent {len(texts)} prompt tokens but "
                    f"{len(numbers)} log-probabilities for them"
                )
            usage = completion.usage
        else:
            if answer is None:
                body.update(add_generation_prompt=True)
            else:
                context = [*context, {"role": "assistant", "content": answer}]
                body.update(add_generation_prompt=False, continue_final_message=True)
            payload = self._post(context, {**body, "prompt_logprobs": 0})
            if not payload.get("prompt_logprobs"):
                raise AdapterError(_no_logprobs(opts.base_url, "chat"))
            scores = _parse(_PromptScores, payload, opts.base_url, "prompt log-probabilities")
            texts, numbers = [], []
            for entry in scores.prompt_logprobs:
                if entry is None:
                    texts.append("")
                    numbers.append(None)
                    continue
                if len(entry) != 1:
                    raise AdapterError(_no_logprobs(opts.base_url, "chat"))
                (value,) = entry.values()
                texts.append(value.decoded_token or "")
                numbers.append(value.logprob)
            usage = scores.usage
        count = None if usage is None else usage.prompt_tokens
        if count is None:
            raise AdapterError(
                f"server {excerpt(opts.base_url)}'s answer has no usage.prompt_tokens "
                "(the number of the prompt's tokens)"
            )
        if not 0 < count <= len(texts):
            raise AdapterError(
                f"server {excerpt(opts.base_url)} says the prompt has {count} tokens but scored "
                f"{len(texts)}; its answer does not describe this prompt"
            )
        return texts[:count], numbers[:count]

    def _score_prompt(self, context: Any) -> list[str]:
        """The prompt's tokens as the server splits them (the answer's tokens follow them)."""
        return self._request(context, None)[0]

    def _continuation(self, context: Any, base: list[str], answer: str) -> TokenScores:
        """(token, log-probability) of each token the server appends for ``answer``."""
        texts, values = self._request(context, answer)
        if len(texts) <= len(base) or texts[1 : len(base)] != base[1:]:
            raise AdapterError(
                f"the server's tokens of the prompt change when the answer {answer!r} follows "
                "it: the tokenizer merges across the boundary (set answer_prefix, e.g. ' ', or "
                "use another label set), or the chat template renders a final assistant turn "
                "otherwise than its generation prompt, e.g. without an empty thinking block "
                "(use endpoint completions with the option tokenizer)"
            )
        appended: TokenScores = []
        for text, value in zip(texts[len(base) :], values[len(base) :], strict=True):
            if value is None:
                raise AdapterError(_no_logprobs(self.options.base_url, self.options.endpoint))
            appended.append((text, value))
        return appended

    def _top_k_scores(self, instance: Instance) -> Any:
        """The restricted softmax over the labels' entries of the first token's top k."""
        labels = self.scored_answers(instance)
        k = self.options.top_logprobs
        url = self.options.base_url
        top: dict[str, float] = {}
        chat = self.options.endpoint == "chat"
        asked = {"logprobs": True, "top_logprobs": k} if chat else {"logprobs": k}
        body = {"model": self.options.model, "max_tokens": 1, "temperature": 0, **asked}
        payload = self._post(self._context(instance), body)
        if chat:
            logprobs = _parse(_ChatAnswer, payload, url, "a chat answer").choices[0].logprobs
            if logprobs is None or not logprobs.content:
                raise AdapterError(_no_logprobs(url, "chat"))
            for entry in logprobs.content[0].top_logprobs:  # best first: a repeat keeps it
                top.setdefault(entry.token, entry.logprob)
        else:
            completion = _parse(_CompletionAnswer, payload, url, "a completion").choices[0]
            first = completion.logprobs.top_logprobs if completion.logprobs else None
            if not first or first[0] is None:
                raise AdapterError(_no_logprobs(url, "completions"))
            top = dict(first[0])
        missing = [label for label in labels if label not in top]
        if missing:
            raise AdapterError(
                f"label {missing[0]!r} is not among the top {k} log-probabilities the server "
                f"returned for instance {excerpt(instance.id)} (it returned "
                f"{excerpt(sorted(top), 200)}); its probability is unknown, not zero. Raise "
                "top_logprobs, or use scoring echo on a server that scores prompts (vLLM); "
                "labels of several tokens always need scoring echo"
            )
        return log_softmax(np.array([top[label] for label in labels], dtype=np.float64))

    # -- cloze: a text scored as the reply -------------------------------------------------

    def reply_problem(self) -> str | None:
        if self.options.scoring == "echo":
            return None
        return (
            "adapter 'openai' with scoring top_logprobs cannot score a text as the model's reply "
            "(it reads the first answer token's top k only); use scoring echo on a server that "
            "scores prompts (vLLM)"
        )

    def _reply_context(self, message: str) -> Any:
        """The request context of a user message alone: the messages, or the local chat
        template's prompt (endpoint completions)."""
        messages = [{"role": "user", "content": message}]
        return messages if self.options.endpoint == "chat" else self._chat_text(messages)

    def check_replies(self, requests: Sequence[ReplyRequest]) -> None:
        if self.tokenizer is None:  # no local tokenizer: no special tokens known to check
            return

        def text(message: str, reply: str) -> str:
            prompt = self._chat_text([{"role": "user", "content": message}])
            return prompt + self.options.answer_prefix + reply

        neutral = text("x", "x")
        for request in requests:
            refuse_joined_control_tokens(
                f"instance {excerpt(request.source)} (cloze)",
                text(request.message, request.reply),
                neutral,
                self.control_tokens,
                self.options.model,
            )

    def score_replies(
        self, requests: Sequence[ReplyRequest], *, batch_size: int = 1
    ) -> list[ReplyScore]:
        """Each reply's tokens as the server appends them to the message's prompt (scoring
        echo), their log-probabilities summed; one request per distinct message, one per
        reply, all in one bounded pool (``batch_size`` changes nothing)."""
        problem = self.reply_problem()
        if problem is not None:
            raise AdapterError(problem)
        self.check_replies(requests)
        messages = list(dict.fromkeys(request.message for request in requests))
        contexts = {message: self._reply_context(message) for message in messages}
        with ThreadPoolExecutor(max_workers=self.options.concurrency) as pool:
            prompts = list(pool.map(lambda m: self._score_prompt(contexts[m]), messages))
            bases = dict(zip(messages, prompts, strict=True))

            def appended(request: ReplyRequest) -> TokenScores:
                answer = self.options.answer_prefix + request.reply
                context = contexts[request.message]
                return self._continuation(context, bases[request.message], answer)

            scored = list(pool.map(appended, requests))
        return [
            ReplyScore(
                logprob=float(sum(value for _, value in tokens)),
                tokens=len(tokens),
                characters=len(request.reply),
            )
            for request, tokens in zip(requests, scored, strict=True)
        ]

    # -- generation ------------------------------------------------------------------------

    def generate_many(
        self,
        instances: Sequence[Instance],
        settings: GenerationSettings,
        *,
        batch_size: int = 1,
        seeds: Sequence[int] | None = None,
    ) -> list[Generation]:
        """Generated texts from the server; samples of one instance are one request with ``n``
        and a seed from (instance seed, 0), so texts do not depend on the batch size where the
        server honours seeds (vLLM does)."""
        if settings.sofa is not None:
            raise AdapterError(
                f"SoFA changes the model's attention mask, which {NO_ATTENTION}; run it through "
                "a Hugging Face adapter"
            )
        seeds = list(range(len(instances))) if seeds is None else list(seeds)
        if len(seeds) != len(instances):
            raise InputError(f"{len(seeds)} seeds for {len(instances)} instances")

        def one(job: tuple[Instance, int]) -> Generation:
            return self._generate_one(job[0], settings, job[1])

        with ThreadPoolExecutor(max_workers=self.options.concurrency) as pool:
            return list(pool.map(one, zip(instances, seeds, strict=True)))

    def _generate_one(
        self,
        instance: Instance,
        settings: GenerationSettings,
        seed: int,
    ) -> Generation:
        check_candidate_count(instance.n, get_label_set(self.label_set_for(instance.task)))
        started = time.perf_counter()
        body: dict[str, Any] = {
            "model": self.options.model,
            "max_tokens": settings.max_new_tokens,
            "n": settings.num_samples,
            "temperature": settings.temperature if settings.do_sample else 0,
            "seed": sample_seed(seed, 0) & 0x7FFFFFFF,
        }
        if settings.stop:
            body["stop"] = list(settings.stop)
        if settings.do_sample and settings.top_k is not None:
            body["top_k"] = settings.top_k
        if not settings.stop_at_eos:
            body["ignore_eos"] = True
        payload = self._post(self._context(instance, settings.prompt_variant), body)
        url = self.options.base_url
        answer: _ChatAnswer | _CompletionAnswer
        if self.options.endpoint == "chat":
            answer = _parse(_ChatAnswer, payload, url, "generated texts")
            texts = {c.index: (c.message.content if c.message else None) for c in answer.choices}
        else:
            answer = _parse(_CompletionAnswer, payload, url, "generated texts")
            texts = {c.index: c.text for c in answer.choices}
        wanted = list(range(settings.num_samples))
        if len(answer.choices) != settings.num_samples or sorted(texts) != wanted:
            raise AdapterError(
                f"server {excerpt(url)} returned {len(answer.choices)} choices (indices "
                f"{excerpt(sorted(texts))}), asked for {settings.num_samples}"
            )
        usage = answer.usage or _Usage()
        generated = usage.completion_tokens or 0
        return Generation(
            texts=[texts[index] or "" for index in range(settings.num_samples)],
            generated_tokens=generated,
            forward_passes=max(1, generated // max(1, settings.num_samples)),
            prompt_tokens=usage.prompt_tokens or 0,
            seconds=time.perf_counter() - started,
        )

    def describe(self, n: int | None = None) -> dict[str, Any]:
        opts = self.options
        return {
            "adapter": self.name,
            "model_id": opts.model,
            "base_url": opts.base_url,
            "endpoint": opts.endpoint,
            "scoring": opts.scoring,
            "images": opts.images,
            "label_set": self.label_set,
            "labels": None if n is None else self.labels_for(n),
            "prompt_hash": self.task_templates["retrieval"].digest(),
            "prompt": self.task_templates["retrieval"].recorded(),
            "prompt_variant": opts.prompt_variant,
            "answer_prefix": opts.answer_prefix,
            "end_token": self.end_text,
            **(
                {"served_models": sorted(self.client.served_models)}
                if self.client.served_models
                else {}
            ),
        }


def _local_tokenizer(folder: str) -> Any:
    path = Path(os.path.expanduser(folder))
    if not path.is_dir():
        raise InputError(f"tokenizer folder {excerpt(folder)} does not exist")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # a broken folder: many error types
        raise InputError(f"cannot load the tokenizer in {excerpt(folder)}: {exc}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"the tokenizer in {excerpt(folder)} has no chat template")
    return tokenizer


def _name(reference: Any) -> str:
    """An image's file name (the text a placeholder shows for it)."""
    if isinstance(reference, (str, Path)):
        return Path(reference).name
    return getattr(reference, "filename", "") or "image"


def _data_url(reference: Any, instance_id: str) -> str:
    """A base64 PNG data URL of an image file or PIL image (read as the local adapters do)."""
    buffer = io.BytesIO()
    load_image(reference, instance_id).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _no_logprobs(base_url: str, endpoint: str) -> str:
    how = (
        "echo with logprobs on /completions"
        if endpoint == "completions"
        else "prompt_logprobs with continue_final_message on /chat/completions (vLLM)"
    )
    return (
        f"server {excerpt(base_url)} returned no log-probabilities for the prompt's tokens; "
        f"exact label scores need {how}. Use another endpoint, or scoring top_logprobs where the "
        "server offers only the top k of the first answer token"
    )


def _observation(scores: np.ndarray, instance: Instance) -> Observation:
    """An instance's observation from its restricted label scores (a judge's tie the last)."""
    answers, tie = split_tie(scores, instance.n)
    return Observation(label_logprobs=answers, target=instance.target, tie_logprob=tie)


def _restricted_from_paths(plan: Any, vocabulary: dict[str, int], paths: list[TokenScores]) -> Any:
    """[N] restricted scores from each path's per-token log-probabilities (scoring.py's
    ``restricted_scores`` on a logit table holding only the tokens the labels use)."""
    import torch

    size = len(vocabulary)
    tables: dict[tuple[int, ...], Any] = {}
    for path, scored in zip(plan.paths, paths, strict=True):
        for depth, ((_, value), token) in enumerate(zip(scored, path, strict=True)):
            prefix = path[:depth]
            if len(plan.options[prefix]) < 2:
                continue
            table = tables.setdefault(prefix, torch.full((1, size), -math.inf, dtype=torch.float64))
            table[0, token] = value
    tables.setdefault((), torch.zeros((1, size), dtype=torch.float64))
    scores = restricted_scores(plan, {p: t.to(torch.float32) for p, t in tables.items()})
    return scores[0].double().numpy()


posdebias_register_adapters = register_hook(ServerAdapter)
