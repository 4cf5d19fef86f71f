"""``create_app``: the calibration gateway as an ASGI app (FastAPI): the OpenAI endpoints, ``/healthz``, ``/metrics``
and ``POST /admin/reload`` (the request flow: ``gateway.core``; docs/gateway.md)."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import time
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from hf_calibration.errors import ParameterError
from hf_calibration.gateway import openai_errors as oe
from hf_calibration.gateway.core import Gateway, GatewayError, check_body, check_calibration, server_error
from hf_calibration.gateway.streams import HEADER, stream_key
from hf_calibration.modeling.backends import ServerError

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


def _error(err: GatewayError) -> JSONResponse:
    return JSONResponse(err.body, status_code=err.status)


def _refuse_constant(name: str):
    """NaN, Infinity and -Infinity are not JSON (RFC 8259) and cannot be forwarded: refused, not a 500."""
    raise ValueError(f"{name} is not a JSON number")


async def _read_json(request: Request):
    raw = await request.body()
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as err:
        raise GatewayError(*oe.invalid_request(None, f"the request body is not JSON ({err})")) from None


def _answers(payload: dict, endpoint: str) -> dict:
    """{choice index: answer text} of a complete (non-streamed) response."""
    out = {}
    for choice in payload.get("choices") or []:
        text = (choice.get("message") or {}).get("content") if endpoint == "chat" else choice.get("text")
        if isinstance(text, str):
            out[choice.get("index", 0)] = text
    return out


def add_routes(app: FastAPI, gw: Gateway) -> None:
    @app.get("/healthz")
    async def healthz():
        """200 when the upstream answers ``GET /models``, else 503 (a load balancer takes the replica out)."""
        try:
            r = await gw.client.get("/models", timeout=5.0)
            up = r.status_code == 200
        except httpx.HTTPError:
            up = False
        body = {"status": "ok" if up else "upstream_unavailable", "upstream": gw.upstream,
                "calibrator": gw.calibrator.current.describe(), "signal": gw.config.signal,
                "abstention": None if gw.rule is None else gw.rule.describe(), "streams": len(gw.streams.streams())}
        return JSONResponse(body, status_code=200 if up else 503)

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/reload")
    async def reload(request: Request):
        """Read ``--calibrator`` again and swap it in; 400 (the old one stays) when the new file is refused; 401/403
        when the caller may not (``admin_refusal``)."""
        refused = admin_refusal(gw.config.admin_key, request)
        if refused is not None:
            return _error(refused)
        try:
            cal = gw.reload_calibrator()
        except ParameterError as err:
            return _error(GatewayError(*oe.invalid_request("calibrator", str(err))))
        return {"calibrator": cal.describe()}

    @app.get("/v1/models")
    async def models():
        started = time.perf_counter()
        try:
            r = await gw.client.get("/models")
        except httpx.HTTPError as err:
            response = _error(gw.transport_error(err))
        else:
            response = _passthrough(gw, r.status_code, r.content)
        _count(gw, "/v1/models", response.status_code, started)
        return response

    async def completions(request: Request):
        endpoint = ENDPOINTS[request.url.path]
        started = time.perf_counter()
        gw.metrics.in_flight.inc()
        try:
            response = await _complete(gw, request, endpoint, started)
        except GatewayError as err:
            response = _error(err)
        finally:
            gw.metrics.in_flight.dec()
        if not isinstance(response, StreamingResponse):
            _count(gw, request.url.path, response.status_code, started)
        return response

    for path in ENDPOINTS:
        app.add_api_route(path, completions, methods=["POST"])


def admin_refusal(admin_key: str | None, request: Request) -> GatewayError | None:
    """None when ``request`` may call an admin endpoint: with ``admin_key`` set, it sends ``Authorization: Bearer
    <admin_key>`` (else 401); without one, it comes from a loopback address, 127.0.0.0/8 or ::1 (else 403). Both
    in OpenAI's error shape."""
    if admin_key is not None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), admin_key.encode()):
            return None
        return GatewayError(*oe.unauthorized("admin endpoints need 'Authorization: Bearer <the --admin-key>'; "
                                             "the key sent is missing or wrong"))
    host = request.client.host if request.client else None
    try:
        address = ipaddress.ip_address(host)
    except (TypeError, ValueError):
        address = None
    mapped = getattr(address, "ipv4_mapped", None)
    if address is not None and (address.is_loopback or (mapped is not None and mapped.is_loopback)):
        return None
    return GatewayError(*oe.forbidden(f"admin endpoints answer loopback clients only when the gateway has no "
                                      f"--admin-key (this request came from {host})"))


def _count(gw: Gateway, endpoint: str, status: int, started: float) -> None:
    gw.metrics.requests.labels(endpoint, str(status)).inc()
    gw.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)


def _passthrough(gw: Gateway, status: int, content: bytes) -> Response:
    if status >= 400:
        gw.metrics.upstream_errors.labels(f"http_{status}").inc()
        return JSONResponse(oe.from_upstream(status, content), status_code=status)
    return Response(content, status_code=status, media_type="application/json")


async def _slot(gw: Gateway):
    try:
        await asyncio.wait_for(gw.slots.acquire(), timeout=gw.config.timeout)
    except asyncio.TimeoutError:
        raise GatewayError(503, oe.error_body(f"all {gw.config.max_in_flight} request slots stayed busy for "
                                              f"{gw.config.timeout:g} s", type="overloaded",
                                              code="gateway_busy")) from None


