"""``posdebias plugins``: every adapter and calibrator, the plugin that provides it, and which
adapter each known ``model_type`` resolves to."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from posdebias.cli import make_console
from posdebias.registry import get_registry
from posdebias.registry.manager import adapter_priority


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plugins", help="list adapters, calibrators, decoders and plugins"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    registry = get_registry()
    table = Table(title="posdebias plugins", title_justify="left")
    for column in ("kind", "name", "plugin", "distribution", "version"):
        table.add_column(column)
    plugins = {info.name: info for info in registry.plugins()}
    for kind, names in (
        ("adapter", registry.adapter_names()),
        ("calibrator", registry.calibrator_names()),
        ("decoder", registry.decoder_names()),
    ):
        for name in names:
            info = plugins[registry.provider(kind, name)]
            table.add_row(kind, name, info.name, info.distribution or "-", info.version or "-")
    console = make_console()
    console.print(table)
    console.print(_model_types(registry))
    for info in registry.plugins():
        if info.error:
            console.print(f"[red]plugin {info.name!r} failed:[/red] {info.error}")
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
