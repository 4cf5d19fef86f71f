"""A served ``evaluate`` or ``diagnose`` whose server dies mid-run keeps every scored read and resumes, without a
server: a ``ScoringBackend`` of our own (the in-process backend on the tiny model) that stops answering after k
prompts, as a dead server does after the retries. (Against a real vLLM server: tests/serving/test_resume.py.)"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from hf_calibration.jobs import DiagnoseConfig, EvaluateConfig, run_diagnose, run_evaluate
from hf_calibration.modeling.backends import ServerError, TransformersBackend
from hf_calibration.runtime.outputs import partial_path

URL = "http://127.0.0.1:9/v1"
LIMIT = 6


class DyingBackend(TransformersBackend):
    """The tiny model in process, two prompts in flight, answering ``alive`` prompts and then raising the
    ServerError a server that stopped answering raises; ``sent`` counts the prompts it was asked. Like a server it
    takes every question's reads of a pass at once (``prefixes_per_session``)."""

    prefixes_per_session = None

    def __init__(self, model, alive=None):
        super().__init__(model, batch_size=1)
        self.max_in_flight, self.alive, self.sent, self._lock = 2, alive, 0, threading.Lock()

    def next_token_logprobs(self, prompts, token_ids):
        with self._lock:
            if self.alive is not None and self.sent + len(prompts) > self.alive:
                raise ServerError("base_url", URL, f"cannot reach {URL}/completions: ConnectError (after 4 attempts)")
            self.sent += len(prompts)
        return super().next_token_logprobs(prompts, token_ids)


@pytest.fixture()
def serve(monkeypatch, tiny_model_dir):
    """``serve(alive)`` → the backend the next served run scores through (``open_server_backend`` replaced)."""
    import hf_calibration.modeling.backends.registry as registry
    from hf_calibration.modeling import load_model

    model, tokenizer = load_model(str(tiny_model_dir))
    made = []

    def serve(alive=None):
        made.append(DyingBackend(model, alive))
        monkeypatch.setattr(registry, "open_server_backend", lambda *a, **k: (tokenizer, made[-1]))
        return made[-1]

    return serve


def _config(model_dir, out, **kw):
    return EvaluateConfig(model=str(model_dir), output_dir=str(out), limit=kw.pop("limit", LIMIT), n_resamples=20,
                          backend="openai", base_url=URL, **kw)


def _records(out):
    return (out / "predictions.jsonl").read_text().splitlines()


def test_dead_server_keeps_the_scored_questions_and_the_rerun_resumes(serve, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    serve(alive=2)
    with pytest.raises(ServerError) as err:
        run_evaluate(_config(tiny_model_dir, out), progress=False)
    assert err.value.parameter == "base_url" and URL in str(err.value)
    message = str(err.value)
    assert f"2 of {LIMIT} questions scored so far are kept" in message and "run the same command again" in message
    assert not out.exists()  # nothing final written
    kept = partial_path(out, "evaluate")
    assert len(kept.read_text().splitlines()) == 1 + 2  # the header and the two answered questions

    resumed = serve()
    result = run_evaluate(_config(tiny_model_dir, out), progress=False)
    assert resumed.sent == LIMIT - 2  # the kept questions are not sent again
    assert not kept.exists() and result.run["n"] == LIMIT

    whole = serve()
    ref = run_evaluate(_config(tiny_model_dir, tmp_path / "whole"), progress=False)
    assert whole.sent == LIMIT
    # the same kernel on the same one-prompt passes, the kept floats read back bit-for-bit: exact
    assert _records(out) == _records(tmp_path / "whole")
    got = json.loads((out / "metrics.json").read_text())["signals"]
    assert got == json.loads((tmp_path / "whole" / "metrics.json").read_text())["signals"]
    local = run_evaluate(EvaluateConfig(model=str(tiny_model_dir), output_dir=str(tmp_path / "local"), limit=LIMIT,
                                        n_resamples=20), progress=False)
    # one prompt per pass vs batched with left padding: within the tiny model's 1e-5 (tests/modeling/test_backends)
    np.testing.assert_allclose(result.scores.probs, local.scores.probs, atol=1e-5)


def test_another_runs_checkpoint_is_refused_and_never_mixed_in(serve, tiny_model_dir, tmp_path):
    from hf_calibration.errors import ParameterError

    out = tmp_path / "run"
    serve(alive=3)
    with pytest.raises(ServerError):
        run_evaluate(_config(tiny_model_dir, out, seed=1), progress=False)
    kept = partial_path(out, "evaluate")
    before = kept.read_text()
    refused = serve()
    with pytest.raises(ParameterError) as err:  # other questions, same folder: the kept scores are not dropped
        run_evaluate(_config(tiny_model_dir, out, seed=2), progress=False)
    assert err.value.parameter == "output_dir" and "overwrite" in err.value.related
    assert "keeps 3 scored prompts of another run" in str(err.value)
    assert refused.sent == 0 and kept.read_text() == before
    other = serve()
    run_evaluate(_config(tiny_model_dir, out, seed=2, overwrite=True), progress=False)
    assert other.sent == LIMIT and not kept.exists()
    out = tmp_path / "run2"  # a folder without results: the kept scores alone decide (evaluate's folder rule aside)
    serve(alive=3)
    with pytest.raises(ServerError):
        run_evaluate(_config(tiny_model_dir, out, limit=LIMIT - 1), progress=False)
    with pytest.raises(ParameterError, match="keeps 3 scored prompts"):  # same questions, another prompt
        run_evaluate(_config(tiny_model_dir, out, limit=LIMIT - 1, prompt_format="plain"), progress=False)
    again = serve()
    run_evaluate(_config(tiny_model_dir, out, limit=LIMIT - 1, prompt_format="plain", overwrite=True),
                 progress=False)
    assert again.sent == LIMIT - 1  # the other run's scores dropped, none mixed in


def test_diagnose_resumes_inside_a_later_pass(serve, tiny_model_dir, tmp_path):
    def diagnose(out):
        return run_diagnose(DiagnoseConfig(model=str(tiny_model_dir), output_dir=str(out), limit=3, n_resamples=20,
                                           backend="openai", base_url=URL), progress=False)

    whole = serve()
    diagnose(tmp_path / "whole")
    out = tmp_path / "run"
    serve(alive=3 + 5)  # the three option reads, then five of the twelve P(True) reads
    with pytest.raises(ServerError) as err:
        diagnose(out)
    assert "the 5 of 12 P(True) reads (after all option reads) scored so far are kept" in str(err.value)
    assert not out.exists()
    resumed = serve()
    diagnose(out)
    assert resumed.sent == whole.sent - 8  # neither the option reads nor the five P(True) reads again
    assert not partial_path(out, "diagnose").exists()
    # the same kernel on the same one-prompt passes, the kept floats read back bit-for-bit: exact
    assert (out / "signals.jsonl").read_text() == (tmp_path / "whole" / "signals.jsonl").read_text()
