"""The paper's generated baselines: free text, then the index parsed from it.

* ``generated`` (the paper's vanilla): greedy, a few new tokens, the first valid label.
* ``instruction``: the same under the ``instruction`` prompt variant (judge by content, not
  order).
* ``chain_of_thought``: the ``cot`` prompt variant, greedy, up to 1,024 new tokens, the LAST
  valid label of the text.
* ``self_consistency``: 10 chains of thought sampled at temperature 0.7 with top-k 40 from one
  shared prefill, majority vote over the parsed answers. A tie goes to the tied answer that the
  earliest sample produced; when no sample parses there is no answer (counted as wrong), or,
  with ``fallback: first``, position 1 (the authors' rule).

An answer that names no valid label is no answer: it counts as wrong and as a parse failure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field

from posdebias._markers import hookimpl
from posdebias.adapters.base import Adapter, GenerationSettings
from posdebias.core.answers import AnswerParser
from posdebias.core.instance import RetrievalInstance
from posdebias.decoders.base import Decision, Decoder, DecoderOptions

PromptVariant = Literal["plain", "instruction", "cot"]


class GeneratedOptions(DecoderOptions):
    prompt_variant: PromptVariant | None = Field(
        default=None, description="plain, instruction or cot (default: the adapter's prompt)"
    )
    max_new_tokens: int = Field(default=8, ge=1, description="new tokens per text at most")
    parse: Literal["first", "last"] = Field(default="first", description="which valid label")
    stop: list[str] = Field(default_factory=list, description="stop strings")


class CotOptions(GeneratedOptions):
    prompt_variant: PromptVariant | None = Field(
        default="cot", description="plain, instruction or cot"
    )
    max_new_tokens: int = Field(default=1024, ge=1, description="new tokens per text at most")
    parse: Literal["first", "last"] = Field(
        default="last", description="which valid label: the answer comes after the reasoning"
    )


class SelfConsistencyOptions(CotOptions):
    samples: int = Field(default=10, ge=1, description="sampled chains per order")
    temperature: float = Field(default=0.7, gt=0, description="sampling temperature")
    top_k: int | None = Field(
        default=40, ge=1, description="sample among the k most likely tokens (null: all)"
    )
    fallback: Literal["none", "first"] = Field(
        default="none", description="when no chain parses: no answer, or position 1"
    )


def label_set_of(adapter: Adapter) -> str:
    return str(getattr(adapter, "label_set", "digits"))


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
        views: Sequence[RetrievalInstance],
        *,
        batch_size: int = 1,
        seeds: Sequence[int],
    ) -> list[Decision]:
        generations = adapter.generate_many(
            views, self.settings(), batch_size=batch_size, seeds=seeds
        )
        decisions: list[Decision] = []
        for view, generation in zip(views, generations, strict=True):
            parser = AnswerParser(label_set_of(adapter), view.n, self.options.parse)
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
        prompt_variant: PromptVariant | None = Field(
            default="instruction", description="plain, instruction or cot"
        )


class ChainOfThought(Generated):
    name = "chain_of_thought"
    Options = CotOptions
    options: CotOptions
    summary = "reason first, then the index: the last valid label of the text"


class SelfConsistency(Generated):
    name = "self_consistency"
    Options = SelfConsistencyOptions
    options: SelfConsistencyOptions
    summary = "majority vote over sampled chains of thought sharing one prefill"

    def sampling(self) -> dict[str, Any]:
        return {
            "do_sample": True,
            "num_samples": self.options.samples,
            "temperature": self.options.temperature,
            "top_k": self.options.top_k,
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


@hookimpl
def posdebias_register_decoders(register: Callable[[type[Decoder]], None]) -> None:
    for decoder in (Generated, Instruction, ChainOfThought, SelfConsistency):
        register(decoder)


__all__ = [
    "ChainOfThought",
    "Generated",
    "Instruction",
    "SelfConsistency",
    "majority_vote",
]
