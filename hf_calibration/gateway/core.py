"""The calibration gateway's core: the request checks, the upstream client and the confidence of each answer
(``app.create_app`` serves it), forwarding to an OpenAI-compatible upstream
with httpx and adding a calibrated confidence to every choice (docs/gateway.md).

Request flow of ``POST /v1/chat/completions`` and ``POST /v1/completions``:

1. the body is checked (JSON object, ``model``, ``messages`` or ``prompt``, the ``calibration`` extension field);
   a bad one gets 400 in OpenAI's error shape naming the field, before anything is sent upstream;
2. ``calibration`` is removed and the body forwarded unchanged; the upstream's answer (or its SSE stream, chunk by
   chunk as it arrives) goes back to the client; an upstream error comes back with its status in OpenAI's shape,
   an unreachable upstream as 503, a broken one as 502, a timeout as 504;
3. for each choice, the signal's follow-up reads go to the upstream through the project's
   ``OpenAICompatibleBackend`` (``secl.answer_signals``; their prompts start with the conversation just answered,
   so the upstream's prefix cache serves that part); the calibrator maps the raw value; the abstention rule
   decides ``abstain``; each choice gains ``confidence`` (in a stream: one extra chunk before ``[DONE]``);
4. the answer's record goes to its stream's queue (``gateway.streams``); the response does not wait for it.
"""

from __future__ import annotations

import asyncio
import threading
import time

import anyio
import httpx

from hf_calibration.errors import ParameterError
from hf_calibration.gateway import openai_errors as oe
from hf_calibration.modeling.backends import ServerError, ServerUnreachable
from hf_calibration.gateway.calibration import CalibratorSlot
from hf_calibration.gateway.config import GatewayConfig
from hf_calibration.gateway.metrics import GatewayMetrics
from hf_calibration.gateway.streams import StreamStore

CALIBRATION_FIELDS = ("signal", "options", "multiple_choice", "enabled")


class GatewayError(Exception):
    """An answer the gateway gives instead of the upstream's: HTTP ``status`` and OpenAI-shaped ``body``."""

    def __init__(self, status: int, body: dict):
        super().__init__(body["error"]["message"])
        self.status, self.body = status, body


def bad_request(param, message) -> GatewayError:
    return GatewayError(*oe.invalid_request(param, message))


def check_calibration(body: dict, default_signal: str) -> dict:
    """The ``calibration`` extension field, checked: {signal, options, multiple_choice} (signal ``none``: no
    confidence)."""
    ext = body.pop("calibration", None)
    if ext is None:
        ext = {}
    if not isinstance(ext, dict):
        raise bad_request("calibration", f"must be an object, got {type(ext).__name__}")
    unknown = sorted(set(ext) - set(CALIBRATION_FIELDS))
    if unknown:
        raise bad_request(f"calibration.{unknown[0]}", f"unknown field; known: {', '.join(CALIBRATION_FIELDS)}")
    from hf_calibration.gateway.config import SIGNALS

    signal = ext.get("signal", default_signal)
    if signal not in SIGNALS:
        raise bad_request("calibration.signal", f"must be one of {', '.join(SIGNALS)}, got {signal!r}")
    enabled = ext.get("enabled", True)
    if not isinstance(enabled, bool):
        raise bad_request("calibration.enabled", f"must be true or false, got {enabled!r}")
    if enabled is False:
        signal = "none"
    options = ext.get("options")
    if options is not None and (not isinstance(options, list) or not options
                                or not all(isinstance(o, str) and o.strip() for o in options)):
        raise bad_request("calibration.options", "must be a non-empty list of non-empty strings")
    mc = ext.get("multiple_choice", False)
    if not isinstance(mc, bool):
        raise bad_request("calibration.multiple_choice", f"must be true or false, got {mc!r}")
    if signal in ("norm_p_true", "option_probability") and not options:
        raise bad_request("calibration.options", f"the signal {signal} needs the request's options")
    if signal == "option_probability" and not mc:
        raise bad_request("calibration.multiple_choice", "option_probability needs a multiple-choice request "
                   "(calibration.multiple_choice: true, the options lettered A, B, … in the prompt)")
    return {"signal": signal, "options": options, "multiple_choice": mc}


ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # OpenAI's chat message roles


