"""How an adapter poses an instance: its task's template, checked against the model's special
tokens, and the retrieval prompt as an adapter option.

Every task is posed with a :class:`~posdebias.core.tasks.TaskTemplate` (the Tasks page): the
adapter option ``prompt`` sets the retrieval task's fields, ``task_prompt`` the text tasks'.
A model directory may ship its trained retrieval prompt as ``posdebias_prompt.json`` (template
fields, in either form :func:`posdebias.core.tasks.template_fields` reads);
:func:`posdebias.load_adapter` uses it as the default.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from pydantic import Field, field_validator

from posdebias._inputs import CONFIG_LIMIT, excerpt, parse_json, path_problem, read_input_text
from posdebias.adapters.base import AdapterOptions, LabelSetName
from posdebias.core.instance import Instance
from posdebias.core.labels import get_label_set
from posdebias.core.tasks import (
    FORMER_FIELDS,
    LABEL_SET_HELP,
    PROMPT_HELP,
    PROMPT_VARIANTS,
    TASK_PROMPT_HELP,
    TEMPLATE_OPTIONS,
    TaskTemplate,
    TaskTemplateFields,
    adapter_templates,
    task_label_set,
    task_template,
    task_variant,
)
from posdebias.errors import ConfigError, InputError

PROMPT_FILE = "posdebias_prompt.json"


class PromptOptions(AdapterOptions):
    """The options that say how an adapter poses an instance and reads its answer, declared
    once for every adapter that renders prompts (the Hugging Face adapters and the ``openai``
    adapter derive their options from it)."""

    label_set: LabelSetName = Field(default=None, description=LABEL_SET_HELP)
    prompt: TaskTemplate | None = Field(default=None, description=PROMPT_HELP)
    task_prompt: TaskTemplateFields = Field(default=None, description=TASK_PROMPT_HELP)
    prompt_variant: str = Field(
        default="plain",
        description=f"{', '.join(PROMPT_VARIANTS)} (the Tasks and Method pages)",
    )
    answer_prefix: str = Field(
        default="", description="text before the label in the answer, e.g. ' ' for LLaVA-1.5"
    )
    end_token: str | None = Field(
        default=None,
        description="end-of-answer token, needed when a label continues another (default: "
        "the model's first eos token; the openai adapter: its local tokenizer's)",
    )
    answer_space: bool = Field(
        default=False,
        description="end the retrieval prompt's query with a space ('Answer: '), as the "
        "authors' prompts do (protocol reference sets it)",
    )

    def templates(self) -> tuple[dict[str, TaskTemplate], dict[str, TaskTemplate]]:
        """Every task's template as these options configure it, and under the prompt variant
        (:func:`~posdebias.core.tasks.adapter_templates`)."""
        return adapter_templates(
            self.prompt,
            self.task_prompt,
            self.prompt_variant,
            self.label_set,
            answer_space=self.answer_space,
        )

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


def coerce_prompt(prompt: TaskTemplate | dict | str | Path | None) -> TaskTemplate | None:
    """The retrieval template of the adapter option ``prompt``: a template, a mapping of its
    fields (each replacing the default's; the older form too), or a JSON file of them."""
    if isinstance(prompt, TaskTemplate) and prompt.tie_label is not None:
        raise ConfigError(_NO_TIE)
    if prompt is None or isinstance(prompt, TaskTemplate):
        return prompt
    if isinstance(prompt, (str, Path)):
        return load_prompt_file(Path(prompt))
    if isinstance(prompt, dict):
        return _template(prompt, "prompt template")
    raise ConfigError(f"prompt must be a mapping of template fields, got {type(prompt).__name__}")


def load_prompt_file(path: Path) -> TaskTemplate:
    """Read a retrieval template's fields from JSON; errors name the file and the field."""
    text = read_input_text(path, "prompt file", limit=CONFIG_LIMIT)
    data = parse_json(text, f"prompt file {path}", error=ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"prompt file {path}: not a JSON object of template fields")
    return _template(data, f"prompt file {path}")


#: Why the retrieval prompt has no tie label.
_NO_TIE = (
    "prompt: tie_label is a pairwise judge's answer, not a retrieval prompt's; set it in "
    "task_prompt"
)


def _template(fields: dict[str, Any], where: str) -> TaskTemplate:
    if fields.get("tie_label") is not None:
        raise ConfigError(_NO_TIE.replace("prompt", where, 1))
    known = [*TaskTemplate.model_fields, *FORMER_FIELDS]
    unknown = [name for name in fields if name not in known]
    if unknown:
        raise ConfigError(
            f"{where}: unknown field {excerpt(unknown[0])} (fields: {', '.join(known)})"
        )
    try:
        return task_template("retrieval", fields)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {str(exc).removeprefix('prompt: ')}") from None


class PosesInstances(Protocol):
    """What :func:`posed_messages` reads of an adapter: its label set, every task's template
    as configured (``base_task_templates``) and under its prompt variant, and its model's
    special tokens."""

    label_set: str | None
    task_templates: dict[str, TaskTemplate]
    base_task_templates: dict[str, TaskTemplate]
    control_tokens: re.Pattern[str] | None


def posed_messages(
    adapter: PosesInstances,
    instance: Instance,
    model: str,
    *,
    variant: str | None = None,
    sentinels: bool = False,
    shown: Iterable[tuple[str, str]] = (),
) -> list[dict]:
    """The chat messages an adapter poses ``instance`` with (every adapter the same way): its
    data (and ``shown``, see :func:`check_control_tokens`) checked for ``model``'s special
    tokens, then its task's template under the adapter's prompt variant, or under ``variant``
    (a generated baseline's) instead."""
    check_control_tokens(instance, adapter.control_tokens, model, shown)
    task = instance.task
    template = (
        adapter.task_templates[task]
        if variant is None
        else task_variant(task, adapter.base_task_templates[task], variant, adapter.label_set)
    )
    labels = get_label_set(task_label_set(task, adapter.label_set))
    return template.messages(instance, labels, sentinels=sentinels)


#: Attributes of a processor that name a placeholder it expands (an image, a video, audio).
_PLACEHOLDER_ATTRIBUTES = ("image_token", "video_token", "audio_token", "boi_token", "eoi_token")


def control_tokens(tokenizer: Any, processor: Any = None) -> re.Pattern[str] | None:
    """A pattern of the strings the model reads as one special token wherever they appear: the
    tokenizer's special tokens (chat-turn markers, BOS / EOS, padding) and the processor's
    placeholders (``<image>``, ``<|image_pad|>``), which it expands into an image's tokens.

    A tokenizer matches them in any text, also in a question or an option, so data holding one
    would end the user's turn, open a fake system turn or ask for an image that is not there;
    :func:`check_control_tokens` refuses such data. None when there are none.
    """
    tokens = {
        str(getattr(token, "content", token))
        for token in getattr(tokenizer, "added_tokens_decoder", {}).values()
        if getattr(token, "special", False)
    }
    tokens.update(str(token) for token in getattr(tokenizer, "all_special_tokens", ()) or ())
    for name in _PLACEHOLDER_ATTRIBUTES:
        value = getattr(processor, name, None)
        if isinstance(value, str):
            tokens.add(value)
    shown = sorted((token for token in tokens if token.strip()), key=lambda t: (-len(t), t))
    if not shown:
        return None
    pattern = re.compile("|".join(re.escape(token) for token in shown))
    _AFFIXES[pattern.pattern] = _affixes(shown)
    return pattern


#: Per pattern of :func:`control_tokens`: the proper prefixes, proper suffixes and tokens of
#: its special tokens (:func:`could_complete_a_token`).
_AFFIXES: dict[str, tuple[frozenset[str], frozenset[str], tuple[str, ...]]] = {}


def _affixes(tokens: list[str]) -> tuple[frozenset[str], frozenset[str], tuple[str, ...]]:
    prefixes = frozenset(token[:k] for token in tokens for k in range(1, len(token)))
    suffixes = frozenset(token[k:] for token in tokens for k in range(1, len(token)))
    return prefixes, suffixes, tuple(tokens)


def could_complete_a_token(
    pattern: re.Pattern[str], texts: Iterable[str], template_texts: Iterable[str] = ()
) -> bool:
    """Whether data ``texts`` could be part of a special token written across fields, shown
    between the prompt's ``template_texts``. A token across fields needs a field that ends
    with its beginning and a field that begins with its end, data or template; and the data
    must take part: a text with such an edge, or one lying inside a token. Data for which
    this is False cannot complete a token in any order it is shown in (an option such as
    "> 5 years" begins like the end of a token, but no field ends like the start of one)."""
    known = _AFFIXES.get(pattern.pattern)
    if known is None:  # a pattern not made by control_tokens: assume it could
        return True
    prefixes, suffixes, tokens = known
    longest = max(map(len, tokens))

    def ends_with_a_start(text: str) -> bool:
        return any(text[-k:] in prefixes for k in range(1, min(len(text), longest) + 1))

    def begins_with_an_end(text: str) -> bool:
        return any(text[:k] in suffixes for k in range(1, min(len(text), longest) + 1))

    texts, template_texts = list(texts), list(template_texts)
    fields = texts + template_texts
    if not (any(map(ends_with_a_start, fields)) and any(map(begins_with_an_end, fields))):
        return False
    if any(ends_with_a_start(text) or begins_with_an_end(text) for text in texts):
        return True
    return any(len(text) < longest and any(text in token for token in tokens) for text in texts)


def check_control_tokens(
    instance: Instance,
    pattern: re.Pattern[str] | None,
    model: str,
    shown: Iterable[tuple[str, str]] = (),
) -> None:
    """Refuse ``instance`` if its stem (caption, question, query), a candidate's text (an
    option, an answer to judge, a passage) or another text of it the prompt shows (``shown``:
    (where, text) pairs, e.g. an image's name as a placeholder) holds one of the model's
    special tokens (:func:`control_tokens`): the model would read a control token, not text."""
    texts = [("the stem", instance.stem)] + [
        (f"candidate {position}'s text", text)
        for position, text in enumerate(instance.texts, start=1)
        if text is not None
    ]
    texts += shown
    found = _first_control_token(pattern, texts)
    if found is not None:
        where, token = found
        raise InputError(
            f"instance {excerpt(instance.id)}: {where} holds {token!r}, {_misread(model)}; "
            "remove it from the data or write it otherwise"
        )


def check_instance_prompts(
    adapter: PosesInstances,
    instance: Instance,
    model: str,
    render: Callable[[Instance], str],
    shown: Iterable[tuple[str, str]] = (),
    template_texts: Iterable[str] = (),
) -> None:
    """Refuse ``instance`` before a run if its data hold a special token (:func:`
    check_control_tokens`) or complete one where fields meet in an order a run may show
    (``render`` renders one order as the model reads it and checks it, e.g. the adapter's
    ``render``). Orders matter only for data that could complete a token
    (:func:`could_complete_a_token`, rare): those are rendered in every order up to N = 7
    candidates, and beyond in every rotation of every order that puts one candidate right
    before another (a token spread over three or more candidates in one particular order is
    then refused when that order is rendered, during the run)."""
    shown = list(shown)
    pattern = adapter.control_tokens
    check_control_tokens(instance, pattern, model, shown)
    if pattern is None:
        return
    render(instance)
    texts = [instance.stem, *(t for t in instance.texts if t is not None)]
    texts += [text for _, text in shown]
    if not could_complete_a_token(pattern, texts, template_texts):
        return
    for order in _orders_to_check(instance.n):
        render(instance.permuted(order))


def _orders_to_check(n: int) -> Iterator[list[int]]:
    if n <= 7:
        yield from (list(order) for order in itertools.permutations(range(n)))
        return
    for first in range(n):
        for second in range(n):
            if first != second:
                base = [first, second, *(k for k in range(n) if k not in (first, second))]
                yield from (base[shift:] + base[:shift] for shift in range(n))


def neutral_instance(instance: Instance) -> Instance:
    """``instance`` with its stem and every candidate text replaced by ``x``: the prompt the
    templates alone write (see :func:`refuse_joined_control_tokens`)."""
    texts = tuple(None if text is None else "x" for text in instance.texts)
    return dataclasses.replace(instance, stem="x", texts=texts)


def joined_token(pattern: re.Pattern[str] | None, joined: str, apart: str) -> str | None:
    """A special token ``joined`` holds more often than ``apart`` (the same pieces kept from
    meeting): one that only the joining of fields writes; None when there is none."""
    if pattern is None:
        return None
    extra = Counter(pattern.findall(joined)) - Counter(pattern.findall(apart))
    return next(iter(extra), None)


def refuse_joined_control_tokens(
    where: str, rendered: str, neutral: str, pattern: re.Pattern[str] | None, model: str
) -> None:
    """Refuse the ``rendered`` prompt (as the model reads it: the chat template's output) if it
    holds one of the model's special tokens more often than ``neutral``, the same prompt with
    neutral data (:func:`neutral_instance`): a token no field holds alone, written where a
    field meets the next (a stem ending in ``<|im_`` and an option starting ``end|>``, a
    template's text completed by the data, a system prompt completed by the user's turn).
    The templates' own tokens (a chain-of-thought prompt's ``<think>``) are in both and pass;
    a separator the chat template writes between two fields keeps them apart, as it does for
    the tokenizer. ``where`` names what it poses (an instance, a cloze question) in the
    error."""
    token = joined_token(pattern, rendered, neutral)
    if token is not None:
        raise InputError(
            f"{where}: its prompt holds {token!r} where its fields are joined (one field ends "
            f"with part of it, the next text begins with the rest), {_misread(model)}; write "
            "the fields otherwise"
        )


def neutral_prompts(
    tasks: Iterable[str],
    render: Callable[[Instance], str],
    labels_for: Callable[[int, str], list[str]],
) -> Iterator[tuple[str, str, list[str]]]:
    """(where, rendered prompt, labels) of each task's prompt with neutral data
    (:func:`neutral_candidates`), 2 and 3 candidates, as ``render`` writes it: what the answer
    prefix and the labels follow (:func:`check_answer_joins`)."""
    for task in tasks:
        for n in (2,) if task == "pairwise_judge" else (2, 3):
            yield f"the prompt ({task})", render(neutral_candidates(task, n)), labels_for(n, task)


def check_answer_joins(
    prompts: Iterable[tuple[str, str, Sequence[str]]],
    answer_prefix: str,
    pattern: re.Pattern[str] | None,
    model: str,
) -> None:
    """Refuse an ``answer_prefix`` that writes one of the model's special tokens where it meets
    the prompt's end (a raw template's last field ``Answer: <|im`` and the prefix ``_end|>``)
    or a label: ``prompts`` are (where, rendered prompt of neutral data, its labels), and the
    joined text may hold no token the three pieces do not hold apart. Checked when the
    adapter is made, before any instance is read."""
    if pattern is None:
        return
    for where, rendered, labels in prompts:
        for label in labels:
            joined = rendered + answer_prefix + label
            apart = _FIELD_FENCE.join((rendered, answer_prefix, label))
            token = joined_token(pattern, joined, apart)
            if token is not None:
                raise ConfigError(
                    f"the answer_prefix {answer_prefix!r} writes {token!r} where it meets the "
                    f"end of {where} or the label {label!r}, {_misread(model)}; write the "
                    "answer_prefix (or the template's last field) otherwise"
                )


def check_template_control_tokens(
    task_templates: Mapping[str, TaskTemplate],
    pattern: re.Pattern[str] | None,
    model: str,
    other_fields: Iterable[tuple[str, str]] = (),
    label_set: str | None = None,
) -> None:
    """Refuse configured templates (every task's, and an adapter's ``other_fields`` such as an
    image placeholder text or the answer prefix) whose text (the system prompt, the
    instruction, a separator) holds one of the model's special tokens: it would end a turn or
    open one where the template means text. Tokens the template's fields write only together
    (a candidate ending in ``</`` and a separator beginning ``s>``) are refused too
    (:func:`check_template_joins`)."""
    fields = template_fields(task_templates) + list(other_fields)
    found = _first_control_token(pattern, fields)
    if found is not None:
        where, token = found
        raise ConfigError(
            f"the prompt template's field {where} holds {token!r}, {_misread(model)}; the chat "
            "template writes the turns and the processor the media, so remove it from the field"
        )
    check_template_joins(task_templates, pattern, model, label_set)


#: A character no special token holds, put around each template field to keep fields apart.
_FIELD_FENCE = "\ue002"


def _fenced(template: TaskTemplate) -> TaskTemplate:
    update = {
        name: f"{_FIELD_FENCE}{value}{_FIELD_FENCE}"
        for name, value in template.model_dump().items()
        if isinstance(value, str) and value
    }
    return template.model_copy(update=update)


def message_texts(messages: list[dict]) -> list[str]:
    """Each message's text parts joined, as a chat template writes them (text parts next to
    each other meet)."""
    return [
        content
        if isinstance(content := message.get("content"), str)
        else "".join(p.get("text", "") for p in content or () if p.get("type") == "text")
        for message in messages
    ]


def neutral_candidates(task: str, n: int) -> Instance:
    """An instance of ``task`` with N neutral candidates (texts ``x0``, ``x1``, ...; images
    named, never opened, for retrieval): what the templates alone write."""
    if task == "retrieval":
        return Instance(stem="x", images=tuple(f"x{k}.png" for k in range(n)), task=task, id="x")
    return Instance(stem="x", texts=tuple(f"x{k}" for k in range(n)), task=task, id="x")


def check_template_joins(
    task_templates: Mapping[str, TaskTemplate],
    pattern: re.Pattern[str] | None,
    model: str,
    label_set: str | None = None,
) -> None:
    """Refuse templates whose fields write one of the model's special tokens where they meet:
    the prompt with neutral data holds the token, the same prompt with each field fenced off
    (:data:`_FIELD_FENCE`) does not. Checked for every task's template, under every prompt
    variant, with 2 and 3 candidates, before any instance is read."""
    if pattern is None:
        return
    for variant in PROMPT_VARIANTS:
        for task, configured in task_templates.items():
            template = task_variant(task, configured, variant, label_set)
            labels = get_label_set(task_label_set(task, label_set))
            for n in (2,) if task == "pairwise_judge" else (2, 3):
                neutral = neutral_candidates(task, n)
                joined = template.messages(neutral, labels)
                apart = _fenced(template).messages(neutral, labels)
                token = joined_token(
                    pattern, "\n".join(message_texts(joined)), "\n".join(message_texts(apart))
                )
                if token is not None:
                    raise ConfigError(
                        f"the fields of {_where(task)} write {token!r} where they meet (one "
                        "field ends with part of it, the next begins with the rest), "
                        f"{_misread(model)}; write the fields otherwise"
                    )


def _where(task: str) -> str:
    """The option of ``task``'s template as a message names it (with the task where the
    option sets several tasks' templates)."""
    option = TEMPLATE_OPTIONS[task]
    return option if list(TEMPLATE_OPTIONS.values()).count(option) == 1 else f"{option} ({task})"


def template_fields(task_templates: Mapping[str, TaskTemplate]) -> list[tuple[str, str]]:
    """(``option.field``, text) of every text field of every task's template (the system
    prompt, the instruction, the separators, ...)."""
    return [
        (f"{TEMPLATE_OPTIONS[task]}.{name}", value)
        for task, template in task_templates.items()
        for name, value in template.model_dump().items()
        if isinstance(value, str)
    ]


def _first_control_token(
    pattern: re.Pattern[str] | None, texts: Iterable[tuple[str, str]]
) -> tuple[str, str] | None:
    """(where, token) of the first special token in ``texts`` ((where, text) pairs), if any."""
    if pattern is None:
        return None
    for where, text in texts:
        found = pattern.search(text)
        if found is not None:
            return where, found.group()
    return None


def _misread(model: str) -> str:
    return (
        f"which model {excerpt(model)} reads as its special token (a chat-turn marker or a "
        "media placeholder), not as text"
    )


RAW_CHAT_TEMPLATE = "raw"
"""The ``chat_template`` value for a base model posed as plain text (no roles, no turns): the
prompt's text after the tokenizer's BOS, as lm-evaluation-harness poses it without a chat
template."""


def resolve_chat_template(value: str, tokenizer: Any) -> str:
    """The Jinja chat template a ``chat_template`` option means: ``raw``, a template (it holds
    ``{{`` or ``{%``), or the path of a file holding one."""
    if value == RAW_CHAT_TEMPLATE:
        bos = getattr(tokenizer, "bos_token", None)
        ids = tokenizer("a", add_special_tokens=True)["input_ids"]
        writes_bos = bos is not None and bool(ids) and ids[0] == tokenizer.bos_token_id
        return ("{{ bos_token }}" if writes_bos else "") + (
            "{% for message in messages %}{{ message['content'] }}{% endfor %}"
        )
    if "{{" in value or "{%" in value:
        return value
    path = Path(os.path.expanduser(value))
    if path_problem(path) is not None or not path.is_file():  # a long text is no file name
        raise InputError(
            f"chat_template {excerpt(value)} is not a Jinja template (no '{{{{' or '{{%'), not "
            f"{RAW_CHAT_TEMPLATE!r} and not a file that exists; give a template, a file holding "
            "one, or 'raw'"
        )
    text = read_input_text(path, "chat template", limit=CONFIG_LIMIT)
    if "{{" not in text and "{%" not in text:
        raise InputError(
            f"chat template file {path} holds no Jinja template (no '{{{{' or '{{%'); it would "
            "render every prompt as the same text"
        )
    return text
