"""Every example of the documentation (docs/*.md and README.md) runs.

Each fenced block is one of:

* ``python``: executed (in a fresh folder, its imports are public: tests/test_public_imports.py);
  ``fragment``: a method or signature out of its class, compiled only; ``service``: a web
  application, served by uvicorn and asked over HTTP by tests/test_serving.py;
* ``yaml`` / ``json`` / ``toml``: read by the loader that reads such a file (an evaluation or
  sweep config by default; ``build config``, ``benchmark line``, ``lmms-eval task``,
  ``lm-eval task``);
* ``bash`` / ``console``: must say how it runs: ``run`` (each ``posdebias`` command is run, with
  ``with ARGS`` appended to ``evaluate`` commands to keep them small), or ``skip: needs ...``
  (a hub model, a GPU, a data set, minutes): those are skipped here and listed by name;
  ``lmms-eval run: TEST``: a page's lmms-eval walk-through, run as written by TEST;
* ``text`` or no language: output (tables, errors, layouts), never a command;
* ``plugin``: the blocks of a page's plugin walkthrough, run together (the ``toml`` names the
  distribution and its entry point, the ``python`` block is its module, the commands and the
  config run with it installed).

A block says how it runs in an HTML comment on the line above it, ``<!-- example: ... -->``.

Stand-ins: a hub model id or a model folder an example names is a tiny random-weight model of
the same family built offline (:data:`STAND_INS`); names an example uses without defining them
(``instances``, ``model``, ...) are given by :data:`GIVEN`.
"""

from __future__ import annotations

import ast
import builtins
import functools
import json
import re
import shlex
import shutil
import textwrap
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from test_registry import write_distribution

#: One worker builds the stand-ins once (under ``--dist loadgroup``).
pytestmark = pytest.mark.xdist_group("doc_examples")

ROOT = Path(__file__).parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

_BLOCK = re.compile(
    r"^(?:<!-- example: (?P<marker>[^\n]*?) -->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)^```[ \t]*$",
    re.S | re.M,
)
_KINDS = (
    "run",
    "skip:",
    "fragment",
    "service",
    "plugin",
    "build config",
    "benchmark line",
    "lmms-eval task",
    "lm-eval task",
    "lmms-eval run",
)
_COMMAND = re.compile(r"^\$?\s*(posdebias|python|pip|make|accelerate|lmms-eval|vllm)( |$)")


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    lang: str
    marker: str
    body: str
    heading: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def appended(self) -> list[str]:
        """The ``with ARGS`` of the marker: options added to each ``posdebias evaluate``."""
        _, _, args = self.marker.partition(" with ")
        return shlex.split(args)


def examples() -> list[Example]:
    found = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            start = text.count("\n", 0, match.start("lang")) + 1
            headings = re.findall(r"^#+ (.*)$", text[: match.start()], re.M)
            found.append(
                Example(
                    page=str(path.relative_to(ROOT)),
                    line=start,
                    lang=match.group("lang"),
                    marker=match.group("marker") or "",
                    body=match.group("body"),
                    heading=headings[-1] if headings else "",
                )
            )
    return found


EXAMPLES = examples()


def of(*langs: str, plugin: bool = False) -> list[Any]:
    """The examples in ``langs`` as pytest params named by page:line (plugin blocks apart)."""
    return [
        pytest.param(example, id=example.id)
        for example in EXAMPLES
        if example.lang in langs and example.marker.startswith("plugin") == plugin
    ]


def skip_if_marked(example: Example) -> None:
    if example.marker.startswith("skip:"):
        pytest.skip(f"{example.id}: {example.marker.removeprefix('skip:').strip()}")


# ------------------------------------------------------------------------------- stand-ins


