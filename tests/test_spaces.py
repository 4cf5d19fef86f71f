"""Each metric Space's app.py starts with gradio, serves its page, and computes through it.

evaluate's own widget (``launch_gradio_widget``) calls ``gr.inputs.Dataframe``, gone since gradio 4, so a
Space built with it no longer starts; ``hf_calibration.integrations.spaces`` is the replacement every app.py uses.
gradio is a test extra (``.[spaces]``); without it the launch tests are skipped with that reason.
"""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hf_calibration import metrics as lib
from hf_calibration.integrations.spaces import compute_from_table

REPO = Path(__file__).resolve().parents[1]
METRICS = sorted(p.parent.name for p in REPO.glob("metrics/*/app.py"))
# folder -> (library function, result key, how the app's examples map to its arguments)
EXPECTED = {
    "expected_calibration_error": (lib.expected_calibration_error, "expected_calibration_error"),
    "smooth_ece": (lib.smooth_ece, "smooth_ece"),
    "calibration_brier_score": (lib.brier_score, "brier_score"),
    "negative_log_likelihood": (lib.negative_log_likelihood, "negative_log_likelihood"),
    "confidence_auroc": (lib.confidence_auroc, "confidence_auroc"),
    "aurc": (lib.aurc, "aurc"),
    "classwise_ece": (lib.classwise_ece, "classwise_ece"),
    "semantic_ece": (None, "semantic_ece"),
}
needs_gradio = pytest.mark.skipif(importlib.util.find_spec("gradio") is None,
                                  reason="gradio is not installed (pip install -e '.[spaces]'; make test does)")


def _examples(name):
    spec = importlib.util.spec_from_file_location(f"_app_{name}", REPO / "metrics" / name / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # app.py launches only under __main__
    return module.EXAMPLES


def _expected(name, rows):
    fn, _ = EXPECTED[name]
    predictions = [json.loads(p) for p, _ in rows]
    references = [json.loads(r) for _, r in rows]
    if name == "semantic_ece":
        return lib.semantic_ece(predictions, references)
    return fn(references, predictions)


def test_every_metric_folder_has_an_app_and_an_expectation():
    assert set(METRICS) == set(EXPECTED)


@pytest.mark.parametrize("name", METRICS)
def test_table_compute_equals_the_library(name):
    evaluate = pytest.importorskip("evaluate")
    module = evaluate.load(str(REPO / "metrics" / name), keep_in_memory=True)
    rows = _examples(name)
    result = compute_from_table(module, rows, "{}")
    assert result[EXPECTED[name][1]] == pytest.approx(_expected(name, rows), abs=1e-12)  # same float64 code path
    with pytest.raises(ValueError, match=r"predictions\[0\]: not a JSON value"):
        compute_from_table(module, [["[0.9", rows[0][1]]])
    with pytest.raises(ValueError, match="options: expected a JSON object"):
        compute_from_table(module, rows, "[1]")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_gradio
@pytest.mark.parametrize("name", METRICS)
def test_space_app_launches_and_computes(name, tmp_path):
    from gradio_client import Client

    port = _free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
           "HF_HOME": str(tmp_path / "hf"), "GRADIO_TEMP_DIR": str(tmp_path / "gradio")}
    log = open(tmp_path / "app.log", "w")
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=REPO / "metrics" / name, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    page = response.read().decode("utf-8", "replace")
                    assert response.status == 200
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(f"app.py did not serve {url}:\n{(tmp_path / 'app.log').read_text()[-3000:]}")
                time.sleep(1)
        assert "gradio" in page.lower()
        rows = _examples(name)
        client = Client(url, verbose=False)
        table = {"headers": ["predictions", "references"], "data": rows}
        result = client.predict(table, "{}", api_name="/compute")
        assert result[EXPECTED[name][1]] == pytest.approx(_expected(name, rows), abs=1e-12)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
