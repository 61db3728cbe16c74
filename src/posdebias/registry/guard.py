"""Calls into adapter and calibrator code, checked at the boundary: a failure, or a result that
breaks the contract (a wrong number of observations or labels), is a :class:`PluginError` that
names the plugin which registered the class, instead of an "internal error" of posdebias.

A built-in adapter or calibrator raising something unexpected is our bug and stays one (the CLI
reports it as an internal error); a broken result is reported the same way for both.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from posdebias.core.instance import RetrievalInstance
from posdebias.core.observation import Observation, Prediction
from posdebias.errors import ObservationError, PluginError, PosdebiasError, UnknownNameError
from posdebias.registry.manager import BUILTIN_PLUGINS, get_registry


def provider_of(kind: str, name: str) -> str | None:
    """The plugin that registered ``kind`` ``name``, or None for an unregistered class."""
    try:
        return get_registry().provider(kind, name)
    except UnknownNameError:
        return None


def _blame(kind: str, name: str) -> tuple[str, str]:
    plugin = provider_of(kind, name)
    where = f"plugin {plugin!r}" if plugin else "an unregistered class"
    fix = (
        f"report it to the plugin's authors, or leave it out with POSDEBIAS_BLOCK_PLUGINS={plugin}"
        if plugin and plugin not in BUILTIN_PLUGINS
        else "please report it"
    )
    return f"{kind} {name!r} (from {where})", fix


@contextmanager
def plugin_call(kind: str, name: str, action: str) -> Iterator[None]:
    """Run plugin code; an unexpected exception from a third-party class becomes a
    PluginError naming the plugin (exit code 2)."""
    try:
        yield
    except ObservationError as exc:
        plugin = provider_of(kind, name)
        if kind != "adapter" or plugin is None or plugin in BUILTIN_PLUGINS:
            raise  # a calibrator's ObservationError is about the observations it was given
        who, fix = _blame(kind, name)  # an observation a third-party adapter built is invalid
        raise PluginError(f"{who} made an invalid result while {action}: {exc}; {fix}") from exc
    except PosdebiasError:
        raise
    except Exception as exc:
        plugin = provider_of(kind, name)
        if plugin is None or plugin in BUILTIN_PLUGINS:
            raise
        who, fix = _blame(kind, name)
        raise PluginError(
            f"{who} failed while {action}: {type(exc).__name__}: {str(exc)[:200]}; {fix}"
        ) from exc


def check_observations(
    adapter: Any, instances: Sequence[RetrievalInstance], observed: Any
) -> list[Observation]:
    """``observed`` is one Observation per instance, each with that instance's N labels."""
    name = getattr(adapter, "name", type(adapter).__name__)
    try:
        result = list(observed)
    except TypeError:
        result = None
    problem = None
    if result is None or len(result) != len(instances):
        count = "no list" if result is None else f"{len(result)} observations"
        problem = f"returned {count} for {len(instances)} instances"
    else:
        for instance, observation in zip(instances, result, strict=True):
            if not isinstance(observation, Observation):
                problem = f"returned a {type(observation).__name__}, not an Observation"
            elif observation.n != instance.n:
                problem = (
                    f"returned {observation.n} label scores for instance {instance.id[:60]!r} "
                    f"with {instance.n} images"
                )
            if problem:
                break
    if problem:
        who, fix = _blame("adapter", name)
        raise PluginError(f"{who} {problem}: it breaks the adapter contract; {fix}")
    return result  # type: ignore[return-value]


def check_prediction(calibrator: Any, prediction: Any, n: int) -> Prediction:
    """``prediction`` is a Prediction over ``n`` candidates."""
    scores = getattr(prediction, "scores", None)
    if not isinstance(prediction, Prediction) or getattr(scores, "shape", (None,))[0] != n:
        who, fix = _blame("calibrator", getattr(calibrator, "name", "?"))
        raise PluginError(
            f"{who} returned {type(prediction).__name__} instead of a Prediction over {n} "
            f"candidates: it breaks the calibrator contract; {fix}"
        )
    return prediction