def _is_token_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in value)


def _check_prompt(prompt) -> None:
    """OpenAI's completions ``prompt``: a string, a list of strings, a list of token ids or a list of such lists."""
    if isinstance(prompt, str) and prompt:
        return
    if isinstance(prompt, list) and prompt and (_is_token_ids(prompt) or all(
            (isinstance(p, str) and p) or _is_token_ids(p) for p in prompt)):
        return
    raise bad_request("prompt", "required: a non-empty string, list of strings, list of token ids or list of "
                      f"such lists, got {prompt!r:.60}")


def _check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "required: a non-empty list of messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}].role", "each message needs a role")
        if m["role"] not in ROLES:
            raise bad_request(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}, got {m['role']!r}")
        content = m.get("content")
        if not (isinstance(content, str) or (isinstance(content, list) and all(isinstance(p, dict) for p in content))
                or (content is None and m["role"] == "assistant")):
            raise bad_request(f"messages[{i}].content", "must be a string or a list of content parts (an assistant "
                              f"turn with tool calls may have none), got {content!r:.60}")


def _check_options(body: dict, endpoint: str) -> None:
    """The OpenAI sampling and output fields the gateway reads itself, checked for their type (the upstream checks
    their ranges)."""
    for name in ("stream", "echo") + (("logprobs",) if endpoint == "chat" else ()):
        if name in body and body[name] is not None and not isinstance(body[name], bool):
            raise bad_request(name, f"must be true or false, got {body[name]!r}")
    ints = ("n", "top_logprobs", "max_tokens", "max_completion_tokens") + (("logprobs",) if endpoint != "chat" else ())
    for name in ints:
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise bad_request(name, f"must be an integer, got {value!r}")
    if body.get("n") is not None and body["n"] < 1:
        raise bad_request("n", f"must be at least 1, got {body['n']!r}")
    if "user" in body and body["user"] is not None and not isinstance(body["user"], str):
        raise bad_request("user", f"must be a string, got {body['user']!r}")


