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


def _function_sources(path: Path, name: str) -> str:
    """The source of test ``name`` with its decorators (parametrized cases live there)."""
    text = path.read_text()
    lines = text.splitlines()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "\n".join(lines[first - 1 : node.end_lineno])
    return ""


def test_security_rows_are_asserted_verbatim_by_their_tests():
    """In the 'Security and hostile input' table, every backticked message of a row is asserted,
    character for character, by one of the tests the row names; and the code says it too."""
    text = (ROOT / "docs" / "errors.md").read_text()
    section = text.split("## Security and hostile input", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| H")]
    assert len(rows) >= 18
    code = "".join(path.read_text() for path in (ROOT / "src" / "posdebias").rglob("*.py"))
    code = re.sub(r"\"\s*\n\s*f?\"", "", code)  # join implicitly concatenated literals
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        message, tests = cells[2], cells[4]
        sources = ""
        for reference in re.findall(r"`((?:tests/[\w/]+\.py::)?test_\w+)`", tests):
            path, _, name = reference.rpartition("::")
            source = _function_sources(ROOT / (path or "tests/test_errors.py"), name)
            assert source, reference
            sources += source
        for fragment in re.findall(r"`([^`]+)`", message):
            assert fragment in sources.replace("\\'", "'"), (fragment, row)
            # the code builds the message: its longest run of words between values is in it
            runs = re.split(r"\{[^}]*\}|\d+|'[^']*'|--[\w-]+|[()]", fragment)
            lead = max((run.strip() for run in runs), key=len)
            pydantic = "Input should" in fragment  # worded by pydantic, not by us
            assert pydantic or len(lead) < 8 or lead in code.replace("\\'", "'"), (fragment, row)


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


def _built_in_adapters() -> list[type]:
    """The adapters the package itself registers (no installed plugin), the simulated one and
    the server adapter aside (each has its own paragraph)."""
    from posdebias.registry.manager import Registry

    registry = Registry(load_entry_points=False)
    return [
        registry.adapter_class(name)
        for name in registry.adapter_names()
        if registry.provider("adapter", name).startswith("posdebias.")
    ]


def _family_name(adapter: type) -> str:
    """The name a reader knows a family by: its summary up to the parenthesis."""
    return adapter.summary.split(" (")[0].removesuffix(" language models")


def _listed_families(path: Path) -> tuple[list[str], list[str]]:
    """The image-text and the text families of a page's 'Built in:' sentence, without the
    parenthesised remarks."""
    text = " ".join(path.read_text().split())
    match = re.search(
        r"Built in: (.*?); for text candidates the language models (.*?); and a generic adapter",
        text,
    )
    assert match, f"{path.name} lost its 'Built in:' sentence"

    def names(listing: str) -> list[str]:
        return [re.sub(r" \([^)]*\)$", "", item) for item in re.split(r", (?![^(]*\))", listing)]

    return names(match.group(1)), names(match.group(2))


def test_readme_and_index_list_every_built_in_family_exactly():
    """Fails when a built-in family is missing from (or stale in) the 'Built in:' sentence of
    README.md and docs/index.md: add it there by the name its summary starts with."""
    adapters = [a for a in _built_in_adapters() if a.model_types]
    image_text = sorted(_family_name(a) for a in adapters if not getattr(a, "text_only", False))
    text = sorted(_family_name(a) for a in adapters if getattr(a, "text_only", False))
    assert len(image_text) >= 26 and len(text) >= 6
    assert "LLaVA-NeXT / LLaVA-NeXT-Video" in image_text and "OLMo 2" in text
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        listed_image_text, listed_text = _listed_families(page)
        assert sorted(listed_image_text) == image_text, page.name
        assert sorted(listed_text) == text, page.name


def test_the_adapters_page_has_a_row_for_every_built_in_adapter_and_its_model_types():
    """Every built-in adapter (the simulated one has its own page) has a row in the tables of
    'Built-in adapters' naming exactly the model types it claims."""
    text = (ROOT / "docs" / "adapters.md").read_text()
    section = text.split("## Built-in adapters", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if line.startswith("| `") and len(cells) > 2:
            rows[cells[0].strip("`")] = re.findall(r"`(\w+)`", cells[1])
    expected = {a.name: sorted(a.model_types) for a in _built_in_adapters()}
    expected.pop("synthetic")
    assert {name: sorted(types) for name, types in rows.items()} == expected


def test_the_api_page_says_which_calibrators_need_calibration_and_labels_as_they_do():
    """docs/api.md's "Which calibrators need what" names, per sentence, the built-in calibrators
    that need no calibration and those that fit from labelled instances: the classes say so."""
    from posdebias.registry import get_registry

    text = (ROOT / "docs" / "api.md").read_text()
    paragraph = text.split("**Which calibrators need what.**", 1)[1].split("\n\n", 1)[0]
    no_fit, rest = paragraph.split("need no calibration", 1)
    labelled = rest.split("forward pass.", 1)[1].split("fit from labelled instances", 1)[0]
    registry = get_registry()
    classes = {name: registry.calibrator_class(name) for name in registry.calibrator_names()}
    assert set(re.findall(r"`(\w+)`", no_fit)) == {n for n, c in classes.items() if not c.needs_fit}
    assert set(re.findall(r"`(\w+)`", labelled)) == {
        n for n, c in classes.items() if c.needs_fit and c.needs_targets
    }
