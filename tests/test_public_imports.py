"""Every ``posdebias`` import the documentation shows a user is public: a module path without a
``_private`` part whose ``__all__`` lists each imported name (docs/compatibility.md)."""

from __future__ import annotations

import ast
import importlib
import inspect
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


def _resolve(path: str) -> object:
    """The object a dotted path names (a module, or an attribute of the longest module)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ImportError(path)


def referenced() -> list[object]:
    """What docs/reference.md renders: each ``::: path`` object and, for a module, its
    ``__all__`` (or the ``members:`` the directive lists)."""
    text = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    shown = []
    for path, options in re.findall(r"^::: ([\w.]+)\n((?:    .*\n)*)", text, re.M):
        found = _resolve(path)
        shown.append(found)
        listed = re.search(r"members: \[(.*)\]", options)
        names = listed.group(1).replace(" ", "").split(",") if listed else None
        if inspect.ismodule(found):
            shown += [getattr(found, name) for name in names or getattr(found, "__all__", [])]
    return shown


def test_every_documented_import_is_in_the_api_reference():
    """A name the docs tell a user to import is one the API reference shows."""
    shown = referenced()
    missing = sorted(
        f"{where}: {module}.{name}"
        for where, module, names in documented_imports()
        for name in names
        if not any(getattr(importlib.import_module(module), name) is s for s in shown)
    )
    assert missing == []


def attribute_uses() -> list[tuple[str, str]]:
    """``(where, name)`` for every ``posdebias.NAME`` a Python example reads off the package."""
    from test_doc_examples import EXAMPLES

    found = []
    for example in EXAMPLES:
        if example.lang != "python":
            continue
        tree = ast.parse(example.body)
        found += [
            (f"{example.id}+{node.lineno - 1}", node.attr)
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "posdebias"
        ]
    return found


def test_every_name_read_off_the_package_is_public_and_referenced():
    import posdebias

    uses = attribute_uses()
    assert {name for _, name in uses} >= {"load_adapter", "get_adapter", "PLUGIN_API_VERSION"}
    shown = referenced()
    assert [
        f"{where}: posdebias.{name}"
        for where, name in uses
        if name not in posdebias.__all__ or not any(getattr(posdebias, name) is s for s in shown)
    ] == []
