"""Error types: every failure a user can cause is one of these, with a message and a fix.

The CLI turns any :class:`PosdebiasError` into its message and ``exit_code`` (2 for bad input or
usage, 1 for runtime failures) instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from pydantic import ValidationError

#: Where a user meets posdebias: Python (``Debiaser``, ``load_adapter``), the ``posdebias``
#: command, or a harness (lm-evaluation-harness, lmms-eval) given model arguments.
Door = Literal["library", "cli", "harness"]
DOORS: tuple[Door, ...] = ("library", "cli", "harness")


class Advice(NamedTuple):
    """What to do about an error, said the way each door does it: the library names the method
    to call, the command line the command or flag, a harness the model argument (``None``: as
    the command line says it, a harness user works in a shell)."""

    library: str
    cli: str
    harness: str | None = None

    def at(self, door: Door) -> str:
        if door == "harness" and self.harness is not None:
            return self.harness
        return self.cli if door in ("cli", "harness") else self.library

    def then(self, more: Advice) -> Advice:
        """This advice followed by ``more``, door by door."""
        return Advice(*(self.at(door) + more.at(door) for door in DOORS))


class PosdebiasError(Exception):
    """Base class of every error posdebias raises on purpose.

    ``advice`` (:class:`Advice`) replaces the end of the message as each door reports it:
    library callers read the method to call (``str(error)``), command-line users the command
    to run, harness users the model argument (:meth:`message_for`).
    """

    exit_code: int = 1

    def __init__(self, *args: object, advice: Advice | None = None) -> None:
        super().__init__(*args)
        self.advice = advice

    def message_for(self, door: Door) -> str:
        """The message as ``door`` shows it (the library's advice swapped for the door's)."""
        text = str(self)
        if self.advice is not None and text.endswith(self.advice.library):
            return text[: len(text) - len(self.advice.library)] + self.advice.at(door)
        return text

    def say_at(self, door: Door) -> None:
        """Word this error's message for ``door`` in place (:meth:`message_for`), so that a
        harness raises it on with its own traceback, cause and type."""
        text = self.message_for(door)
        if self.advice is not None and text != str(self):
            self.args = (text,)
            self.advice = Advice(*(self.advice.at(door),) * 3)  # said: the same at every door


class InputError(PosdebiasError, ValueError):
    """The user gave something we cannot use (a file, a value, a name); exit code 2."""

    exit_code = 2


class ConfigError(InputError):
    """A configuration file or option has a wrong key, type or value."""


class UnknownNameError(InputError, KeyError):
    """A calibrator, adapter or label-set name that is not registered."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class ObservationError(InputError):
    """An observation has the wrong shape or impossible values."""


class CalibrationError(InputError):
    """A calibration state is missing, corrupt, or made for another setting."""


class CalibrationErrors(CalibrationError):
    """Several calibration problems found at once (the states of a folder): the message lists
    them; ``errors`` holds each one, in the order found, for callers that handle them apart."""

    def __init__(
        self, *args: object, advice: Advice | None = None, errors: Sequence[InputError] = ()
    ) -> None:
        super().__init__(*args, advice=advice)
        self.errors = tuple(errors)

    def say_at(self, door: Door) -> None:
        super().say_at(door)
        for error in self.errors:
            error.say_at(door)


class BenchmarkError(InputError):
    """A benchmark file, manifest or source dataset cannot be used."""


class AdapterError(PosdebiasError):
    """A model cannot be turned into observations (no chat template, no image spans, ...)."""

    exit_code = 2


class ModelCodeError(AdapterError):
    """The model's own code (its processor, its forward: transformers' or the checkpoint's)
    raised an error: not a bug of posdebias. The message names the family, the call, the
    error and what to try; exit code 2."""


class PluginError(PosdebiasError):
    """A third-party plugin failed to load or breaks the plugin contract."""


class PluginContractError(PluginError):
    """A calibrator or adapter broke the plugin contract at run time (e.g. returned 2 scores
    for N = 4); the message names it, and the runner adds the plugin and distribution."""


class ResumeError(InputError):
    """``--resume`` was asked on a run directory made with another configuration."""


class OutputError(PosdebiasError):
    """An output location cannot be written (permissions, disk full)."""

    exit_code = 2


def validation_problems(exc: ValidationError, *, unknown: str = "option") -> list[str]:
    """One line per problem of a pydantic error: where, what was wrong and what was given.

    The one place that phrases pydantic's errors for users, so an unknown key, a wrong type or a
    failed check reads the same in a config file, a manifest, a state or an option list.
    ``unknown`` names what an extra key is ("option", "key", "field").
    """
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            problems.append(f"unknown {unknown} {where!r}")
            continue
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] not in {"value_error", "assertion_error", "missing"} and "input" in error:
            message += f" (got {_short(error['input'])})"
        if error["type"] in _AS_WRITTEN:
            message += f"; {_AS_WRITTEN[error['type']]}"
        problems.append(f"{where}: {message}" if where else message)
    return problems


#: How to write a value that strict validation read as the wrong type (options, config and
#: benchmark files are read as written: ``true`` is no 1, ``"5"`` no 5, ``1.0`` no whole
#: number, ``"yes"`` no boolean).
_AS_WRITTEN = {
    "int_type": "write a whole number, without quotes or a decimal point",
    "float_type": "write a number, without quotes",
    "bool_type": "write true or false, without quotes",
}


def validation_message(exc: ValidationError, owner: str, *, unknown: str = "option") -> str:
    """``owner: problem; problem`` (see :func:`validation_problems`)."""
    return f"{owner}: " + "; ".join(validation_problems(exc, unknown=unknown))


def options_error(exc: ValidationError, owner: str, names: Iterable[str]) -> ConfigError:
    """The ConfigError for options that failed validation, listing the option ``names``."""
    return ConfigError(validation_message(exc, owner) + f"; options: {', '.join(names) or 'none'}")


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class PosdebiasPluginWarning(RuntimeWarning):
    """A plugin was skipped or overridden, or broke the plugin contract (filterable by class:
    ``-W error::posdebias.errors.PosdebiasPluginWarning``)."""
