"""The retrieval prompt as configuration: the paper's prompt by default, any layout by config.

The template yields chat-message content (text and image items); the adapter renders it with the
processor's own chat template and generation prompt. Placeholders:

* ``{n}``: number of images; ``{range}``: the label range named by the label set
  (``1 to 4``, ``A to D``, ``first to fourth``); ``{first}`` / ``{last}``: its ends.
* ``{caption}``: the query text (in ``query``).
* ``{label}`` / ``{index}``: image k's label and 1-based index (in ``image_prefix`` /
  ``image_suffix``).

A model directory may ship its trained prompt as ``posdebias_prompt.json`` (a serialised
:class:`PromptTemplate`); :func:`posdebias.load_adapter` uses it as the default.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from posdebias._inputs import CONFIG_LIMIT, excerpt, parse_json, read_input_text
from posdebias.core.instance import Instance
from posdebias.core.labels import LabelSet, get_label_set
from posdebias.core.tasks import (
    PROMPT_VARIANTS,
    TaskTemplate,
    check_placeholders,
    task_label_set,
    task_variant,
)
from posdebias.errors import AdapterError, ConfigError, InputError, validation_problems

PROMPT_FILE = "posdebias_prompt.json"

DEFAULT_INSTRUCTION = (
    "Given {n} images indexed from {range}, identify the image that best matches the provided "
    "caption. Respond with the index number only and nothing else."
)
DEFAULT_QUERY = "Caption: {caption}\nAnswer:"

#: Prompt variants (:data:`posdebias.core.tasks.PROMPT_VARIANTS`; docs/method.md, "Baselines",
#: gives the exact texts). ``plain`` is the template as configured; the others are derived from
#: it by :meth:`PromptTemplate.variant`, so they work with any template and every method.
#: ``instruction``, ``cot`` and ``self_consistency`` are the paper's prompts word for word (its
#: Appendix E, Table 9); ``posdebias_instruction`` and ``posdebias_cot`` are posdebias's
#: earlier wordings, kept so that older runs can be repeated. The candidate tasks' templates
#: have the same variants in their own words (:func:`posdebias.core.tasks.task_variant`).
ANSWER_ONLY = "Respond with the index number only and nothing else."
#: The paper's debiasing instruction, placed before :data:`ANSWER_ONLY`.
INSTRUCTION_HINT = (
    "Please note that the provided images have been randomly shuffled, so it is essential to "
    "consider them fairly and without bias. Analyze the visual content objectively and do not "
    "be influenced by the order of the images."
)
#: The paper's chain-of-thought request, on its own line after the task sentence.
COT_HINT = (
    "Please think step by step. First, write your reasoning inside <think> and </think> tags. "
    "Then, after the closing </think> tag, output only the final answer index (a single "
    "integer from {range})."
)
#: The same requests for a label set other than digits (the paper asks for an integer).
COT_LABEL_HINT = (
    "Please think step by step. First, write your reasoning inside <think> and </think> tags. "
    "Then, after the closing </think> tag, output only the final answer label (one of {range})."
)
COT_QUERY_END = "Answer: <think>"
#: The paper's self-consistency request, on its own line after the task sentence.
SC_HINT = (
    "Please think step by step to analyze the content of the images. After your reasoning, "
    'provide the final answer in the exact format: "The answer is <index>".'
)
SC_LABEL_HINT = SC_HINT.replace("<index>", "<label>")
POSDEBIAS_INSTRUCTION_HINT = (
    "The order of the images is arbitrary: judge each image by its content only, never by its "
    "position in the list."
)
POSDEBIAS_COT_HINT = (
    "Think step by step: describe what each image shows and compare it with the caption, then "
    "give the index ({range}) of the best match at the end."
)
POSDEBIAS_COT_QUERY_END = "Let's think step by step."


class PromptTemplate(BaseModel):
    """How one retrieval instance becomes a chat message (see the module docstring).

    With ``images_first`` (the paper's layout) the message is: every image (each wrapped in
    ``image_prefix`` / ``image_suffix``), then ``instruction``, ``separator``, ``query``.
    Otherwise: ``instruction``, the images, then ``query``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    instruction: str = DEFAULT_INSTRUCTION
    query: str = DEFAULT_QUERY
    image_prefix: str = ""
    image_suffix: str = ""
    separator: str = "\n"
    images_first: bool = True
    system: str | None = None

    @model_validator(mode="after")
    def _check_placeholders(self) -> PromptTemplate:
        sample = {"n": 2, "range": "1 to 2", "first": "1", "last": "2"}
        fields = {
            "instruction": (self.instruction, sample),
            "query": (self.query, {**sample, "caption": "c"}),
            "image_prefix": (self.image_prefix, {**sample, "label": "1", "index": 1}),
            "image_suffix": (self.image_suffix, {**sample, "label": "1", "index": 1}),
        }
        for name, (template, values) in fields.items():
            allowed = ", ".join("{" + key + "}" for key in values)
            try:
                check_placeholders(template, values)
                template.format(**values)
            except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
                raise ValueError(
                    f"{name} template {excerpt(template)} is invalid ({str(exc)[:120]}); "
                    f"placeholders: {allowed}"
                ) from None
        if "{caption}" not in self.query and "{caption}" not in self.instruction:
            raise ValueError("the prompt never shows the caption: put {caption} in query")
        return self

    def digest(self) -> str:
        """sha256 of the template's canonical JSON (recorded as ``prompt_hash``)."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def variant(self, name: str, label_set: str = "digits") -> PromptTemplate:
        """This template under a prompt variant (:data:`PROMPT_VARIANTS`).

        ``label_set``: the labels the prompt asks for; with any other than digits, ``cot`` and
        ``self_consistency`` ask for a label (:data:`COT_LABEL_HINT`, :data:`SC_LABEL_HINT`)
        where the paper's words ask for an integer index.

        The task sentence is the instruction without :data:`ANSWER_ONLY`. ``instruction``
        puts :data:`INSTRUCTION_HINT` between the task sentence and :data:`ANSWER_ONLY`.
        ``cot`` and ``self_consistency`` drop :data:`ANSWER_ONLY` and put their request on a
        new line after the task sentence; ``cot`` also ends the query ``Answer: <think>``
        (replacing a trailing ``Answer:``, keeping nothing after it). ``posdebias_instruction``
        and ``posdebias_cot`` are the earlier wordings (docs/method.md).
        """
        if name == "plain":
            return self
        task = self.instruction.replace(ANSWER_ONLY, "").strip()
        has_answer_only = ANSWER_ONLY in self.instruction
        if name == "instruction":
            hinted = _join(task, INSTRUCTION_HINT)
            instruction = _join(hinted, ANSWER_ONLY) if has_answer_only else hinted
            return self.model_copy(update={"instruction": instruction})
        digits = label_set == "digits"
        if name == "self_consistency":
            hint = SC_HINT if digits else SC_LABEL_HINT
            return self.model_copy(update={"instruction": _line(task, hint)})
        if name == "cot":
            query = _end_query(self.query, COT_QUERY_END)
            hint = COT_HINT if digits else COT_LABEL_HINT
            return self.model_copy(update={"instruction": _line(task, hint), "query": query})
        if name == "posdebias_instruction":
            return self.model_copy(
                update={"instruction": _join(self.instruction, POSDEBIAS_INSTRUCTION_HINT)}
            )
        if name == "posdebias_cot":
            query = _end_query(self.query, POSDEBIAS_COT_QUERY_END)
            return self.model_copy(
                update={"instruction": _join(task, POSDEBIAS_COT_HINT), "query": query}
            )
        raise ConfigError(
            f"unknown prompt variant {name!r}; choose one of: {', '.join(PROMPT_VARIANTS)}"
        )

    def messages(self, caption: str, num_images: int, label_set: LabelSet) -> list[dict]:
        """Chat messages with one ``{"type": "image"}`` item per image, in order."""
        labels = label_set.labels(num_images)
        values: dict[str, Any] = {
            "n": num_images,
            "range": label_set.range_text(num_images),
            "first": labels[0],
            "last": labels[-1],
        }
        images: list[dict] = []
        for index, label in enumerate(labels, start=1):
            if self.image_prefix:
                text = self.image_prefix.format(**values, label=label, index=index)
                images.append({"type": "text", "text": text})
            images.append({"type": "image"})
            if self.image_suffix:
                text = self.image_suffix.format(**values, label=label, index=index)
                images.append({"type": "text", "text": text})
        instruction = self.instruction.format(**values)
        query = self.query.format(**values, caption=caption)
        if self.images_first:
            content = [*images, {"type": "text", "text": instruction + self.separator + query}]
        else:
            content = [
                {"type": "text", "text": instruction + self.separator},
                *images,
                {"type": "text", "text": self.separator + query},
            ]
        messages = [{"role": "user", "content": content}]
        if self.system is not None:
            messages.insert(
                0, {"role": "system", "content": [{"type": "text", "text": self.system}]}
            )
        return messages


def _join(first: str, second: str) -> str:
    return f"{first} {second}" if first.strip() else second


def _line(first: str, second: str) -> str:
    return f"{first}\n{second}" if first.strip() else second


def _end_query(query: str, ending: str) -> str:
    """``query`` with a trailing ``Answer:`` (and any space after it) replaced by ``ending``,
    or with ``ending`` on a new line when it has none."""
    stripped = query.rstrip()
    if stripped.endswith("Answer:"):
        return stripped[: -len("Answer:")] + ending
    return stripped + "\n" + ending


def coerce_prompt(prompt: PromptTemplate | dict | str | Path | None) -> PromptTemplate | None:
    """A PromptTemplate from a template, a dict of fields, or a JSON file path."""
    if prompt is None or isinstance(prompt, PromptTemplate):
        return prompt
    if isinstance(prompt, (str, Path)):
        return load_prompt_file(Path(prompt))
    if isinstance(prompt, dict):
        try:
            return PromptTemplate.model_validate(prompt)
        except ValidationError as exc:
            raise ConfigError(f"prompt template: {_errors(exc)}") from None
    raise ConfigError(f"prompt must be a mapping of template fields, got {type(prompt).__name__}")


def load_prompt_file(path: Path) -> PromptTemplate:
    """Read a PromptTemplate from JSON; errors name the file and the wrong field."""
    text = read_input_text(path, "prompt file", limit=CONFIG_LIMIT)
    data = parse_json(text, f"prompt file {path}", error=ConfigError)
    try:
        return PromptTemplate.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"prompt file {path}: {_errors(exc)}") from None


def _errors(exc: ValidationError) -> str:
    allowed = ", ".join(PromptTemplate.model_fields)
    return "; ".join(validation_problems(exc, unknown="field")) + f" (fields: {allowed})"


def variant_prompts(
    variant: str, label_set: str, prompt: PromptTemplate, templates: dict[str, TaskTemplate]
) -> tuple[PromptTemplate, PromptTemplate, Callable[[str], TaskTemplate]]:
    """What a generated baseline poses under a prompt variant, as :func:`instance_messages`
    takes it: the retrieval ``prompt`` under the variant (twice: it is the default of this
    posing, so every task is posed) and each task's template (``templates``, as configured)
    under it (:meth:`PromptTemplate.variant`, :func:`posdebias.core.tasks.task_variant`)."""

    def template(task: str) -> TaskTemplate:
        return task_variant(task, templates[task], variant)

    varied = prompt.variant(variant, label_set)
    return varied, varied, template


def instance_messages(
    instance: Instance,
    label_set: LabelSet,
    *,
    prompt: PromptTemplate,
    default: PromptTemplate,
    templates: Callable[[str], TaskTemplate],
    sentinels: bool = False,
) -> list[dict]:
    """The chat messages of ``instance`` (every adapter poses it the same way): the retrieval
    ``prompt`` for a retrieval instance, its task's template (``templates(task)``) otherwise.

    A prompt variant (``prompt`` other than the adapter's ``default``) rewrites the retrieval
    prompt only; asked of another task it is refused rather than silently dropped, which would
    report the plain prompt under the variant's name.
    """
    if instance.task == "retrieval":
        return prompt.messages(instance.query, instance.n, label_set)
    if prompt != default:
        raise AdapterError(
            f"prompt variants apply to retrieval prompts; a {instance.task} instance is "
            "posed with its task template (task_prompt)"
        )
    return templates(instance.task).messages(instance, label_set, sentinels=sentinels)


class PosesInstances(Protocol):
    """What :func:`posed_messages` reads of an adapter: its label set, its templates as
    configured (``base_*``) and under its prompt variant, and its model's special tokens."""

    label_set: str | None
    prompt: PromptTemplate
    base_prompt: PromptTemplate
    task_templates: dict[str, TaskTemplate]
    base_task_templates: dict[str, TaskTemplate]
    control_tokens: re.Pattern[str] | None


def posed_messages(
    adapter: PosesInstances,
    instance: Instance,
    model: str,
    *,
    prompt: PromptTemplate | None = None,
    variant: str | None = None,
    sentinels: bool = False,
    shown: Iterable[tuple[str, str]] = (),
) -> list[dict]:
    """The chat messages an adapter poses ``instance`` with (every adapter the same way): its
    data (and ``shown``, see :func:`check_control_tokens`) checked for ``model``'s special
    tokens, then the retrieval template (or ``prompt``) or its task's template; ``variant`` (a
    generated baseline's prompt variant) poses the configured templates under it instead of
    ``prompt`` and the adapter's own variant."""
    check_control_tokens(instance, adapter.control_tokens, model, shown)
    chosen, default, templates = (
        (prompt or adapter.prompt, adapter.prompt, adapter.task_templates.__getitem__)
        if variant is None
        else variant_prompts(
            variant,
            task_label_set("retrieval", adapter.label_set),
            adapter.base_prompt,
            adapter.base_task_templates,
        )
    )
    return instance_messages(
        instance,
        get_label_set(task_label_set(instance.task, adapter.label_set)),
        prompt=chosen,
        default=default,
        templates=templates,
        sentinels=sentinels,
    )


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
    texts = [("the stem", instance.query)] + [
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
    texts = [instance.query, *(t for t in instance.texts if t is not None)]
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
    templates alone write (see :func:`check_joined_control_tokens`)."""
    texts = tuple(None if text is None else "x" for text in instance.texts)
    return dataclasses.replace(instance, query="x", texts=texts)


def check_joined_control_tokens(
    instance: Instance, rendered: str, neutral: str, pattern: re.Pattern[str] | None, model: str
) -> None:
    """Refuse ``instance`` if its ``rendered`` prompt (as the model reads it: the chat
    template's output) holds one of the model's special tokens more often than ``neutral``,
    the same prompt with neutral data (:func:`neutral_instance`): a token no field holds
    alone, written where a field meets the next (a stem ending in ``<|im_`` and an option
    starting ``end|>``, a template's text completed by the data, a system prompt completed
    by the user's turn). The templates' own tokens (a chain-of-thought prompt's ``<think>``)
    are in both and pass; a separator the chat template writes between two fields keeps them
    apart, as it does for the tokenizer."""
    refuse_joined_control_tokens(
        f"instance {excerpt(instance.id)}", rendered, neutral, pattern, model
    )


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
    """:func:`check_joined_control_tokens` for any prompt: ``where`` names what it poses
    (an instance, a cloze question) in the error."""
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
    """(where, rendered prompt, labels) of each task's prompt with neutral data (every text
    ``x``; the retrieval task's candidates are images, named but never opened), 2 and 3
    candidates, as ``render`` writes it: what the answer prefix and the labels follow
    (:func:`check_answer_joins`)."""
    for task in tasks:
        for n in (2,) if task == "pairwise_judge" else (2, 3):
            if task == "retrieval":
                images = tuple(f"x{k}.png" for k in range(n))
                neutral = Instance(query="x", images=images, task=task, id="x")
            else:
                texts = tuple(f"x{k}" for k in range(n))
                neutral = Instance(query="x", texts=texts, task=task, id="x")
            yield f"the prompt ({task})", render(neutral), labels_for(n, task)


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
    prompt: PromptTemplate,
    task_templates: Mapping[str, TaskTemplate],
    pattern: re.Pattern[str] | None,
    model: str,
    other_fields: Iterable[tuple[str, str]] = (),
    label_set: str | None = None,
) -> None:
    """Refuse a configured prompt template (the retrieval ``prompt``, each task's template, an
    adapter's ``other_fields`` such as an image placeholder text or the answer prefix) whose
    text (the system prompt, the instruction, a separator) holds one of the model's special
    tokens: it would end a turn or open one where the template means text. Tokens the
    template's fields write only together (a candidate ending in ``</`` and a separator
    beginning ``s>``) are refused too (:func:`check_template_joins`)."""
    fields = template_fields(prompt, task_templates) + list(other_fields)
    found = _first_control_token(pattern, fields)
    if found is not None:
        where, token = found
        raise ConfigError(
            f"the prompt template's field {where} holds {token!r}, {_misread(model)}; the chat "
            "template writes the turns and the processor the media, so remove it from the field"
        )
    check_template_joins(prompt, task_templates, pattern, model, label_set)


#: A character no special token holds, put around each template field to keep fields apart.
_FIELD_FENCE = "\ue002"
_Template = TypeVar("_Template", "PromptTemplate", TaskTemplate)


def _fenced(template: _Template) -> _Template:
    update = {
        name: f"{_FIELD_FENCE}{value}{_FIELD_FENCE}"
        for name, value in template.model_dump().items()
        if isinstance(value, str) and value
    }
    return template.model_copy(update=update)


def _message_texts(messages: list[dict]) -> list[str]:
    """Each message's text parts joined, as a chat template writes them (text parts next to
    each other meet)."""
    texts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        else:
            texts.append(
                "".join(p.get("text", "") for p in content or () if p.get("type") == "text")
            )
    return texts


def check_template_joins(
    prompt: PromptTemplate,
    task_templates: Mapping[str, TaskTemplate],
    pattern: re.Pattern[str] | None,
    model: str,
    label_set: str | None = None,
) -> None:
    """Refuse templates whose fields write one of the model's special tokens where they meet:
    the prompt with neutral data (every text ``x``) holds the token, the same prompt with
    each field fenced off (:data:`_FIELD_FENCE`) does not. Checked for the retrieval prompt
    and every task's template, under every prompt variant, with 2 and 3 candidates, before
    any instance is read."""
    if pattern is None:
        return
    own = task_label_set("retrieval", label_set)  # None: each task's own labels
    labels = get_label_set(own)
    for variant in PROMPT_VARIANTS:
        varied, _, templates = variant_prompts(variant, own, prompt, dict(task_templates))
        for n in (2, 3):
            cases: list[tuple[str, list[dict], list[dict]]] = [
                (
                    "prompt",
                    varied.messages("x", n, labels),
                    _fenced(varied).messages("x", n, labels),
                )
            ]
            for task in task_templates:
                if task == "pairwise_judge" and n != 2:
                    continue  # a judgement has two answers
                template = templates(task)
                texts = tuple(f"x{k}" for k in range(n))  # no data joins a field into a token
                neutral = Instance(query="x", texts=texts, task=task, id="x")
                task_labels = get_label_set(task_label_set(task, label_set))
                cases.append(
                    (
                        f"task_prompt ({task})",
                        template.messages(neutral, task_labels),
                        _fenced(template).messages(neutral, task_labels),
                    )
                )
            for where, joined, apart in cases:
                token = joined_token(
                    pattern, "\n".join(_message_texts(joined)), "\n".join(_message_texts(apart))
                )
                if token is not None:
                    raise ConfigError(
                        f"the fields of {where} write {token!r} where they meet (one field ends "
                        f"with part of it, the next begins with the rest), {_misread(model)}; "
                        "write the fields otherwise"
                    )


def template_fields(
    prompt: PromptTemplate, task_templates: Mapping[str, TaskTemplate]
) -> list[tuple[str, str]]:
    """(``option.field``, text) of every text field of the retrieval prompt and the tasks'
    templates (the system prompt, the instruction, the separators, ...)."""
    return [
        (f"{option}.{name}", value)
        for option, templates in (("prompt", [prompt]), ("task_prompt", task_templates.values()))
        for template in templates
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
    path = Path(value).expanduser()
    if not path.is_file():
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
