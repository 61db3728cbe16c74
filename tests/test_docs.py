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
