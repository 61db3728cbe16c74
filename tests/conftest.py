"""Shared fixtures and hypothesis profile."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os

import pytest
from hypothesis import HealthCheck, settings

# Each xdist worker (and each process it starts) runs torch and OpenMP on one thread: ``make
# test`` runs two workers on two cores, and with torch's default of a thread per core each
# worker's threads wait, spinning, for the core the other worker holds (posdebias._threads).
# Set before any test module imports torch; the tests of posdebias' own thread handling set
# the counts they need (``torch_threads_elsewhere``, monkeypatch).
os.environ.setdefault("OMP_NUM_THREADS", "1")

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def installed_plugins() -> set[str]:
    """Entry points of the ``posdebias`` group that the environment has installed."""
    return {entry.name for entry in importlib.metadata.entry_points(group="posdebias")}


# The suite never loads plugins of other installed distributions: their adapters, calibrators or
# warnings would change what the tests see. Blocked by name through the environment, so the CLI
# subprocesses the tests start inherit it; plugins a test writes itself (``site``) still load.
INSTALLED_PLUGINS = installed_plugins()
if INSTALLED_PLUGINS:
    _already = {n for n in os.environ.get("POSDEBIAS_BLOCK_PLUGINS", "").split(",") if n}
    os.environ["POSDEBIAS_BLOCK_PLUGINS"] = ",".join(sorted(INSTALLED_PLUGINS | _already))


#: a test of an ``xdist_group`` that ``--dist loadgroup`` did not group (see below)
UNGROUPED = pytest.StashKey[str]()


def _group(item) -> str:
    """The ``xdist_group`` of a test as ``--dist loadgroup`` names it ("" for none)."""
    return "_".join(sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                            for m in item.iter_markers("xdist_group")}))  # fmt: skip


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """``--dist loadgroup`` keeps each ``xdist_group`` on one worker, so its fixtures (the vLLM
    server, the real models, the harness runs) are made once, by renaming its tests
    ``NODEID@GROUP``. A pytest that ignores the rename splits the groups silently and every
    worker makes every group's fixtures (minutes): noted here, refused by :func:`_grouped`.

    Longest work first: a worker runs a group whole, and a group of minutes handed out last
    leaves the other worker idle while it finishes (the real models' group: about 4 minutes).
    So the groups holding ``slow`` tests come first, then the other groups, then the modules in
    their usual order (``make test`` keeps this order with ``--no-loadscope-reorder``; xdist
    would otherwise hand out modules and groups by their number of tests)."""
    if not getattr(config.option, "loadgroup", False):
        return
    slow = {_group(item) for item in items if item.get_closest_marker("slow")} - {""}
    items.sort(key=lambda item: 2 if not _group(item) else 0 if _group(item) in slow else 1)
    for item in items:
        group = _group(item)
        if group and not item.nodeid.endswith("@" + group):
            config.stash[UNGROUPED] = item.nodeid
            return


@pytest.fixture(autouse=True, scope="session")
def _grouped(request):
    ungrouped = request.config.stash.get(UNGROUPED, None)
    if ungrouped is not None:
        pytest.fail(
            f"--dist loadgroup does not group {ungrouped} (pytest {pytest.__version__} ignores "
            "pytest-xdist's renaming): install the versions of constraints/test.txt (`make "
            "test` does)",
            pytrace=False,
        )


@pytest.fixture
def torch_threads_elsewhere(monkeypatch):
    """Three thread counts that differ, so a scope seen applying or restoring one did so:
    posdebias' default is every CPU (``OMP_NUM_THREADS``, one elsewhere in the suite), a count
    the test chooses is 1, and torch starts on one more than the default. Yields that count,
    the one a scope must restore."""
    import torch

    import posdebias._threads as threads

    cpus = max(2, threads.available_cpus())  # on one CPU, two: else the counts coincide
    monkeypatch.setattr(threads, "available_cpus", lambda: cpus)
    monkeypatch.setenv("OMP_NUM_THREADS", str(cpus))
    before = torch.get_num_threads()
    torch.set_num_threads(threads.default_threads() + 1)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _fresh_registry():
    """Each test sees a registry built from scratch (plugins registered in one test stay there)."""
    from posdebias.registry import reset_registry

    reset_registry()
    yield
    reset_registry()


@contextlib.contextmanager
def _figures_as_marked(node):
    """A run's report and a study's draw their figures (most of a small run's time) only for a
    test or module marked ``figures``, in the formats the marker names if it names any
    (``figures("png")``: a test that reads only the PNGs); elsewhere report.md is written
    without them. Subprocesses draw them as usual."""
    marked = node.get_closest_marker("figures")
    if marked is not None and marked.args:  # the formats the test reads, e.g. figures("svg")
        with pytest.MonkeyPatch.context() as patch:
            for module in ("figures", "report"):
                patch.setattr(f"posdebias.evaluation.{module}.FORMATS", marked.args)
            yield
        return
    if marked is not None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("posdebias.evaluation.report.REPORT_FIGURES", ())
        patch.setattr("posdebias.evaluation.sweep.figure_files", lambda *_: {})
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A fixture shared by a module's tests (a finished run) draws figures only if its module
    is marked ``figures``; a test's own fixtures, as the test is marked."""
    with _figures_as_marked(request.node):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _figures_as_marked(item):
        yield


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site-packages folder on sys.path for plugin distributions written by a test."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site


@pytest.fixture(scope="session")
def real_models(tmp_path_factory):
    """The real pretrained models (tests/real_models.py), loaded once per test process from
    their GGUF files, with how many times each load parsed its file's metadata (``parses``)."""
    import gguf
    import torch

    from real_models import LoadedModels, gemma3_gguf, smollm2_gguf

    torch.set_num_threads(1)
    files = {"smollm2": smollm2_gguf(), "gemma3": gemma3_gguf(tmp_path_factory.mktemp("gguf"))}
    models, parses = LoadedModels(), {}
    reader = gguf.gguf_reader.GGUFReader  # a parse is its __init__, in any subclass too
    original = reader.__init__
    for name, path in files.items():

        def counted(self, *args, _model=name, **kwargs):
            parses[_model] = parses.get(_model, 0) + 1
            return original(self, *args, **kwargs)

        reader.__init__ = counted
        try:
            models.load(name, str(path))
        finally:
            reader.__init__ = original
    models.parses = parses
    return models
