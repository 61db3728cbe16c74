"""Every ``posdebias`` import the documentation shows a user is public: a module path without a
``_private`` part whose ``__all__`` lists each imported name (docs/compatibility.md)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SOURCES = sorted(
    [*(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").rglob("*"), ROOT / "README.md"]
)

_IMPORT = re.compile(r"^\s*(from\s+posdebias[\w.]*\s+import\s+[^#\n]+|import\s+posdebias[\w.]*)")


def documented_imports() -> list[tuple[str, str, list[str]]]:
    """``(where, module, names)`` for every import line of posdebias in the docs' code."""
    found = []
    for path in SOURCES:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = _IMPORT.match(line)
            if match is None or "`" in line:
                continue  # prose that mentions an import in backticks is not code
            statement = ast.parse(match.group(1).strip().rstrip("(").strip()).body[0]
            where = f"{path.relative_to(ROOT)}:{number}"
            if isinstance(statement, ast.ImportFrom):
                found.append((where, statement.module or "", [a.name for a in statement.names]))
            else:
                found += [(where, alias.name, []) for alias in statement.names]
    return found


def problems(module_name: str, names: list[str]) -> list[str]:
    if any(part.startswith("_") for part in module_name.split(".")):
        return [f"{module_name} is a private module"]
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        return [f"{module_name} declares no __all__ (no public surface)"]
    return [f"{name} is not in {module_name}.__all__" for name in names if name not in exported]


def test_the_docs_import_something():
    modules = {module for _, module, _ in documented_imports()}
    assert {"posdebias", "posdebias.adapters.hf", "posdebias.testing"} <= modules


@pytest.mark.parametrize("where, module, names", documented_imports(), ids=lambda v: str(v))
def test_every_documented_import_is_public(where, module, names):
    assert problems(module, names) == [], where


def test_a_private_or_unexported_import_is_caught():
    assert problems("posdebias.adapters.hf.adapter", ["HFAdapter"]) == [
        "posdebias.adapters.hf.adapter declares no __all__ (no public surface)"
    ]
    assert problems("posdebias._io", []) == ["posdebias._io is a private module"]
    assert problems("posdebias.adapters.hf", ["load_image"]) == [
        "load_image is not in posdebias.adapters.hf.__all__"
    ]
