"""llama.cpp serving the packaged Q4_1 GGUF (the file the in-process model is dequantised from): reads, ``evaluate``
and ``diagnose`` against the in-process numbers within the quantised-activation tolerance derived in conftest.py;
the bad inputs (another model's tokenizer, a prompt over the context, ``secl-serve`` without runtime LoRA loading,
the server gone mid-run and the same command resumed)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.backends import ServerError, TransformersBackend
from tests.served_helpers import (ROWS, DyingProxy, check_dying_server_resume, error_lines, prompts,  # noqa: F401
                                  read_ids, run_cli)  # (prompts: a fixture)
from tests.serving_llamacpp.conftest import CTX, U32, VOCAB, open_backend, q4_logprob_tol

LIMIT = 4


@pytest.fixture(scope="module")
def served(q4_server, smollm):
    backend = open_backend(q4_server, smollm[1], max_in_flight=2)
    yield backend
    backend.close()


def _last_logits(model, rows):
    import torch

    with torch.no_grad():
        return [model(input_ids=torch.tensor([r])).logits[0, -1].double() for r in rows]


def _tolerances(model, rows):
    """Per prompt, conftest's q4_logprob_tol from the in-process logits' spread, and the top-2 margin."""
    out = []
    for z in _last_logits(model, rows):
        top2 = z.topk(2).values
        out.append((q4_logprob_tol(float(z.std())), float(top2[0] - top2[1])))
    return out


def test_next_token_logprobs_within_the_derived_tolerance(served, prompts, smollm):
    model, tok = smollm
    ids = read_ids(tok)
    local = TransformersBackend(model, batch_size=4, pad_id=tok.pad_token_id)
    got, ref = served.next_token_logprobs(prompts, ids), local.next_token_logprobs(prompts, ids)
    assert got.logprobs.min() < -10
    for i, (tol, margin) in enumerate(_tolerances(model, prompts)):
        np.testing.assert_array_less(np.abs(got.logprobs[i] - ref.logprobs[i]), tol)
        if margin > 2 * tol:
            assert got.top_ids[i] == ref.top_ids[i]


def test_both_exact_read_paths_agree(served, prompts, smollm, monkeypatch):
    """Forced reads and the full distribution read the same logits; only the float32 normaliser's summation order
    differs: (V − 1)·u relative (conftest.py)."""
    ids = read_ids(smollm[1])
    ids = ids[:4] + ids[-4:]  # one request per id on the forced path
    reads = served._engine()
    monkeypatch.setattr(reads, "forced_max", 10 ** 6)
    forced = served.next_token_logprobs(prompts[:2], ids)
    monkeypatch.setattr(reads, "forced_max", 0)
    full = served.next_token_logprobs(prompts[:2], ids)
    np.testing.assert_allclose(forced.logprobs, full.logprobs, atol=2 * (VOCAB - 1) * U32)
    np.testing.assert_array_equal(forced.top_ids, full.top_ids)


def test_mcqa_scores_within_the_derived_tolerance(served, smollm):
    from hf_calibration.modeling import score_mcqa

    model, tok = smollm
    got, ref = score_mcqa(served, tok, ROWS, progress=False), score_mcqa(model, tok, ROWS, progress=False)
    rows = [tok.encode(p, add_special_tokens=False) for p in ref.prompts]
    for i, (tol, _) in enumerate(_tolerances(model, rows)):
        # an option probability is p_j = 1/Σ_k exp(lp_k − lp_j): log-ratio errors ≤ 2·tol move it by ≤ e^{2tol} − 1
        assert np.abs(got.probs[i] - ref.probs[i]).max() <= math.expm1(2 * tol)


def test_evaluate_and_diagnose_through_llamacpp(q4_server, tmp_path, capsys):
    served = ["--backend", "openai", "--base-url", q4_server]
    rc, out, err = run_cli(capsys, "evaluate", "--output-dir", str(tmp_path / "eval"), "--limit", str(LIMIT),
                           "--n-resamples", "20", *served)
    assert rc == 0, err
    assert "server: llama.cpp; chosen-token reads: full distribution or forced reads" in out
    run = json.loads((tmp_path / "eval" / "metrics.json").read_text())["run"]
    assert run["server"]["engine"] == "llama.cpp" and "forced reads" in run["server"]["read_path"]
    rc, out, err = run_cli(capsys, "diagnose", "--output-dir", str(tmp_path / "diag"), "--limit", "2",
                           "--n-resamples", "20", *served)
    assert rc == 0, err
    run = json.loads((tmp_path / "diag" / "diagnosis.json").read_text())["run"]
    assert run["server"]["engine"] == "llama.cpp"
    records = [json.loads(line) for line in (tmp_path / "diag" / "signals.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(0 <= r["p_true"] <= 1 for r in records)


# ----------------------------------------------------------------------------------------------- bad input


def test_another_models_tokenizer_is_named_and_the_same_one_passes(q4_server, served, tiny_tokenizer):
    assert served.capabilities.tokenizer == "llama.cpp"  # SmolLM2's own tokenizer: checked, no mismatch
    with pytest.raises(ParameterError) as err:
        open_backend(q4_server, tiny_tokenizer)
    assert err.value.parameter == "base_url"
    message = str(err.value)
    assert "the server's tokenizer splits" in message and "another model" in message
    assert "into []" not in message  # the server's real split is shown, not an empty answer to a foreign shape


def test_wrong_model_in_a_job_is_one_line(q4_server, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, err = run_cli(capsys, "evaluate", "--output-dir", str(out), "--limit", "2", "--model", str(tiny_model_dir),
                         "--backend", "openai", "--base-url", q4_server)
    assert rc == 2 and len(error_lines(err)) == 1 and "--base-url" in err and "Traceback" not in err
    assert not out.exists()


def test_context_overflow_refused_before_sending_and_by_the_server(served, smollm, tmp_path, capsys, q4_server):
    tok = smollm[1]
    rows = [{"question": "word " * CTX, "choices": ["a", "b"], "answer": 0, "subject": "x"}]
    from hf_calibration.modeling import score_mcqa

    with pytest.raises(ParameterError, match=f"context of {CTX}") as err:
        score_mcqa(served, tok, rows, progress=False)
    assert err.value.parameter == "prompts"
    unchecked = open_backend(q4_server, tok)  # past our check: the server's own refusal, named
    unchecked.max_context = None
    try:
        with pytest.raises(ServerError) as err:
            unchecked.next_token_logprobs([[42] * (CTX + 10)], [42])
    finally:
        unchecked.close()
    assert err.value.parameter == "base_url" and "HTTP 4" in str(err.value) and "context" in str(err.value)
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"question": "word " * CTX, "choices": ["a", "b"], "answer": 0}) + "\n")
    rc, _, err = run_cli(capsys, "evaluate", "--output-dir", str(tmp_path / "o"), "--dataset", str(data),
                         "--backend", "openai", "--base-url", q4_server)
    assert rc == 2 and len(error_lines(err)) == 1 and "--dataset" in err and str(CTX) in err


def test_secl_serve_says_it_needs_runtime_lora_loading(q4_server, tmp_path, capsys):
    out = tmp_path / "secl"
    rc, _, err = run_cli(capsys, "secl-serve", "--output-dir", str(out), "--base-url", q4_server,
                         "--limit-per-domain", "2")
    lines = error_lines(err)
    assert rc == 2 and len(lines) == 1 and "--base-url" in lines[0], err
    assert "runtime LoRA loading" in lines[0] and "llama.cpp" in lines[0]


# --------------------------------------------------------------------------------------- server gone, resumed


def test_server_gone_mid_run_keeps_scores_and_the_same_command_resumes(q4_server, tmp_path, capsys):
    proxy = DyingProxy(q4_server[: -len("/v1")], per="prompt")  # a question: one prompt, read in one or more requests
    try:
        # same server, cache off; the read path may differ: the normaliser bound, twice
        check_dying_server_resume(capsys, proxy, tmp_path, ["--n-resamples", "20", "--batch-size", "1", "--backend",
                                                            "openai"], LIMIT, 2 * 2 * (VOCAB - 1) * U32)
    finally:
        proxy.close()
