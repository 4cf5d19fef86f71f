"""A served ``evaluate`` whose server dies mid-run, against the real vLLM server: a small proxy on 127.0.0.1 forwards
to it and, after a set number of completions, stops answering (it closes each connection unanswered, as a dead
server does). The job prints one line saying what it kept; the same command, the server back, resumes."""

from __future__ import annotations

import json
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from hf_calibration.cli import main
from hf_calibration.runtime.outputs import partial_path
from tests.serving.conftest import MODEL, PROB_ATOL

LIMIT = 4


class DyingProxy:
    """Forwards every request to ``target`` (a server root) until ``budget`` completions were forwarded, then
    closes each completion request's connection without an answer; ``completions`` counts the ones forwarded."""

    def __init__(self, target: str):
        self.target, self.budget, self.completions, self.lock = target, None, 0, threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith("/completions"):
                    with proxy.lock:
                        if proxy.budget is not None and proxy.completions >= proxy.budget:
                            self.close_connection = True
                            return  # no answer: the client sees the server disconnect
                        proxy.completions += 1
                r = httpx.request(self.command, proxy.target + self.path, content=body, timeout=300,
                                  headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
                self.send_response(r.status_code)
                self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            do_GET = do_POST = _forward

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def proxy(vllm_server):
    p = DyingProxy(vllm_server.url[: -len("/v1")])
    yield p
    p.close()


def _evaluate(capsys, out, url):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(["evaluate", "--output-dir", str(out), "--limit", str(LIMIT), "--n-resamples", "20",
                   "--batch-size", "1", "--backend", "openai", "--base-url", url, "--served-model", MODEL])
    return rc, capsys.readouterr().err


def _lines(err):
    """stderr's lines less the progress bar's (tqdm's "scoring:  50%|█████     | 2/4 …" updates, closed with a newline
    before the error): the error itself must be one line."""
    return [line for line in err.strip().splitlines() if "%|" not in line]


def _records(out):
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def test_server_dying_mid_run_keeps_scores_and_the_same_command_resumes(proxy, tmp_path, capsys):
    out = tmp_path / "served"
    proxy.budget = 1 + 2  # the start-up check's one completion, then two questions (one request in flight)
    rc, err = _evaluate(capsys, out, proxy.url)
    lines = _lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "--base-url" in lines[0] and proxy.url in lines[0]
    assert f"2 of {LIMIT} questions scored so far are kept" in lines[0] and "run the same command again" in lines[0]
    assert not out.exists()  # nothing final written
    kept = partial_path(out, "evaluate")
    assert len(kept.read_text().splitlines()) == 1 + 2

    proxy.budget, proxy.completions = None, 0  # the server is back at the same address
    rc, err = _evaluate(capsys, out, proxy.url)
    assert rc == 0, err
    assert proxy.completions == 1 + LIMIT - 2  # the check, then only the questions not kept
    assert not kept.exists()

    rc, err = _evaluate(capsys, tmp_path / "whole", proxy.url)  # an uninterrupted run of the same command
    assert rc == 0, err
    got, ref = _records(out), _records(tmp_path / "whole")
    assert [r["prediction"] for r in got] == [r["prediction"] for r in ref]
    # the same server on the same one-prompt requests; its kernels need not repeat bit-for-bit (a prefix-cache hit
    # reads the prompt's keys and values instead of recomputing them), so within PROB_ATOL (tests/serving/conftest)
    for g, r in zip(got, ref):
        assert abs(g["confidence"] - r["confidence"]) <= PROB_ATOL


def test_diagnose_resumes_inside_a_later_pass_through_the_server(proxy, tmp_path, capsys):
    def diagnose(out):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rc = main(["diagnose", "--output-dir", str(out), "--limit", "2", "--n-resamples", "20", "--batch-size", "1",
                       "--backend", "openai", "--base-url", proxy.url, "--served-model", MODEL])
        return rc, capsys.readouterr().err

    rc, err = diagnose(tmp_path / "whole")
    assert rc == 0, err
    whole, proxy.completions = proxy.completions, 0
    proxy.budget = 1 + 2 + 3  # the check, both option reads, three of the eight P(True) reads
    rc, err = diagnose(tmp_path / "run")
    assert rc == 2 and len(_lines(err)) == 1, err
    assert "the 3 of 8 P(True) reads (after all option reads) scored so far are kept" in err
    proxy.budget, proxy.completions = None, 0
    rc, err = diagnose(tmp_path / "run")
    assert rc == 0, err
    assert proxy.completions == whole - 5  # neither the option reads nor the three P(True) reads again
    assert not partial_path(tmp_path / "run", "diagnose").exists()
    got, ref = (_read_jsonl(tmp_path / d / "signals.jsonl") for d in ("run", "whole"))
    assert [r["prediction"] for r in got] == [r["prediction"] for r in ref]
    for g, r in zip(got, ref):  # as test_jobs_served's diagnose: P(True)Norm's 1/τ_n = 5 inside a softmax
        for name in ("option_probability", "p_true", "norm_p_true", "dinco"):
            assert abs(g[name] - r[name]) <= 10 * PROB_ATOL, name


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]
