"""The plugin contract, exercised with real plugin distributions written to disk.

A distribution is a package plus a ``*.dist-info`` folder with ``entry_points.txt`` on
``sys.path``: exactly what ``pip install`` leaves behind, discovered through
importlib.metadata like any installed plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

import posdebias
from helpers import posdebias_command
from posdebias.errors import ConfigError, PosdebiasPluginWarning, UnknownNameError
from posdebias.registry import Registry, hookspecs

PLUGIN_CODE = '''
import numpy as np
from pydantic import Field

from posdebias import Calibrator, CalibratorOptions, Prediction, hookimpl


class LastPositionOptions(CalibratorOptions):
    margin: float = Field(default=1.0, gt=0)


class LastPosition(Calibrator):
    """Always answers the last position: a bias you can see in the metrics."""

    name = "last_position"
    Options = LastPositionOptions

    def _predict(self, observation, state, rotations):
        scores = np.zeros(observation.n)
        scores[-1] = self.options.margin
        return Prediction(scores=scores)


@hookimpl
def posdebias_register_calibrators(register):
    register(LastPosition)
'''


def write_distribution(
    site: Path,
    module: str,
    code: str,
    version: str = "1.2.3",
    *,
    name: str | None = None,
    entry: str | None = None,
) -> None:
    """An installed distribution (``name``, default the module's with dashes) whose module
    ``module`` is the entry point ``entry`` (default the module's name) of group posdebias."""
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text(textwrap.dedent(code))
    dist = site / f"{module}-{version}.dist-info"
    dist.mkdir()
    dist_name = name or module.replace("_", "-")
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
    )
    (dist / "entry_points.txt").write_text(f"[posdebias]\n{entry or module} = {module}\n")


def run_cli(site: Path, *args: str, env: dict[str, str] | None = None):
    """`python -m posdebias ARGS` with ``site`` installed; no test here reads a figure."""
    # keep the caller's PYTHONPATH after the site: the source under test comes first there
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    environment = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.run(
        [*posdebias_command(), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )


def test_builtins_register_through_the_hooks():
    registry = Registry(load_entry_points=False)
    assert set(registry.calibrator_names()) >= {
        "vanilla", "pride", "attention_readout", "purified_attention", "attention_guided",
        "permutation_average",
    }  # fmt: skip
    assert "synthetic" in registry.adapter_names()
    assert registry.provider("calibrator", "attention_guided") == (
        "posdebias.calibrators.attention_guided"
    )
    assert registry.provider("adapter", "llava") == "posdebias.adapters.families.llava"
    assert registry.bundled_model("posdebias/organism").default


def test_installed_plugin_is_listed_with_its_distribution(site):
    write_distribution(site, "posdebias_lastpos", PLUGIN_CODE)
    registry = Registry()
    assert registry.provider("calibrator", "last_position") == "posdebias_lastpos"
    info = {p.name: p for p in registry.plugins()}["posdebias_lastpos"]
    assert (info.distribution, info.version, info.calibrators) == (
        "posdebias-lastpos", "1.2.3", ["last_position"],
    )  # fmt: skip
    calibrator = registry.create_calibrator("last_position", margin=2.0)
    assert calibrator.options.margin == 2.0
    with pytest.raises(ConfigError, match="unknown option 'marginn'"):
        registry.create_calibrator("last_position", marginn=2.0)


def test_plugin_calibrator_usable_from_cli_and_config(site, tmp_path):
    write_distribution(site, "posdebias_lastpos", PLUGIN_CODE)
    listing = run_cli(site, "plugins")
    assert listing.returncode == 0, listing.stderr
    assert "last_position" in listing.stdout and "posdebias-lastpos" in listing.stdout

    out = tmp_path / "run"
    result = run_cli(
        site,
        "evaluate",
        "--adapter",
        "synthetic",
        "--calibrators",
        "vanilla,last_position",
        "--count",
        "12",
        "--orders",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    metrics = json.loads((out / "results.json").read_text())["calibrators"]["last_position"]
    assert metrics["metrics"]["selection_rate"] == [0.0, 0.0, 0.0, 100.0]

    config = tmp_path / "config.yaml"
    config.write_text("calibrators:\n  last_position: {margin: 3.0}\ncount: 5\norders: 1\n")
    out2 = tmp_path / "run2"
    result = run_cli(
        site, "evaluate", "--adapter", "synthetic", "--config", str(config), "--out", str(out2)
    )
    assert result.returncode == 0, result.stderr
    saved = json.loads((out2 / "results.json").read_text())["calibrators"]
    assert list(saved) == ["last_position"] and saved["last_position"]["options"]["margin"] == 3.0


def test_broken_plugin_is_skipped_and_named(site):
    write_distribution(site, "posdebias_broken", "raise RuntimeError('boom at import')\n")
    write_distribution(site, "posdebias_lastpos", PLUGIN_CODE)
    with pytest.warns(PosdebiasPluginWarning, match="posdebias_broken.*boom at import"):
        registry = Registry()
    assert "last_position" in registry.calibrator_names()  # the rest still works
    errors = {p.name: p.error for p in registry.plugins() if p.error}
    assert "boom at import" in errors["posdebias_broken"]


def test_plugin_with_unknown_hook_is_rejected(site):
    write_distribution(
        site,
        "posdebias_typo",
        "from posdebias import hookimpl\n\n@hookimpl\ndef posdebias_register_calibrator(register):"
        "\n    pass\n",
    )
    with pytest.warns(PosdebiasPluginWarning, match="posdebias_typo.*unknown hook"):
        registry = Registry()
    assert "vanilla" in registry.calibrator_names()
    assert "unknown hook" in {p.name: p.error for p in registry.plugins()}["posdebias_typo"]


def test_plugin_registering_a_non_calibrator_is_rejected(site):
    write_distribution(
        site,
        "posdebias_bad",
        "from posdebias import hookimpl\n\n@hookimpl\ndef posdebias_register_calibrators(register):"
        "\n    register(object)\n",
    )
    with pytest.warns(PosdebiasPluginWarning, match="not a subclass of Calibrator"):
        Registry()


def test_environment_variables_restrict_plugins(site, monkeypatch):
    write_distribution(site, "posdebias_lastpos", PLUGIN_CODE)
    monkeypatch.setenv("POSDEBIAS_BLOCK_PLUGINS", "posdebias_lastpos")
    assert "last_position" not in Registry().calibrator_names()
    monkeypatch.delenv("POSDEBIAS_BLOCK_PLUGINS")
    monkeypatch.setenv("POSDEBIAS_LOAD_PLUGINS", "")
    assert "last_position" not in Registry().calibrator_names()
    monkeypatch.setenv("POSDEBIAS_LOAD_PLUGINS", "posdebias_lastpos")
    assert "last_position" in Registry().calibrator_names()


def test_in_process_plugin_object():
    registry = Registry(load_entry_points=False)

    class Plugin:
        @posdebias.hookimpl
        def posdebias_register_calibrators(self, register):
            from posdebias.calibrators.vanilla import Vanilla

            class Echo(Vanilla):
                name = "echo"

            register(Echo)

    registry.add_plugin(Plugin(), name="inline")
    assert registry.provider("calibrator", "echo") == "inline"


def test_register_takes_its_documented_parameter_by_name(tmp_path):
    """docs/plugins.md documents ``register(cls)`` and ``register(model)``: a plugin that passes
    the argument by that name registers (it was skipped with a TypeError once)."""
    from posdebias.adapters.families.synthetic import SyntheticAdapter
    from posdebias.calibrators.vanilla import Vanilla
    from posdebias.decoders.cloze import Cloze
    from posdebias.registry.bundled import BundledModel

    registry = Registry(load_entry_points=False)

    class Plugin:
        @posdebias.hookimpl
        def posdebias_register_adapters(self, register):
            register(cls=type("ByName", (SyntheticAdapter,), {"name": "by_name"}))

        @posdebias.hookimpl
        def posdebias_register_calibrators(self, register):
            register(cls=type("ByName", (Vanilla,), {"name": "by_name"}))

        @posdebias.hookimpl
        def posdebias_register_decoders(self, register):
            register(cls=type("ByName", (Cloze,), {"name": "by_name"}))

        @posdebias.hookimpl
        def posdebias_register_models(self, register):
            (tmp_path / "config.json").write_text("{}")
            register(model=BundledModel(name="by-name", path=tmp_path))

    info = registry.add_plugin(Plugin(), name="by_name")
    assert info.error is None
    assert (info.adapters, info.calibrators, info.decoders, info.models) == (
        ["by_name"],
        ["by_name"],
        ["by_name"],
        ["by-name"],
    )


def test_unknown_names_list_the_known_ones():
    with pytest.raises(UnknownNameError, match="known calibrators: attention_guided, "):
        posdebias.get_calibrator("attention_guidd")
    with pytest.raises(UnknownNameError, match="known adapters: .*synthetic"):
        posdebias.get_registry().create_adapter("nope")


def test_every_hook_is_documented_with_its_signature():
    """docs/plugins.md carries a heading with each hook's exact signature (datasette-style)."""
    docs = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    hooks = [name for name in dir(hookspecs) if name.startswith("posdebias_")]
    assert hooks
    for hook in hooks:
        assert f"### `{hook}(register)`" in docs, hook
