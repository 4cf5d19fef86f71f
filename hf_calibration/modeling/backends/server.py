"""``OpenAICompatibleBackend``: scoring through a server speaking the OpenAI completions protocol (vLLM, llama.cpp).

Every request sends token ids (``prompt`` as a list of ints), never text, so the server scores exactly the
ids the local tokenizer and chat template produced. At start-up ``engines.probe`` finds out what the server can
read exactly (its tokenizer endpoint, context, how chosen-token log-probabilities, continuations and generation
entropies are read, LoRA loading) and picks the read strategy; ``capabilities`` holds what it found and
``capabilities.line()`` says it in one line. What is read, and how exactly, engine by engine: docs/serving.md.

Requests run concurrently (``max_in_flight`` at a time, a thread pool over one ``httpx.Client``); a connection
error, a timeout or HTTP 408/429/5xx is retried ``retries`` times with exponential back-off, then raises
``ServerError`` (a ParameterError naming ``base_url``). A server that cannot read something exactly, serves
another model (tokenizer or vocabulary) or does not serve ``served_model`` (an engine that checks the name) is
refused before anything is scored.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from hf_calibration.errors import ParameterError
from hf_calibration.modeling.backends.base import (ScoringBackend, ServerError, ServerUnreachable, TokenLogprobs,
                                                  check_token_prompts)
from hf_calibration.modeling.backends.engines import PROBE_TEXTS, Capabilities  # noqa: F401  (re-exported)

TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)


def _first_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text[:limit]


class ServerHTTPError(ServerError):
    """A ``ServerError`` for an HTTP error answer: ``status`` (the HTTP status) and ``error`` (the answer's OpenAI error
    object ``{"message", "type", "param", "code"}``, or None when the answer has none)."""

    def __init__(self, base_url: str, message: str, *, status: int, error: dict | None):
        super().__init__("base_url", base_url, message)
        self.status, self.error = status, error


def error_object(response) -> dict | None:
    """The OpenAI error object of an HTTP answer (``{"error": {...}}``; vLLM's older flat ``{"object": "error",
    ...}`` too), or None when the answer is not one (plain text, another JSON shape)."""
    try:
        body = response.json()
    except ValueError:
        return None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"]
    if isinstance(body, dict) and body.get("object") == "error":
        return body
    return None


def model_not_served(status: int, error: dict | None) -> bool:
    """True for a server's answer that the request's ``model`` is not served: HTTP 404 whose error object names the
    ``model`` parameter (vLLM's "model does not exist": ``param: "model"``) or has OpenAI's ``model_not_found``
    code. Decided from the status and the structure, never the message text."""
    return status == 404 and isinstance(error, dict) and (error.get("param") == "model"
                                                          or error.get("code") == "model_not_found")


def lora_refusal(base_url: str, status: int, error: dict | None, text: str, *, folder, rank) -> ParameterError:
    """The refusal of a LoRA load or unload, decided from the HTTP status and the error object (vLLM 0.32: the endpoint
    missing without VLLM_ALLOW_RUNTIME_LORA_UPDATING is a 404 without vLLM's ``NotFoundError`` type, or a 405; an
    adapter folder it cannot find, a 404 of type ``NotFoundError``; a name already loaded, 400; a failure of the engine
    to load it (rank above ``--max-lora-rank``, no ``--enable-lora``, weights it cannot read), 500 with the engine's
    message). The server's message is quoted, never parsed. ``folder`` and ``rank``: the adapter's, named in the
    refusal (None for an unload, or a rank not known)."""
    said = (error or {}).get("message") or text or f"HTTP {status}"
    endpoint_answered = isinstance(error, dict) and error.get("type") == "NotFoundError"
    if status == 405 or (status == 404 and not endpoint_answered):
        return ParameterError("base_url", base_url, f"the server has no runtime LoRA loading (/v1/load_lora_adapter "
                              f"answered HTTP {status}): start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and "
                              "--enable-lora")
    if status == 404:
        return ServerError("base_url", base_url, f"the server found no adapter at {folder} (HTTP 404: {said}): it "
                           "must read the same folder (a shared disk when it runs elsewhere)")
    if status >= 500 and rank is not None:
        return ParameterError("lora_r", rank, f"the server could not load the rank-{rank} adapter (HTTP {status}: "
                              f"{said}): start it with --enable-lora --max-lora-rank {rank} or more, or lower lora_r")
    return ServerError("base_url", base_url, f"the server refused the adapter: HTTP {status}: {said}")


class OpenAICompatibleBackend(ScoringBackend):
    """Scores through ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``), the model served as ``served_model``.

    tokenizer : the local tokenizer of the served model (prompts are built and tokenised here).
    top_logprobs : next tokens read per request (vLLM's default cap ``--max-logprobs`` is 20).
    max_in_flight : concurrent requests. timeout : seconds per request. retries : attempts after the first.
    check : probe the server and run the start-up checks (``engines.probe``); leave True outside tests of them.
    on_missing_model : called with ``served_model`` when the server answers that it does not serve that name
    (``model_not_served``: e.g. a LoRA adapter lost when the server restarted); when it returns True (it has had the
    server load the name again) the request is sent once more. None (default): such an answer raises at once.

    ``capabilities`` (an ``engines.Capabilities``, None before the probe) says which engine serves and how each
    quantity is read; ``capabilities.line()`` is the start-up line, ``capabilities.record()`` what jobs record.

    Raises ServerError naming ``base_url`` when the server cannot be reached, ParameterError naming
    ``served_model`` when a server that checks names does not serve that name, ParameterError naming ``base_url``
    when its tokenizer splits text differently from ``tokenizer``, its vocabulary differs, or it cannot read the
    log-probabilities of chosen token ids exactly.
    """

    name = "server"

    def __init__(self, base_url: str, served_model: str, tokenizer, *, top_logprobs: int = 20, max_in_flight: int = 8,
                 timeout: float = 300.0, retries: int = 3, check: bool = True, on_missing_model=None):
        import httpx

        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ParameterError("base_url", base_url, f"must be an http(s) URL such as http://127.0.0.1:8000/v1, "
                                 f"got {base_url!r}")
        if not isinstance(served_model, str) or not served_model:
            raise ParameterError("served_model", served_model, f"must name the served model, got {served_model!r}")
        for name, value in (("top_logprobs", top_logprobs), ("max_in_flight", max_in_flight)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(name, value, f"must be a positive integer, got {value!r}")
        self.base_url, self.served_model, self.tokenizer = base_url.rstrip("/"), served_model, tokenizer
        self.top_logprobs, self.max_in_flight, self.retries = top_logprobs, max_in_flight, retries
        self.on_missing_model = on_missing_model
        self.vocab_size = len(tokenizer)
        self.max_context = None
        self.capabilities: Capabilities | None = None
        self._reads = None
        self._client = httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=max_in_flight))
        if check:
            self.check_server()

    # ------------------------------------------------------------------------------- transport

    def _request(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One request with the retries (``_send``); the decoded JSON. When the server answers that it does not serve
        ``served_model`` and ``on_missing_model`` has it loaded again, the request is sent once more."""
        try:
            return self._send(method, path, payload)
        except ServerHTTPError as err:
            if (self.on_missing_model is None or not model_not_served(err.status, err.error)
                    or not self.on_missing_model(self.served_model)):
                raise
        return self._send(method, path, payload)

    def _send(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One request with the retries; the decoded JSON. A 4xx other than 408/429 raises ``ServerHTTPError`` at
        once."""
        import httpx

        url = f"{self.base_url}{path}"
        for attempt in range(self.retries + 1):
            unreachable = False
            try:
                response = self._client.request(method, url, json=payload)
            except httpx.TransportError as err:
                unreachable = True
                problem = f"cannot reach {url}: {type(err).__name__}: {_first_line(err) or 'no answer'}"
            else:
                if response.status_code < 400:
                    try:
                        return response.json()
                    except ValueError:  # a plain-text answer (vLLM's /v1/load_lora_adapter)
                        return {"text": response.text}
                problem = f"{url} answered HTTP {response.status_code}: {_first_line(response.text)}"
                if response.status_code not in TRANSIENT_STATUS:
                    raise ServerHTTPError(self.base_url, problem, status=response.status_code,
                                          error=error_object(response))
            if attempt < self.retries:
                time.sleep(min(8.0, 0.5 * 2 ** attempt))
        raise (ServerUnreachable if unreachable else ServerError)(
            "base_url", self.base_url, f"{problem} (after {self.retries + 1} attempts)")

    def _map(self, fn, items):
        """``fn`` over ``items`` with at most ``max_in_flight`` requests at once; results in input order."""
        items = list(items)
        if len(items) <= 1 or self.max_in_flight == 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(self.max_in_flight) as pool:
            return list(pool.map(fn, items))

    def complete(self, prompts: list[list[int]], **options) -> list[dict]:
        """POST /completions for a batch of token-id prompts (greedy: temperature 0; ``options``, the request's other
        fields: ``max_tokens``, ``logprobs``, ...) with the retries of ``request`` → the choices, in prompt order. The
        read strategies of ``engines`` send their reads through it. ServerError naming ``base_url`` when the server
        answers another number of choices than prompts."""
        payload = {"model": self.served_model, "prompt": prompts, "temperature": 0.0, **options}
        choices = self._request("POST", "/completions", payload).get("choices") or []
        if len(choices) != len(prompts):
            raise ServerError("base_url", self.base_url, f"/completions returned {len(choices)} choices for "
                              f"{len(prompts)} prompts")
        return sorted(choices, key=lambda c: c.get("index", 0))

    def request(self, method: str, path: str, payload: dict | None = None) -> dict:
        """One request to ``base_url + path`` with the retries (a connection error, a timeout, HTTP 408/429/5xx);
        the decoded JSON, or ``{"text": …}`` for a plain-text answer. ServerError naming ``base_url`` otherwise."""
        return self._request(method, path, payload)

    def post_once(self, path: str, payload: dict) -> tuple[int, str, dict | None]:
        """One POST to ``base_url + path``, not retried (a repeated LoRA load is refused as a duplicate):
        ``(HTTP status, the answer's text on one line, at most 300 characters, its OpenAI error object or None:
        error_object)``. ServerError naming ``base_url`` when the server cannot be reached."""
        import httpx

        url = f"{self.base_url}{path}"
        try:
            response = self._client.post(url, json=payload)
        except httpx.TransportError as err:
            raise ServerUnreachable("base_url", self.base_url, f"cannot reach {url}: {type(err).__name__}") from None
        error = error_object(response) if response.status_code >= 400 else None
        return response.status_code, " ".join(response.text.split())[:300], error

    @property
    def root_url(self) -> str:
        """The server's root: ``base_url`` without its ``/v1`` (where vLLM's ``/tokenize`` and llama.cpp's ``/props``
        and ``/lora-adapters`` are)."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def request_at_root(self, method: str, path: str, payload: dict | None = None) -> tuple[int, object] | None:
        """One request to ``root_url + path``, not retried (the probe's questions, ``engines.probe``): ``(HTTP
        status, the decoded JSON or, for a plain-text answer, the text)``, whatever the status; None when the server
        cannot be reached."""
        import httpx

        try:
            response = self._client.request(method, f"{self.root_url}{path}", json=payload)
        except httpx.TransportError:
            return None
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text

    def with_served_model(self, served_model: str, *, on_missing_model=None) -> "OpenAICompatibleBackend":
        """This backend reading through ``served_model`` instead (the base model or a LoRA adapter the server has
        loaded): the same connection, probe and read strategy, the strategy rebound to the new name, and
        ``on_missing_model`` (see the class) for that name. ``self`` when the name is already this backend's."""
        import copy

        if served_model == self.served_model:
            return self
        view = copy.copy(self)
        view.served_model, view.on_missing_model = served_model, on_missing_model
        if self._reads is not None:  # the strategy sends requests through its backend: rebind it to the view
            view._reads = copy.copy(self._reads)
            view._reads.backend = view
        return view

    def close(self) -> None:
        self._client.close()

    def load_lora_adapter(self, name: str, path: str) -> None:
        """Load a PEFT LoRA folder into the server under ``name`` (``post_lora_adapter``; the server needs
        ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), then score through it: this backend's
        ``served_model`` becomes ``name``. Raises what ``post_lora_adapter`` raises: ParameterError naming
        ``base_url`` when the engine has no runtime LoRA loading (llama.cpp loads adapters at start only,
        ``--lora``), ServerError naming ``base_url`` with the server's answer when it refuses (e.g. a rank above
        ``--max-lora-rank``)."""
        self.post_lora_adapter(name, path)
        self.served_model = name
        self.check_server()

    def post_lora_adapter(self, name: str, path, *, rank: int | None = None,
                          what: str = "loading a LoRA adapter") -> None:
        """The one sender of vLLM's ``POST /v1/load_lora_adapter``: ``{"lora_name": name, "lora_path": <path made
        absolute>}`` (the server resolves a relative path from its own working directory), sent once, never retried
        (a repeated load is refused as a duplicate). ``served_model`` is left as it is.

        rank : the adapter's LoRA rank, named in the refusal when the engine fails to load it (None: not known).
        what : the caller's purpose, quoted when the probed engine has no runtime LoRA loading.
        Raises ``lora_refusal``'s error for an HTTP error answer (ParameterError naming ``base_url`` or
        ``lora_r``, ServerError naming ``base_url``), ParameterError naming ``base_url`` before sending when the
        probe found no runtime LoRA loading, ServerError naming ``base_url`` when the server cannot be reached."""
        self.require_runtime_lora(what)
        folder = os.path.abspath(path)
        status, text, error = self.post_once("/load_lora_adapter", {"lora_name": name, "lora_path": folder})
        if status >= 400:
            raise lora_refusal(self.base_url, status, error, text, folder=folder, rank=rank)

    def require_runtime_lora(self, what: str) -> None:
        """ParameterError naming ``base_url`` when the probed engine cannot load LoRA adapters at run time."""
        caps = self.capabilities
        if caps is not None and caps.lora != "runtime":
            raise ParameterError("base_url", self.base_url, f"{what} needs runtime LoRA loading, which the "
                                 f"{caps.engine} server does not have (LoRA: {caps.lora}); serve the model with vLLM "
                                 "(--enable-lora, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): docs/serving.md")

    # --------------------------------------------------------------------------------- checks

    def check_server(self) -> None:
        """Probe the server and pick the read strategy (``engines.probe``): served name, context, vocabulary,
        tokenizer, exact chosen-token reads, LoRA loading."""
        from hf_calibration.modeling.backends.engines import probe

        self._reads, self.capabilities = probe(self)
        self.max_context = self.capabilities.max_context

    def _engine(self):
        if self._reads is None:  # check=False (tests of the checks): vLLM's dialect, as before any probe
            from hf_calibration.modeling.backends.engines import TokenIdReads

            self._reads = TokenIdReads(self)
        return self._reads

    # -------------------------------------------------------------------------------- scoring

    def next_token_logprobs(self, prompts, token_ids) -> TokenLogprobs:
        rows, ids = check_token_prompts(prompts), self._check_ids(token_ids)
        self.check_lengths(rows, extra=1)
        reads = self._engine()
        return _stack(self._map(lambda row: reads.next_token(row, ids), rows))

    def continuation_logprobs(self, prompts, continuations):
        """Each continuation token read as the chosen next token after the prompt and the tokens before it:
        exact, and independent of ``prompt_logprobs`` (which vLLM 0.32's CPU build cannot compute with
        ``--enable-lora`` and llama.cpp does not return; docs/serving.md)."""
        rows = check_token_prompts(prompts)
        conts = check_token_prompts(continuations, "continuations")
        if len(rows) != len(conts):
            raise ParameterError("continuations", len(conts), f"need one per prompt ({len(rows)}), got {len(conts)}")
        self.check_lengths([p + c for p, c in zip(rows, conts)], extra=0)
        reads = self._engine()
        return self._map(lambda i: reads.continuation([rows[i] + conts[i][:j] for j in range(len(conts[i]))],
                                                      conts[i]), range(len(rows)))

    def generate(self, prompts, *, max_new_tokens: int):
        rows = check_token_prompts(prompts)
        self.check_lengths(rows, extra=max_new_tokens)
        reads = self._engine()
        return self._map(lambda row: reads.generate(row, max_new_tokens), rows)


def _stack(results: Sequence[tuple]) -> TokenLogprobs:
    lp = np.array([r[0] for r in results], dtype=np.float64)
    return TokenLogprobs(lp, np.array([r[1] for r in results], dtype=np.int64),
                         np.array([r[2] for r in results], dtype=np.float64))
