"""The plugin contract at run time, with real plugin distributions on disk (see test_registry).

A plugin's broken calibrator or adapter is named (calibrator, plugin, distribution), is never
reported as posdebias's internal error, and does not cost the other calibrators their results.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from posdebias.errors import PluginContractError, PosdebiasPluginWarning
from posdebias.registry import Registry
from test_registry import run_cli, write_distribution

HEADER = """
import numpy as np
from pydantic import BaseModel

from posdebias import Calibrator, Prediction, hookimpl
"""

ABSTRACT = (
    HEADER
    + '''
class Unfinished(Calibrator):
    """Forgot _predict."""

    name = "unfinished"


@hookimpl
def posdebias_register_calibrators(register):
    register(Unfinished)
'''
)

TWO_SCORES = (
    HEADER
    + """
class TwoScores(Calibrator):
    name = "two_scores"

    def _predict(self, observation, state, rotations):
        return Prediction(scores=np.array([0.0, 1.0]))


@hookimpl
def posdebias_register_calibrators(register):
    register(TwoScores)
"""
)

NOT_FINITE = (
    HEADER
    + """
class NotFinite(Calibrator):
    name = "not_finite"

    def _predict(self, observation, state, rotations):
        return Prediction(scores=np.full(observation.n, np.nan))


@hookimpl
def posdebias_register_calibrators(register):
    register(NotFinite)
"""
)

RAISES = (
    HEADER
    + """
class Flaky(Calibrator):
    name = "flaky"

    def _predict(self, observation, state, rotations):
        raise ZeroDivisionError("flaky gave up")


@hookimpl
def posdebias_register_calibrators(register):
    register(Flaky)
"""
)

FITTED = (
    HEADER
    + """
class Offsets(BaseModel):
    offsets: list[float]
    note: str = ""


class Offset(Calibrator):
    name = "offset"
    needs_fit = True
    Fitted = Offsets

    def _fit(self, observations):
        mean = np.mean([obs.label_logprobs for obs in observations], axis=0)
        return {"offsets": mean.tolist(), "note": "mean log-score", "logit_prior": mean.tolist()}

    def _predict(self, observation, state, rotations):
        offsets = np.asarray(self.fitted(state).offsets)
        return Prediction(scores=observation.label_logprobs - offsets)


class Undeclared(Calibrator):
    name = "undeclared"
    needs_fit = True

    def _fit(self, observations):
        return {"secret": 1.0}

    def _predict(self, observation, state, rotations):
        return Prediction(scores=observation.label_logprobs)


class Forgetful(Undeclared):
    name = "forgetful"

    def state_reads(self, state):
        return ("bias_matrix",)

    def _fit(self, observations):
        return {"logit_prior": [0.0] * observations[0].n}


class Misnamed(Forgetful):
    name = "misnamed"

    def state_reads(self, state):
        return ("logit_priors", "offsets")


class Unfitted(Undeclared):
    name = "unfitted"
    needs_fit = False

    def state_reads(self, state):
        return ("logit_prior",)


@hookimpl
def posdebias_register_calibrators(register):
    for calibrator in (Offset, Undeclared, Forgetful, Misnamed, Unfitted):
        register(calibrator)
