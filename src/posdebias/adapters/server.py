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
import io
import json
import math
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal
from urllib.parse import urlsplit

import numpy as np
from pydantic import Field, field_validator

from posdebias._images import open_image
from posdebias._inputs import excerpt
from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter, AdapterOptions, Generation, sample_seed
from posdebias.adapters.hf.prompt import (
    PROMPT_VARIANTS,
    PromptTemplate,
    coerce_prompt,
    instance_messages,
    variant_prompts,
)
from posdebias.adapters.hf.scoring import plan_labels, restricted_scores
from posdebias.core.instance import RetrievalInstance
from posdebias.core.labels import check_candidate_count, get_label_set
from posdebias.core.observation import Observation, log_softmax
from posdebias.core.tasks import (
    DEFAULT_TEMPLATES,
    TaskTemplate,
    joined_text_messages,
    task_template,
    task_variant,
)
from posdebias.errors import AdapterError, InputError

if TYPE_CHECKING:
    from posdebias.adapters.hf.generation import GenerationSettings

#: Why this adapter has no attention (named when a calibrator that needs it is refused).
NO_ATTENTION = (
    "an OpenAI-compatible server returns log-probabilities but no attention weights (vLLM, "
    "SGLang and hosted APIs do not export them)"
)


class ServerOptions(AdapterOptions):
    """Options of the ``openai`` adapter (``adapter.options`` in a config file)."""

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
    label_set: str = Field(default="digits", description="digits, upper, lower, roman, words")
    prompt: PromptTemplate | None = Field(
        default=None, description="retrieval prompt template fields (default: the method's)"
    )
    task_prompt: TaskTemplate | None = Field(
        default=None,
        description="template fields of the other tasks (multiple_choice, pairwise_judge, "
        "rerank); default: each task's own",
    )
    prompt_variant: str = Field(default="plain", description="plain, instruction or cot")
    answer_prefix: str = Field(default="", description="text before the label in the answer")
    end_token: str | None = Field(
        default=None,
        description="end-of-answer token text, needed when a label continues another "
        "(default: the local tokenizer's eos token)",
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

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"base_url {excerpt(value)} is not an http(s) URL; give the API root, e.g. "
                "http://127.0.0.1:8000/v1"
            )
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(
                f"base_url {excerpt(value)} must not carry a query, fragment or credentials "
                "(put the key in the variable named by api_key_env)"
            )
        return value.rstrip("/")

    @field_validator("label_set")
    @classmethod
    def _known_label_set(cls, value: str) -> str:
        get_label_set(value)
        return value

    @field_validator("prompt_variant")
    @classmethod
    def _known_variant(cls, value: str) -> str:
        if value not in PROMPT_VARIANTS:
            raise ValueError(f"unknown prompt variant {value!r}; choose one of {PROMPT_VARIANTS}")
        return value

    @field_validator("prompt", mode="before")
    @classmethod
    def _coerce_prompt(cls, value: Any) -> Any:
        return coerce_prompt(value)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects would send the request (and its key) elsewhere than base_url: refuse them."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        raise urllib.error.HTTPError(
            req.full_url, code, f"redirect to {newurl} refused", headers, fp
        )


