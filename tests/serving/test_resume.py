"""A served ``evaluate`` whose server dies mid-run, against the real vLLM server: a small proxy on 127.0.0.1 forwards
to it and, after a set number of completions, stops answering (it closes each connection unanswered, as a dead
server does). The job prints one line saying what it kept; the same command, the server back, resumes."""

from __future__ import annotations

import pytest

from hf_calibration.runtime.outputs import partial_path
from tests.served_helpers import DyingProxy, check_dying_server_resume, error_lines, read_jsonl, run_cli
from tests.serving.conftest import MODEL, PROB_ATOL

LIMIT = 4


@pytest.fixture()
def proxy(vllm_server):
    p = DyingProxy(vllm_server.url[: -len("/v1")])  # a question: one completion request
    yield p
    p.close()


def test_server_dying_mid_run_keeps_scores_and_the_same_command_resumes(proxy, tmp_path, capsys):
    # the same server on the same one-prompt requests; its kernels need not repeat bit-for-bit (a prefix-cache hit
    # reads the prompt's keys and values instead of recomputing them), so within PROB_ATOL (tests/serving/conftest)
    check_dying_server_resume(capsys, proxy, tmp_path, ["--n-resamples", "20", "--batch-size", "1", "--backend",
                                                        "openai", "--served-model", MODEL], LIMIT, PROB_ATOL)


def test_diagnose_resumes_inside_a_later_pass_through_the_server(proxy, tmp_path, capsys):
    def diagnose(out):
        rc, _, err = run_cli(capsys, "diagnose", "--output-dir", str(out), "--limit", "2", "--n-resamples", "20",
                             "--batch-size", "1", "--backend", "openai", "--base-url", proxy.url, "--served-model",
                             MODEL)
        return rc, err

    rc, err = diagnose(tmp_path / "whole")
    assert rc == 0, err
    whole = proxy.completions
    proxy.back()
    proxy.budget = 1 + 2 + 3  # the check, both option reads, three of the eight P(True) reads
    rc, err = diagnose(tmp_path / "run")
    assert rc == 2 and len(error_lines(err)) == 1, err
    assert "the 3 of 8 P(True) reads (after all option reads) scored so far are kept" in err
    proxy.back()
    rc, err = diagnose(tmp_path / "run")
    assert rc == 0, err
    assert proxy.completions == whole - 5  # neither the option reads nor the three P(True) reads again
    assert not partial_path(tmp_path / "run", "diagnose").exists()
    got, ref = (read_jsonl(tmp_path / d / "signals.jsonl") for d in ("run", "whole"))
    assert [r["prediction"] for r in got] == [r["prediction"] for r in ref]
    for g, r in zip(got, ref):  # as test_jobs_served's diagnose: P(True)Norm's 1/τ_n = 5 inside a softmax
        for name in ("option_probability", "p_true", "norm_p_true", "dinco"):
            assert abs(g[name] - r[name]) <= 10 * PROB_ATOL, name

