"""``hf-calibration evaluate`` and ``diagnose`` through the vLLM server, against the same jobs in process; and
the bad inputs of a served run (one line naming the option, exit 2, nothing written)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from hf_calibration.cli import main
from hf_calibration.errors import ParameterError
from tests.serving.conftest import MAX_MODEL_LEN, MODEL, PROB_ATOL

LIMIT = 4


def _cli(capsys, *argv):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(list(argv))
    return rc, capsys.readouterr().err


def _served(server):
    return ["--backend", "openai", "--base-url", server.url, "--served-model", server.model]


@pytest.fixture(scope="module")
def calibrator_file(tmp_path_factory):
    from hf_calibration.posthoc import TemperatureScaler

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(100, 4)) * 2
    path = tmp_path_factory.mktemp("ts") / "ts.json"
    labels = np.where(rng.uniform(size=100) < 0.6, logits.argmax(axis=1), rng.integers(0, 4, 100))  # T ≠ 1
    TemperatureScaler().fit(logits, labels).save(path)
    return path


def test_evaluate_through_server(vllm_server, tmp_path, capsys, calibrator_file):
    from hf_calibration.jobs.evaluate import EvaluateConfig, run_evaluate

    rc, err = _cli(capsys, "evaluate", "--output-dir", str(tmp_path / "served"), "--limit", str(LIMIT),
                   "--n-resamples", "50", "--posthoc", str(calibrator_file), *_served(vllm_server))
    assert rc == 0, err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = run_evaluate(EvaluateConfig(output_dir=str(tmp_path / "local"), limit=LIMIT, n_resamples=50,
                                          posthoc=str(calibrator_file)), progress=False)
    got = json.loads((tmp_path / "served" / "metrics.json").read_text())
    assert got["run"]["backend"] == "openai" and got["run"]["served_model"] == MODEL
    records = [json.loads(line) for line in (tmp_path / "served" / "predictions.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in records] == ref.scores.prediction.tolist()
    np.testing.assert_allclose([r["confidence"] for r in records], ref.scores.confidence, atol=PROB_ATOL)
    for name in ("option_probability", "posthoc_temperature"):
        g, r = got["signals"][name], ref.metrics["signals"][name]
        # the same predictions, confidences within PROB_ATOL: ECE and Brier move by at most that (a mean of
        # |Δconf| terms) unless a confidence crosses a bin edge, which the equal predictions rule out only
        # for accuracy; so accuracy is exact and the rest within 2·PROB_ATOL
        assert g["accuracy"]["value"] == r["accuracy"]["value"]
        assert abs(g["brier"]["value"] - r["brier"]["value"]) <= 2 * PROB_ATOL


def test_diagnose_through_server(vllm_server, tmp_path, capsys):
    from hf_calibration.jobs.diagnose import DiagnoseConfig, run_diagnose

    rc, err = _cli(capsys, "diagnose", "--output-dir", str(tmp_path / "served"), "--limit", str(LIMIT),
                   "--n-resamples", "20", *_served(vllm_server))
    assert rc == 0, err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = run_diagnose(DiagnoseConfig(output_dir=str(tmp_path / "local"), limit=LIMIT, n_resamples=20),
                           progress=False)
    records = [json.loads(line) for line in (tmp_path / "served" / "signals.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in records] == ref.signals.prediction.tolist()
    for name, conf in ref.signals.confidence.items():
        # each signal is a ratio or softmax of read probabilities: at most 2·PROB_ATOL; P(True)Norm divides by
        # τ_n = 0.2 inside its softmax, so 5× that
        np.testing.assert_allclose([r[name] for r in records], conf, atol=10 * PROB_ATOL, err_msg=name)
    greedy = [np.nan if r["verbalized_greedy"] is None else r["verbalized_greedy"] for r in records]
    np.testing.assert_array_equal(greedy, ref.signals.verbalized_greedy)


# ----------------------------------------------------------------------------------------------- bad input


def _assert_one_line(rc, err, option, out_dir):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in err, err
    assert not out_dir.exists()


def test_server_unreachable(tmp_path, capsys, vllm_server):
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    out = tmp_path / "out"
    rc, err = _cli(capsys, "evaluate", "--output-dir", str(out), "--limit", "2", "--backend", "openai",
                   "--base-url", url)
    _assert_one_line(rc, err, "--base-url", out)
    assert url in err


def test_wrong_served_model(tmp_path, capsys, vllm_server):
    out = tmp_path / "out"
    rc, err = _cli(capsys, "diagnose", "--output-dir", str(out), "--limit", "2", "--backend", "openai",
                   "--base-url", vllm_server.url, "--served-model", "no-such-model")
    _assert_one_line(rc, err, "--served-model", out)
    assert "no-such-model" in err and MODEL in err


def test_lora_the_server_was_not_started_with(tmp_path, capsys, vllm_server):
    out = tmp_path / "out"
    rc, err = _cli(capsys, "evaluate", "--output-dir", str(out), "--limit", "2", "--backend", "openai",
                   "--base-url", vllm_server.url, "--served-model", "calm-adapter")
    _assert_one_line(rc, err, "--served-model", out)
    assert "calm-adapter" in err and "LoRA" in err


def test_prompt_longer_than_context(served, smollm):
    tok = smollm[1]
    rows = [{"question": "word " * MAX_MODEL_LEN, "choices": ["a", "b"], "answer": 0, "subject": "x"}]
    from hf_calibration.modeling import score_mcqa

    with pytest.raises(ParameterError, match=f"context of {MAX_MODEL_LEN}") as err:
        score_mcqa(served, tok, rows)
    assert err.value.parameter == "prompts"


def test_backend_options_checked_before_anything(tmp_path, capsys):
    out = tmp_path / "out"
    rc, err = _cli(capsys, "evaluate", "--output-dir", str(out), "--backend", "openai")
    _assert_one_line(rc, err, "--base-url", out)
    rc, err = _cli(capsys, "evaluate", "--output-dir", str(out), "--base-url", "http://127.0.0.1:1/v1")
    _assert_one_line(rc, err, "--base-url", out)
    rc, err = _cli(capsys, "diagnose", "--output-dir", str(out), "--dataset", "gsm8k", "--backend", "openai",
                   "--base-url", "http://127.0.0.1:1/v1")
    _assert_one_line(rc, err, "--backend", out)


def test_question_longer_than_context_in_a_job(vllm_server, tmp_path, capsys):
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"question": "word " * MAX_MODEL_LEN, "choices": ["a", "b"], "answer": 0}) + "\n"
                    + json.dumps({"question": "Short?", "choices": ["a", "b"], "answer": 1}) + "\n")
    out = tmp_path / "out"
    rc, err = _cli(capsys, "evaluate", "--output-dir", str(out), "--dataset", str(data), "--limit", "2",
                   *_served(vllm_server))
    _assert_one_line(rc, err, "--dataset", out)
    assert str(MAX_MODEL_LEN) in err
