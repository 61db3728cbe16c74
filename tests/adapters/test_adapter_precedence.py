"""Which adapter a model_type resolves to: built-ins, plugins, priority, warnings, listing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

import posdebias
from posdebias.adapters.families.qwen2_vl import Qwen3VLAdapter
from posdebias.registry import Registry


def _plugin(*classes):
    class Plugin:
        @posdebias.hookimpl
        def posdebias_register_adapters(self, register):
            for cls in classes:
                register(cls)

    return Plugin()


class SameClaim(Qwen3VLAdapter):
    name = "my_qwen3"


class TakeOver(Qwen3VLAdapter):
    name = "my_qwen3_priority"
    priority = 10


class NewFamily(Qwen3VLAdapter):
    name = "my_family"
    model_types = ("my_vl",)


def test_builtin_keeps_its_model_type_against_a_plugin_at_equal_priority():
    registry = Registry(load_entry_points=False)
    with pytest.warns(RuntimeWarning) as caught:
        registry.add_plugin(_plugin(SameClaim), name="thirdparty")
    message = str(caught[0].message)
    assert "'my_qwen3' claims model_type 'qwen3_vl', already claimed by adapter 'qwen3_vl'" in (
        message
    )
    assert "higher `priority`" in message and "--adapter my_qwen3" in message
    assert registry.adapter_for_model_type("qwen3_vl") is Qwen3VLAdapter
    assert registry.adapter_class("my_qwen3") is SameClaim  # still usable by name
    claims = registry.model_type_claims()["qwen3_vl"]
    assert [c.value.name for c in claims] == ["qwen3_vl", "my_qwen3"]


def test_two_plugins_claiming_one_new_model_type_warn_and_the_first_wins():
    class Second(NewFamily):
        name = "my_family_2"

    registry = Registry(load_entry_points=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry.add_plugin(_plugin(NewFamily), name="first")  # no overlap: no warning
    with pytest.warns(RuntimeWarning, match="'my_family_2' claims model_type 'my_vl'"):
        registry.add_plugin(_plugin(Second), name="second")
    assert registry.adapter_for_model_type("my_vl") is NewFamily


def test_a_higher_priority_takes_a_family_over_deliberately_without_a_warning():
    registry = Registry(load_entry_points=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        registry.add_plugin(_plugin(TakeOver), name="thirdparty")
    assert registry.adapter_for_model_type("qwen3_vl") is TakeOver
    assert registry.adapter_for_model_type("qwen3_vl_moe") is TakeOver
    assert registry.adapter_for_model_type("qwen2_5_vl").name == "qwen2_vl"
    assert registry.adapter_for_model_type("unknown_vl") is None


PLUGIN = """
from posdebias import hookimpl
from posdebias.adapters.families.qwen2_vl import Qwen3VLAdapter


class MyQwen(Qwen3VLAdapter):
    name = "my_qwen"
    priority = PRIORITY


@hookimpl
def posdebias_register_adapters(register):
    register(MyQwen)
"""


@pytest.mark.parametrize("priority", [0, 1])
def test_plugins_command_shows_what_each_model_type_resolves_to(tmp_path, priority):
    site = tmp_path / "site"
    (site / "posdebias_myqwen").mkdir(parents=True)
    code = textwrap.dedent(PLUGIN).replace("PRIORITY", str(priority))
    (site / "posdebias_myqwen" / "__init__.py").write_text(code)
    dist = site / "posdebias_myqwen-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: posdebias-myqwen\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[posdebias]\nmyqwen = posdebias_myqwen\n")
    # The worktree's own source stays first when PYTHONPATH is set (CI has none: installed).
    path = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "COLUMNS": "80"}
    result = subprocess.run(
        [sys.executable, "-m", "posdebias", "plugins"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = {
        line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
        for line in result.stdout.splitlines()
        if line.startswith("│") and ("qwen" in line or "llava" in line)
    }
    if priority == 0:
        assert rows["qwen3_vl"][:3] == ["qwen3_vl", "posdebias.adapters.families.qwen2_vl", "0"]
        assert rows["qwen3_vl"][3] == "my_qwen (myqwen, priority 0)"
        assert "claims model_type 'qwen3_vl'" in result.stderr  # the warning is visible
    else:
        assert rows["qwen3_vl"][:3] == ["my_qwen", "myqwen", "1"]
        assert rows["qwen3_vl"][3] == "qwen3_vl (posdebias.adapters.families.qwen2_vl, priority 0)"
        assert "claims model_type" not in result.stderr
    assert rows["llava"][:2] == ["llava", "posdebias.adapters.families.llava"]
