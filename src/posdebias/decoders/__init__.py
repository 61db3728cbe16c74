"""Built-in decoders: methods that call the model themselves (generated answers, SoFA, cloze);
each module registers its classes through the plugin hook (see
:data:`posdebias.registry.BUILTIN_PLUGINS`)."""

from posdebias.decoders.base import Decision, Decoder, DecoderOptions
from posdebias.decoders.cloze import Cloze, ClozeMean
from posdebias.decoders.generated import ChainOfThought, Generated, Instruction, SelfConsistency
from posdebias.decoders.sofa import Sofa

__all__ = [
    "ChainOfThought",
    "Cloze",
    "ClozeMean",
    "Decision",
    "Decoder",
    "DecoderOptions",
    "Generated",
    "Instruction",
    "SelfConsistency",
    "Sofa",
]
