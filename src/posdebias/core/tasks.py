"""Task kinds and their prompt templates: how an instance of any kind becomes chat messages.

A task is a prompt template plus a benchmark source; the calibrators see what they always saw
(N label scores, the last prompt token's attention mass on each candidate's span). Every task,
``retrieval`` included, is posed with a :class:`TaskTemplate`; its defaults are
:data:`DEFAULT_TEMPLATES` (retrieval's is the method's prompt, the paper's words), which a
user overrides field by field (``adapter.options.prompt`` for retrieval,
``adapter.options.task_prompt`` for the text tasks). Retrieval prompts written in the older
form (``image_prefix``, ``image_suffix``, ``images_first``) are read by
:func:`template_fields` and still fit the states made with them (:func:`former_digest`).

A template yields chat-message content: text items and one ``{"type": "image"}`` item per
image (the stem's images first, then each candidate's where its template puts ``{image}``).
Each candidate's text is ONE content item of its own, so an adapter can find exactly the
characters of that text in the rendered prompt (:func:`TaskTemplate.messages` with
``sentinels``); the label and separator text around it are other items.

Placeholders: ``{n}``, ``{range}``, ``{first}``, ``{last}`` everywhere (and ``{tie}``, the tie
label, where ``tie_label`` is set); the stem's text as ``{question}``, ``{query}`` or
``{caption}`` (one name per task's habit) in ``instruction``, ``stem`` or ``query``; ``{label}``,
``{index}``, ``{text}`` and ``{image}`` in ``candidate``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    model_validator,
)

import posdebias.defaults as defaults
from posdebias._inputs import excerpt
from posdebias.core.instance import CANDIDATE_NOUNS, TASK_KINDS, Instance
from posdebias.core.labels import LabelSet
from posdebias.errors import ConfigError, InputError, validation_problems

#: The label set each task prompts with unless the adapter names one (``label_set``).
TASK_LABEL_SETS = {
    "retrieval": "digits",
    "multiple_choice": "upper",
    "pairwise_judge": "upper",
    "rerank": "digits",
}

#: The help text of every adapter's ``label_set`` option.
LABEL_SET_HELP = (
    "digits, upper, lower, roman or words; default: each task's own (letters for multiple "
    "choice and pairwise judgements, digits for retrieval and rerank)"
)


def task_label_set(task: str, chosen: str | None = None) -> str:
    """The label set a ``task``'s prompt names its candidates with: ``chosen`` (an adapter's
    ``label_set`` option) or the task's own (:data:`TASK_LABEL_SETS`: letters for multiple
    choice and judged answers, digits for retrieval and passages). The one place every adapter
    and door asks, so that one task is labelled alike whatever runs it."""
    return chosen if chosen is not None else TASK_LABEL_SETS.get(task, "digits")


def default_orders(n: int, requested: int | None = None, *, cyclic: bool = False) -> int:
    """Candidate orders T per test instance: ``requested``, or :data:`defaults.ORDERS` (5)
    where N candidates have that many orders, else all of them (N! distinct orders; N cyclic
    rotations with ``cyclic``). A pairwise judgement (N = 2) is thus shown in both orders,
    which position consistency needs. The one place the CLI, the API and sweeps decide T."""
    if requested is not None:
        return requested
    exist = n if cyclic else math.factorial(n)
    return min(defaults.ORDERS, exist)


#: The placeholders of the stem's text: one per task's habit (a question, a query, a caption).
STEM_PLACEHOLDERS = ("question", "query", "caption")

#: Private-use characters that bracket a candidate's index in a sentinel rendering.
SENTINEL_OPEN, SENTINEL_CLOSE = "\ue000", "\ue001"

#: Widest field a template may ask for (``{label:>3}``); a huge width would build a huge string.
MAX_FIELD_WIDTH = 100


def check_placeholders(template: str, values: dict[str, Any]) -> None:
    """Only the named placeholders, no attribute or index access (``{n.real}``,
    ``{caption.__class__}`` would reach into Python objects) and no huge widths."""
    for _, name, spec, _ in string.Formatter().parse(template):
        if name is None:
            continue
        if name not in values:
            raise ValueError(f"unknown placeholder {{{name[:40]}}}")
        if spec and (
            "{" in spec or any(int(run) > MAX_FIELD_WIDTH for run in re.findall(r"\d+", spec))
        ):
            raise ValueError(
                f"format spec {spec[:40]!r} of {{{name}}} is nested or wider than {MAX_FIELD_WIDTH}"
            )


def _format_problem(template: str, values: dict[str, Any]) -> str | None:
    """Why ``template`` cannot be formatted with ``values`` (:func:`check_placeholders`, then a
    trial format), naming the placeholders it may use; None when it can."""
    try:
        check_placeholders(template, values)
        template.format(**values)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        allowed = ", ".join("{" + key + "}" for key in values)
        return f"{excerpt(template)} is invalid ({str(exc)[:120]}); placeholders: {allowed}"
    return None


def candidate_parts(candidate: str) -> tuple[str, str, str]:
    """A candidate template split where the image and the text go: (before the image, between
    image and text, after the text), each a template of the other placeholders. Found by
    parsing the template, so escaped braces (``{{text}}``) stay text; without ``{image}`` the
    image (if any) goes right before the text. Raises ValueError for a template that does not
    show ``{text}`` exactly once, shows ``{image}`` twice or after it, or formats either."""
    pieces, markers = [""], []
    for literal, name, spec, conversion in string.Formatter().parse(candidate):
        pieces[-1] += literal.replace("{", "{{").replace("}", "}}")
        if name is None:
            continue
        if name in ("image", "text"):
            if spec or conversion:
                raise ValueError(f"{{{name}}} takes no format spec or conversion in candidate")
            markers.append(name)
            pieces.append("")
        else:
            shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            pieces[-1] += "{" + shown + "}"
    if markers.count("text") != 1:
        raise ValueError(
            "the candidate template never shows the candidate: put {text} in it"
            if "text" not in markers
            else "candidate template shows {text} more than once"
        )
    if markers == ["text"]:
        return pieces[0], "", pieces[1]
    if markers != ["image", "text"]:
        raise ValueError(
            "candidate template shows {image} more than once"
            if markers.count("image") > 1
            else "put {image} before {text} in the candidate template"
        )
    return pieces[0], pieces[1], pieces[2]


class TaskTemplate(BaseModel):
    """How an instance of any task becomes one chat message (module docstring).

    ``layout``: ``stem_first`` renders instruction, stem, candidates, query;
    ``candidates_first`` renders the candidates, then instruction, stem and query (the layout
    of the retrieval prompt, whose images come first). ``candidate`` is rendered once per
    candidate with ``candidate_separator`` between them (``candidates_first``: after each);
    ``separator`` joins the other parts. An empty ``stem`` is left out with its separator
    (the retrieval prompt shows its caption in ``query``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    instruction: str
    stem: str
    candidate: str = "{label}. {image}{text}"
    candidate_separator: str = "\n"
    query: str = "Answer:"
    separator: str = "\n"
    layout: Literal["stem_first", "candidates_first"] = "stem_first"
    system: str | None = None
    #: a pairwise judge's answer for "neither is better" (MT-Bench's ``[[C]]``), offered by the
    #: prompt and scored beside the answers' labels; None: no tie answer (the default)
    tie_label: str | None = None

    @model_validator(mode="after")
    def _check(self) -> TaskTemplate:
        sample: dict[str, Any] = {"n": 2, "range": "A to B", "first": "A", "last": "B"}
        if self.tie_label is not None:
            if not self.tie_label or self.tie_label != self.tie_label.strip():
                raise ValueError(
                    f"tie_label {self.tie_label!r} must be a non-empty label without spaces "
                    "around it, e.g. C"
                )
            if any(char.isspace() or char in "{}" for char in self.tie_label):
                raise ValueError(
                    f"tie_label {excerpt(self.tie_label)} must be one word (no spaces or braces)"
                )
            sample["tie"] = self.tie_label
        stem = {**sample, **dict.fromkeys(STEM_PLACEHOLDERS, "q")}
        candidate = {**sample, "label": "A", "index": 1, "text": "t", "image": ""}
        fields = {
            "instruction": (self.instruction, stem),
            "stem": (self.stem, stem),
            "candidate": (self.candidate, candidate),
            "candidate_separator": (self.candidate_separator, sample),
            "query": (self.query, stem),
        }
        for name, (template, values) in fields.items():
            problem = _format_problem(template, values)
            if problem is not None:
                raise ValueError(f"{name} template {problem}")
        if not any(
            name in STEM_PLACEHOLDERS
            for text in (self.instruction, self.stem, self.query)
            for _, name, _, _ in string.Formatter().parse(text)
        ):
            raise ValueError(
                "the prompt never shows the stem (the caption, question or query): put "
                "{question} (or {caption}, {query}) in stem or query"
            )
        candidate_parts(self.candidate)  # {text} once, {image} at most once and before it
        return self

    def recorded(self) -> dict[str, Any]:
        """The template's fields as records and its digest hold them: an unset ``tie_label``
        is left out, so templates without one read as before it existed."""
        fields = self.model_dump(mode="json")
        if fields["tie_label"] is None:
            del fields["tie_label"]
        return fields

    def digest(self) -> str:
        """sha256 of the template's canonical JSON (:meth:`recorded`; the ``prompt_hash``)."""
        canonical = json.dumps(self.recorded(), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def messages(
        self, instance: Instance, label_set: LabelSet, *, sentinels: bool = False
    ) -> list[dict]:
        """Chat messages of ``instance``: one ``{"type": "image"}`` item per image.

        ``sentinels``: candidate k's text item holds :data:`SENTINEL_OPEN` + k +
        :data:`SENTINEL_CLOSE` instead of its text, so that the text's characters can be found
        in the rendered prompt (adapters do; see :func:`candidate_char_spans`).
        """
        n = instance.n
        if sentinels:
            check_sentinel_free(instance)
        labels = label_set.labels(n)
        values: dict[str, Any] = {
            "n": n,
            "range": label_set.range_text(n),
            "first": labels[0],
            "last": labels[-1],
        }
        if self.tie_label is not None:
            values["tie"] = self.tie_label
        stem_text = dict.fromkeys(STEM_PLACEHOLDERS, instance.stem)
        head = self.instruction.format(**values, **stem_text)
        stem = self.stem.format(**values, **stem_text) + self.separator if self.stem else ""
        tail = self.query.format(**values, **stem_text)
        between = self.candidate_separator.format(**values)
        before_image, after_image, after_text = candidate_parts(self.candidate)
        content: list[dict] = [{"type": "image"} for _ in instance.stem_images]
        parts: list[dict] = []
        for index, (label, candidate) in enumerate(
            zip(labels, instance.candidates, strict=True), start=1
        ):
            fill = {**values, "label": label, "index": index}
            _add_text(parts, before_image.format(**fill))
            if candidate.image is not None:
                parts.append({"type": "image"})
            _add_text(parts, after_image.format(**fill))
            if candidate.text is not None:
                shown = (
                    f"{SENTINEL_OPEN}{index - 1}{SENTINEL_CLOSE}" if sentinels else candidate.text
                )
                parts.append({"type": "text", "text": shown})
            _add_text(parts, after_text.format(**fill))
            if self.layout == "candidates_first" or index < n:
                _add_text(parts, between)
        if self.layout == "stem_first":
            content += [{"type": "text", "text": head + self.separator + stem}]
            content += parts
            _add_text(content, self.separator + tail)
        else:
            content += parts
            _add_text(content, head + self.separator + stem + tail)
        messages: list[dict] = [{"role": "user", "content": content}]
        if self.system is not None:
            messages.insert(
                0, {"role": "system", "content": [{"type": "text", "text": self.system}]}
            )
        return messages


def check_sentinel_free(instance: Instance) -> None:
    """Refuse ``instance`` if a text of it holds :data:`SENTINEL_OPEN` or
    :data:`SENTINEL_CLOSE`, the characters that place the candidates' spans in the prompt
    (adapters call it before a run, so that no run stops at such an instance)."""
    if any(
        SENTINEL_OPEN in text or SENTINEL_CLOSE in text
        for text in (instance.stem, *(t for t in instance.texts if t is not None))
    ):
        raise InputError(
            f"instance {excerpt(instance.id)} holds the private-use characters U+E000 / "
            "U+E001, which posdebias uses to place the candidates' spans; remove them"
        )


def _add_text(content: list[dict], text: str) -> None:
    if text:
        content.append({"type": "text", "text": text})


#: Each task's request for the bare label: the end of its default instruction, which the
#: reasoning variants replace (:func:`task_variant`). Retrieval's is the paper's.
ANSWER_ONLY: dict[str, str] = {
    "retrieval": "Respond with the index number only and nothing else.",
    "multiple_choice": "Respond with the label ({range}) of the correct option only and "
    "nothing else.",
    "pairwise_judge": "Respond with {first} or {last} only and nothing else.",
    "rerank": "Respond with the passage's label only and nothing else.",
}

#: A pairwise judge's request for the bare label when its template offers a tie answer
#: (``tie_label``; MT-Bench's judge prompt: "[[C]] for a tie").
TIE_ANSWER_ONLY = "Respond with {first} or {last}, or {tie} for a tie, only and nothing else."

#: What a judge template with a tie label but neither the default request nor ``{tie}`` gets
#: appended to its instruction, so that the prompt always offers the tie answer.
TIE_OFFER = "Respond with {tie} for a tie."


def answer_only(task: str, template: TaskTemplate) -> str:
    """The request for the bare label of ``task`` as ``template`` poses it: the tie variant
    for a judge with a tie label (:data:`TIE_ANSWER_ONLY`), else :data:`ANSWER_ONLY`."""
    if task == "pairwise_judge" and template.tie_label is not None:
        return TIE_ANSWER_ONLY
    return ANSWER_ONLY[task]


def scored_labels(task: str | None, template: TaskTemplate | None, labels: list[str]) -> list[str]:
    """The labels an adapter scores for an instance of ``task`` whose answers are ``labels``:
    those, plus the template's tie label for a pairwise judge with one (last). Refuses a tie
    label that is also an answer's label (a :class:`ConfigError`: exit 2)."""
    tie = template.tie_label if template is not None and task == "pairwise_judge" else None
    if tie is None:
        return labels
    if tie in labels:
        raise ConfigError(
            f"task_prompt.tie_label {tie!r} is also an answer's label ({', '.join(labels)}); "
            "choose another tie label (e.g. C with letters, 3 with digits)"
        )
    return [*labels, tie]


DEFAULT_TEMPLATES: dict[str, TaskTemplate] = {
    # the method's prompt (the paper's words): the N images, then instruction and caption
    "retrieval": TaskTemplate(
        instruction="Given {n} images indexed from {range}, identify the image that best "
        "matches the provided caption. " + ANSWER_ONLY["retrieval"],
        stem="",
        candidate="{image}{text}",
        candidate_separator="",
        query="Caption: {caption}\nAnswer:",
        layout="candidates_first",
    ),
    "multiple_choice": TaskTemplate(
        instruction="Answer the following multiple-choice question. "
        + ANSWER_ONLY["multiple_choice"],
        stem="Question: {question}\nOptions:",
        candidate="{label}. {image}{text}",
    ),
    "pairwise_judge": TaskTemplate(
        instruction="Which of the two answers to the question below is better? "
        + ANSWER_ONLY["pairwise_judge"],
        stem="Question: {question}",
        candidate="Answer {label}: {text}",
        query="Better answer:",
    ),
    "rerank": TaskTemplate(
        instruction="Given a query and {n} passages labelled {range}, identify the passage "
        "that answers the query best. " + ANSWER_ONLY["rerank"],
        stem="Query: {query}",
        candidate="[{label}] {text}",
    ),
}

#: The tasks whose candidates are texts: the adapter option ``task_prompt`` sets their
#: templates' fields (retrieval's is the option ``prompt``).
TEXT_TASKS = ("multiple_choice", "pairwise_judge", "rerank")

#: The adapter option that sets each task's template fields.
TEMPLATE_OPTIONS = {"retrieval": "prompt", **dict.fromkeys(TEXT_TASKS, "task_prompt")}

#: The prompt variants (the generated baselines' prompts), for every task: ``plain`` is the
#: template as configured; the others add a request to it in the task's words
#: (:data:`VARIANT_WORDINGS`, :func:`task_variant`).
PROMPT_VARIANTS = (
    "plain",
    "instruction",
    "cot",
    "self_consistency",
    "posdebias_instruction",
    "posdebias_cot",
)


@dataclass(frozen=True)
class Wording:
    """One prompt variant's words for one task (:func:`task_variant`).

    ``request``: the sentence the variant adds (``{things}``: the task's noun);
    ``request_for_labels``: the same when the labels are not digits (the paper asks for an
    integer); ``query_end``: what the query ends with, appended to it, or in place of a
    trailing ``Answer:`` with ``after_answer`` (else on a line of its own).
    """

    request: str
    request_for_labels: str | None = None
    query_end: str = ""
    after_answer: bool = False


#: The text tasks' variant wordings, in each task's noun.
TEXT_WORDINGS = {
    "instruction": Wording(
        "Please note that the provided {things} have been randomly shuffled, so it is "
        "essential to consider them fairly and without bias. Analyze their content "
        "objectively and do not be influenced by the order of the {things}."
    ),
    "cot": Wording(
        "Please think step by step. First, write your reasoning inside <think> and </think> "
        "tags. Then, after the closing </think> tag, output only the label of the final "
        "answer (one of {range}).",
        query_end=" <think>",
    ),
    "self_consistency": Wording(
        "Please think step by step to analyze the {things}. After your reasoning, provide the "
        'final answer in the exact format: "The answer is <label>".'
    ),
    "posdebias_instruction": Wording(
        "The order of the {things} is arbitrary: judge each by its content only, never by its "
        "position in the list."
    ),
    "posdebias_cot": Wording(
        "Think step by step: judge each of the {things} by its content, then give the label "
        "({range}) of the best one at the end.",
        query_end="\nLet's think step by step.",
    ),
}

#: The retrieval prompt's variants: ``instruction``, ``cot`` and ``self_consistency`` are the
#: paper's prompts word for word (its Appendix E, Table 9); ``posdebias_instruction`` and
#: ``posdebias_cot`` are posdebias's earlier wordings, kept so that older runs can be repeated.
RETRIEVAL_WORDINGS = {
    "instruction": Wording(
        "Please note that the provided images have been randomly shuffled, so it is essential "
        "to consider them fairly and without bias. Analyze the visual content objectively and "
        "do not be influenced by the order of the images."
    ),
    "cot": Wording(
        "Please think step by step. First, write your reasoning inside <think> and </think> "
        "tags. Then, after the closing </think> tag, output only the final answer index (a "
        "single integer from {range}).",
        "Please think step by step. First, write your reasoning inside <think> and </think> "
        "tags. Then, after the closing </think> tag, output only the final answer label (one "
        "of {range}).",
        query_end="Answer: <think>",
        after_answer=True,
    ),
    "self_consistency": Wording(
        "Please think step by step to analyze the content of the images. After your "
        'reasoning, provide the final answer in the exact format: "The answer is <index>".',
        "Please think step by step to analyze the content of the images. After your "
        'reasoning, provide the final answer in the exact format: "The answer is <label>".',
    ),
    "posdebias_instruction": Wording(
        "The order of the images is arbitrary: judge each image by its content only, never by "
        "its position in the list."
    ),
    "posdebias_cot": Wording(
        "Think step by step: describe what each image shows and compare it with the caption, "
        "then give the index ({range}) of the best match at the end.",
        query_end="Let's think step by step.",
        after_answer=True,
    ),
}

#: Each task's variant wordings (:data:`PROMPT_VARIANTS` but ``plain``).
VARIANT_WORDINGS: dict[str, dict[str, Wording]] = {
    "retrieval": RETRIEVAL_WORDINGS,
    **dict.fromkeys(TEXT_TASKS, TEXT_WORDINGS),
}


def task_variant(
    task: str, template: TaskTemplate, name: str, label_set: str | None = None
) -> TaskTemplate:
    """``template`` (of ``task``) under a prompt variant (:data:`PROMPT_VARIANTS`), in the
    task's words (:data:`VARIANT_WORDINGS`; ``label_set``, the adapter's, picks the request
    for digits or for other labels).

    The task sentence is the instruction without the task's answer-only request
    (:data:`ANSWER_ONLY`, wherever it stands), stripped. ``instruction`` puts its request
    between the task sentence and the answer-only request (at the end when the instruction has
    none); ``posdebias_instruction`` appends its request to the instruction; ``cot``,
    ``self_consistency`` and ``posdebias_cot`` put their request after the task sentence
    (``cot`` and ``self_consistency`` on a new line) and end the query as the wording says.
    A judge's request with a tie label (:data:`TIE_ANSWER_ONLY`) is handled alike, and the
    variants that drop it keep the tie offer (:data:`TIE_OFFER`), so every variant's prompt
    offers the tie.
    """
    if name == "plain":
        return template
    wordings = VARIANT_WORDINGS[task]
    if name not in wordings:
        raise ConfigError(
            f"unknown prompt variant {name!r}; choose one of: {', '.join(PROMPT_VARIANTS)}"
        )
    wording = wordings[name]
    digits = task_label_set(task, label_set) == "digits"
    request_text = wording.request if digits else wording.request_for_labels or wording.request
    hint = request_text.replace("{things}", CANDIDATE_NOUNS[task])
    request = answer_only(task, template)
    instruction = template.instruction
    has_answer_only = request in instruction
    sentence = instruction.replace(request, "").strip()  # the task sentence
    if name == "instruction":
        update = {"instruction": _joined(sentence, hint, request if has_answer_only else "")}
    elif name == "posdebias_instruction":
        update = {"instruction": _joined(instruction, hint)}
    else:
        glue = "\n" if name in ("cot", "self_consistency") else " "
        if has_answer_only and request == TIE_ANSWER_ONLY:
            hint = _joined(hint, TIE_OFFER)  # the dropped request offered the tie: keep the offer
        update = {"instruction": sentence + glue + hint if sentence.strip() else hint}
        if wording.query_end:
            update["query"] = _query_ending(template.query, wording)
    return template.model_copy(update=update)


def _query_ending(query: str, wording: Wording) -> str:
    stripped = query.rstrip()
    if not wording.after_answer:
        return stripped + wording.query_end
    if stripped.endswith("Answer:"):
        return stripped[: -len("Answer:")] + wording.query_end
    return stripped + "\n" + wording.query_end


def _joined(*sentences: str) -> str:
    return " ".join(sentence for sentence in sentences if sentence.strip())


def task_template(task: str, override: TaskTemplate | dict[str, Any] | None = None) -> TaskTemplate:
    """The template of ``task``: its default, with the fields of ``override`` replaced (for
    retrieval also in the older form, :func:`template_fields`)."""
    if task not in DEFAULT_TEMPLATES:
        raise ConfigError(f"unknown task {task!r}; choose one of: {', '.join(TASK_KINDS)}")
    base = DEFAULT_TEMPLATES[task]
    if override is None:
        return base
    if isinstance(override, TaskTemplate):
        return override
    option = TEMPLATE_OPTIONS[task] + ("" if task == "retrieval" else f" for {task}")
    if task == "retrieval":
        override = template_fields(override)
    fields = {**base.model_dump(), **override}
    if task != "pairwise_judge":
        fields["tie_label"] = None  # a tie is a judge's answer; other tasks have none
    elif fields.get("tie_label") is not None:
        fields["instruction"] = _tie_offered(fields)
    try:
        return TaskTemplate.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc, unknown="field"))
        raise ConfigError(f"{option}: {problems[:400]}") from None


