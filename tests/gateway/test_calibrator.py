"""Calibrators with provenance: fit-posthoc records the signal and the model it fitted on; the gateway maps the raw
signal through the file, refuses one fitted on another signal or model (the CLI in one line, exit 2), and swaps a
new version in on reload while a refused file leaves the old one. An unreachable upstream gets a 503 in OpenAI's
shape. No model server is needed: the data are real scored answers (tests/gateway/data/)."""

from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import pytest

from hf_calibration.errors import ParameterError
from tests.gateway.conftest import running_gateway
from tests.gateway.test_abstain import DATA

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _fit(tmp_path, method="platt", signal="norm_p_true", name="cal.json"):
    from hf_calibration.jobs import FitPosthocConfig, run_fit_posthoc

    folder = tmp_path / "data"
    if not folder.exists():
        shutil.copytree(DATA.parent, folder)
    out = tmp_path / name
    run_fit_posthoc(FitPosthocConfig(method=method, predictions=str(folder / DATA.name), output=str(out),
                                     signal=signal))
    return out


def test_fit_posthoc_records_signal_and_model_and_the_gateway_maps_through_it(tmp_path):
    from hf_calibration.gateway.calibration import load_checked
    from hf_calibration.gateway.abstain import read_labelled
    from hf_calibration.posthoc import load_calibrator

    path = _fit(tmp_path)
    saved = json.loads(path.read_text())
    assert saved["fitted_on"] == {"signal": "norm_p_true", "model": MODEL, "predictions": DATA.name,
                                  "n": len(read_labelled(DATA, "norm_p_true")[0])}
    cal = load_checked(path, signal="norm_p_true", model=MODEL)
    peer = load_calibrator(path)  # the posthoc package's own reading of the same file
    for raw in (0.05, 0.5, 0.93):
        assert cal(raw) == pytest.approx(float(peer.transform(np.array([raw]))[0]), abs=1e-12)
    assert cal.kind == "platt" and len(cal.version) == 12


def test_a_calibrator_of_another_signal_or_model_or_without_provenance_is_refused(tmp_path):
    from hf_calibration.gateway.calibration import load_checked

    path = _fit(tmp_path)
    with pytest.raises(ParameterError, match="signal 'norm_p_true'") as err:
        load_checked(path, signal="p_true", model=MODEL)
    assert err.value.parameter == "calibrator"
    with pytest.raises(ParameterError, match="model"):
        load_checked(path, signal="norm_p_true", model="Qwen/Qwen2.5-Coder-0.5B-Instruct")
    old = tmp_path / "old.json"
    payload = json.loads(path.read_text())
    del payload["fitted_on"]
    old.write_text(json.dumps(payload))
    with pytest.raises(ParameterError, match="fitted_on"):
        load_checked(old, signal="norm_p_true", model=MODEL)


def test_serve_refuses_a_mismatched_calibrator_in_one_line(tmp_path, capsys):
    from hf_calibration.cli import main

    path = _fit(tmp_path)
    rc = main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--model", MODEL, "--calibrator", str(path),
               "--signal", "p_true", "--check-upstream", "false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("hf-calibration: error: --calibrator: ")


def test_reload_swaps_a_new_version_and_keeps_the_old_on_a_refused_file(tmp_path):
    from hf_calibration.gateway.config import GatewayConfig
    from hf_calibration.modeling.backends import load_tokenizer
    from hf_calibration.modeling.backends.launch import free_port

    path = _fit(tmp_path)
    config = GatewayConfig(upstream=f"http://127.0.0.1:{free_port()}/v1", model=MODEL, signal="norm_p_true",
                           calibrator=str(path))
    with running_gateway(config, tokenizer=load_tokenizer(MODEL)) as (url, gw):
        root = url[: -len("/v1")]
        first = httpx.get(f"{root}/healthz").json()["calibrator"]
        shutil.copy(_fit(tmp_path, method="isotonic", name="iso.json"), path)
        second = httpx.post(f"{root}/admin/reload").json()["calibrator"]
        assert second["kind"] == "isotonic" and second["version"] != first["version"]
        payload = json.loads(path.read_text())
        payload["fitted_on"]["signal"] = "verbalized"
        path.write_text(json.dumps(payload))
        refused = httpx.post(f"{root}/admin/reload")
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "calibrator"
        assert gw.calibrator.current.version == second["version"]
        metrics = httpx.get(f"{root}/metrics").text
        assert f'gateway_calibrator_info{{kind="isotonic",version="{second["version"]}"}} 1.0' in metrics
        # nothing listens upstream: OpenAI's error shape with 503, and /healthz says so
        down = httpx.post(f"{url}/chat/completions", json={"model": MODEL, "messages": [
            {"role": "user", "content": "Hi"}], "calibration": {"options": ["Hi", "Bye"]}}, timeout=60)
        assert down.status_code == 503 and down.json()["error"]["code"] == "upstream_unreachable"
        assert httpx.get(f"{root}/healthz").status_code == 503