async def _complete(gw: Gateway, request: Request, endpoint: str, started: float):
    body = await _read_json(request)
    check_body(body, endpoint)
    ext = check_calibration(body, gw.config.signal)
    try:
        key = stream_key(request.headers.get(HEADER), body.get("user"))
    except ParameterError as err:
        raise GatewayError(*oe.invalid_request(HEADER, str(err))) from None
    path = "/chat/completions" if endpoint == "chat" else "/completions"
    if body.get("stream"):
        return await _stream(gw, body, endpoint, path, ext, key, started)
    await _slot(gw)
    try:
        try:
            r = await gw.client.post(path, json=body)
        except httpx.HTTPError as err:
            raise gw.transport_error(err) from None
        if r.status_code >= 400 or ext["signal"] == "none":
            return _passthrough(gw, r.status_code, r.content)
        payload = r.json()
        answers = _answers(payload, endpoint)
        if answers:
            try:
                found = await gw.confidences(body["model"], gw._prompt(body, endpoint), answers, ext, key)
            except ServerError as err:
                raise server_error(gw, err) from None
            for choice in payload["choices"]:
                conf = found.get(choice.get("index", 0))
                if conf is not None:
                    choice["confidence"], choice["abstain"] = conf, conf.get("abstain", False)
        return JSONResponse(payload, status_code=r.status_code)
    finally:
        gw.slots.release()


def _sse(payload) -> bytes:
    return b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"


async def _stream(gw: Gateway, body, endpoint, path, ext, key, started):
    """Open the upstream stream; its error status comes back as a JSON error before any event is sent, else the
    events are relayed as they arrive and the confidences follow in one last chunk before ``[DONE]``."""
    await _slot(gw)
    try:
        upstream = await gw.client.send(gw.client.build_request("POST", path, json=body), stream=True)
    except httpx.HTTPError as err:
        gw.slots.release()
        raise gw.transport_error(err) from None
    if upstream.status_code >= 400:
        content = await upstream.aread()
        await upstream.aclose()
        gw.slots.release()
        return _passthrough(gw, upstream.status_code, content)

    async def events():
        texts: dict[int, list[str]] = {}
        last: dict = {}
        status = 200
        try:
            async for line in upstream.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    if ext["signal"] != "none" and texts:
                        yield _sse(await _final_chunk(gw, body, endpoint, ext, key, texts, last))
                    yield _sse(b"[DONE]")
                    break
                yield _sse(data.encode())
                _collect(data, endpoint, texts, last)
        except httpx.HTTPError as err:
            failed = gw.transport_error(err)
            status = failed.status
            yield _sse(failed.body)
        except (ServerError, GatewayError) as err:
            failed = server_error(gw, err) if isinstance(err, ServerError) else err
            status = failed.status
            yield _sse(failed.body)
        finally:
            await upstream.aclose()
            gw.slots.release()
            _count(gw, "/v1/" + path.strip("/"), status, started)

    return StreamingResponse(events(), media_type="text/event-stream")


def _collect(data: str, endpoint: str, texts: dict, last: dict) -> None:
    """Add one chunk's text deltas to ``texts`` (per choice index) and keep the id, created and model."""
    try:
        chunk = json.loads(data)
    except ValueError:
        return
    for name in ("id", "created", "model", "object"):
        if name in chunk:
            last[name] = chunk[name]
    for choice in chunk.get("choices") or []:
        piece = (choice.get("delta") or {}).get("content") if endpoint == "chat" else choice.get("text")
        texts.setdefault(choice.get("index", 0), [])
        if isinstance(piece, str):
            texts[choice.get("index", 0)].append(piece)


async def _final_chunk(gw, body, endpoint, ext, key, texts, last) -> dict:
    answers = {i: "".join(parts) for i, parts in texts.items()}
    found = await gw.confidences(body["model"], gw._prompt(body, endpoint), answers, ext, key)
    empty = {"delta": {}} if endpoint == "chat" else {"text": ""}
    return {**last, "choices": [{"index": i, **empty, "finish_reason": None, "confidence": c,
                                 "abstain": c.get("abstain", False)} for i, c in sorted(found.items())]}


def create_app(config: GatewayConfig, *, tokenizer=None, stepper=None) -> FastAPI:
    """The gateway app for ``config`` (``GatewayConfig``). ``tokenizer``: the served model's (default: loaded from
    ``config.model``); ``stepper``: the per-stream method (``streams.StreamStepper``; default counting). Raises
    ParameterError naming ``calibrator`` or ``abstain_calibration`` for files that cannot be used, at once."""
    gw = Gateway(config, tokenizer=tokenizer, stepper=stepper)

    @asynccontextmanager
    async def lifespan(app):
        await gw.start()
        yield
        await gw.stop()

    app = FastAPI(title="hf-calibration gateway", lifespan=lifespan)
    app.state.gateway = gw

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        """Starlette's own 404/405 (an unknown path or method) in OpenAI's error shape, like every other error."""
        body = oe.error_body(f"{request.method} {request.url.path}: {exc.detail}", type="invalid_request_error",
                             code="not_found" if exc.status_code == 404 else "http_" + str(exc.status_code))
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    add_routes(app, gw)
    return app