def check_body(body, endpoint: str) -> None:
    """The request body before anything is sent upstream: a JSON object with ``model``, OpenAI's ``messages`` (chat)
    or ``prompt`` (completions), and the types of the fields the gateway reads. GatewayError (400 naming the
    field) otherwise."""
    if not isinstance(body, dict):
        raise bad_request(None, "the request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise bad_request("model", "required: the served model's name (GET /v1/models lists them)")
    if endpoint == "chat":
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    _check_options(body, endpoint)


class Gateway:
    """The state behind the app: config, tokenizer, the async upstream client, the read backends (one per served
    name), the calibrator slot, the abstention rule, the streams and the metrics."""

    def __init__(self, config: GatewayConfig, *, tokenizer=None, stepper=None):
        from hf_calibration.secl.confidence import ConfidenceTokens

        self.config = config
        self.upstream = config.upstream.rstrip("/")
        if tokenizer is None:
            from hf_calibration.modeling.backends import load_tokenizer

            tokenizer = load_tokenizer(config.model)
        self.tokenizer = tokenizer
        self.tokens = ConfidenceTokens.from_tokenizer(tokenizer)
        self.metrics = GatewayMetrics()
        self.calibrator = CalibratorSlot(config.calibrator, signal=config.signal, model=config.model)
        self._label_calibrator()
        self.rule = self._abstention_rule()
        self.streams = StreamStore(config.state_dir, stepper, on_event=self._stream_event)
        self.slots = asyncio.Semaphore(config.max_in_flight)
        self.reads = anyio.CapacityLimiter(config.max_reads_in_flight)
        self._backends: dict = {}
        self._backends_lock = threading.Lock()
        self.client: httpx.AsyncClient | None = None

    def _label_calibrator(self) -> None:
        self.metrics.calibrator_version.clear()
        cal = self.calibrator.current
        self.metrics.calibrator_version.labels(cal.kind, cal.version).set(1)

    def _abstention_rule(self):
        if self.config.abstain_risk is None:
            return None
        from hf_calibration.gateway.abstain import learn_then_test, read_labelled

        conf, correct = read_labelled(self.config.abstain_calibration, self.config.signal)
        return learn_then_test(conf, correct, alpha=self.config.abstain_risk, delta=self.config.abstain_delta)

    def _stream_event(self, key: str, saved: dict, events: dict) -> None:
        self.metrics.stream_steps.labels(key).inc()
        self.metrics.adapter_version.labels(key).set(saved["version"])
        if "bursts" in saved["state"]:
            self.metrics.secl_bursts.labels(key).set(saved["state"]["bursts"])

    def reload_calibrator(self):
        cal = self.calibrator.reload()
        self._label_calibrator()
        return cal

    # ------------------------------------------------------------------------------------------ upstream

    async def start(self) -> None:
        timeout = httpx.Timeout(self.config.timeout, connect=10.0)
        limits = httpx.Limits(max_connections=self.config.max_in_flight * 2, max_keepalive_connections=64)
        self.client = httpx.AsyncClient(base_url=self.upstream, timeout=timeout, limits=limits)

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        self.streams.close()
        for backend in self._backends.values():
            backend.close()

    def backend(self, served: str):
        """The ``OpenAICompatibleBackend`` that reads through ``served`` (the request's model name, or a stream's
        adapter), made on first use without the start-up probe (``run_serve`` probes once) and without retries (an
        upstream failure reaches the client at once, as a 502/503). A stream adapter the upstream answers it does not
        serve (restarted under the gateway) is loaded again by the stepper (``reload_adapter``) and the read sent
        once more."""
        with self._backends_lock:
            if served not in self._backends:
                from hf_calibration.modeling.backends import OpenAICompatibleBackend

                self._backends[served] = OpenAICompatibleBackend(
                    self.upstream, served, self.tokenizer, max_in_flight=4, timeout=self.config.timeout, retries=0,
                    check=False, on_missing_model=getattr(self.streams.stepper, "reload_adapter", None))
            return self._backends[served]

    def transport_error(self, err: Exception) -> GatewayError:
        if isinstance(err, httpx.TimeoutException):
            self.metrics.upstream_errors.labels("timeout").inc()
            return GatewayError(504, oe.error_body(f"the upstream server {self.upstream} did not answer within "
                                                   f"{self.config.timeout:g} s", type="upstream_timeout",
                                                   code="upstream_timeout"))
        if isinstance(err, (httpx.ConnectError, httpx.ConnectTimeout)):
            self.metrics.upstream_errors.labels("unreachable").inc()
            return GatewayError(*oe.upstream_unreachable(self.upstream, type(err).__name__))
        self.metrics.upstream_errors.labels("broken").inc()
        return GatewayError(*oe.upstream_failed(self.upstream, f"{type(err).__name__}: {err}"))

    # ---------------------------------------------------------------------------------------- confidence

    def _prompt(self, body: dict, endpoint: str):
        """(prompt ids, prompt format) the upstream answered, or a string saying why the gateway cannot rebuild them
        (tools, non-text message parts, several prompts in one request)."""
        if endpoint == "chat":
            messages = body["messages"]
            if body.get("tools"):
                return "the gateway reads a confidence for conversations without tools only"
            if any(not isinstance(m.get("content"), str) for m in messages):
                return "the gateway reads a confidence for text messages only (no content parts)"
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self.tokenizer.encode(text, add_special_tokens=False), "chat"
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and not _is_token_ids(prompt):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False), "plain"
        if _is_token_ids(prompt):
            return list(prompt), "plain"
        return (f"the gateway reads a confidence for one prompt per request (this one has {len(prompt)}); send "
                "one prompt per request")

    def confidence(self, served: str, prompt, answer: str, ext: dict, key: str) -> dict:
        """The ``confidence`` object of one choice (runs in a worker thread: the reads block)."""
        from hf_calibration.secl.answer_signals import answer_signal

        signal = ext["signal"]
        if isinstance(prompt, str):  # why this request's prompt cannot be read (``_prompt``)
            return {"value": None, "signal": signal, "stream": key, "error": prompt}
        ids, fmt = prompt
        start = time.perf_counter()
        state = self.streams.state(key)
        reader = served  # SECL's signal: the verbalized read through the stream's served adapter (secl_stepper)
        if signal == "secl":
            reader = state["state"].get("served_name") or served
        text = answer if fmt == "chat" else answer.strip()
        read = answer_signal(self.backend(reader), self.tokenizer, ids, text,
                             "verbalized" if signal == "secl" else signal, prompt_format=fmt, options=ext["options"],
                             multiple_choice=ext["multiple_choice"], tau_n=self.config.tau_n, tokens=self.tokens)
        self.metrics.confidence_seconds.labels(signal).observe(time.perf_counter() - start)
        cal = self.calibrator.current  # read once: one version per answer
        calibrated = cal(read.raw) if signal == self.config.signal else read.raw
        described = cal.describe() if signal == self.config.signal else {"kind": "identity", "version": "none",
                                                                           "fitted_on": None}
        abstain = self.rule.abstain(read.raw) if self.rule is not None and signal == self.config.signal else False
        out = {"value": calibrated, "raw": read.raw, "signal": signal, "calibrator": described, "stream": key,
               "adapter_version": state["version"], "abstain": abstain, "mass": read.mass}
        if read.option is not None:
            out["option"] = read.option
        out.update(read.detail)
        self.metrics.confidence.labels(key, signal).observe(calibrated)
        self.metrics.answers.labels(key, str(abstain).lower()).inc()
        record = {"time": time.time(), "stream": key, "model": served, "signal": signal, "raw": read.raw,
                  "confidence": calibrated, "abstain": abstain, "calibrator": cal.version, "option": read.option}
        if getattr(self.streams.stepper, "needs_prompt", False):  # a stepper that reads the question again (SECL)
            record.update(prompt_ids=list(ids), answer=text, options=ext["options"],
                          multiple_choice=ext["multiple_choice"])
        self.streams.submit(key, record)
        return out

    async def confidences(self, served, prompt, answers: dict, ext, key) -> dict:
        """{choice index: confidence object} for the answers of one response, read concurrently."""
        async def one(i, text):
            try:
                value = await anyio.to_thread.run_sync(self.confidence, served, prompt, text, ext, key,
                                                       limiter=self.reads)
            except ServerError:  # the upstream failed the reads: the client's 502/503 (server_error)
                raise
            except ParameterError as err:  # the answer cannot be read for this signal (e.g. no option letter)
                value = {"value": None, "signal": ext["signal"], "stream": key, "error": str(err)}
            return i, value

        pairs = await asyncio.gather(*(one(i, t) for i, t in answers.items()))
        return dict(pairs)


def server_error(gw: Gateway, err) -> GatewayError:
    """A ``ServerError`` of the read backend (after its own message) as the client's 502/503."""
    text = str(err)
    if isinstance(err, ServerUnreachable):
        gw.metrics.upstream_errors.labels("unreachable").inc()
        return GatewayError(*oe.upstream_unreachable(gw.upstream, text.split(": ", 1)[-1][:200]))
    gw.metrics.upstream_errors.labels("broken").inc()
    return GatewayError(*oe.upstream_failed(gw.upstream, text[:300]))
