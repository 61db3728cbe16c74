"""The paper's generated baselines: free text, then the index parsed from it.

Each row's prompt is the paper's (posdebias.adapters.hf.prompt, its Table 9 word for word):

* ``generated`` (the paper's vanilla): greedy, a few new tokens (8), the first valid label.
* ``instruction``: the same under the paper's ``instruction`` prompt (the images were shuffled,
  judge them fairly).
* ``chain_of_thought``: the paper's ``cot`` prompt (reasoning in ``<think>`` tags), greedy, up
  to 1,024 new tokens, the LAST valid label of the text.
* ``self_consistency``: the paper's ``self_consistency`` prompt ("The answer is <index>"), 10
  samples at temperature 0.7 with top-k 40, up to 512 new tokens, from one shared prefill; each
  sample's answer is its first "The answer is K" (a K outside 1..N casts no vote; no such
  phrase: the last number in 1..N); majority vote. ``sampling: generation_config`` also applies
  the checkpoint's other generation-config sampling settings (top_p, ...), as the authors'
  ``generate`` does. A tie goes to the tied answer that the
  earliest sample produced; when no sample votes there is no answer (counted as wrong), or,
  with ``fallback: first``, position 1 (the authors' rule).

An answer that names no valid label is no answer: it counts as wrong and as a parse failure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

import posdebias.defaults as defaults
from posdebias._markers import register_hook
from posdebias.adapters.base import Adapter, GenerationSettings
from posdebias.adapters.hf.prompt import PROMPT_VARIANTS
from posdebias.core.answers import AnswerParser, Which
from posdebias.core.instance import Instance
from posdebias.decoders.base import Decision, Decoder, DecoderOptions

VARIANTS_TEXT = ", ".join(PROMPT_VARIANTS)
PARSE_TEXT = "first, last (valid label), last_number (authors' vanilla) or answer_is"


class GeneratedOptions(DecoderOptions):
    prompt_variant: str | None = Field(
        default=None, description=f"{VARIANTS_TEXT} (default: the adapter's prompt)"
    )
    max_new_tokens: int = Field(
        default=8, ge=1, le=defaults.MAX_NEW_TOKENS, description="new tokens per text at most"
    )
    parse: Which = Field(default="first", description=f"which label is the answer: {PARSE_TEXT}")
    stop: list[str] = Field(default_factory=list, description="stop strings")

    @field_validator("prompt_variant")
    @classmethod
    def _known_variant(cls, value: str | None) -> str | None:
        if value is not None and value not in PROMPT_VARIANTS:
            raise ValueError(f"unknown prompt variant {value!r}; choose one of {VARIANTS_TEXT}")
        return value


class CotOptions(GeneratedOptions):
    prompt_variant: str | None = Field(default="cot", description=VARIANTS_TEXT)
    max_new_tokens: int = Field(
        default=1024, ge=1, le=defaults.MAX_NEW_TOKENS, description="new tokens per text at most"
    )
    parse: Which = Field(
        default="last",
        description=f"which label is the answer (it comes after the reasoning): {PARSE_TEXT}",
    )


class SelfConsistencyOptions(CotOptions):
    prompt_variant: str | None = Field(default="self_consistency", description=VARIANTS_TEXT)
    max_new_tokens: int = Field(
        default=512, ge=1, le=defaults.MAX_NEW_TOKENS, description="new tokens per sample at most"
    )
    parse: Which = Field(
        default="answer_is",
        description=f"which label is a sample's answer: {PARSE_TEXT}",
    )
    samples: int = Field(
        default=10, ge=1, le=defaults.MAX_SAMPLES, description="sampled chains per order"
    )
    temperature: float = Field(default=0.7, gt=0, le=100, description="sampling temperature")
    top_k: int | None = Field(
        default=40,
        ge=1,
        le=10_000_000,
        description="sample among the k most likely tokens (null: all)",
    )
    fallback: Literal["none", "first"] = Field(
        default="none", description="when no chain parses: no answer, or position 1"
    )
    sampling: Literal["own", "generation_config"] = Field(
        default="own",
        description="sample with temperature and top_k only (own), or also with the "
        "checkpoint's generation-config settings (top_p, min_p, ...) as the authors' generate",
    )


def tie_label_of(adapter: Adapter, task: str) -> str | None:
    """The tie label ``adapter`` offers a pairwise judge (``task_prompt.tie_label``), else
    None: a generated verdict that names it is the tie (position N of the parsed answers)."""
    templates = getattr(adapter, "task_templates", None) or {}
    template = templates.get(task) if task == "pairwise_judge" else None
    return None if template is None else template.tie_label


class Generated(Decoder):
    """Greedy generation parsed for the index (the paper's vanilla row)."""

    name = "generated"
    Options = GeneratedOptions
    options: GeneratedOptions
    summary = "greedy generation, the index parsed from the text (the paper's vanilla)"
    default_variant: ClassVar[str | None] = None

    def settings(self) -> GenerationSettings:
        options = self.options
        return GenerationSettings(
            max_new_tokens=options.max_new_tokens,
            stop=tuple(options.stop),
            prompt_variant=options.prompt_variant or self.default_variant,
            **self.sampling(),
        )

    def sampling(self) -> dict[str, Any]:
        return {}

    def vote(self, answers: list[int | None]) -> int | None:
        return answers[0]

    def decide(
        self,
        adapter: Adapter,
        views: Sequence[Instance],
        *,
        batch_size: int = 1,
        seeds: Sequence[int],
    ) -> list[Decision]:
        generations = adapter.generate_many(
            views, self.settings(), batch_size=batch_size, seeds=seeds
        )
        decisions: list[Decision] = []
        for view, generation in zip(views, generations, strict=True):
            parser = AnswerParser(
                adapter.label_set_for(view.task),
                view.n,
                self.options.parse,
                tie_label_of(adapter, view.task),
            )
            answers = [parser.parse(text) for text in generation.texts]
            decisions.append(
                Decision(
                    choice=self.vote(answers),
                    texts=list(generation.texts),
                    answers=answers,
                    forward_passes=generation.forward_passes,
                    generated_tokens=generation.generated_tokens,
                    seconds=generation.seconds,
                )
            )
        return decisions


class Instruction(Generated):
    name = "instruction"
    summary = "greedy generation under the debiasing instruction prompt"
    default_variant = "instruction"

    class Options(GeneratedOptions):
        prompt_variant: str | None = Field(default="instruction", description=VARIANTS_TEXT)


class ChainOfThought(Generated):
    name = "chain_of_thought"
    Options = CotOptions
    options: CotOptions
    summary = "reason first, then the index: the last valid label of the text"


class SelfConsistency(Generated):
    name = "self_consistency"
    Options = SelfConsistencyOptions
    options: SelfConsistencyOptions
    summary = "majority vote over sampled reasoning chains sharing one prefill"

    def sampling(self) -> dict[str, Any]:
        return {
            "do_sample": True,
            "num_samples": self.options.samples,
            "temperature": self.options.temperature,
            "top_k": self.options.top_k,
            "sampling_config": self.options.sampling,
        }

    def vote(self, answers: list[int | None]) -> int | None:
        return majority_vote(answers, fallback=self.options.fallback)


def majority_vote(answers: Sequence[int | None], *, fallback: str = "none") -> int | None:
    """The most frequent parsed answer; ties go to the tied answer produced earliest; with no
    parsed answer: None, or 0 (position 1) when ``fallback == "first"``."""
    valid = [answer for answer in answers if answer is not None]
    if not valid:
        return 0 if fallback == "first" else None
    counts = Counter(valid)
    best = max(counts.values())
    return next(answer for answer in valid if counts[answer] == best)


posdebias_register_decoders = register_hook(Generated, Instruction, ChainOfThought, SelfConsistency)


__all__ = [
    "ChainOfThought",
    "Generated",
    "Instruction",
    "SelfConsistency",
    "majority_vote",
]
