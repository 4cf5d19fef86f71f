"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status
(https://platform.openai.com/docs/guides/error-codes; the ``openai`` client raises ``BadRequestError`` for 400,
``APIStatusError`` subclasses for the others, and reads ``body["error"]["message"]``)."""

from __future__ import annotations

import json


def error_body(message: str, *, type: str, param: str | None = None, code=None) -> dict:
    """The JSON body of an error: message (one line), type (e.g. ``invalid_request_error``), param (the request
    field at fault, dotted, or None), code (a short machine-readable reason, or None)."""
    return {"error": {"message": str(message), "type": type, "param": param, "code": code}}


def invalid_request(param: str | None, message: str) -> tuple[int, dict]:
    """(400, the body naming ``param``): a request the gateway refuses before anything is sent upstream."""
    return 400, error_body(message, type="invalid_request_error", param=param, code="invalid_value")


def upstream_unreachable(url: str, reason: str) -> tuple[int, dict]:
    """(503, the body): the upstream server could not be connected to; the client may retry."""
    return 503, error_body(f"the upstream server {url} cannot be reached ({reason}); retry later",
                           type="upstream_unavailable", code="upstream_unreachable")


def upstream_failed(url: str, reason: str) -> tuple[int, dict]:
    """(502, the body): the upstream server was reached but its answer broke off or could not be read."""
    return 502, error_body(f"the upstream server {url} failed: {reason}", type="upstream_error",
                           code="upstream_failed")


def from_upstream(status: int, content: bytes) -> dict:
    """The upstream's error answer in OpenAI's shape: kept as is when it already is (vLLM's recent versions),
    converted from vLLM's older ``{"object": "error", "message", "type", "param", "code"}``, else the text as the
    message."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and "message" in body["error"]:
        err = body["error"]
        return error_body(err["message"], type=err.get("type") or "upstream_error", param=err.get("param"),
                          code=err.get("code", status))
    if isinstance(body, dict) and "message" in body:
        return error_body(body["message"], type=body.get("type") or "upstream_error", param=body.get("param"),
                          code=body.get("code", status))
    text = content.decode("utf-8", errors="replace").strip() or f"HTTP {status}"
    return error_body(" ".join(text.split())[:500], type="upstream_error", code=status)


def unauthorized(message: str) -> tuple[int, dict]:
    """(401, the body): an admin request without the right ``Authorization: Bearer`` key (OpenAI's invalid key)."""
    return 401, error_body(message, type="invalid_request_error", code="invalid_api_key")


def forbidden(message: str) -> tuple[int, dict]:
    """(403, the body): an admin request from a client the gateway does not take admin requests from."""
    return 403, error_body(message, type="permission_error", code="admin_loopback_only")
