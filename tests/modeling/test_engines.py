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


def test_the_probe_reads_through_the_backends_public_methods(topk_server, tiny_tokenizer):
    """``engines`` (the probe and the read strategies) sends through the backend's public methods — ``request``,
    ``complete``, ``request_at_root`` — never its transport (before: ``_request``, ``_client``, ``_complete``).
    ``request_at_root`` asks the server's root (outside /v1) once: the status and decoded body whatever the status,
    None when nothing answers."""
    import inspect
    import re
    import socket

    from hf_calibration.modeling.backends import ServerError, engines

    assert not re.findall(r"backend\._\w+", inspect.getsource(engines))
    backend = OpenAICompatibleBackend(topk_server, "m", tiny_tokenizer, check=False)
    assert backend.root_url + "/v1" == topk_server
    assert backend.request_at_root("GET", "/props") == (404, {"error": {"message": "Not Found"}})
    assert TopKOnly.requests[-1] == "/props"  # the root's path, not /v1/props
    assert [c["text"] for c in backend.complete([[1, 2]], max_tokens=1)] == ["w0"]
    with pytest.raises(ServerError) as err:  # the server answers one choice whatever it is sent
        backend.complete([[1, 2], [3]], max_tokens=1)
    assert err.value.parameter == "base_url" and "1 choices for 2 prompts" in str(err.value)
    backend.close()
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    closed = OpenAICompatibleBackend(f"http://127.0.0.1:{port}/v1", "m", tiny_tokenizer, check=False, retries=0)
    assert closed.request_at_root("GET", "/props") is None
    closed.close()