#: Model ids and folders the examples name -> the tiny model family that stands in for each.
STAND_INS = {
    "Qwen/Qwen2.5-VL-3B-Instruct": "qwen2_5_vl",
    "./my-qwen2.5-vl": "qwen2_5_vl",
    "./my-qwen3": "qwen3",
}
#: Data folders the examples name -> what stands in (a small benchmark of the bundled shapes).
DATA_STAND_INS = {"runs/coco-adv": "shapes benchmark"}
IMAGES = ("a.jpg", "b.jpg", "c.jpg", "w.jpg", "x.jpg", "y.jpg", "z.jpg")


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    """Tiny models (one per family), test images and the organism's benchmark cache, built once
    for the module; each example gets copies in its own folder."""
    from posdebias.organism.benchmark import bundled_benchmark
    from posdebias.testing import save_tiny_model, write_test_images

    root = tmp_path_factory.mktemp("stand-ins")
    for family in sorted(set(STAND_INS.values())):
        save_tiny_model(family, root / "models" / family)
    for file, name in zip(write_test_images(root / "images", len(IMAGES)), IMAGES, strict=True):
        file.rename(root / "images" / name)
    bundled_benchmark(4, root / "cache")
    return root


@pytest.fixture
def sandbox(stand_ins, tmp_path, monkeypatch):
    """A fresh working folder holding the stand-ins; the hub off, the organism cache shared,
    one torch thread (the models are tiny: far faster on a busy machine)."""
    import torch

    monkeypatch.setenv("POSDEBIAS_CACHE_DIR", str(stand_ins / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    for name in IMAGES:
        shutil.copy(stand_ins / "images" / name, tmp_path / name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path
    torch.set_num_threads(threads)


def place_stand_ins(text: str, folder: Path, models: Path) -> str:
    """``text`` with every model it names replaced by a tiny one (a folder named like a path
    is made at that path; a hub id becomes the path of a copy), and data folders made."""
    for name, family in STAND_INS.items():
        if name not in text:
            continue
        target = folder / name if name.startswith("./") else folder / "stand-ins" / family
        if not target.exists():
            shutil.copytree(models / family, target)
        if not name.startswith("./"):
            text = text.replace(name, str(target))
    if "examples/" in text and not (folder / "examples").exists():
        shutil.copytree(ROOT / "examples", folder / "examples")  # as in a source checkout
    for name in DATA_STAND_INS:
        if name in text and not (folder / name).exists():
            from helpers import build_shapes_benchmark

            built = build_shapes_benchmark(folder / "data", count=6, n=4)
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(built, folder / name)
    return text


def _given_instances(folder: Path) -> Any:
    from posdebias import Instance

    images = tuple(str(folder / name) for name in IMAGES[:3])
    return [Instance(f"a caption {k}", images, k, f"q{k}") for k in range(3)]


def _bundled(count: int, start: int = 0) -> list[Any]:
    from posdebias.benchmarks import load_benchmark
    from posdebias.organism import bundled_benchmark

    return load_benchmark(bundled_benchmark(4)).instances[start : start + count]


def _given_mcq(folder: Path) -> Any:
    from posdebias import Instance

    options = ("Rome", "Paris", "Madrid", "Berlin")
    return [
        Instance(f"Question {k}?", texts=options, target=k, id=f"m{k}", task="multiple_choice")
        for k in range(4)
    ]


@functools.cache
def _given_model(folder: Path) -> Any:
    from posdebias.testing import tiny_model_and_processor

    return tiny_model_and_processor("qwen2_5_vl")


#: Names the examples use without defining them -> what stands in for each.
GIVEN: dict[str, Callable[[Path], Any]] = {
    "instances": _given_instances,
    "model": lambda folder: _given_model(folder)[0],
    "processor": lambda folder: _given_model(folder)[1],
    "labelled_instances": lambda folder: _bundled(5),
    "queries": lambda folder: [(item.stem, list(item.images)) for item in _bundled(4, 5)],
    "calibration_instances": _given_mcq,
    "supported_VLM": lambda folder: {},
}


def free_names(code: str) -> set[str]:
    """Names the code reads and never binds (what it expects to be given)."""
    tree = ast.parse(code)
    names = [node for node in ast.walk(tree) if isinstance(node, ast.Name)]
    bound = {node.id for node in names if isinstance(node.ctx, ast.Store)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    read = {node.id for node in names if isinstance(node.ctx, ast.Load)}
    return read - bound - set(dir(builtins))


def run_python(example: Example, folder: Path, models: Path) -> dict[str, Any]:
    code = place_stand_ins(example.body, folder, models)
    namespace: dict[str, Any] = {"__name__": "__example__"}
    for name in sorted(free_names(code)):
        assert name in GIVEN, f"{example.id} uses {name!r}, which nothing gives"
        namespace[name] = GIVEN[name](folder)
    exec(compile(code, example.id, "exec"), namespace)
    return namespace


def commands(example: Example) -> list[list[str]]:
    """The ``posdebias`` commands of a shell block (console: only the ``$`` lines)."""
    text = example.body.replace("\\\n", " ")
    lines = text.splitlines()
    if example.lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    found = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "posdebias", f"{example.id}: only posdebias commands run here: {line}"
        if words[1:2] == ["evaluate"]:
            words += example.appended
        found.append(words[1:])
    return found


def run_commands(example: Example, folder: Path, models: Path) -> None:
    from posdebias.cli import main

    for argv in commands(example):
        argv = shlex.split(place_stand_ins(shlex.join(argv), folder, models))
        assert main(argv) == 0, f"{example.id}: posdebias {shlex.join(argv)} failed"


# ---------------------------------------------------------------------------- the examples


def _api_guide(namespace: dict[str, Any], out: str, folder: Path) -> None:
    assert "attention informative: True" in out
    assert out.count("(right)") >= 10 and out.count("bias removed") == 4
    assert sorted(p.name for p in (folder / "calibration").iterdir()) == [
        "attention_guided.json",
        "vanilla.json",
    ]


def _check_kit(namespace: dict[str, Any], out: str, folder: Path) -> None:
    assert namespace["report"].passed


#: (page, section) -> what its example must have done beyond running.
EXPECTED: dict[tuple[str, str], Callable[[dict[str, Any], str, Path], None]] = {
    ("docs/api.md", "An application end to end"): _api_guide,
    ("docs/adapters.md", "`posdebias check`"): _check_kit,
}


@pytest.mark.parametrize("example", of("python"))
def test_python_example_runs(example, request, capsys):
    skip_if_marked(example)
    if example.marker in ("fragment", "service"):  # a service runs in tests/test_serving.py
        compile(textwrap.dedent(example.body), example.id, "exec")
        return
    assert example.marker == "", f"{example.id}: unknown marker {example.marker!r}"
    folder = request.getfixturevalue("sandbox")
    models = request.getfixturevalue("stand_ins") / "models"
    namespace = run_python(example, folder, models)
    expected = EXPECTED.get((example.page, example.heading))
    if expected is not None:
        expected(namespace, capsys.readouterr().out, folder)


@pytest.mark.parametrize("example", of("bash", "console", "sh"))
def test_command_example_runs_or_says_what_it_needs(example, request):
    assert example.marker.startswith(("run", "skip: needs ", "lmms-eval run: tests/")), (
        f"{example.id}: a command block says how it runs: <!-- example: run --> or "
        "<!-- example: skip: needs ... -->"
    )
    skip_if_marked(example)
    if example.marker.startswith("lmms-eval run:"):  # minutes: a test of its own runs it
        pytest.skip(f"{example.id}: {example.marker.partition(':')[2].strip()}")
    folder = request.getfixturevalue("sandbox")
    run_commands(example, folder, request.getfixturevalue("stand_ins") / "models")


def _harness_task(example: Example) -> None:
    """An lmms-eval or lm-eval task file: YAML whose ``!function`` tags name existing functions."""
    import importlib

    functions = []

    class Loader(yaml.SafeLoader):
        pass

    def function(loader: yaml.SafeLoader, node: yaml.Node) -> str:
        functions.append(loader.construct_scalar(node))
        return functions[-1]

    Loader.add_constructor("!function", function)
    task = yaml.load(example.body, Loader=Loader)
    assert task["task"] and functions
    for dotted in functions:
        module, _, name = str(dotted).rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), dotted


def check_config(example: Example, folder: Path) -> None:
    """A config block read by the loader that reads such a file."""
    from posdebias.benchmarks.config import build_config_from
    from posdebias.benchmarks.files import InstanceRecord
    from posdebias.evaluation.config import config_from_data
    from posdebias.evaluation.job import build_calibrators, build_decoders
    from posdebias.evaluation.sweep import SweepSpec

    if example.lang == "toml":
        assert tomllib.loads(example.body)
        return
    if example.lang == "json":
        # a line wrapped for the page: each continuation starts with its separating space
        text = example.body.replace("\n", "")
        if example.marker == "benchmark line":
            InstanceRecord.model_validate_json(text)
        else:
            json.loads(text)
        return
    if example.marker in ("lmms-eval task", "lm-eval task"):
        _harness_task(example)
        return
    data = yaml.safe_load(example.body)
    if example.marker == "build config":
        build_config_from(data, {}, example.id)
        return
    assert example.marker in ("", "plugin"), f"{example.id}: unknown marker {example.marker!r}"
    sweep = data.pop("sweep", None)
    if sweep is not None:
        SweepSpec.model_validate(sweep)
    config = config_from_data(data, example.id)
    build_calibrators(config)  # every name registered, every option known and in range
    build_decoders(config)


@pytest.mark.parametrize("example", of("yaml", "json", "toml"))
def test_config_example_is_read_by_its_loader(example, tmp_path):
    skip_if_marked(example)
    check_config(example, tmp_path)


@pytest.mark.parametrize(
    "page", sorted({e.page for e in EXAMPLES if e.marker.startswith("plugin")})
)
def test_plugin_walkthrough_runs(page, request, site, capsys):
    """The page's plugin, installed from its own blocks: the pyproject's entry point, the
    module; then its commands and its config run with the plugin registered."""
    from posdebias.registry import reset_registry

    blocks = [e for e in EXAMPLES if e.page == page and e.marker.startswith("plugin")]
    (project,) = [e for e in blocks if e.lang == "toml"]
    meta = tomllib.loads(project.body)["project"]
    ((entry, module),) = meta["entry-points"]["posdebias"].items()
    (code,) = [e for e in blocks if e.lang == "python"]
    write_distribution(site, module, code.body, meta["version"], name=meta["name"], entry=entry)
    reset_registry()
    folder = request.getfixturevalue("sandbox")
    models = request.getfixturevalue("stand_ins") / "models"
    for example in blocks:
        if example.lang in ("bash", "console"):
            run_commands(example, folder, models)
        elif example.lang == "yaml":
            check_config(example, folder)
    out = capsys.readouterr().out
    assert meta["name"] in out  # `posdebias plugins` lists the distribution


# ------------------------------------------------------------------- the rules themselves


def test_every_block_is_an_example_of_a_known_kind():
    unknown = [
        f"{e.id}: {e.marker}" for e in EXAMPLES if e.marker and not e.marker.startswith(_KINDS)
    ]
    assert unknown == []
    assert len(EXAMPLES) > 60 and {e.lang for e in EXAMPLES} >= {"python", "bash", "yaml"}
    python = {(e.page, e.heading) for e in EXAMPLES if e.lang == "python"}
    assert set(EXPECTED) <= python  # every expectation still finds its example


def test_output_blocks_hold_no_commands():
    """A block without a language (or ``text``) is output; a command there would not run."""
    hidden = [
        f"{e.id}: {line}"
        for e in EXAMPLES
        if e.lang in ("", "text")
        for line in e.body.splitlines()
        if _COMMAND.match(line)
    ]
    assert hidden == []


def indented_code(text: str) -> list[int]:
    """Lines that open an indented code block (4 spaces after a blank line, outside fences and
    lists): such a block would escape this test."""
    lines = text.splitlines()
    found, fenced = [], False
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        previous = lines[number - 2] if number >= 2 else ""
        before = lines[number - 3] if number >= 3 else ""
        if (
            not fenced
            and line.startswith("    ")
            and line.strip()
            and not previous.strip()
            and not re.match(r"^\s*([-*]|\d+\.)\s", before)
            and not before.startswith(("  ", "* ", "- "))
        ):
            found.append(number)
    return found


def test_every_code_block_is_fenced():
    assert {str(p.relative_to(ROOT)): indented_code(p.read_text()) for p in PAGES} == {
        str(p.relative_to(ROOT)): [] for p in PAGES
    }
    assert indented_code("text\n\n    posdebias evaluate\n") == [3]


def test_a_command_block_without_a_marker_fails():
    bare = Example("x.md", 1, "bash", "", "posdebias evaluate\n", "")
    with pytest.raises(AssertionError, match="says how it runs"):
        test_command_example_runs_or_says_what_it_needs(bare, None)
