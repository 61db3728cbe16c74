"""``posdebias plugins``: every adapter, calibrator, decoder and bundled model, and its plugin;
then which adapter each known ``model_type`` resolves to (and who else claims it).

``--options`` adds every option of each entry with its type, default and description (from the
entry's pydantic ``Options`` model), so a configuration can be written without reading code.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from rich.markup import escape
from rich.table import Table

from posdebias._version import __version__
from posdebias.cli import listing_table, make_console
from posdebias.errors import InputError
from posdebias.registry import PluginInfo, Registry, get_registry
from posdebias.registry.manager import adapter_priority
from posdebias.testing.coverage import coverage_markdown, family_coverage


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plugins",
        description="Everything registered, the plugin and distribution that provides it.",
    )
    parser.add_argument(
        "--options",
        action="store_true",
        help="also list every option of each entry: type, default, range and description",
    )
    parser.add_argument(
        "--families",
        action="store_true",
        help="instead: every image-text family of the installed transformers and whether "
        "posdebias reads it (built in, generic, or refused with the reason)",
    )
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="with --families: print the table as Markdown (the Adapters documentation page)",
    )
    parser.set_defaults(handler=run)


def _run_families(args: argparse.Namespace) -> int:
    import transformers

    transformers.logging.set_verbosity_error()
    rows = family_coverage()
    if args.markdown:
        print(coverage_markdown(rows), end="")
        return 0
    table = listing_table(
        "image-text families of transformers", ("model_type", "verdict", "adapter, or why")
    )
    for row in rows:
        table.add_row(escape(row.model_type), row.verdict, escape(row.detail))
    make_console().print(table)
    return 0


def _entries(registry: Registry) -> list[tuple[str, str, Any]]:
    """(kind, name, class) of every registered adapter, calibrator and decoder."""
    return (
        [("adapter", name, registry.adapter_class(name)) for name in registry.adapter_names()]
        + [
            ("calibrator", name, registry.calibrator_class(name))
            for name in registry.calibrator_names()
        ]
        + [("decoder", name, registry.decoder_class(name)) for name in registry.decoder_names()]
    )


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else str(value)


def _constraints(metadata: list[Any]) -> tuple[Any, Any]:
    low = next((m for m in metadata if isinstance(m, Ge | Gt)), None)
    high = next((m for m in metadata if isinstance(m, Le | Lt)), None)
    return low, high


def _inner(annotation: Any) -> list[Any]:
    """The types inside ``annotation``: union members, list and tuple items, recursively."""
    return [found for arg in typing.get_args(annotation) for found in (arg, *_inner(arg))]


def option_range(info: FieldInfo) -> str:
    """The range of a numeric option as its model checks it (``1 to 1,024``, ``above 0 to
    1,000``; ``each ...`` for the items of a list); empty where the model states none."""
    low, high = _constraints(list(info.metadata))
    each = ""
    if low is None and high is None:  # the items' own: list[Annotated[int, Field(...)]]
        inner = _inner(info.annotation)
        annotated = [a for a in inner if typing.get_origin(a) is typing.Annotated]
        if annotated:
            low, high = _constraints(
                [c for meta in annotated[0].__metadata__ for c in getattr(meta, "metadata", [])]
            )
        containers = [info.annotation, *inner]
        each = "each " if any(typing.get_origin(a) in (list, tuple) for a in containers) else ""
    if low is None and high is None:
        return ""
    start, end = _bound(low), _bound(high)
    if start and end:
        return f"{each}{start} to {end}"
    return f"{each}from {start}" if start else f"{each}up to {end}"


def _bound(limit: Ge | Gt | Le | Lt | None) -> str:
    """One end of a range: its number, after ``above`` or ``below`` where it is excluded."""
    if limit is None:
        return ""
    (name,) = [name for name in ("gt", "ge", "lt", "le") if hasattr(limit, name)]
    return {"gt": "above ", "lt": "below "}.get(name, "") + _number(getattr(limit, name))


def _type_name(annotation: Any) -> str:
    """``annotation`` as a reader writes it: ``int | None``, ``list[int]`` (no constraints)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in args)
    if origin is typing.Literal:
        return "Literal"
    if annotation is type(None):
        return "None"
    if annotation is Ellipsis:
        return "..."
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(arg) for arg in args)}]"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def option_rows(options: type[BaseModel]) -> list[tuple[str, str, str, str, str]]:
    """(name, type, default, description, range) of every field of an options model."""
    rows = []
    for name, info in options.model_fields.items():
        kind = _type_name(info.annotation)
        if info.default is not PydanticUndefined:
            default = repr(info.default)
        elif info.default_factory is not None:
            default = repr(info.default_factory())  # type: ignore[call-arg]
        else:
            default = "(required)"
        rows.append((name, kind, default, info.description or "", option_range(info)))
    return rows


def run(args: argparse.Namespace) -> int:
    if args.families:
        return _run_families(args)
    if args.markdown:
        raise InputError("--markdown goes with --families: posdebias plugins --families --markdown")
    registry = get_registry()
    console = make_console(one_line_rows=True)
    console.print(f"posdebias {__version__}")
    plugins: dict[str, PluginInfo] = {info.name: info for info in registry.plugins()}
    table = listing_table(
        "registered", ("kind", "name", "summary", "plugin", "distribution", "version")
    )
    entries = _entries(registry)
    registered = [
        (kind, name, str(getattr(cls, "summary", "") or "")) for kind, name, cls in entries
    ]
    registered += [
        ("model", model.name, model.summary + (" (the default run)" if model.default else ""))
        for model in registry.bundled_models()
    ]
    for kind, name, summary in registered:
        info = plugins[registry.provider(kind, name)]
        table.add_row(kind, name, summary, info.name, info.distribution or "-", info.version or "-")
    console.print(table)
    console.print(_model_types(registry))
    if args.options:
        for kind, name, cls in entries:
            rows = option_rows(cls.Options)
            options = listing_table(
                f"{kind} {name}: options", ("option", "type", "default", "range", "description")
            )
            for option, type_, default, description, range_ in rows:
                options.add_row(option, type_, default, range_, description)
            if not rows:
                options.add_row("(none)", "", "", "", "")
            console.print(options)
    for info in registry.plugins():
        if info.error:
            console.print(f"plugin {info.name!r} failed: {info.error}", style="red")
    return 0


def _model_types(registry: Any) -> Table:
    """model_type -> the adapter it resolves to (precedence: docs/adapters.md)."""
    table = listing_table(
        "model types (anything else: generic, if it can reproduce the positions)",
        ("model_type", "adapter", "plugin", "priority", "also claimed by"),
    )
    for model_type, claims in registry.model_type_claims().items():
        chosen, others = claims[0], claims[1:]
        table.add_row(
            model_type,
            chosen.value.name,
            chosen.plugin,
            str(adapter_priority(chosen.value)),
            ", ".join(
                f"{o.value.name} ({o.plugin}, priority {adapter_priority(o.value)})" for o in others
            )
            or "-",
        )
    return table
