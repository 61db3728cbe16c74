"""Docs stay true: every test named in docs/errors.md exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _defined_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_test_named_in_errors_md_exists():
    text = (ROOT / "docs" / "errors.md").read_text()
    named = re.findall(r"`((?:tests/[\w/]+\.py::)?test_\w+)`", text)
    assert len(named) > 30
    for reference in named:
        path, _, name = reference.rpartition("::")
        module = ROOT / (path or "tests/test_errors.py")
        assert module.exists(), reference
        assert name in _defined_functions(module), reference


def _function_source(path: Path, name: str) -> str:
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node) or ""
    return ""


def test_stale_and_foreign_rows_are_asserted_verbatim_by_their_tests():
    """In the 'Stale results' table, each backticked message is asserted by a named test."""
    text = (ROOT / "docs" / "errors.md").read_text()
    section = text.split("## Stale results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| S")]
    assert len(rows) >= 15
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        message, tests = cells[2], cells[4]
        expected = re.findall(r"`([^`]+)`", message)
        sources = ""
        for reference in re.findall(r"`((?:tests/[\w/]+\.py::)?test_\w+)`", tests):
            path, _, name = reference.rpartition("::")
            sources += _function_source(ROOT / (path or "tests/test_errors.py"), name)
        assert sources, row
        for fragment in expected:
            if fragment.startswith("--") or " " not in fragment:
                continue  # a flag or a file name, not a message
            assert fragment in sources.replace("\\'", "'"), (fragment, row)
