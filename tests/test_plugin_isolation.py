"""The suite does not depend on what else is installed.

A third-party plugin installed the real way (a distribution with an entry point in the
``posdebias`` group, in a site folder on the path) that shadows a built-in calibrator and takes
over the organism's model type must change nothing under the suite's settings (tests/conftest.py
blocks every plugin installed when the session starts), and must load when nothing blocks it.
Every run is a fresh process: nothing here depends on what ran before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_registry import write_distribution

ROOT = Path(__file__).parents[1]

#: A plugin no test should ever see: it shadows `vanilla` (a warning on every registry), adds a
#: calibrator, and claims the organism's model type with an adapter that refuses to load.
NOISY = """
from posdebias import hookimpl
from posdebias.adapters.families.llava import LlavaAdapter
from posdebias.calibrators.vanilla import Vanilla


class Hijack(LlavaAdapter):
    name = "isolation_hijack"
    model_types = ("llava",)
    priority = 100

    def __init__(self, *args, **kwargs):
        raise RuntimeError("hijacked by an installed plugin")


class Shadow(Vanilla):
    name = "vanilla"


class Extra(Vanilla):
    name = "isolation_extra"


@hookimpl
def posdebias_register_adapters(register):
    register(Hijack)


@hookimpl
def posdebias_register_calibrators(register):
    register(Shadow)
    register(Extra)
"""

#: What a process sees of the registry: under the suite's settings (the conftest module run
#: first, as pytest runs it) or bare; ``load`` also loads the organism.
PROBE = """
import importlib.util, json, sys, warnings

warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    if sys.argv[1] == "suite":
        spec = importlib.util.spec_from_file_location("suite_conftest", sys.argv[2])
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    from posdebias.registry import get_registry

    registry = get_registry()
    llava = registry.adapter_for_model_type("llava")
    seen = {
        "calibrators": registry.calibrator_names(),
        "adapters": registry.adapter_names(),
        "plugins": sorted(plugin.name for plugin in registry.plugins()),
        "llava": f"{llava.__module__}.{llava.__qualname__}",
    }
    if sys.argv[3] == "load":
        import posdebias
        try:
            seen["loaded"] = type(posdebias.load_adapter("posdebias/organism")).__name__
        except RuntimeError as exc:
            seen["loaded"] = str(exc)
seen["warnings"] = sorted(str(w.message) for w in caught)
print(json.dumps(seen))
"""


def environment(site: Path | None) -> dict[str, str]:
    """This environment without the suite's plugin settings, ``site`` first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSDEBIAS_")}
    env["HF_HUB_OFFLINE"] = "1"
    paths = [str(site)] if site is not None else []
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT / "tests")])
    return env


def probe(site: Path | None, settings: str, load: bool = False) -> dict:
    conftest = str(ROOT / "tests" / "conftest.py")
    command = [sys.executable, "-c", PROBE, settings, conftest, "load" if load else "-"]
    result = subprocess.run(
        command, capture_output=True, text=True, env=environment(site), timeout=300
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def installed(tmp_path):
    """A site folder holding the noisy plugin's distribution (on no process's path yet)."""
    site = tmp_path / "site"
    site.mkdir()
    write_distribution(site, "posdebias_isolation_noise", NOISY)
    return site


def test_an_installed_plugin_changes_nothing_under_the_suites_settings(installed):
    baseline = probe(None, "suite")
    assert probe(installed, "suite") == baseline  # registry, claims and warnings alike
    assert "isolation_extra" not in baseline["calibrators"]
    assert baseline["llava"] == "posdebias.adapters.families.llava.LlavaAdapter"


def test_the_same_plugin_loads_when_nothing_blocks_it(installed):
    seen = probe(installed, "bare", load=True)
    assert "isolation_extra" in seen["calibrators"] and "isolation_hijack" in seen["adapters"]
    assert "posdebias_isolation_noise" in seen["plugins"]
    assert seen["llava"].endswith("Hijack")
    assert seen["loaded"] == "hijacked by an installed plugin"
    assert any("'vanilla' is already provided" in w for w in seen["warnings"]), seen["warnings"]


def test_a_test_that_loads_the_organism_passes_with_the_plugin_installed(installed):
    """The suite itself, in its own pytest process, with the plugin installed before it starts."""
    test = "tests/organism/test_organism_model.py::test_loads_offline_by_name_through_the_llava_adapter"  # noqa: E501
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", test]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env=environment(installed), timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "1 passed" in result.stdout
