"""Models with their own Python code: refused by default, never executed implicitly."""

from __future__ import annotations

import json

import pytest

import posdebias
from posdebias.cli import main
from posdebias.errors import InputError
from posdebias.testing import save_tiny_model

CONFIGURATION = """
from pathlib import Path
Path({marker!r}).write_text("executed")
from transformers import LlavaConfig


class CustomConfig(LlavaConfig):
    model_type = "llava_custom_x"
"""

MODELING = """
from transformers import LlavaForConditionalGeneration
from .configuration_x import CustomConfig


class CustomModel(LlavaForConditionalGeneration):
    config_class = CustomConfig
"""


@pytest.fixture(scope="module")
def custom_code_model(tmp_path_factory):
    """A LLaVA checkpoint that declares its own config and model classes (auto_map) under a
    model_type transformers does not know, as LLaVA-OneVision-1.5 does; importing its code
    writes a marker file."""
    root = tmp_path_factory.mktemp("remote")
    directory = save_tiny_model("llava", root / "model")
    marker = root / "EXECUTED"
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "llava_custom_x"
    config["auto_map"] = {
        "AutoConfig": "configuration_x.CustomConfig",
        "AutoModelForImageTextToText": "modeling_x.CustomModel",
    }
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "configuration_x.py").write_text(CONFIGURATION.format(marker=str(marker)))
    (directory / "modeling_x.py").write_text(MODELING)
    return directory, marker


@pytest.fixture
def modules_cache(tmp_path, monkeypatch):
    """Where transformers copies executed model code (kept out of the user's cache)."""
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    return tmp_path / "modules"


def test_custom_code_is_refused_by_default_with_why_and_how(custom_code_model, capsys):
    directory, marker = custom_code_model
    with pytest.raises(InputError) as error:
        posdebias.load_adapter(directory)
    message = str(error.value)
    assert "ships its own Python code" in message and "auto_map" in message
    assert "can do anything your user account can" in message
    # each door names its own way to opt in
    assert "pass trust_remote_code=True (load_adapter)" in message and "--" not in message
    harness = error.value.message_for("harness")
    assert '"trust_remote_code": true in the adapter_options file' in harness
    assert main(["evaluate", "--model", str(directory)]) == 2
    err = capsys.readouterr().err
    assert "ships its own Python code" in err and "opt in with --trust-remote-code, then" in err
    assert "trust_remote_code=True" not in err and "adapter_options" not in err
    assert main(["check", "--model", str(directory)]) == 2
    assert not marker.exists()  # the model's code never ran


def test_opting_in_runs_the_code_and_check_decides(custom_code_model, modules_cache, capsys):
    directory, marker = custom_code_model
    adapter = posdebias.load_adapter(directory, trust_remote_code=True)
    assert marker.exists() and adapter.name == "generic"
    assert type(adapter.model).__name__ == "CustomModel"
    assert main(["check", "--model", str(directory), "--trust-remote-code", "-N", "3"]) == 0
    assert "all 7 checks passed" in capsys.readouterr().out
