"""CLI flags are checked against the config model, so a flag and its field cannot drift apart:
every field of the run's config has a flag of `posdebias evaluate` that sets it, and every flag
either sets the field of its name or is one of the declared run flags."""

from __future__ import annotations

import pytest

from posdebias.cli import build_parser
from posdebias.cli.evaluate import RUN_FLAGS, config_flags, with_model_options
from posdebias.evaluation.config import EvaluateConfig, load_config


def flags_of(command: str) -> set[str]:
    parser = build_parser([command])
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return {action.dest for action in sub.choices[command]._actions if action.dest != "help"}


def test_every_config_field_has_an_evaluate_flag_and_every_flag_a_field():
    flags = flags_of("evaluate")
    fields = set(EvaluateConfig.model_fields)
    assert fields - flags == set()
    assert flags - fields <= RUN_FLAGS, flags - fields - RUN_FLAGS


@pytest.mark.parametrize("command", ["calibrate", "sweep"])
def test_the_other_commands_flags_name_config_fields_or_their_own(command):
    own = {"calibrate": {"out"}, "sweep": {"study", "benchmarks", "values", "out"}}[command]
    assert flags_of(command) - set(EvaluateConfig.model_fields) - own <= RUN_FLAGS


def test_a_sweep_offers_every_setting_of_evaluate_but_those_a_study_decides():
    """Each point of a study is an `evaluate`: the sweep takes the same flags (--task and
    --order-kind were missing), less the declared ones a study sets or cannot use."""
    from posdebias.cli.sweep import STUDY_DECIDES

    own = {"study", "benchmarks", "values"}
    assert flags_of("sweep") - own == flags_of("evaluate") - set(STUDY_DECIDES)
    assert all(reason for reason in STUDY_DECIDES.values())


@pytest.mark.parametrize("command", ["evaluate", "calibrate", "sweep", "check", "rank"])
def test_every_command_that_loads_a_model_takes_the_same_model_flags(command):
    assert {"model", "adapter", "chat_template", "threads", "trust_remote_code"} <= flags_of(
        command
    )


@pytest.mark.parametrize("command", ["evaluate", "calibrate", "sweep"])
def test_the_task_flag_reaches_the_config(command, tmp_path):
    argv = [command, "--task", "multiple_choice", "--base-url", "http://127.0.0.1:9/v1",
            "--out", str(tmp_path / "out")]  # fmt: skip
    if command == "sweep":
        argv.insert(1, "tau")
    args = build_parser(argv).parse_args(argv)
    assert config_flags(args)["task"] == "multiple_choice"
    config = with_model_options(load_config(None, adapter="openai"), args)
    assert config.adapter.options["base_url"] == "http://127.0.0.1:9/v1"


def test_each_flag_reaches_its_field(tmp_path):
    argv = ["evaluate", "--adapter", "synthetic", "--order-kind", "cyclic", "--orders", "3",
            "--calibration-benchmark", str(tmp_path / "cal"), "--count", "7", "-N", "3",
            "--seed", "9", "--resamples", "200", "--baseline", "pride"]  # fmt: skip
    args = build_parser(argv).parse_args(argv)
    config = load_config(None, **config_flags(args))
    assert (config.order_kind, config.orders, config.count, config.n) == ("cyclic", 3, 7, 3)
    assert config.calibration_benchmark == tmp_path / "cal"
    assert (config.seed, config.resamples, config.baseline) == (9, 200, "pride")
    assert config.adapter.name == "synthetic"