class ServerClient:
    """POSTs JSON to one server: bounded timeouts, retries with backoff, no proxy, no redirect."""

    def __init__(self, options: ServerOptions) -> None:
        self.base_url = options.base_url
        self.timeout = options.timeout
        self.retries = options.retries
        self.backoff = options.backoff
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
        self._headers = {"Content-Type": "application/json"}
        if options.api_key_env:
            key = os.environ.get(options.api_key_env)
            if not key:
                raise InputError(
                    f"api_key_env names {options.api_key_env!r}, but that environment variable "
                    "is not set"
                )
            self._headers["Authorization"] = f"Bearer {key}"

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/{path}"
        data = json.dumps(body).encode()
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(url, data=data, headers=self._headers, method="POST")
            try:
                with self._opener.open(request, timeout=self.timeout) as response:
                    payload = json.loads(response.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                if 300 <= exc.code < 400:
                    where = exc.headers.get("Location", "") if exc.headers else ""
                    raise AdapterError(
                        f"server {excerpt(url)} redirects (HTTP {exc.code}) to {excerpt(where)}; "
                        "the redirect is refused (requests go to base_url only): give the final "
                        "address as base_url"
                    ) from None
                detail = _error_detail(exc)
                problem = f"HTTP {exc.code}: {detail}"
                if exc.code == 429 or exc.code >= 500:
                    continue
                raise AdapterError(
                    f"server {excerpt(url)} refused the request ({problem})"
                ) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                problem = excerpt(str(getattr(exc, "reason", exc)), 200)
                continue
            except ValueError:
                raise AdapterError(f"server {excerpt(url)} answered with no JSON") from None
            if not isinstance(payload, dict):
                raise AdapterError(f"server {excerpt(url)} answered {excerpt(payload)}, no object")
            return payload
        raise AdapterError(
            f"server {excerpt(url)} did not answer after {self.retries + 1} attempts "
            f"({problem}); is it running at that address?"
        )


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read().decode("utf-8", errors="replace")
    except Exception:  # the body is only a courtesy
        text = ""
    try:
        message = json.loads(text).get("error", {})
        text = message.get("message", text) if isinstance(message, dict) else str(message)
    except (ValueError, AttributeError):
        pass
    return excerpt(text or exc.reason, 300)


TokenScores = list[tuple[str, float]]  # (token text, log-probability) of appended tokens


class ServerAdapter(Adapter):
    """Label scores (and generated texts) from an OpenAI-compatible server; see the module doc."""

    name: ClassVar[str] = "openai"
    Options = ServerOptions
    provides_attention: ClassVar[bool] = False
    no_attention_reason: ClassVar[str] = NO_ATTENTION
    summary: ClassVar[str] = "a model behind an OpenAI-compatible server (vLLM, SGLang, ...)"

    def __init__(self, **options: Any) -> None:
        self.options: ServerOptions = self.parse_options(options)  # type: ignore[assignment]
        opts = self.options
        self.label_set = opts.label_set
        self.base_prompt = opts.prompt or PromptTemplate()
        self.prompt = self.base_prompt.variant(opts.prompt_variant, opts.label_set)
        #: each candidate task's template as configured, and under the prompt variant
        self.base_task_templates = {
            task: task_template(task, opts.task_prompt) for task in DEFAULT_TEMPLATES
        }
        self.task_templates = {
            task: task_variant(task, template, opts.prompt_variant)
            for task, template in self.base_task_templates.items()
        }
        self.client = ServerClient(opts)
        self.tokenizer = _local_tokenizer(opts.tokenizer) if opts.tokenizer else None
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
        self._last_n: int | None = None

    @classmethod
    def create(cls, **options: Any) -> ServerAdapter:
        return cls(**options)

    @property
    def num_layers(self) -> None:
        return None

    @property
    def attention_layers(self) -> None:
        return None

    @property
    def labels(self) -> list[str] | None:
        return None if self._last_n is None else self.labels_for(self._last_n)

    # -- prompts ---------------------------------------------------------------------------

    def messages(
        self,
        instance: RetrievalInstance,
        prompt: PromptTemplate | None = None,
        *,
        variant: str | None = None,
    ) -> list:
        """OpenAI chat messages of one instance (any task): the template's text and image
        items, images as base64 PNG ``image_url`` parts (or the placeholder text); adjacent
        texts joined, a text-only content as one string (the prompt the Hugging Face adapters
        render, whatever separator the server would join a list's items with). ``variant``:
        a prompt variant of the configured templates, as the Hugging Face adapters pose it."""
        chosen, default, templates = (
            (prompt or self.prompt, self.prompt, self.task_templates.__getitem__)
            if variant is None
            else variant_prompts(
                variant, self.label_set, self.base_prompt, self.base_task_templates
            )
        )
        raw = instance_messages(
            instance,
            get_label_set(self.label_set),
            prompt=chosen,
            default=default,
            templates=templates,
        )
        shown = [*instance.stem_images, *(i for i in instance.images if i is not None)]
        images = iter(shown)
        messages = []
        for message in raw:
            content = message["content"]
            if isinstance(content, str):
                messages.append(message)
                continue
            parts = []
            for item in content:
                if item["type"] != "image":
                    parts.append(item)
                elif self.options.images == "placeholder":
                    text = self.options.image_placeholder.replace("{name}", _name(next(images)))
                    parts.append({"type": "text", "text": text})
                else:
                    url = _data_url(next(images), instance.id)
                    parts.append({"type": "image_url", "image_url": {"url": url}})
            messages.append({**message, "content": parts})
        return joined_text_messages(messages)

    def render(
        self,
        instance: RetrievalInstance,
        prompt: PromptTemplate | None = None,
        *,
        variant: str | None = None,
    ) -> str:
        """The completion prompt: the local tokenizer's chat template + generation prompt."""
        assert self.tokenizer is not None
        shows_images = instance.stem_images or any(i is not None for i in instance.images)
        if shows_images and self.options.images == "content":
            raise InputError(
                "endpoint completions takes text only and these instances show images; use "
                "endpoint chat (images as content parts) or images: placeholder"
            )
        messages = self.messages(instance, prompt, variant=variant)
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
        self, instances: Sequence[RetrievalInstance], *, batch_size: int = 1
    ) -> list[Observation]:
        """Observations in order; every request of every instance shares one bounded pool, so
        ``batch_size`` does not change results (nor, much, the speed)."""
        for instance in instances:
            check_candidate_count(instance.n, get_label_set(self.label_set))
        with ThreadPoolExecutor(max_workers=self.options.concurrency) as pool:
            if self.options.scoring == "top_logprobs":
                rows = list(pool.map(self._top_k_scores, instances))
            else:
                rows = self._echo_scores_all(instances, pool)
        if instances:
            self._last_n = instances[-1].n
        return [
            Observation(label_logprobs=row, target=instance.target)
            for row, instance in zip(rows, instances, strict=True)
        ]

    def _echo_scores_all(self, instances: Sequence[RetrievalInstance], pool: Any) -> list[Any]:
        """Each prompt alone (its token count), then every label after it, then the end token
        after the labels that another label continues; the restricted softmax per instance."""
        prepared = [self._prepare(instance) for instance in instances]
        bases = list(pool.map(lambda item: self._score_prompt(item[0]), prepared))
        jobs = [(i, label) for i, (_, labels) in enumerate(prepared) for label in labels]

        def continuation(job: tuple[int, str], with_end: bool = False) -> TokenScores:
            index, label = job
            answer = label + ((self.end_text or "") if with_end else "")
            return self._continuation(prepared[index][0], bases[index], answer)

        first = list(pool.map(continuation, jobs))
        scored: list[dict[str, TokenScores]] = [{} for _ in instances]
        for (index, label), tokens in zip(jobs, first, strict=True):
            scored[index][label] = tokens
        plans = [self._plan(labels, scored[i]) for i, (_, labels) in enumerate(prepared)]
        ending = [
            (index, label)
            for index, (_, labels) in enumerate(prepared)
            for label, path in zip(labels, plans[index][0].paths, strict=True)
            if len(path) > len(scored[index][label])
        ]
        ended = list(pool.map(lambda job: continuation(job, with_end=True), ending))
        for (index, label), tokens in zip(ending, ended, strict=True):
            scored[index][label] = tokens
        return [
            _restricted_from_paths(plan, vocabulary, [scored[i][label] for label in labels])
            for i, ((_, labels), (plan, vocabulary)) in enumerate(zip(prepared, plans, strict=True))
        ]

    def _prepare(self, instance: RetrievalInstance) -> tuple[Any, list[str]]:
        """The request context of one instance (messages or rendered text) and its labels."""
        labels = [self.options.answer_prefix + label for label in self.labels_for(instance.n)]
        if self.options.endpoint == "chat":
            return self.messages(instance), labels
        return self.render(instance), labels

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
        if opts.endpoint == "completions":
            body.update(prompt=context + (answer or ""), echo=True, logprobs=0)
            payload = self.client.post("completions", body)
            logprobs = _first_choice(payload, "completions").get("logprobs") or {}
            tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
            if not isinstance(tokens, list) or not isinstance(values, list):
                raise AdapterError(_no_logprobs(opts.base_url, "completions"))
            texts, numbers = [str(t) for t in tokens], list(values)
        else:
            messages = context
            if answer is None:
                body.update(messages=messages, add_generation_prompt=True)
            else:
                body.update(
                    messages=[*messages, {"role": "assistant", "content": answer}],
                    add_generation_prompt=False,
                    continue_final_message=True,
                )
            body["prompt_logprobs"] = 0
            payload = self.client.post("chat/completions", body)
            entries = payload.get("prompt_logprobs")
            if not isinstance(entries, list) or not entries:
                raise AdapterError(_no_logprobs(opts.base_url, "chat"))
            texts, numbers = [], []
            for entry in entries:
                if entry is None:
                    texts.append("")
                    numbers.append(None)
                    continue
                if not isinstance(entry, dict) or len(entry) != 1:
                    raise AdapterError(_no_logprobs(opts.base_url, "chat"))
                (value,) = entry.values()
                texts.append(str(value.get("decoded_token", "")))
                numbers.append(float(value["logprob"]))
        count = _prompt_tokens(payload)
        if len(texts) < count:
            raise AdapterError(_no_logprobs(opts.base_url, opts.endpoint))
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

    def _top_k_scores(self, instance: RetrievalInstance) -> Any:
        """The restricted softmax over the labels' entries of the first token's top k."""
        labels = [self.options.answer_prefix + label for label in self.labels_for(instance.n)]
        k = self.options.top_logprobs
        if self.options.endpoint == "chat":
            body = {
                "model": self.options.model,
                "messages": self.messages(instance),
                "max_tokens": 1,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": k,
            }
            choice = _first_choice(self.client.post("chat/completions", body), "chat")
            content = (choice.get("logprobs") or {}).get("content") or []
            if not content:
                raise AdapterError(_no_logprobs(self.options.base_url, "chat"))
            top = {e["token"]: float(e["logprob"]) for e in content[0].get("top_logprobs", [])}
        else:
            body = {
                "model": self.options.model,
                "prompt": self.render(instance),
                "max_tokens": 1,
                "temperature": 0,
                "logprobs": k,
            }
            choice = _first_choice(self.client.post("completions", body), "completions")
            entries = (choice.get("logprobs") or {}).get("top_logprobs") or []
            if not entries or not isinstance(entries[0], dict):
                raise AdapterError(_no_logprobs(self.options.base_url, "completions"))
            top = {str(t): float(v) for t, v in entries[0].items()}
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

    # -- generation ------------------------------------------------------------------------

    def generate_many(
        self,
        instances: Sequence[RetrievalInstance],
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

        def one(job: tuple[RetrievalInstance, int]) -> Generation:
            return self._generate_one(job[0], settings, job[1])

        with ThreadPoolExecutor(max_workers=self.options.concurrency) as pool:
            return list(pool.map(one, zip(instances, seeds, strict=True)))

    def _generate_one(
        self,
        instance: RetrievalInstance,
        settings: GenerationSettings,
        seed: int,
    ) -> Generation:
        check_candidate_count(instance.n, get_label_set(self.label_set))
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
        if self.options.endpoint == "chat":
            body["messages"] = self.messages(instance, variant=settings.prompt_variant)
            payload = self.client.post("chat/completions", body)
        else:
            body["prompt"] = self.render(instance, variant=settings.prompt_variant)
            payload = self.client.post("completions", body)
        choices = payload.get("choices")
        if not isinstance(choices, list) or len(choices) != settings.num_samples:
            raise AdapterError(
                f"server {excerpt(self.options.base_url)} returned "
                f"{len(choices) if isinstance(choices, list) else 'no'} choices, asked for "
                f"{settings.num_samples}"
            )
        choices = sorted(choices, key=lambda c: int(c.get("index", 0)))
        texts = [
            str((c.get("message") or {}).get("content") or "")
            if self.options.endpoint == "chat"
            else str(c.get("text") or "")
            for c in choices
        ]
        usage = payload.get("usage") or {}
        generated = int(usage.get("completion_tokens") or 0)
        return Generation(
            texts=texts,
            generated_tokens=generated,
            forward_passes=max(1, generated // max(1, settings.num_samples)),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
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
            "prompt_hash": self.prompt.digest(),
            "prompt": self.prompt.model_dump(mode="json"),
            "prompt_variant": opts.prompt_variant,
            "answer_prefix": opts.answer_prefix,
            "end_token": self.end_text,
        }


def _local_tokenizer(folder: str) -> Any:
    path = Path(folder).expanduser()
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
    """A base64 PNG data URL of an image file or PIL image."""
    from PIL import Image

    if isinstance(reference, Image.Image):
        image = reference.convert("RGB")
    elif isinstance(reference, (str, Path)) and "://" not in str(reference):
        image = open_image(str(reference), what=f"instance {excerpt(instance_id)}: image")
    else:
        raise InputError(
            f"instance {excerpt(instance_id)}: image {excerpt(reference)} is neither a file path "
            "nor a PIL image"
        )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _first_choice(payload: dict[str, Any], endpoint: str) -> dict[str, Any]:
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise AdapterError(f"the server's {endpoint} answer has no choices: {excerpt(payload)}")
    return choices[0]


def _prompt_tokens(payload: dict[str, Any]) -> int:
    usage = payload.get("usage")
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(count, int):
        raise AdapterError("the server's answer has no usage.prompt_tokens")
    return count


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


@hookimpl
def posdebias_register_adapters(register: Callable[[type[Adapter]], None]) -> None:
    register(ServerAdapter)
