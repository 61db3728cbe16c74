"""Failures of third-party code during a run: named, and never posdebias's internal error.

posdebias's own adapters and calibrators raising is a bug (the CLI reports an internal error
and asks for a report). A plugin's adapter or calibrator raising is the plugin's problem: the
error names the calibrator or adapter, the plugin and its distribution, and a failing
calibrator is dropped from the run while the others carry on.
"""

from __future__ import annotations

import warnings

from posdebias.errors import PosdebiasPluginWarning
from posdebias.registry import get_registry


def third_party_origin(kind: str, obj: object) -> str | None:
    """Where a third-party adapter or calibrator comes from (``plugin 'p' (distribution d
    1.0)``, or its module when it was never registered); None for posdebias's own classes."""
    cls = type(obj)
    if cls.__module__.split(".")[0] == "posdebias":
        return None
    info = get_registry().plugin_of(kind, cls)
    return info.describe() if info is not None else f"module {cls.__module__}"


def failure_message(kind: str, name: str, origin: str, exc: BaseException, where: str) -> str:
    """One line: what failed, who provides it, where, and the plugin's own error."""
    return f"{kind} {name!r} from {origin} failed {where}: {type(exc).__name__}: {exc}"


def warn_plugin(message: str) -> None:
    warnings.warn(message, PosdebiasPluginWarning, stacklevel=3)