#: The fields of the retrieval prompt's older form, read by :func:`template_fields`.
FORMER_FIELDS = ("image_prefix", "image_suffix", "images_first")


def template_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Template fields of a retrieval prompt given in either form: as they are, or in the
    older form, whose ``image_prefix`` + ``{image}`` + ``image_suffix`` is the candidate
    template and whose ``images_first: false`` is the ``stem_first`` layout."""
    former = {name: fields[name] for name in FORMER_FIELDS if name in fields}
    if not former:
        return dict(fields)
    both = [name for name in ("candidate", "candidate_separator", "layout") if name in fields]
    if both:
        raise ConfigError(
            f"prompt: give {both[0]} or the older {', '.join(former)}, not both "
            "(candidate = image_prefix + {image} + image_suffix + {text})"
        )
    prefix, suffix = former.get("image_prefix", ""), former.get("image_suffix", "")
    first = former.get("images_first", True)
    if not isinstance(prefix, str) or not isinstance(suffix, str) or not isinstance(first, bool):
        raise ConfigError(
            "prompt: image_prefix and image_suffix must be texts and images_first true or false"
        )
    values = {"n": 2, "range": "1 to 2", "first": "1", "last": "2", "label": "1", "index": 1}
    for name, text in (("image_prefix", prefix), ("image_suffix", suffix)):
        problem = _format_problem(text, values)
        if problem is not None:
            raise ConfigError(
                f"prompt: {name} {problem} (the image goes between image_prefix and image_suffix)"
            )
    rest = {name: value for name, value in fields.items() if name not in FORMER_FIELDS}
    return {
        **rest,
        "candidate": prefix + "{image}" + suffix + "{text}",
        "candidate_separator": "",
        "layout": "candidates_first" if first else "stem_first",
    }


def former_digest(template: TaskTemplate) -> str | None:
    """The prompt hash a retrieval state fitted with ``template`` recorded before retrieval
    became a task template (the digest of the template's older form), so that such states
    keep fitting; None when the older form could not express the template."""
    has_image = any(
        name == "image" for _, name, _, _ in string.Formatter().parse(template.candidate)
    )
    prefix, suffix, tail = candidate_parts(template.candidate)
    if (
        template.stem
        or template.candidate_separator
        or template.tie_label is not None
        or not has_image
        or tail
    ):
        return None
    fields = {
        "instruction": template.instruction,
        "query": template.query,
        "image_prefix": prefix,
        "image_suffix": suffix,
        "separator": template.separator,
        "images_first": template.layout == "candidates_first",
        "system": template.system,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def adapter_templates(
    prompt: TaskTemplate | None,
    task_prompt: Mapping[str, Any] | None,
    variant: str,
    label_set: str | None,
    *,
    answer_space: bool = False,
) -> tuple[dict[str, TaskTemplate], dict[str, TaskTemplate]]:
    """Every task's template as an adapter's options configure it (``prompt``: retrieval's;
    ``task_prompt``: fields of the text tasks'; ``answer_space``: retrieval's query ends with a
    space, as the authors' prompts), and the same under the prompt ``variant`` (derived from
    the spaced query, so that ``cot`` keeps its ``Answer: <think>``): the one place every
    adapter takes its templates from."""
    retrieval = prompt or DEFAULT_TEMPLATES["retrieval"]
    if answer_space and not retrieval.query.endswith(" "):
        retrieval = retrieval.model_copy(update={"query": retrieval.query + " "})
    configured = {"retrieval": retrieval}
    configured.update(
        (task, task_template(task, None if task_prompt is None else dict(task_prompt)))
        for task in TEXT_TASKS
    )
    varied = {
        task: task_variant(task, template, variant, label_set)
        for task, template in configured.items()
    }
    return configured, varied


def _tie_offered(fields: dict[str, Any]) -> str:
    """A judge instruction that offers the tie answer: as written where it or the query names
    ``{tie}``; else the default request for the label becomes :data:`TIE_ANSWER_ONLY`, and
    any other instruction gets :data:`TIE_OFFER` appended."""
    instruction = str(fields["instruction"])
    if "{tie}" in instruction or "{tie}" in str(fields.get("query", "")):
        return instruction
    default = ANSWER_ONLY["pairwise_judge"]
    if instruction.endswith(default):
        return instruction[: -len(default)] + TIE_ANSWER_ONLY
    return _joined(instruction, TIE_OFFER)


def check_task_fields(fields: dict[str, Any] | None) -> dict[str, Any] | None:
    """``fields`` if they make a valid template of every candidate task (:func:`task_template`
    raises a :class:`ConfigError`, a ValueError, naming the field that does not)."""
    if fields is not None:
        unknown = [name for name in fields if name not in TaskTemplate.model_fields]
        if unknown:
            known = ", ".join(TaskTemplate.model_fields)
            raise ValueError(f"unknown field {unknown[0]!r}; the fields: {known}")
        for task in TEXT_TASKS:
            task_template(task, fields)
    return fields


def _template_as_fields(value: Any) -> Any:
    return value.model_dump() if isinstance(value, TaskTemplate) else value


#: An adapter option holding task-template fields (``task_prompt``, a mapping or a whole
#: :class:`TaskTemplate`): each replaces that field of every candidate task's own template;
#: checked when the options are read.
TaskTemplateFields = Annotated[
    dict[str, Any] | None,
    BeforeValidator(_template_as_fields),
    AfterValidator(check_task_fields),
]

#: The help text of every adapter's ``prompt`` option.
PROMPT_HELP = (
    "the retrieval prompt's template fields, or a JSON file of them (default: the method's "
    "prompt; the Tasks page)"
)

#: The help text of every adapter's ``task_prompt`` option.
TASK_PROMPT_HELP = (
    "fields of the candidate tasks' prompt template (multiple_choice, pairwise_judge, rerank), "
    "each replacing that field of the task's own template (the Tasks page)"
)


def text_only_messages(messages: list[dict]) -> list[dict]:
    """The same messages with each content list joined into one string (text-only chat
    templates expect ``content`` to be a string); refuses image items."""
    for message in messages:
        content = message["content"]
        if isinstance(content, list) and any(item.get("type") != "text" for item in content):
            raise ConfigError(
                "this model reads text only, but the prompt holds images; use a "
                "vision-language model for instances with images"
            )
    return joined_text_messages(messages)


def joined_text_messages(messages: list[dict]) -> list[dict]:
    """The same messages with adjacent text items joined (nothing between them, as the chat
    templates that iterate over items render them); a content of text only becomes one string.

    The prompt's text is the items' concatenation. A server that renders a text-only chat
    template joins the items of a list itself, with its own separator (vLLM: a newline), so
    what is sent must already be one string.
    """
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            items: list[dict] = []
            for item in content:
                if item.get("type") == "text" and items and items[-1].get("type") == "text":
                    items[-1] = {**items[-1], "text": items[-1]["text"] + item["text"]}
                else:
                    items.append(item)
            texts_only = all(item.get("type") == "text" for item in items)
            content = "".join(item["text"] for item in items) if texts_only else items
        out.append({**message, "content": content})
    return out


def candidate_char_spans(
    marked: str, texts: list[str | None]
) -> tuple[str, list[tuple[int, int] | None]]:
    """Replace the sentinels of a rendered prompt by the candidates' texts.

    Returns the prompt as rendered with the real texts and, per candidate, the character range
    ``[start, end)`` of its text in it (None for a candidate without text). Raises
    :class:`ConfigError` when a sentinel is missing or repeated (a chat template that drops or
    copies message content).
    """
    pattern = re.compile(re.escape(SENTINEL_OPEN) + r"(\d+)" + re.escape(SENTINEL_CLOSE))
    pieces: list[str] = []
    spans: list[tuple[int, int] | None] = [None] * len(texts)
    cursor = 0
    for match in pattern.finditer(marked):
        index = int(match.group(1))
        text = texts[index] if index < len(texts) else None
        if text is None or spans[index] is not None:
            raise ConfigError(
                f"the chat template rendered candidate {index + 1}'s text more than once or for "
                "a candidate without text; posdebias cannot place its span"
            )
        pieces.append(marked[cursor : match.start()])
        start = sum(map(len, pieces))  # where the text starts in the rendered prompt
        spans[index] = (start, start + len(text))
        pieces.append(text)
        cursor = match.end()
    pieces.append(marked[cursor:])
    missing = [k + 1 for k, text in enumerate(texts) if text is not None and spans[k] is None]
    if missing:
        raise ConfigError(
            f"the chat template dropped the text of candidates {missing}; posdebias cannot "
            "place their spans"
        )
    return "".join(pieces), spans
