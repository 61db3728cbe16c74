"""Built-in decoders: methods that call the model themselves (generated answers, SoFA)."""

from posdebias.decoders.base import Decision, Decoder, DecoderOptions
from posdebias.decoders.generated import ChainOfThought, Generated, Instruction, SelfConsistency
from posdebias.decoders.sofa import Sofa

BUILTIN_DECODERS: tuple[type[Decoder], ...] = (
    Generated,
    Instruction,
    ChainOfThought,
    SelfConsistency,
    Sofa,
)

__all__ = [
    "BUILTIN_DECODERS",
    "ChainOfThought",
    "Decision",
    "Decoder",
    "DecoderOptions",
    "Generated",
    "Instruction",
    "SelfConsistency",
    "Sofa",
]
