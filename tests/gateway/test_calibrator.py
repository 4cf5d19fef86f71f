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


def test_admin_endpoints_without_a_key_answer_loopback_clients_only(tmp_path):
    """No --admin-key: POST /admin/reload from 127.0.0.1 or ::1 reloads; from any other address it gets 403 in
    OpenAI's error shape and the calibrator stays (the app served through httpx's ASGI transport, which sets the
    client address)."""
    import asyncio

    from hf_calibration.gateway.app import create_app
    from hf_calibration.gateway.config import ADMIN_KEY_ENV, GatewayConfig
    from hf_calibration.modeling.backends import load_tokenizer
    from hf_calibration.modeling.backends.launch import free_port

    path = _fit(tmp_path)
    assert ADMIN_KEY_ENV not in __import__("os").environ
    app = create_app(GatewayConfig(upstream=f"http://127.0.0.1:{free_port()}/v1", model=MODEL,
                                   signal="norm_p_true", calibrator=str(path)), tokenizer=load_tokenizer(MODEL))
    first = app.state.gateway.calibrator.current.version

    async def reload(host):
        transport = httpx.ASGITransport(app=app, client=(host, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.post("/admin/reload")

    shutil.copy(_fit(tmp_path, method="isotonic", name="iso.json"), path)
    for host in ("203.0.113.7", "10.0.0.2", "2001:db8::1"):
        refused = asyncio.run(reload(host))
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_loopback_only"
        assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    assert app.state.gateway.calibrator.current.version == first
    for host in ("127.0.0.1", "::1"):
        done = asyncio.run(reload(host))
        assert done.status_code == 200 and done.json()["calibrator"]["kind"] == "isotonic"


def test_admin_key_is_checked_from_the_flag_and_the_environment_and_sighup_still_reloads(tmp_path, monkeypatch):
    """With a key (``serve --admin-key``, or HF_CALIBRATION_ADMIN_KEY), /admin/reload needs ``Authorization: Bearer
    KEY`` even from loopback: missing or wrong → 401 in OpenAI's error shape, the calibrator unchanged; right → the
    reload. SIGHUP reloads without any key."""
    import os
    import signal
    import time

    from hf_calibration.gateway.config import ADMIN_KEY_ENV, GatewayConfig
    from hf_calibration.modeling.backends import load_tokenizer
    from hf_calibration.modeling.backends.launch import free_port
    from tests.gateway.conftest import serve_process

    path = _fit(tmp_path)
    upstream = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: the admin endpoint needs no upstream
    args = ["--upstream", upstream, "--model", MODEL, "--signal", "norm_p_true", "--calibrator", str(path),
            "--admin-key", "s3cret-flag"]
    with serve_process(args, log=tmp_path / "serve.log") as (url, proc):
        root = url[: -len("/v1")]
        first = httpx.get(f"{root}/healthz").json()["calibrator"]["version"]
        shutil.copy(_fit(tmp_path, method="isotonic", name="iso.json"), path)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-flag"}):
            refused = httpx.post(f"{root}/admin/reload", headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{root}/healthz").json()["calibrator"]["version"] == first
        done = httpx.post(f"{root}/admin/reload", headers={"Authorization": "Bearer s3cret-flag"})
        assert done.status_code == 200 and done.json()["calibrator"]["kind"] == "isotonic"
        shutil.copy(_fit(tmp_path, method="histogram", name="hist.json"), path)
        os.kill(proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 30
        while httpx.get(f"{root}/healthz").json()["calibrator"]["kind"] != "histogram":
            assert time.monotonic() < deadline, "SIGHUP did not reload the calibrator within 30 s"
            time.sleep(0.2)
    monkeypatch.setenv(ADMIN_KEY_ENV, "s3cret-env")
    config = GatewayConfig(upstream=upstream, model=MODEL, signal="norm_p_true", calibrator=str(path))
    assert "s3cret" not in repr(config)
    with running_gateway(config, tokenizer=load_tokenizer(MODEL)) as (url, gw):
        root = url[: -len("/v1")]
        assert httpx.post(f"{root}/admin/reload").status_code == 401
        assert httpx.post(f"{root}/admin/reload", headers={"Authorization": "Bearer s3cret-env"}).status_code == 200
    with pytest.raises(ParameterError) as err:
        GatewayConfig(upstream=upstream, admin_key=" ")
    assert err.value.parameter == "admin_key" and " " not in str(err.value.value)
