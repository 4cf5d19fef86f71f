"""``engines.probe`` refuses a server that speaks only the OpenAI protocol (top-20 log-probabilities of generated
tokens, keyed by token text, as OpenAI's completions reference shows them): no chosen-token read is exact there,
so the backend stops with one ParameterError naming ``base_url`` and what is missing, before any question. The
engines it accepts are tested against real servers (tests/serving, tests/serving_llamacpp)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.backends import OpenAICompatibleBackend


class TopKOnly(BaseHTTPRequestHandler):
    """/v1/models lists "m"; /v1/completions answers one generated token with its top-20 alternatives by text;
    nothing else exists. ``requests`` collects the paths asked."""

    requests: list = []

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.requests.append(self.path)
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "acme"}]})
        self._send(404, {"error": {"message": "Not Found"}})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.requests.append(self.path)
        if self.path != "/v1/completions":
            return self._send(404, {"error": {"message": "Not Found"}})
        top = {f"w{i}": -0.5 - i for i in range(20)}
        self._send(200, {"choices": [{"index": 0, "text": "w0", "logprobs": {
            "tokens": ["w0"], "token_logprobs": [-0.5], "top_logprobs": [top], "text_offset": [0]}}]})

    def log_message(self, *args):
        pass


@pytest.fixture()
def topk_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), TopKOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    TopKOnly.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_a_top_k_only_server_is_refused_naming_what_is_missing(topk_server, tiny_tokenizer):
    with pytest.raises(ParameterError) as err:
        OpenAICompatibleBackend(topk_server, "m", tiny_tokenizer)
    assert err.value.parameter == "base_url"
    message = str(err.value)
    assert "cannot read the log-probabilities of chosen token ids exactly" in message
    assert "logprob_token_ids" in message and "logit_bias" in message and "docs/serving.md" in message
    assert "tokenizer" not in message  # no /tokenize: nothing compared, no mismatch claimed
    assert "/v1/completions" in TopKOnly.requests
