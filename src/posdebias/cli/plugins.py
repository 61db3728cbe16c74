"""``posdebias plugins``: every adapter and calibrator, and the plugin that provides it."""

from __future__ import annotations

import argparse

from rich.table import Table

from posdebias.cli import make_console
from posdebias.registry import get_registry


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
    for info in registry.plugins():
        if info.error:
            console.print(f"[red]plugin {info.name!r} failed:[/red] {info.error}")
    return 0
