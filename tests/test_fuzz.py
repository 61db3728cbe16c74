"""Fuzzing the loaders: malformed configs and calibration files must raise posdebias errors
(with a message), never anything else."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from posdebias import CalibrationState
from posdebias.errors import PosdebiasError
from posdebias.evaluation.config import EvaluateConfig, load_config
from posdebias.evaluation.job import build_adapter, build_calibrators

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)  # fmt: skip
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
config_keys = st.sampled_from([*EvaluateConfig.model_fields, "adapter", "calibrators", "typo"])
config_payloads = st.dictionaries(config_keys, json_values, max_size=5)
state_keys = st.sampled_from([*CalibrationState.model_fields, "extra"])


def write_temp(suffix: str, data: bytes) -> Path:
    handle = tempfile.NamedTemporaryFile(suffix=suffix, delete=False)  # noqa: SIM115
    handle.write(data)
    handle.close()
    return Path(handle.name)


@given(payload=config_payloads, suffix=st.sampled_from([".yaml", ".json"]))
def test_config_payloads_raise_only_our_errors(payload, suffix):
    path = write_temp(suffix, json.dumps(payload, allow_nan=True).encode())
    try:
        config = load_config(path)
        build_calibrators(config)
        if config.model is None:
            build_adapter(config)
    except PosdebiasError as exc:
        assert str(exc)
    finally:
        path.unlink()


@given(data=st.binary(max_size=200), suffix=st.sampled_from([".yaml", ".toml", ".json"]))
def test_config_bytes_raise_only_our_errors(data, suffix):
    path = write_temp(suffix, data)
    try:
        load_config(path)
    except PosdebiasError as exc:
        assert str(exc)
    finally:
        path.unlink()


@given(
    payload=st.dictionaries(state_keys, json_values, max_size=8),
    version=st.sampled_from([1, 1, 2, "1", None]),
)
def test_calibration_payloads_raise_only_our_errors(payload, version):
    payload = {"schema_version": version, "calibrator": "attention_guided", "n": 4, **payload}
    path = write_temp(".json", json.dumps(payload, allow_nan=True).encode())
    try:
        state = CalibrationState.load(path)
        state.check_compatible(n=4, num_layers=8, calibrator="attention_guided")
    except PosdebiasError as exc:
        assert str(exc)
    finally:
        path.unlink()


@given(data=st.binary(max_size=300))
def test_calibration_bytes_raise_only_our_errors(data):
    path = write_temp(".json", data)
    try:
        CalibrationState.load(path)
    except PosdebiasError as exc:
        assert str(exc)
    finally:
        path.unlink()
