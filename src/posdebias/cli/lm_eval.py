"""``posdebias lm-eval``: lm-evaluation-harness's own command line with ``--model posdebias``
registered (lm-eval 0.4 reads no entry point, so a plain ``lm-eval`` cannot find it)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util

from posdebias.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "lm-eval",
        add_help=False,  # -h is lm-eval's
        description="Run lm-evaluation-harness (lm-eval's arguments, e.g. --model posdebias "
        "--model_args ... --tasks ... --include_path ...) with the model posdebias known.",
    )
    parser.set_defaults(handler=run, passed_on=[])


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("lm_eval") is None:
        raise ConfigError(
            "lm-evaluation-harness is not installed: pip install 'posdebias[lm-eval]'"
        )
    # the integration subclasses lm-eval's model class: importable only with the extra
    integration = importlib.import_module("posdebias.integrations.lm_eval")
    integration.main(args.passed_on)
    return 0
