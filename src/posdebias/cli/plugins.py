"""``posdebias plugins``: every adapter, calibrator, decoder and bundled model, and its plugin;
then which adapter each known ``model_type`` resolves to (and who else claims it).

``--options`` adds every option of each entry with its type, default and description (from the
entry's pydantic ``Options`` model), so a configuration can be written without reading code.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined
from rich.markup import escape
from rich.table import Table

from posdebias._version import __version__
from posdebias.cli import make_console
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
        help="also list every option of each entry: type, default and description",
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
    table = Table(title="image-text families of transformers", title_justify="left")
    for column in ("model_type", "verdict", "adapter, or why"):
        table.add_column(column)
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


def option_rows(options: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) of every field of an options model."""
    rows = []
    for name, info in options.model_fields.items():
        annotation = info.annotation
        kind = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
        if info.default is not PydanticUndefined:
            default = repr(info.default)
        elif info.default_factory is not None:
            default = repr(info.default_factory())  # type: ignore[call-arg]
        else:
            default = "(required)"
        rows.append((name, kind, default, info.description or ""))
    return rows


def run(args: argparse.Namespace) -> int:
    if args.families:
        return _run_families(args)
    if args.markdown:
        raise InputError("--markdown goes with --families: posdebias plugins --families --markdown")
    registry = get_registry()
    console = make_console()
    console.print(f"posdebias {__version__}")
    plugins: dict[str, PluginInfo] = {info.name: info for info in registry.plugins()}
    table = Table(title="registered", title_justify="left")
    for column in ("kind", "name", "summary", "plugin", "distribution", "version"):
        table.add_column(column)
    entries = _entries(registry)
    for kind, name, cls in entries:
        info = plugins[registry.provider(kind, name)]
        table.add_row(
            kind,
            name,
            str(getattr(cls, "summary", "") or ""),
            info.name,
            info.distribution or "-",
            info.version or "-",
        )
    for model in registry.bundled_models():
        info = plugins[registry.provider("model", model.name)]
        summary = model.summary + (" (the default run)" if model.default else "")
        table.add_row(
            "model", model.name, str(summary), info.name, info.distribution or "-",
            info.version or "-",
        )  # fmt: skip
    console.print(table)
    console.print(_model_types(registry))
    if args.options:
        for kind, name, cls in entries:
            rows = option_rows(cls.Options)
            options = Table(title=f"{kind} {name}: options", title_justify="left")
            for column in ("option", "type", "default", "description"):
                options.add_column(column)
            for row in rows:
                options.add_row(*(str(cell) for cell in row))
            if not rows:
                options.add_row("(none)", "", "", "")
            console.print(options)
    for info in registry.plugins():
        if info.error:
            console.print(f"plugin {info.name!r} failed: {info.error}", style="red")
    return 0


def _model_types(registry: Any) -> Table:
    """model_type -> the adapter it resolves to (precedence: docs/adapters.md)."""
    table = Table(
        title="model types (anything else: generic, if it can reproduce the positions)",
        title_justify="left",
    )
    for column in ("model_type", "adapter", "plugin", "priority", "also claimed by"):
        table.add_column(column)
    for model_type, claims in registry.model_type_claims().items():
        chosen, others = claims[0], claims[1:]
        table.add_row(
            model_type,
            chosen.cls.name,
            chosen.plugin,
            str(adapter_priority(chosen.cls)),
            ", ".join(
                f"{o.cls.name} ({o.plugin}, priority {adapter_priority(o.cls)})" for o in others
            )
            or "-",
        )
    return table
