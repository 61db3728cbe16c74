"""The built-in plugin: posdebias registers its own adapters and calibrators through the same
hooks as third parties."""

from __future__ import annotations

from posdebias.registry.hookspecs import hookimpl


@hookimpl
def posdebias_register_adapters(register):
    from posdebias.adapters import BUILTIN_ADAPTERS

    for adapter in BUILTIN_ADAPTERS:
        register(adapter)


@hookimpl
def posdebias_register_decoders(register):
    from posdebias.decoders import BUILTIN_DECODERS

    for decoder in BUILTIN_DECODERS:
        register(decoder)


@hookimpl
def posdebias_register_calibrators(register):
    from posdebias.calibrators import BUILTIN_CALIBRATORS

    for calibrator in BUILTIN_CALIBRATORS:
        register(calibrator)
