"""The gateway's own checks of a request body, before anything is sent upstream: a body the upstream could not be
sent (NaN or Infinity, which Python's json reads but cannot write back) and a ``calibration.enabled`` that is not
a boolean get 400 in OpenAI's error shape naming the field; an unknown path or method gets its 404/405 in the same
shape. The upstream is a closed port: a request that reached it would get 503, not 400."""

from __future__ import annotations

import asyncio

import httpx

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def _app():
    from hf_calibration.gateway.app import create_app
    from hf_calibration.gateway.config import GatewayConfig
    from hf_calibration.modeling.backends import load_tokenizer
    from hf_calibration.modeling.backends.launch import free_port

    return create_app(GatewayConfig(upstream=f"http://127.0.0.1:{free_port()}/v1", model=MODEL),
                      tokenizer=load_tokenizer(MODEL))


def _send(app, method, path, **kw):
    async def go():
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.request(method, path, **kw)

    return asyncio.run(go())


def _assert_openai_error(r, status, param):
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param


def test_non_finite_numbers_and_a_non_boolean_enabled_get_400_naming_the_field():
    app = _app()
    for constant in (b"NaN", b"Infinity", b"-Infinity"):
        body = (b'{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "temperature": %s}'
                % (MODEL.encode(), constant))
        r = _send(app, "POST", "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        _assert_openai_error(r, 400, None)
        assert constant.decode() in r.json()["error"]["message"]
    for enabled in ("no", 0, None):
        r = _send(app, "POST", "/v1/chat/completions", json={"model": MODEL, "messages": [
            {"role": "user", "content": "Hi"}], "calibration": {"enabled": enabled}})
        _assert_openai_error(r, 400, "calibration.enabled")


def test_unknown_paths_and_methods_answer_in_openai_error_shape():
    app = _app()
    _assert_openai_error(_send(app, "GET", "/v1/nope"), 404, None)
    _assert_openai_error(_send(app, "GET", "/v1/chat/completions"), 405, None)


def test_fields_of_the_wrong_type_get_400_naming_the_field_before_the_upstream():
    """OpenAI's request schema (the types the ``openai`` client sends): a message role outside it, message content
    that is neither a string nor content parts, a non-string ``user``, a string ``n`` or ``logprobs``, a prompt of
    the wrong type — each 400 naming the field, where they used to reach the upstream (or be coerced)."""
    app = _app()
    hi = [{"role": "user", "content": "Hi"}]
    for body, param in (({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
                        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
                        ({"messages": [{"role": "user"}]}, "messages[0].content"),
                        ({"messages": hi, "user": 5}, "user"),
                        ({"messages": hi, "n": "2"}, "n"),
                        ({"messages": hi, "n": 0}, "n"),
                        ({"messages": hi, "logprobs": "yes"}, "logprobs"),
                        ({"messages": hi, "max_tokens": 1.5}, "max_tokens")):
        _assert_openai_error(_send(app, "POST", "/v1/chat/completions", json={"model": MODEL, **body}), 400, param)
    for prompt in (5, [], [""], [1.5], {"a": 1}, [[]]):
        _assert_openai_error(_send(app, "POST", "/v1/completions", json={"model": MODEL, "prompt": prompt}), 400,
                             "prompt")
    _assert_openai_error(_send(app, "POST", "/v1/completions", json={"model": MODEL, "prompt": "a",
                                                                     "logprobs": True}), 400, "logprobs")
    # well-formed bodies pass the checks
    from hf_calibration.gateway.core import check_body

    check_body({"model": MODEL, "messages": hi + [{"role": "assistant", "content": None, "tool_calls": []}], "n": 2,
                "user": "u", "logprobs": True, "top_logprobs": 3}, "chat")
    for prompt in ("a", ["a", "b"], [1, 2], [[1, 2], [3]]):
        check_body({"model": MODEL, "prompt": prompt, "logprobs": 2}, "completions")


def test_why_a_confidence_cannot_be_read_names_the_cause():
    """The gateway answers several prompts in one request but reads a confidence for one prompt at a time, text
    messages without tools: its reason says which."""
    from hf_calibration.gateway.core import Gateway  # noqa: F401  (the method under test)

    gw = _app().state.gateway
    assert "one prompt per request" in gw._prompt({"prompt": ["a", "b"]}, "completions")
    assert "tools" in gw._prompt({"messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "chat")
    assert "content parts" in gw._prompt({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "chat")
    ids, fmt = gw._prompt({"prompt": [[5, 6]]}, "completions")
    assert ids == [5, 6] and fmt == "plain"
    assert gw._prompt({"prompt": [7]}, "completions") == ([7], "plain")