"""
)


def evaluate(site, tmp_path, calibrators, name="run"):
    out = tmp_path / name
    result = run_cli(
        site, "evaluate", "--adapter", "synthetic", "--calibrators", calibrators,
        "--count", "6", "--orders", "2", "--out", str(out),
    )  # fmt: skip
    return result, out


def test_an_abstract_calibrator_is_rejected_at_registration(site):
    write_distribution(site, "posdebias_unfinished", ABSTRACT)
    with pytest.warns(PosdebiasPluginWarning) as caught:
        registry = Registry()
    message = str(caught[0].message)
    assert "posdebias_unfinished" in message and "posdebias-unfinished 1.2.3" in message
    assert "'unfinished' (Unfinished) is abstract" in message and "_predict" in message
    assert "unfinished" not in registry.calibrator_names()


@pytest.mark.parametrize(
    ("module", "code", "label", "why"),
    [
        ("posdebias_two", TWO_SCORES, "two_scores", "returned 2 scores for N=4 candidates"),
        ("posdebias_nan", NOT_FINITE, "not_finite", "returned invalid scores: scores contains"),
        ("posdebias_flaky", RAISES, "flaky", "ZeroDivisionError: flaky gave up"),
    ],
)
def test_a_failing_plugin_calibrator_is_named_and_the_others_are_kept(
    site, tmp_path, module, code, label, why
):
    write_distribution(site, module, code)
    result, out = evaluate(site, tmp_path, f"vanilla,{label},pride")
    assert result.returncode == 1, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    distribution = module.replace("_", "-")
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1
    assert (
        f"calibrator {label!r} from plugin {module!r} (distribution {distribution} 1.2.3)"
        in (error[0])
    )
    assert why in error[0]
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warning) == 1 and "the other calibrators carry on" in warning[0]
    results = json.loads((out / "results.json").read_text())
    assert set(results["calibrators"]) == {"vanilla", "pride"}
    assert why in results["failed"][label]
    assert "vanilla" in result.stdout and "pride" in result.stdout  # the table was printed


def test_predict_rejects_a_wrong_number_of_scores_in_process():
    from posdebias.calibrators.vanilla import Vanilla
    from posdebias.core.observation import Observation, Prediction

    class Short(Vanilla):
        name = "short"

        def _predict(self, observation, state, rotations):
            return Prediction(scores=observation.label_logprobs[:2])

    observation = Observation(label_logprobs=np.log(np.full(4, 0.25)))
    calibrator = Short()
    with pytest.raises(PluginContractError, match="'short' returned 2 scores for N=4 candidates"):
        calibrator.predict(observation, calibrator.fit([], n=4))


def test_results_record_the_plugin_distributions_and_plugins_lists_them(site, tmp_path):
    write_distribution(site, "posdebias_offset", FITTED, version="0.4.2")
    result, out = evaluate(site, tmp_path, "vanilla,offset")
    assert result.returncode == 0, result.stderr
    plugins = json.loads((out / "results.json").read_text())["plugins"]
    by_name = {(p["kind"], p["name"]): p for p in plugins}
    assert by_name[("calibrator", "offset")]["distribution"] == "posdebias-offset"
    assert by_name[("calibrator", "offset")]["version"] == "0.4.2"
    assert by_name[("calibrator", "vanilla")]["distribution"] == "posdebias"
    assert by_name[("adapter", "synthetic")]["plugin"] == "posdebias.adapters.families.synthetic"

    listing = run_cli(site, "plugins", "--options")
    assert listing.returncode == 0, listing.stderr
    text = listing.stdout
    assert text.startswith("posdebias 0.1.0") or "posdebias 0.1.0" in text.splitlines()[0]
    assert "posdebias-offset" in text and "0.4.2" in text
    assert "conditional bias matrix" in text  # a summary (the table wraps long ones)
    assert "calibrator attention_guided: options" in text and "top_k" in text


def test_a_plugin_calibrator_persists_its_own_fitted_parameters(site, tmp_path):
    write_distribution(site, "posdebias_offset", FITTED)
    result, out = evaluate(site, tmp_path, "offset")
    assert result.returncode == 0, result.stderr
    state = json.loads((out / "states" / "offset.json").read_text())
    assert state["extra"]["note"] == "mean log-score" and len(state["extra"]["offsets"]) == 4
    assert state["logit_prior"] == state["extra"]["offsets"]  # a known field goes to its place

    undeclared, _ = evaluate(site, tmp_path, "undeclared", name="run2")
    assert undeclared.returncode == 1 and "internal error" not in undeclared.stderr
    assert "calibrator 'undeclared' from plugin 'posdebias_offset'" in undeclared.stderr
    assert "fields the calibration state does not have (secret)" in undeclared.stderr

    # what a calibrator says its predictions read must be what its fit filled
    told = {
        "forgetful": "state_reads (what _predict reads) names ['bias_matrix'], but its _fit did "
        "not fill them",
        "misnamed": "state_reads (what _predict reads) names ['logit_priors', 'offsets'], "
        "neither fitted fields of the calibration state (attention_prior, bias_matrix,",
        "unfitted": "names ['logit_prior'], but needs_fit is False",
    }
    for calibrator, said in told.items():
        failed, _ = evaluate(site, tmp_path, calibrator, name=f"run-{calibrator}")
        assert failed.returncode == 1 and "Traceback" not in failed.stderr
        assert f"calibrator '{calibrator}' from plugin" in failed.stderr and said in failed.stderr

    # a saved state whose own parameters were edited is refused when loaded: exit 2, no run
    state["extra"]["offsets"] = "four numbers"
    edited = tmp_path / "edited" / "offset.json"
    edited.parent.mkdir()
    edited.write_text(json.dumps(state))
    refused = run_cli(site, "evaluate", "--adapter", "synthetic", "--calibrators", "offset",
                      "--count", "6", "--orders", "1", "--calibration", str(edited),
                      "--out", str(tmp_path / "run4"))  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "its own fitted parameters (extra)" in refused.stderr and "offsets" in refused.stderr
    assert not (tmp_path / "run4").exists()


BROKEN_ADAPTER = '''
from posdebias import hookimpl
from posdebias.adapters.base import Adapter
from posdebias.adapters.families.synthetic import SyntheticAdapter


class Broken(SyntheticAdapter):
    name = "broken_sim"

    def observe_many(self, instances, *, batch_size=1):
        raise RuntimeError("the model server is down")


class NoLayers(Adapter):
    """Forgot num_layers and observe_many."""

    name = "no_layers"


@hookimpl
def posdebias_register_adapters(register):
    register(Broken)
'''

ABSTRACT_ADAPTER = BROKEN_ADAPTER.replace("register(Broken)", "register(NoLayers)")


def test_a_failing_plugin_adapter_is_named_not_an_internal_error(site, tmp_path):
    write_distribution(site, "posdebias_broken_sim", BROKEN_ADAPTER)
    write_distribution(site, "posdebias_no_layers", ABSTRACT_ADAPTER)
    result = run_cli(site, "evaluate", "--adapter", "broken_sim", "--count", "3", "--orders", "1")
    assert result.returncode == 1
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert (
        "error: adapter 'broken_sim' from plugin 'posdebias_broken_sim' (distribution "
        "posdebias-broken-sim 1.2.3) failed observing instance" in result.stderr
    )
    assert "RuntimeError: the model server is down" in result.stderr
    # the abstract one (another distribution) was refused at registration: one warning line
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warning) == 1 and "'no_layers' (NoLayers) is abstract" in warning[0]
    assert "num_layers" in warning[0] and "observe_many" in warning[0]


def test_every_built_in_option_says_what_it_does(capsys):
    """`posdebias plugins --options` is the reference of every option: a built-in option
    without a description (a subclass re-declaring a field loses its parent's) is a gap."""
    from posdebias.cli import main
    from posdebias.cli.plugins import _entries, option_rows
    from posdebias.registry import get_registry

    undocumented = [
        f"{kind} {name}: {row[0]}"
        for kind, name, cls in _entries(get_registry())
        if cls.__module__.startswith("posdebias.")
        for row in option_rows(cls.Options)
        if not row[3].strip()
    ]
    assert not undocumented, undocumented
    assert main(["plugins", "--options"]) == 0
    listing = capsys.readouterr().out
    assert "paper Eq. 11" in listing and "sampling temperature" in listing
