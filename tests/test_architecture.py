"""docs/architecture.md draws exactly the layers import-linter checks (pyproject.toml)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _layer_cell(line: str) -> str:
    """The layer column of a drawing line: its text up to the first run of 2+ spaces."""
    return re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]


def drawings(markdown: str) -> list[list[str]]:
    """The layer rows of every fenced block. A row is a line indented by exactly two spaces; a
    row ending in ``|`` continues on the next line; any other line is a wrapped description."""
    found = []
    for block in re.findall(r"^```\n(.*?)^```$", markdown, flags=re.S | re.M):
        rows: list[str] = []
        pending = ""
        for line in block.splitlines():
            if pending:
                cell = f"{pending} {_layer_cell(line)}"
            elif re.match(r"^  \S", line):
                cell = _layer_cell(line)
            else:
                continue
            pending = cell if cell.endswith("|") else ""
            if not pending:
                rows.append(" | ".join(part.strip() for part in cell.split("|")))
        found.append(rows)
    return found


def layer_contracts() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    return [
        [" | ".join(part.strip() for part in layer.split("|")) for layer in contract["layers"]]
        for contract in contracts
        if contract["type"] == "layers"
    ]


def test_the_architecture_drawings_are_the_import_linter_contracts():
    drawn = drawings((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert sorted(drawn) == sorted(layer_contracts())


def test_type_checking_imports_are_checked_too():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert config["tool"]["importlinter"]["exclude_type_checking_imports"] is False


def test_the_parser_reads_wrapped_rows_and_skips_descriptions():
    """Not vacuous: a drawing that differs from a contract by one layer does not match."""
    markdown = (
        "```\n  a                 top\n  b | c |           two, wrapped\n    d               more\n"
        "                    a description line\n  e\n```\n"
    )
    assert drawings(markdown) == [["a", "b | c | d", "e"]]
    assert drawings(markdown.replace("  e\n", "")) != [["a", "b | c | d", "e"]]
